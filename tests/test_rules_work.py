"""Work-size rules (whyidle.diagnose.rules_work) and the GPU-aware ``small_batch``, on plain fact
dicts shaped like :func:`whyidle.analysis.run.analyze`'s output."""

from __future__ import annotations

import pytest
from test_diagnose import assert_contract  # the one report-contract check

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import rules_batch
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules_work import no_mixed_precision, small_workload

GB = 10**9
NAMES = {"6.1": "NVIDIA GeForce GTX 1070", "7.0": "Tesla V100-SXM2-16GB", "7.5": "Tesla T4",
         "8.0": "NVIDIA A100-SXM4-80GB", "8.6": "NVIDIA GeForce RTX 3090", "8.9": "NVIDIA L4",
         "9.0": "NVIDIA H200"}




def make_step(data=0.05, fwd=0.35, bwd=0.45, opt=0.1, mean=0.1, p50=None, batch=64.0):
    other = max(0.0, 1.0 - (data + fwd + bwd + opt))
    return {"steps": 20, "batch_size": batch, "samples_per_s": batch / mean if batch else None,
            "step_time_s": {"p50": p50 if p50 is not None else mean, "p90": mean, "mean": mean},
            "shares": {"data_wait": data, "forward": fwd, "backward": bwd, "optimizer": opt, "eval": 0.0,
                       "other_host": other}}


def make_facts(cc="9.0", kind="cuda", step=None, devices=None, gpu=None, gpu_idle=None, framework="torch",
               name=None):
    device = {"kind": kind, "name": name or NAMES.get(cc, "NVIDIA GPU") if kind == "cuda" else "Some CPU",
              "compute_capability": cc if kind == "cuda" else None, "memory_total_bytes": 141 * GB, "count": 1}
    return RunFacts(framework=framework, device=device, step=step if step is not None else make_step(),
                    devices=devices, gpu=gpu, gpu_idle=gpu_idle)


def fp32_audit(autocast=False, tf32=False, dtypes=None, params=None):
    return {"params": params if params is not None else {"cuda": 1_200_000},
            "param_dtypes": dtypes if dtypes is not None else {"float32": 1_200_000},
            "autocast": autocast, "matmul_tf32": tf32}


# -- no_mixed_precision ------------------------------------------------------------------------

def test_mixed_precision_fires_on_hopper_with_bf16_and_tf32():
    f = no_mixed_precision(make_facts("9.0", devices=fp32_audit(tf32=False)))
    assert_contract(f)
    assert f["id"] == "no_mixed_precision" and f["severity"] == "warning"
    # c = 0.35 + 0.45 = 0.8, m = 2.0 (H100/H200 row): 1 / (0.2 + 0.4) = 1.667
    assert f["est_speedup"] == pytest.approx(1 / (0.2 + 0.8 / 2.0), abs=1e-3)
    ev = f["evidence"]
    assert ev["architecture"] == "Hopper" and ev["compute_capability"] == "9.0"
    assert ev["compute_share"] == pytest.approx(0.8) and ev["math_speedup"] == 2.0
    assert ev["recommended_dtype"] == "bfloat16" and ev["fp32_param_share"] == 1.0
    assert "fp8" in ev["tensor_core_dtypes"]
    code = f["fix"]["code"]
    assert 'torch.autocast("cuda", dtype=torch.bfloat16)' in code and "GradScaler(" not in code
    assert "torch.backends.cuda.matmul.allow_tf32 = True" in code
    assert 'set_float32_matmul_precision("high")' in f["fix"]["text"]
    assert "80%" in f["summary"] and "H200" in f["summary"] and "1.67×" in f["summary"]


def test_mixed_precision_with_tf32_already_on_uses_the_smaller_factor():
    f = no_mixed_precision(make_facts("8.0", devices=fp32_audit(tf32=True)))
    assert f["evidence"]["math_speedup"] == 1.5
    assert f["est_speedup"] == pytest.approx(1 / (0.2 + 0.8 / 1.5), abs=1e-3)
    assert "allow_tf32" not in f["fix"]["code"]  # already on: not suggested again


def test_mixed_precision_volta_uses_float16_and_gradscaler():
    f = no_mixed_precision(make_facts("7.0", devices=fp32_audit(tf32=None)))
    assert_contract(f)
    assert f["severity"] == "warning"
    code = f["fix"]["code"]
    assert 'torch.autocast("cuda", dtype=torch.float16)' in code
    assert 'torch.amp.GradScaler("cuda")' in code
    assert "allow_tf32" not in code  # no TF32 before 8.0
    assert f["evidence"]["recommended_dtype"] == "float16" and f["evidence"]["architecture"] == "Volta"
    assert f["est_speedup"] == pytest.approx(1 / (0.2 + 0.8 / 2.0), abs=1e-3)


def test_mixed_precision_turing_t4_float16():
    f = no_mixed_precision(make_facts("7.5", devices=fp32_audit()))
    assert f["evidence"]["recommended_dtype"] == "float16"
    assert "GradScaler" in f["fix"]["code"]


def test_mixed_precision_geforce_ampere_factor():
    f = no_mixed_precision(make_facts("8.6", devices=fp32_audit()))
    assert f["evidence"]["math_speedup"] == 1.5
    assert f["est_speedup"] == pytest.approx(1 / (0.2 + 0.8 / 1.5), abs=1e-3)


def test_mixed_precision_pascal_is_info_that_says_it_will_not_help():
    f = no_mixed_precision(make_facts("6.1", devices=fp32_audit(tf32=None)))
    assert_contract(f)
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert f["evidence"]["tensor_cores"] is False
    assert "no tensor cores" in f["summary"] and "will not help much" in f["summary"]
    assert "GTX 1070" in f["summary"] and "Pascal" in f["summary"]
    assert f["fix"]["code"] is None and "Stay in float32" in f["fix"]["text"] and "1/64" in f["fix"]["text"]


def test_mixed_precision_gtx_1660_has_no_tensor_cores():
    f = no_mixed_precision(make_facts("7.5", devices=fp32_audit(), name="NVIDIA GeForce GTX 1660 Ti"))
    assert f["severity"] == "info" and f["est_speedup"] is None


def test_mixed_precision_silent_with_autocast_on_or_unknown():
    assert no_mixed_precision(make_facts("9.0", devices=fp32_audit(autocast=True))) is None
    assert no_mixed_precision(make_facts("9.0", devices=fp32_audit(autocast=None))) is None


@pytest.mark.parametrize("drop", ["param_dtypes", "autocast"])
def test_mixed_precision_silent_when_audit_keys_missing(drop):
    audit = fp32_audit()
    del audit[drop]
    assert no_mixed_precision(make_facts("9.0", devices=audit)) is None


def test_mixed_precision_missing_tf32_is_fine():
    audit = fp32_audit()
    del audit["matmul_tf32"]
    f = no_mixed_precision(make_facts("9.0", devices=audit))
    assert f is not None and "allow_tf32" not in f["fix"]["code"]  # unknown: not claimed to be off


def test_mixed_precision_silent_without_facts():
    assert no_mixed_precision(make_facts("9.0", devices=None)) is None
    assert no_mixed_precision(RunFacts(**{})) is None
    facts = make_facts("9.0", devices=fp32_audit())
    facts.step = None
    assert no_mixed_precision(facts) is None
    assert no_mixed_precision(make_facts(None, devices=fp32_audit())) is None  # unknown compute capability
    assert no_mixed_precision(make_facts("13.0", devices=fp32_audit())) is None  # newer than the table


def test_mixed_precision_silent_on_cpu():
    assert no_mixed_precision(make_facts(kind="cpu", devices=fp32_audit(params={"cpu": 1000}))) is None


def test_mixed_precision_silent_when_params_not_on_gpu():
    assert no_mixed_precision(make_facts("9.0", devices=fp32_audit(params={"cpu": 1_200_000}))) is None


def test_mixed_precision_silent_for_half_precision_models():
    half = fp32_audit(dtypes={"bfloat16": 1_000_000, "float32": 200_000})
    assert no_mixed_precision(make_facts("9.0", devices=half)) is None
    assert no_mixed_precision(make_facts("9.0", devices=fp32_audit(dtypes={}))) is None
    # a few float16 buffers do not make a model half precision
    mostly = fp32_audit(dtypes={"torch.float32": 950, "float16": 50})
    assert no_mixed_precision(make_facts("9.0", devices=mostly)) is not None


def test_mixed_precision_silent_when_compute_is_small():
    step = make_step(data=0.6, fwd=0.15, bwd=0.15, opt=0.05)  # input-bound: faster math gains nothing
    assert no_mixed_precision(make_facts("9.0", step=step, devices=fp32_audit())) is None


def test_mixed_precision_capped_by_gpu_starvation():
    # forward + backward 80 % of the step on the host, but the GPU had no work 55 % of the time
    facts = make_facts("9.0", devices=fp32_audit(), gpu_idle={"starved_share": 0.55, "starved_s": 1.0,
                                                                "idle_s_by_cause": {}, "steps": 20})
    assert no_mixed_precision(facts) is None
    facts.gpu_idle["starved_share"] = 0.3
    f = no_mixed_precision(facts)
    assert f["evidence"]["speedable_share"] == pytest.approx(0.7)
    assert f["est_speedup"] == pytest.approx(1 / (0.3 + 0.7 / 2.0), abs=1e-3)


def test_mixed_precision_keras_code():
    f = no_mixed_precision(make_facts("8.0", devices=fp32_audit(), framework="keras"))
    assert 'set_global_policy("mixed_bfloat16")' in f["fix"]["code"]
    f = no_mixed_precision(make_facts("7.0", devices=fp32_audit(), framework="keras"))
    assert 'set_global_policy("mixed_float16")' in f["fix"]["code"]


# -- small_workload ------------------------------------------------------------------------------

def idle(starved=0.02):
    return {"starved_share": starved, "starved_s": starved * 2.0,
            "idle_s_by_cause": {"data": 0.0, "sync": 0.0, "host": 0.0, "launch": 0.0, "other": 0.0}, "steps": 20}


def gpu(sm=None, used=2 * GB, total=141 * GB):
    return {"util_mean": 99.0, "sm_active_mean": sm, "sm_occupancy_mean": None, "tensor_active_mean": None,
            "memory_used_max_bytes": used, "memory_total_bytes": total}


def test_small_workload_from_sm_activity():
    f = small_workload(make_facts("9.0", gpu=gpu(sm=0.22), gpu_idle=idle(0.03)))
    assert_contract(f)
    assert f["id"] == "small_workload" and f["severity"] == "warning" and f["est_speedup"] is None
    assert f["evidence"]["basis"] == "sm_active" and f["evidence"]["sm_active_mean"] == 0.22
    assert "22%" in f["summary"] and "3%" in f["summary"] and "small for this GPU" in f["summary"]
    text = f["fix"]["text"]
    assert "Nothing to fix" in text and "batch size" in text and "MPS" in text and "MIG" in text
    assert "cheaper GPU" in text


def test_small_workload_no_mig_on_geforce():
    f = small_workload(make_facts("8.6", gpu=gpu(sm=0.3, total=24 * GB), gpu_idle=idle()))
    assert "MIG" not in f["fix"]["text"] and f["evidence"]["mig_capable"] is False


def test_small_workload_silent_when_sm_activity_is_high():
    # memory almost empty and short steps, but GPM says the SMs are busy: not small
    step = make_step(mean=0.01)
    assert small_workload(make_facts("9.0", step=step, gpu=gpu(sm=0.7), gpu_idle=idle())) is None


def test_small_workload_from_memory_and_step_time_without_gpm():
    step = make_step(mean=0.012, p50=0.010)
    f = small_workload(make_facts("8.0", step=step, gpu=gpu(sm=None, used=3 * GB, total=80 * GB), gpu_idle=idle()))
    assert_contract(f)
    assert f["severity"] == "info" and f["evidence"]["basis"] == "memory_and_step_time"
    assert f["evidence"]["memory_used_share"] == pytest.approx(3 / 80, abs=1e-4)
    assert "10.0 ms" in f["summary"] and "4%" in f["summary"]


def test_small_workload_silent_without_gpm_for_long_steps_or_full_memory():
    long_steps = make_step(mean=0.3)
    assert small_workload(make_facts("8.0", step=long_steps, gpu=gpu(used=3 * GB, total=80 * GB),
                                     gpu_idle=idle())) is None
    short = make_step(mean=0.01)
    assert small_workload(make_facts("8.0", step=short, gpu=gpu(used=60 * GB, total=80 * GB),
                                     gpu_idle=idle())) is None
    assert small_workload(make_facts("8.0", step=short, gpu=gpu(used=None), gpu_idle=idle())) is None


def test_small_workload_silent_when_the_gpu_starves():
    assert small_workload(make_facts("9.0", gpu=gpu(sm=0.2), gpu_idle=idle(0.4))) is None
    assert small_workload(make_facts("9.0", gpu=gpu(sm=0.2), gpu_idle=idle(T.SMALL_WORK_MAX_STARVED))) is None


def test_small_workload_silent_on_missing_facts_and_cpu():
    assert small_workload(make_facts("9.0", gpu=gpu(sm=0.2), gpu_idle=None)) is None
    assert small_workload(make_facts("9.0", gpu=gpu(sm=0.2), gpu_idle={"steps": 3})) is None
    assert small_workload(make_facts("9.0", gpu=None, gpu_idle=idle())) is None
    assert small_workload(make_facts(kind="cpu", gpu=None, gpu_idle=idle())) is None
    assert small_workload(RunFacts(**{})) is None


# -- small_batch on a GPU ---------------------------------------------------------------------------

def batch_facts(batch=4.0, used=4 * GB, total=80 * GB, kind="cuda"):
    step = make_step(data=0.0, fwd=0.3, bwd=0.3, opt=0.2, mean=0.01, batch=batch)
    return make_facts("8.0", kind=kind, step=step, gpu=gpu(used=used, total=total) if kind == "cuda" else None)


def test_small_batch_gpu_headroom_suggests_target():
    f = rules_batch.small_batch(batch_facts(batch=4.0, used=4 * GB, total=80 * GB))
    ev = f["evidence"]
    # min(32 / 4, 0.8 × 80 / 4 = 16) = 8 → 32
    assert ev["suggested_batch_size"] == 32 and ev["target_batch_size"] == 32
    assert ev["memory_used_bytes"] == 4 * GB and ev["memory_total_bytes"] == 80 * GB
    assert ev["memory_used_share"] == pytest.approx(0.05)
    assert "4.0 of 80.0 GB" in f["summary"] and "room for batches of 32" in f["summary"]


def test_small_batch_gpu_headroom_bounds_target():
    # 0.8 × 80 / 30 = 2.13 → 4 × 2.13 = 8.5 → 8 (power of two, rounded down)
    f = rules_batch.small_batch(batch_facts(batch=4.0, used=30 * GB, total=80 * GB))
    assert f["evidence"]["suggested_batch_size"] == 8 and f["evidence"]["target_batch_size"] == 8
    assert "batch_size=8" in f["fix"]["code"] and "batches of 8 " in f["summary"]
    k = 8 / 4
    fixed = 0.2 + 0.2
    assert f["est_speedup"] == pytest.approx(k / (fixed + (1 - fixed) * k), abs=1e-3)


def test_small_batch_gpu_memory_full():
    f = rules_batch.small_batch(batch_facts(batch=4.0, used=70 * GB, total=80 * GB))
    assert f["evidence"]["suggested_batch_size"] is None
    assert f["evidence"]["target_batch_size"] == T.SMALL_BATCH_TARGET
    assert "little room to grow" in f["summary"] and "nearly full" in f["fix"]["text"]


def test_small_batch_cpu_unchanged():
    f = rules_batch.small_batch(batch_facts(batch=4.0, kind="cpu"))
    assert "suggested_batch_size" not in f["evidence"] and "GB" not in f["summary"]
    assert f["evidence"]["target_batch_size"] == T.SMALL_BATCH_TARGET


def test_small_batch_gpu_without_memory_numbers():
    facts = batch_facts(batch=4.0)
    facts.gpu["memory_used_max_bytes"] = None
    f = rules_batch.small_batch(facts)
    assert "suggested_batch_size" not in f["evidence"]
    assert f["evidence"]["target_batch_size"] == T.SMALL_BATCH_TARGET
