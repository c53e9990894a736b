"""The program's own model hooks, timed (instrument/hooks.py), and what the diagnosis makes of them
(rules_work.model_hooks, cases.md C26: ``wandb.watch`` with a small ``log_freq``)."""

from __future__ import annotations

import functools
import sys

import pytest
import torch

from test_diagnose import make_facts, make_host, make_loader, make_step
from whyidle.analysis.run import _hooks
from whyidle.diagnose import diagnose, rules_work
from whyidle.instrument.hooks import MODULE_METHODS, TENSOR_METHODS, HookTimer, owner


@pytest.fixture
def timer():
    """A HookTimer installed on torch's classes, taken out again after the test."""
    saved = [(cls, name, cls.__dict__[name]) for cls, names in ((torch.nn.Module, MODULE_METHODS),
                                                                   (torch.Tensor, TENSOR_METHODS))
             for name in names if name in cls.__dict__]
    t = HookTimer(lambda frame: (f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", None),
                  torch.__path__[0])
    t.install(torch)
    try:
        yield t
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)


def test_program_hooks_are_timed_and_keep_their_semantics(timer):
    model = torch.nn.Linear(4, 2)
    seen = []

    def double_output(module, inputs, output):  # a forward hook that replaces the output
        return output * 2

    handle = model.register_forward_hook(double_output)
    model.weight.register_hook(lambda grad: seen.append(grad.shape))
    x = torch.ones(3, 4)
    with torch.no_grad():
        plain = torch.nn.functional.linear(x, model.weight, model.bias)
    out = model(x)
    assert torch.allclose(out, plain * 2)  # the hook's return value is what the program gets
    out.sum().backward()
    assert seen == [torch.Size([2, 4])]
    assert timer.take() > 0 and timer.take() == 0
    rows = {r["function"]: r for r in timer.record(1)["hooks"]}
    fwd = rows["test_program_hooks_are_timed_and_keep_their_semantics.<locals>.double_output"]
    assert fwd["phase"] == "forward" and fwd["calls"] == 1 and fwd["owner"] == "program"
    assert fwd["defined"].endswith(f"test_hooks.py:{double_output.__code__.co_firstlineno}")
    assert "test_hooks.py" in fwd["registered"]
    assert any(r["phase"] == "backward" for r in rows.values())
    handle.remove()  # the handle the program got removes the timed wrapper
    assert torch.allclose(model(x), plain) and not model._forward_hooks


def test_logging_inside_a_hook_is_the_logging_regions_not_the_hooks():
    """A forward hook that writes TensorBoard histograms: the writer's time is a ``logging``
    region (reported as logging), so the hook timer leaves it out of the hook's time."""
    import time

    from whyidle.instrument import regions as region_mod

    class Agent:
        disabled = False
        on_exit: list = []

        def record(self, rec):
            pass

        def notice(self, msg):
            pass

    regions = region_mod.Regions(Agent(), 0)
    t = HookTimer(lambda frame: ("here", None), torch.__path__[0], regions)

    def log_histograms(module, inputs, output):
        time.sleep(0.002)  # the hook's own work
        regions.begin("logging")
        time.sleep(0.05)  # writer.add_histogram
        regions.end("logging", "SummaryWriter.add_histogram")

    timed = t.wrap(log_histograms, "forward", None)
    timed(None, (), None)
    ns = t.take()
    assert regions.outside_ns >= 50_000_000
    assert 2_000_000 <= ns < 30_000_000
    assert t.record(1)["hooks"][0]["s"] < 0.03


def test_torchs_own_hooks_and_callable_objects_are_left_alone(timer):
    from torch.nn.utils import prune

    model = torch.nn.Linear(4, 2)
    prune.l1_unstructured(model, "weight", amount=0.5)  # prune finds its hook again by type
    hook = next(iter(model._forward_pre_hooks.values()))
    assert isinstance(hook, prune.BasePruningMethod)
    prune.remove(model, "weight")

    class Callable:
        def __call__(self, module, inputs):
            return None

    obj = Callable()
    model.register_forward_pre_hook(obj)
    assert next(iter(model._forward_pre_hooks.values())) is obj
    partial = functools.partial(lambda tag, module, inputs, output: None, "x")
    model.register_forward_hook(partial)
    model(torch.ones(1, 4))
    assert [r["function"] for r in timer.record(1)["hooks"]] == [
        "test_torchs_own_hooks_and_callable_objects_are_left_alone.<locals>.<lambda>"]


def test_owner_is_the_package_in_site_packages_else_the_program():
    assert owner("/venv/lib/python3.11/site-packages/wandb/integration/torch/wandb_torch.py:120") == "wandb"
    assert owner("/usr/lib/python3/dist-packages/mlflow/pytorch/__init__.py") == "mlflow"
    assert owner("train.py:12") == "program" and owner(None) == "program"
    assert owner(sys.modules[__name__].__file__) == "program"


def _facts_with_hooks(hk_share: float, owner_name: str = "program"):
    step = make_step(data=0.01, fwd=0.45, bwd=0.47, opt=0.05, mean=0.06)
    facts = make_facts(step, make_host(cores=2), make_loader(nw=0))
    steps = [{"t0": 0, "t1": 60_000_000, "hk": int(hk_share * 60_000_000)} for _ in range(20)]
    rec = {"k": "hooks", "t": 1, "hooks": [
        {"phase": "backward", "function": "watch.<locals>.gradient_hook", "defined": "train.py:70",
         "registered": "train.py:80 main", "owner": owner_name, "calls": 120, "s": 0.5},
        {"phase": "forward", "function": "watch.<locals>.parameter_hook", "defined": "train.py:63",
         "registered": "train.py:80 main", "owner": owner_name, "calls": 20, "s": 0.5}]}
    facts.hooks = _hooks(rec, steps, step)
    return facts


def test_hooks_holding_the_step_are_the_verdict_with_the_fix_and_its_estimate():
    facts = _facts_with_hooks(0.78)
    assert facts.hooks["share_of_step"] == pytest.approx(0.78)
    assert facts.hooks["by_phase"] == pytest.approx({"backward": 0.39, "forward": 0.39})
    verdict, findings = diagnose(facts)
    assert verdict == "host_bound"
    f = findings[0]
    assert f["evidence"]["kind"] == "model_hooks" and f["bound"] == pytest.approx(0.78) and f["severity"] == "critical"
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.78 * (1 - 1 / 50)), rel=0.01)
    assert "gradient_hook" in f["summary"] and "registered at train.py:80 main" in f["summary"]
    assert "if step % 50" in f["fix"]["code"]
    assert rules_work.model_hooks(_facts_with_hooks(0.1)) is None  # cheap hooks: nothing to say
    assert _hooks(None, [{"t0": 0, "t1": 10, "hk": 0}], make_step()) is None


def test_wandb_watch_hooks_get_the_trackers_own_setting():
    f = rules_work.model_hooks(_facts_with_hooks(0.5, "wandb"))
    assert f["evidence"]["owner"] == "wandb" and f["severity"] == "critical"
    assert "log_freq=1000" in f["fix"]["code"] and "wandb.watch" in f["fix"]["text"]


def test_tensorflow_imported_by_tensorboard_does_not_take_a_torch_run():
    from whyidle.analysis.run import _proc_record

    torch_proc = {"k": "proc", "t": 1, "framework": "torch"}
    tf_proc = {"k": "proc", "t": 2, "framework": "tensorflow"}
    steps = [{"k": "step", "t": 3, "by": "optimizer"}]
    assert _proc_record([torch_proc, tf_proc] + steps) is torch_proc
    assert _proc_record([torch_proc, tf_proc], [{"by": "loader"}]) is torch_proc  # the step table's rows
    assert _proc_record([torch_proc, tf_proc, {"k": "step", "t": 3, "by": "keras"}]) is tf_proc  # Keras trains
    assert _proc_record([torch_proc, tf_proc]) is tf_proc  # no steps: the order decides, as before


def test_debug_switches_left_on_are_a_warning():
    """Anomaly detection, or CUDA_LAUNCH_BLOCKING on a CUDA run, read at the device audit."""
    facts = make_facts(make_step(), make_host())
    assert rules_work.debug_mode(facts) is None
    facts.devices = dict(facts.devices or {}, anomaly_detection=True, launch_blocking=True, params={"cpu": 10})
    f = rules_work.debug_mode(facts)
    assert f["severity"] == "warning" and f["est_speedup"] is None and f["bound"] is None
    assert f["evidence"]["switches"] == ["anomaly detection"]  # launch blocking matters on CUDA only
    assert "set_detect_anomaly(False)" in f["fix"]["code"]
    facts.devices["params"] = {"cuda": 10}
    assert rules_work.debug_mode(facts)["evidence"]["switches"] == ["anomaly detection", "CUDA_LAUNCH_BLOCKING=1"]
    assert diagnose(facts)[0] != "debug_mode"  # no measured share: never the verdict
