"""Module calls of the first steps (instrument/module_calls.py): the forward's preamble before its
first layer, and the ``preprocess_in_forward`` finding it feeds (diagnose/rules_work.py)."""

from __future__ import annotations

import sys
import time

import pytest
import torch
from torch import nn

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import rules_work
from whyidle.instrument.module_calls import ModuleCalls


class Tokenizing(nn.Module):
    """Preprocessing inside forward (a stand-in: 20 ms of host work) before its first layer."""

    def __init__(self, host_s: float = 0.0):
        super().__init__()
        self.host_s = host_s
        self.embed = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        if self.host_s:
            time.sleep(self.host_s)
        return self.head(torch.relu(self.embed(x)))


def observe_steps(model: nn.Module, steps: int = 3) -> dict:
    calls = ModuleCalls(lambda frame: (f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", None))
    pre = nn.modules.module.register_module_forward_pre_hook(lambda m, args: calls.pre(m, args, sys._getframe(1)))
    post = nn.modules.module.register_module_forward_hook(lambda m, args, out: calls.post())
    try:
        x = torch.randn(4, 8)
        for _ in range(steps):
            t0 = time.monotonic_ns()
            model(x).sum().backward()
            calls.end_step(time.monotonic_ns() - t0)
    finally:
        pre.remove()
        post.remove()
    return calls.record()


def test_preamble_is_the_forward_before_its_first_layer():
    rec = observe_steps(Tokenizing(host_s=0.02))
    assert rec["preamble_s"] == pytest.approx(0.02, abs=0.015)
    assert rec["root"][0] == "Tokenizing"
    assert rec["modules"] == []  # no module repeats
    plain = observe_steps(Tokenizing())
    assert plain["preamble_s"] < 0.005  # the first layer is called at once
    assert plain["root"][0] == "Tokenizing"


def facts(share: float, workers: int = 2, cores: int = 2, framework: str = "torch") -> RunFacts:
    p50 = 0.1
    return RunFacts(framework=framework, step={"step_time_s": {"p50": p50}, "shares": {}},
                    loader={"num_workers": workers}, host={"cores": cores},
                    preamble={"cls": "VisionLanguageModel", "site": "train.py:90 main", "s_per_step": share * p50,
                              "share_of_step": share,
                              "sites": [{"function": "train.py encode", "site": "train.py:40 encode", "seconds": 1.0,
                                         "leaf": "re/__init__.py:1 sub"}]})


def test_preprocess_in_forward_finding():
    f = rules_work.preprocess_in_forward(facts(0.5))
    assert f["id"] == "host_bound" and f["severity"] == "critical"
    assert f["evidence"]["kind"] == "preprocess_in_forward" and f["evidence"]["module"] == "VisionLanguageModel"
    assert f["bound"] == 0.5 and f["est_speedup"] == 2.0
    assert "VisionLanguageModel.forward" in f["summary"] and "train.py encode" in f["summary"]
    assert "collate_fn=Preprocess()" in f["fix"]["code"]
    compile(f["fix"]["code"].replace("...", "32"), "fix", "exec")  # the fix parses
    assert rules_work.preprocess_in_forward(facts(0.25))["severity"] == "warning"
    assert rules_work.preprocess_in_forward(facts(0.1)) is None  # under HOST_SHARE_WARN
    # one core, no workers: moving the work would keep it serial, so no estimate
    assert rules_work.preprocess_in_forward(facts(0.5, workers=0, cores=1))["est_speedup"] is None
    assert "data_collator" in rules_work.preprocess_in_forward(facts(0.5, framework="transformers"))["fix"]["text"]


def test_a_wrappers_own_work_is_not_the_preamble():
    class DataParallel(nn.Module):  # stands in for DDP / FSDP: its own work, then the model
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, x):
            time.sleep(0.02)  # gradient-sync set-up / parameter all-gather
            return self.module(x)

    rec = observe_steps(DataParallel(Tokenizing()))
    assert rec["preamble_s"] < 0.005 and rec["root"][0] == "Tokenizing"
    rec = observe_steps(DataParallel(Tokenizing(host_s=0.02)))
    assert rec["preamble_s"] == pytest.approx(0.02, abs=0.015)


def test_ipc_share_is_the_data_wait_spent_receiving_batches():
    from whyidle.analysis import stacks

    recs = [{"k": "stacks", "t": 5, "hz": 100, "sites": [
        ["data", None, "multiprocessing/reduction.py:157 recvfds", 6, 60.0],
        ["data", None, "torch/_utils.py:198 _rebuild_tensor", 2, 20.0],
        ["data", None, "selectors.py:415 select", 2, 20.0],   # waiting for a worker
        ["forward", None, "torch/nn/modules/conv.py:1 forward", 5, 50.0]]}]
    assert stacks.leaf_share(recs, "data", stacks.IPC_LEAVES) == pytest.approx(0.8)
    assert stacks.leaf_share(recs, "backward", stacks.IPC_LEAVES) is None


def test_count_tensors_walks_nested_targets_and_stays_bounded():
    from whyidle.instrument.torch import count_tensors

    targets = [{"boxes": torch.zeros(5, 4), "labels": torch.zeros(5, dtype=torch.int64)} for _ in range(8)]
    assert count_tensors((torch.zeros(8, 3, 4, 4, dtype=torch.uint8), targets)) == (17, 8 * 48 + 8 * 80 + 8 * 40)
    assert count_tensors(list(range(1_000_000)), limit=100) == (0, 0)  # a huge list is not walked whole


def test_a_loss_called_per_sample_is_recorded_and_folding_it_is_the_fix():
    model, crit = nn.Linear(8, 3), nn.CrossEntropyLoss()
    calls = ModuleCalls(lambda frame: (f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", None))
    pre = nn.modules.module.register_module_forward_pre_hook(lambda m, args: calls.pre(m, args, sys._getframe(1)))
    post = nn.modules.module.register_module_forward_hook(lambda m, args, out: calls.post())
    try:
        x, y = torch.randn(6, 8), torch.randint(0, 3, (6,))
        for _ in range(3):
            t0 = time.monotonic_ns()
            out = nn.functional.relu(model(x))
            torch.stack([crit(out[i:i + 1], y[i:i + 1]) for i in range(6)]).mean().backward()
            calls.end_step(time.monotonic_ns() - t0)
    finally:
        pre.remove()
        post.remove()
    (row,) = calls.record()["modules"]
    assert row[0] == "CrossEntropyLoss" and row[2] == 6 and row[4] == 1 and row[5] == 0  # no parameters
    # the rule: its calls, twice as much backward (at most the step's backward), and the loop's own
    # Python at that line
    site = row[1]
    f = rules_work.module_loop(RunFacts(
        framework="torch", step={"shares": {"forward": 0.3, "backward": 0.4, "other_host": 0.25}},
        module_loops=[{"cls": "CrossEntropyLoss", "site": site, "calls_per_step": 32, "forward_s_per_step": 0.003,
                       "share_of_step": 0.25, "batch": 27, "params": 0}],
        hotspots={"other": [{"site": site, "share": 0.2, "samples": 40}, {"site": "x.py:1 f", "share": 0.05,
                                                                         "samples": 40}]}))
    assert f["id"] == "host_bound" and f["evidence"]["kind"] == "module_loop"
    assert f["bound"] == pytest.approx(0.25 + 0.4 + 0.2)
    assert f["est_speedup"] == pytest.approx(1 / (1 - 0.85 * (1 - 1 / 32)), rel=1e-3)
    assert 'nn.CrossEntropyLoss(reduction="none")' in f["fix"]["code"] and "-100" in f["fix"]["code"]


def test_two_loss_loops_add_up_and_each_loss_keeps_its_own_arguments():
    site_ce, site_pair = "pairs.py:35 compute_loss", "pairs.py:41 compute_loss"
    f = rules_work.module_loop(RunFacts(
        framework="torch", step={"shares": {"forward": 0.3, "backward": 0.3, "other_host": 0.35}},
        module_loops=[{"cls": "MarginRankingLoss", "site": site_pair, "calls_per_step": 63,
                       "forward_s_per_step": 0.004, "share_of_step": 0.2, "batch": 1, "params": 0},
                      {"cls": "CrossEntropyLoss", "site": site_ce, "calls_per_step": 64,
                       "forward_s_per_step": 0.002, "share_of_step": 0.1, "batch": 1, "params": 0}],
        hotspots={"other": [{"site": site_pair, "share": 0.3, "samples": 50}]}))
    ev = f["evidence"]
    assert [lp["module"] for lp in ev["loops"]] == ["MarginRankingLoss", "CrossEntropyLoss"]
    assert f["bound"] == pytest.approx((0.2 + 0.2 + 0.3) + (0.1 + 0.1))
    assert "CrossEntropyLoss` 64 times at pairs.py:35" in f["summary"]
    code = f["fix"]["code"]
    assert "criterion(x1, x2, y)" in code and "-100" not in code  # its own signature; no ignore_index


def test_a_lazy_module_before_its_first_forward_counts_as_having_weights():
    import torch.nn as nn

    from whyidle.instrument.module_calls import _numel

    lazy = nn.Sequential(nn.LazyLinear(4), nn.ReLU())
    assert _numel(lazy) == 2  # weight and bias, uninitialized: no ValueError, the module has weights
    lazy(torch.randn(2, 3))
    assert _numel(lazy) == 3 * 4 + 4
    assert _numel(nn.ReLU()) == 0
