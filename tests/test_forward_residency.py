"""Short CPU steps of a small model keep whyidle's ``Module.__call__`` wrapper in over the lite steps
(assigning ``Module.__call__`` around every full step slows the steps near it by ~0.4 ms); a deep
model's lite steps get PyTorch's own ``__call__`` back (passing its calls through would slow
every step). ``patches.assign`` skips assigning a value the owner holds already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

from whyidle.instrument import patches
from whyidle.instrument.torch import FORWARD_PASS_NS, FORWARD_SWITCH_NS, TorchInstrument

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def residency(calls_per_step: float, stride: int, step_s: float) -> bool:
    fake = types.SimpleNamespace(calls_per_step=calls_per_step, stride=stride, step_s=step_s)
    TorchInstrument._forward_residency(fake)
    return fake.fwd_resident


def test_residency_rule():
    assert residency(6, 26, 0.0007)  # the 2ms benchmark's MLP: 6 calls, 2.4 µs of a 0.7 ms step
    assert not residency(194, 4, 0.005)  # the deep case: 78 µs of a 5 ms step would slow every step
    assert not residency(3, 64, 0.0002)  # a tiny model's 0.2 ms steps: 1.2 µs is 0.6 % of each
    assert not residency(6, 26, 0.0)  # step time not known yet
    # the stride's lite steps' pass-through against the two switches around a full step
    calls = 2 * FORWARD_SWITCH_NS / FORWARD_PASS_NS / 63
    assert residency(calls * 0.9, 64, 1.0) and not residency(calls * 1.1, 64, 1.0)


def test_assign_skips_a_value_the_owner_holds():
    calls = []

    class Meta(type):
        def __setattr__(cls, name, value):
            calls.append(name)
            super().__setattr__(name, value)

    class Owner(metaclass=Meta):
        def f(self):
            return 1

    def g(self):
        return 2

    original = Owner.__dict__["f"]
    try:
        patches.assign(Owner, "f", g)
        patches.assign(Owner, "f", g)  # held already: no setattr
        assert calls == ["f"] and Owner().f() == 2
        patches.assign(Owner, "f", original)
        assert calls == ["f", "f"] and Owner().f() == 1
    finally:
        patches.restore()
    assert Owner().f() == 1


#: A short-step loop of ``argv[1]`` (``mlp`` or ``deep``) under the agent; prints which
#: ``Module.__call__`` its lite steps ran with.
PROGRAM = textwrap.dedent('''
    import json, sys
    import torch
    import whyidle.instrument.torch as wt
    torch.set_num_threads(1)
    if sys.argv[1] == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    else:
        model = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(128)], torch.nn.Linear(8, 2))  # cheap calls
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256) if sys.argv[1] == "mlp" else torch.randn(16, 8)
    y = torch.randint(0, 2, (len(x),))
    lite_calls = set()
    for i in range(300):
        inst = wt._INSTANCE
        if i > 200 and not inst.full:
            lite_calls.add(torch.nn.Module.__dict__["__call__"].__module__)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    inst = wt._INSTANCE
    print(json.dumps({"resident": inst.fwd_resident, "calls": inst.calls_per_step, "stride": inst.stride,
                      "lite_calls": sorted(lite_calls)}))
''')


def run_loop(tmp_path, kind: str) -> dict:
    run_dir = tmp_path / kind
    run_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "whyidle", "run", "bootstrap") + os.pathsep + SRC,
               WHYIDLE_RUN_DIR=str(run_dir), WHYIDLE_STACK_HZ="0")
    env.pop("WHYIDLE_READER", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM, kind], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_small_model_keeps_the_wrapper_deep_model_gets_pytorchs_back(tmp_path):
    mlp = run_loop(tmp_path, "mlp")
    assert 2 <= mlp["calls"] <= 4 and mlp["stride"] > 1  # 3 module calls per step
    assert mlp["resident"] and mlp["lite_calls"] == ["whyidle.instrument.forward"]
    deep = run_loop(tmp_path, "deep")
    assert 60 <= deep["calls"] <= 140 and deep["stride"] > 1
    assert not deep["resident"] and deep["lite_calls"] == ["torch.nn.modules.module"]
