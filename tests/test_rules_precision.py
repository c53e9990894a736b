"""``emulated_precision`` (whyidle.diagnose.rules_precision) on plain facts, and the agent's
measurement it reads (whyidle.instrument.torch.lowp_matmul_slowdown)."""

from __future__ import annotations

import sys

import pytest
from test_diagnose import assert_contract  # the one report-contract check
from test_rules_work import fp32_audit, make_facts, make_step

from whyidle.diagnose.rules_precision import emulated_precision


def cpu_audit(dtype="bfloat16", slowdown=6.0, native=False, share=1.0):
    return {"params": {"cpu": 400_000}, "param_dtypes": {"float32": 400_000}, "autocast": False,
            "autocast_dtypes": {"cpu": dtype}, "autocast_share": share, "autocast_site": "train.py:41 main",
            "cpu_matmul": {"dtype": dtype, "n": 32, "float32_s": 2e-6, "lowp_s": 2e-6 * slowdown,
                           "slowdown": slowdown, "native": native}}


def cpu_facts(devices, api=None, step=None):
    facts = make_facts(kind="cpu", devices=devices, step=step or make_step(fwd=0.3, bwd=0.6, opt=0.05, data=0.0))
    return facts.replace(api=api) if api else facts


def test_cpu_bf16_without_native_support_is_critical_with_the_float32_fix():
    f = emulated_precision(cpu_facts(cpu_audit(slowdown=6.0)))
    assert_contract(f)
    assert f["id"] == "emulated_precision" and f["severity"] == "critical"
    # forward + backward 0.9 slowed 6×: float32 removes 0.9 × (1 − 1/6) = 0.75 of the step → 4×
    assert f["bound"] == pytest.approx(0.75, abs=1e-3)
    assert f["est_speedup"] == pytest.approx(4.0, abs=1e-2)
    code = f["fix"]["code"]
    assert "native = torch.ops.mkldnn._is_mkldnn_bf16_supported()" in code
    assert 'torch.autocast("cpu", dtype=torch.bfloat16, enabled=native):   # train.py:41 main' in code
    assert "AVX512-BF16" in f["summary"] and "6.0×" in f["summary"] and "train.py:41" in f["summary"]


def test_cpu_float16_names_its_own_units():
    f = emulated_precision(cpu_facts(cpu_audit(dtype="float16", slowdown=10.0)))
    assert "AVX512-FP16" in f["summary"] and "_is_mkldnn_fp16_supported" in f["fix"]["code"]


def test_only_the_forward_under_autocast_is_charged():
    # a small head under autocast: 10 % of the forward, slowed 6×: 0.9 × 0.1 × 5/6 = 0.075 of the step
    assert emulated_precision(cpu_facts(cpu_audit(share=0.1))) is None
    half = emulated_precision(cpu_facts(cpu_audit(share=0.5)))
    assert half["bound"] == pytest.approx(0.375, abs=1e-3) and "50% of the forward" in half["summary"]
    # an agent without the share (older run directories) charges the whole forward
    assert emulated_precision(cpu_facts({**cpu_audit(), "autocast_share": None}))["bound"] == pytest.approx(0.75)


def test_cpu_with_native_bf16_or_a_small_share_is_silent():
    assert emulated_precision(cpu_facts(cpu_audit(slowdown=1.2, native=True))) is None
    # oneDNN reports native bfloat16 while the 32×32 probe is slow (an AVX512-BF16 EPYC: 6×, its
    # bfloat16 CNN 1.7× faster than float32): the probe is no evidence there
    assert emulated_precision(cpu_facts(cpu_audit(slowdown=6.4, native=True))) is None
    # slowed 3×, but forward + backward only 0.2 of the step: 0.2 × 2/3 = 0.13 < HOST_SHARE_WARN
    assert emulated_precision(cpu_facts(cpu_audit(slowdown=3.0), step=make_step(fwd=0.1, bwd=0.1, data=0.7))) is None
    # autocast off, or the measurement missing (older agent), or a model on the GPU
    assert emulated_precision(cpu_facts({**cpu_audit(), "autocast_dtypes": {}})) is None
    assert emulated_precision(cpu_facts({**cpu_audit(), "cpu_matmul": None})) is None
    assert emulated_precision(cpu_facts({**cpu_audit(), "params": {"cuda": 1}})) is None


@pytest.mark.parametrize("api, config, code", [
    ("lightning", {"precision": "bf16-mixed"}, 'precision="bf16-mixed" if native else "32-true"'),
    ("hf_trainer", {"bf16": True}, "bf16=native"),
    ("accelerate", {"mixed_precision": "bf16"}, 'mixed_precision="bf16" if native else "no"'),
])
def test_cpu_fix_in_the_framework_api(api, config, code):
    f = emulated_precision(cpu_facts(cpu_audit(), api={"name": api, "config": config}))
    assert code in f["fix"]["code"]


def test_cuda_bf16_before_ampere_advises_float16_with_a_gradscaler():
    audit = {**fp32_audit(), "autocast": True, "autocast_dtypes": {"cuda": "bfloat16"}}
    f = emulated_precision(make_facts("7.5", devices=audit))
    assert_contract(f)
    assert f["severity"] == "warning" and f["evidence"]["compute_capability"] == "7.5"
    # forward + backward 0.8, the T4's conservative float16 factor (capability table): Amdahl
    assert f["est_speedup"] > 1.1 and "GradScaler" in f["fix"]["code"] and "T4" in f["summary"]
    pascal = emulated_precision(make_facts("6.1", devices=audit))
    assert pascal["severity"] == "info" and pascal["est_speedup"] is None
    assert emulated_precision(make_facts("8.0", devices=audit)) is None  # bfloat16 tensor cores
    assert emulated_precision(make_facts("7.5", devices={**audit, "autocast_dtypes": {"cuda": "float16"}})) is None


def test_the_agent_measures_the_cpu_autocast_dtype_against_float32():
    torch = pytest.importorskip("torch")
    from whyidle.instrument.torch import lowp_matmul_slowdown

    state = torch.random.get_rng_state()
    got = lowp_matmul_slowdown(torch, "bfloat16")
    assert torch.equal(state, torch.random.get_rng_state())  # the program's random stream untouched
    assert got["dtype"] == "bfloat16" and got["n"] == 32 and got["float32_s"] > 0 and got["lowp_s"] > 0
    assert got["slowdown"] == pytest.approx(got["lowp_s"] / got["float32_s"])
    assert got["native"] in (True, False, None)


AUTOCAST_SCRIPT = '''
import sys, torch, torch.nn as nn, torch.nn.functional as F
mode = sys.argv[1]
torch.manual_seed(0)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.head = nn.Linear(256, 4)

    def forward(self, x):
        if mode == "head":  # only the small head under autocast
            h = self.body(x)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.head(h).float()
        return self.head(self.body(x))

net = Net()
if mode == "decorated":  # autocast turned on inside the root's forward (as Accelerate's wrapper does)
    net.forward = torch.autocast("cpu", dtype=torch.bfloat16)(net.forward)
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
for _ in range(8):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "block"):
        loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
'''


@pytest.mark.slow
@pytest.mark.timing  # a measured share of real runs: beside other tests a head's share swings past 0.8
@pytest.mark.parametrize("mode", ["block", "decorated", "head", "off"])
def test_the_audit_times_the_forward_under_cpu_autocast(tmp_path, mode):
    """The device audit's ``autocast_share``: the with-block around the model and a forward that
    turns autocast on inside itself cover (nearly) all of the forward; a head alone, part of it."""
    import json
    import os

    from conftest import observe

    script = tmp_path / "train.py"
    script.write_text(AUTOCAST_SCRIPT)
    proc, report, run_dir = observe(tmp_path, [sys.executable, str(script), mode], name=mode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    audits = [json.loads(line) for name in os.listdir(run_dir) if name.startswith("proc-")
              for line in open(os.path.join(run_dir, name)) if '"k":"devices"' in line]
    assert len(audits) == 3
    last = audits[-1]
    if mode == "off":
        assert last["autocast_dtypes"] == {} and last["cpu_matmul"] is None and last["autocast_share"] == 0
        return
    assert last["autocast_dtypes"] == {"cpu": "bfloat16"} and last["cpu_matmul"]["dtype"] == "bfloat16"
    assert "train.py" in last["autocast_site"]
    if mode == "head":
        assert last["autocast_share"] < 0.8
    else:
        assert last["autocast_share"] > 0.8
