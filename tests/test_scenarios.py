"""Real training scripts under `whyidle run`, each staging one fault kind (tests/scenarios/).

Each test runs the faulty variant (and, where the kind has one, the fixed variant) unchanged under
``whyidle run`` and asserts the verdict and key evidence, and that the fixed variant is measurably
faster by whyidle's own samples/s. Ratios are asserted loosely (this machine is shared and noisy);
tests/scenarios/README.md has the measured values. The C-numbered cases stage the field cases of
../shared/cases.md; the scripts were written from those specs and live here, so they run whether
or not ../shared is present.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from conftest import SCENARIOS, finding, observe

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def scenario(tmp_path, script, *args, name=None, timeout=240):
    proc, report, _ = observe(tmp_path, [sys.executable, os.path.join(SCENARIOS, script), *args],
                              timeout=timeout, name=name or os.path.splitext(script)[0] + "-" + "-".join(args)[:40])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None
    return report


def sps(report) -> float:
    return report["metrics"]["samples_per_s"]


def ids(report) -> set[str]:
    return {f["id"] for f in report["findings"] if f["severity"] != "info"}


# -- the scenarios -----------------------------------------------------------------------

def test_main_process_loader_with_cpu_heavy_samples(tmp_path):
    faulty = scenario(tmp_path, "main_loader_cpu.py", "--variant", "faulty", "--steps", "30")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "loader_in_main_process"
    assert f["evidence"]["data_wait_share"] >= 0.5
    assert f["evidence"]["loader_cpu_busy_share"] >= 0.8  # the main process computes its batches
    assert f["evidence"]["suggested_num_workers"] >= 1
    assert f["evidence"]["focus"]["function"].endswith(("decode", "__getitem__", "augment"))
    assert f["evidence"]["est_speedup_if_removed"] == pytest.approx(1 / (1 - f["evidence"]["data_wait_share"]), rel=0.01)
    assert 1.0 < f["est_speedup"] <= f["evidence"]["est_speedup_if_removed"]
    # the workers' option is printed (first, or after the measured cheaper-sample fix when that gains more:
    # the numpy decode is the program's own per-sample code, which batching or caching removes)
    options = f["fix"]["options"]
    workers = next(o for o in options if "num_workers=" in (o["code"] or ""))
    assert 1.0 < workers["est_speedup"] <= f["est_speedup"] == options[0]["est_speedup"]

    # all the loading is CPU work on 2 cores: 2 workers take it off the training thread, but the
    # fixed run stays partly input-bound (about 40 % data wait; tests/scenarios/README.md)
    fixed = scenario(tmp_path, "main_loader_cpu.py", "--variant", "fixed", "--steps", "30")
    assert fixed["metrics"]["shares"]["data_wait"] < 0.75 * faulty["metrics"]["shares"]["data_wait"]
    assert sps(fixed) >= 1.3 * sps(faulty)


def test_loader_waiting_on_slow_storage(tmp_path):
    faulty = scenario(tmp_path, "slow_storage.py", "--variant", "faulty", "--steps", "30")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "storage"
    assert f["evidence"]["loader_cpu_busy_share"] < 0.5  # off-CPU, waiting on reads
    assert f["evidence"]["loader_read_bytes_per_sample"] >= 2048  # ~3 KB files are really read
    fixed = scenario(tmp_path, "slow_storage.py", "--variant", "fixed", "--steps", "30")
    assert fixed["metrics"]["shares"]["data_wait"] < faulty["metrics"]["shares"]["data_wait"] / 2
    assert sps(fixed) >= 1.5 * sps(faulty)


def test_compute_heavy_model_on_in_memory_data_is_device_bound(tmp_path):
    report = scenario(tmp_path, "compute_heavy.py", "--steps", "40")
    assert report["verdict"] == "device_bound"
    assert finding(report, "input_bound") is None
    assert finding(report, "host_bound") is None
    shares = report["metrics"]["shares"]
    assert shares["forward"] + shares["backward"] + shares["optimizer"] >= 0.8
    assert report["findings"][0]["id"] == "device_bound"


def test_python_logging_in_the_loop_is_host_bound_and_named(tmp_path):
    faulty = scenario(tmp_path, "logging_loop.py", "--variant", "faulty", "--steps", "25")
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    assert f["evidence"]["focus"]["function"] == "logging_loop.py log_metrics"
    assert f["evidence"]["kind"] == "logging"
    assert "log_metrics" in f["summary"] and "log_metrics" in f["fix"]["text"]
    fixed = scenario(tmp_path, "logging_loop.py", "--variant", "fixed", "--steps", "25")
    assert "host_bound" not in ids(fixed)
    assert sps(fixed) >= 1.5 * sps(faulty)


def test_batch_size_one_is_small_batch(tmp_path):
    faulty = scenario(tmp_path, "batch1.py", "--variant", "faulty", "--steps", "1500")
    assert faulty["verdict"] == "small_batch"
    f = finding(faulty, "small_batch")
    assert f["evidence"]["batch_size"] == 1
    assert f["est_speedup"] > 1.3
    fixed = scenario(tmp_path, "batch1.py", "--variant", "fixed", "--steps", "80")
    assert finding(fixed, "small_batch") is None
    assert sps(fixed) >= 1.8 * sps(faulty)  # measured 2.4–2.7×
    # the estimate (batch 32, from the model's layers timed at 1 and 32) within 2× of batch 64's
    # measured gain (issue 32: no single estimate off by more than 2×; before: 1.6× against 3.4×)
    assert f["evidence"]["basis"] == "layer_probe"
    measured = sps(fixed) / sps(faulty)
    assert measured / 2 <= f["est_speedup"] <= measured * 2


def test_busy_unrelated_processes_are_cpu_contention(tmp_path):
    burners = subprocess.Popen([sys.executable, os.path.join(SCENARIOS, "burn.py"), "2", "120"])
    try:
        time.sleep(1.0)
        report = scenario(tmp_path, "contention.py", name="contention")
    finally:
        burners.terminate()
        burners.wait(timeout=30)
    assert report["verdict"] == "cpu_contention"
    f = finding(report, "cpu_contention")
    assert f["evidence"]["cause"] == "other_processes"
    assert f["evidence"]["run_delay_share"] >= 0.1
    assert f["evidence"]["other_procs_cores"] >= 0.5
    assert any("burn.py" in p["command"] for p in f["evidence"]["top_other_processes"])


# -- field cases of ../shared/cases.md -----------------------------------------------------------

def test_c01_too_few_workers(tmp_path):
    faulty = scenario(tmp_path, "c01_too_few_workers.py", "--variant", "faulty", "--steps", "40")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "too_few_workers"
    assert f["evidence"]["data_wait_share"] >= 0.5
    assert f["evidence"]["suggested_num_workers"] >= 3  # the case's ⌈fetch / step⌉ is about 4
    fixed = scenario(tmp_path, "c01_too_few_workers.py", "--variant", "fixed", "--steps", "40")
    assert "input_bound" not in ids(fixed) or fixed["metrics"]["shares"]["data_wait"] < 0.2
    assert sps(fixed) >= 2 * sps(faulty)


def test_c07_tokenization_in_the_data_path(tmp_path):
    # ~0.45 s a step: 16 steps measure it (the fixed variant's ~0.09 s steps take 30)
    faulty = scenario(tmp_path, "c07_tokenize_on_the_fly.py", "--variant", "faulty", "--steps", "16")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    assert f["evidence"]["cause"] == "loader_in_main_process"
    assert f["evidence"]["loader_cpu_busy_share"] >= 0.8
    # the hot spot inside the data fetch is the tokenizer
    assert f["evidence"]["focus"]["function"].split()[-1] in ("encode", "_token_ids", "_wordpiece", "__getitem__")
    fixed = scenario(tmp_path, "c07_tokenize_on_the_fly.py", "--variant", "fixed", "--steps", "30")
    assert "input_bound" not in ids(fixed)
    assert sps(fixed) >= 1.7 * sps(faulty)  # measured 2.42–2.56× (tests/scenarios/README.md)


def test_c11_progress_bar_and_logging_every_step(tmp_path):
    faulty = scenario(tmp_path, "c11_progress_logging.py", "--variant", "faulty", "--steps", "310")
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    assert f["evidence"]["kind"] == "logging"
    assert f["evidence"]["other_host_share"] >= 0.5
    fixed = scenario(tmp_path, "c11_progress_logging.py", "--variant", "fixed", "--steps", "310")
    assert sps(fixed) >= 2 * sps(faulty)


def test_c12_python_loops_in_the_loss(tmp_path):
    faulty = scenario(tmp_path, "c12_python_loop_loss.py", "--variant", "faulty")
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    assert f["evidence"]["kind"] == "python_compute"
    assert "loss" in f["evidence"]["focus"]["function"]
    assert "vectorize" in f["fix"]["text"]
    fixed = scenario(tmp_path, "c12_python_loop_loss.py", "--variant", "fixed")
    # the loss loop is gone; the 1.6 ms step's own loop Python (~21 % other host, just above
    # HOST_SHARE_WARN, beside a ~22 % data wait: either can be the verdict) may stay, but is never
    # put on the loss again
    g = next((g for g in fixed["findings"] if g["id"] == "host_bound"), None)
    assert g is None or (g["bound"] <= f["bound"] / 3 and "loss" not in ((g["evidence"]["focus"] or {}).get("function") or ""))
    assert sps(fixed) >= 10 * sps(faulty)


def test_c18_thread_oversubscription(tmp_path):
    faulty = scenario(tmp_path, "c18_thread_oversubscription.py", "--variant", "faulty", "--steps", "30")
    assert faulty["verdict"] == "cpu_contention"
    f = finding(faulty, "cpu_contention")
    assert f["evidence"]["cause"] == "oversubscription"
    assert f["evidence"]["intra_op_threads"] == 8 and f["evidence"]["processes"] == 2
    assert "set_num_threads" in f["fix"]["code"]
    fixed = scenario(tmp_path, "c18_thread_oversubscription.py", "--variant", "fixed", "--steps", "30")
    assert sps(fixed) >= 1.3 * sps(faulty)  # measured 2.8–3.0× idle, 1.6× on a loaded machine


def test_image_decode_in_the_main_process_is_input_bound_first(tmp_path):
    """Issue 13: PIL decode + resize in __getitem__ with num_workers=0 holds ~88 % of the step on
    2 cores: input_bound is the verdict (it was DEVICE-BOUND), and the first option is the one
    measured to help here (2 workers with the model's threads stepped down: 1.49-1.71x; 2 workers
    beside 2 busy intra-op threads: 1.07-1.36x)."""
    report = scenario(tmp_path, "image_decode_main.py", "--steps", "40")
    assert report["verdict"] == "input_bound"
    f = finding(report, "input_bound")
    assert f["bound"] >= 0.6 and f["evidence"]["cause"] == "loader_in_main_process"
    first = f["fix"]["options"][0]
    assert "worker process" in first["text"] and first["est_speedup"] == f["est_speedup"] > 1.2
    if os.cpu_count() == 2:
        assert "torch.set_num_threads(1)" in first["code"]
    assert any("reduced size" in o["text"] for o in f["fix"]["options"][1:])


def _native_cpu_bf16() -> bool:
    """The CPU runs bfloat16 matmuls natively (its flags: AVX512-BF16 or AMX; or oneDNN says so);
    else PyTorch's slow fallback. The same decision as whyidle's (rules_precision.native_units)."""
    import torch

    from whyidle.instrument.shape_probe import LOWP_FLAGS, lowp_cpu_flags

    flags = lowp_cpu_flags() or []
    return any(f in flags for f in LOWP_FLAGS["bfloat16"]) or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _no_emulated_claim(report) -> bool:
    """No emulated_precision warning or critical (an info saying "inconclusive" may stand)."""
    return not any(f["id"] == "emulated_precision" and f["severity"] != "info" for f in report["findings"])


def test_bf16_batch_of_two_is_small_batch(tmp_path):
    """Issue 13: a bf16-autocast transformer at batch 2 (64 measured 5.1x the samples/s on a CPU
    with native bfloat16) is small_batch, the verdict, not device_bound. On a CPU without it
    (AVX2 EPYC: batch 64 only 1.32x, float32 at batch 2 4.9x) the emulated bfloat16 holds the step."""
    report = scenario(tmp_path, "small_batch_bf16.py", "--steps", "300")
    if not _native_cpu_bf16():
        assert report["verdict"] == "emulated_precision"
        assert any(f["id"] == "small_batch" for f in report["findings"])
        return
    assert report["verdict"] == "small_batch"
    # issue 32: with native bfloat16 the batch-2 step is no evidence against it (batch 64 ran 1.7×
    # faster in bfloat16 than in float32): never a float32 fix printed as a warning or critical
    assert _no_emulated_claim(report)
    f = finding(report, "small_batch")
    assert f["severity"] == "warning" and f["est_speedup"] > 1.3
    assert "learning rate" in f["fix"]["text"]
    # the estimate at batch 32 within 2× of batch 32's measured gain (issue 32: 1.5× against 3.6×
    # before; the model's own layers timed at 2 and 32: 3.8×)
    fixed = scenario(tmp_path, "small_batch_bf16.py", "--batch", "32", "--steps", "60", name="bf16_b32")
    measured = sps(fixed) / sps(report)
    assert measured / 2 <= f["est_speedup"] <= measured * 2


def test_bf16_autocast_without_native_bf16_is_emulated_precision(tmp_path):
    """A CNN under CPU bfloat16 autocast: on a CPU without native bfloat16 the verdict is
    emulated_precision with the float32 fix (measured 11.8x here; est. 5.2x, conservative), and
    the float32 run has no such finding; on a CPU with native bfloat16 the finding stays silent."""
    faulty = scenario(tmp_path, "emulated_bf16.py", "--variant", "faulty", "--steps", "40")
    if _native_cpu_bf16():  # the scenario's premise does not hold on this CPU: no float32 advice
        assert _no_emulated_claim(faulty) and faulty["verdict"] != "emulated_precision"
        return
    assert faulty["verdict"] == "emulated_precision"
    f = finding(faulty, "emulated_precision")
    assert f["severity"] == "critical" and f["evidence"]["native"] is False
    assert f["evidence"]["matmul_slowdown"] >= 2.0 and f["est_speedup"] >= 2.0
    assert "float32" in f["fix"]["text"] and "enabled=native" in f["fix"]["code"]
    assert f["evidence"]["autocast_share"] > 0.8 and "emulated_bf16.py" in f["evidence"]["site"]
    fixed = scenario(tmp_path, "emulated_bf16.py", "--variant", "fixed", "--steps", "200")
    assert not any(g["id"] == "emulated_precision" for g in fixed["findings"])
    assert sps(fixed) >= 2.0 * sps(faulty)  # measured 11.8x; the estimate is the lower bound
    assert f["est_speedup"] <= sps(fixed) / sps(faulty) * 1.25


def test_c26_tracker_hooks_every_step_are_host_work_in_forward_and_backward(tmp_path):
    """cases.md C26: histogram hooks on every parameter (wandb.watch with log_freq=1) were
    device_bound (their time read as forward/backward); the hooks are timed and named, and a
    larger log_freq is the fix (measured 4.57-5.23x; est. 4.2-4.5x)."""
    faulty = scenario(tmp_path, "c26_watch_hooks.py", "--variant", "faulty", "--steps", "30")
    assert faulty["verdict"] == "host_bound"
    f = finding(faulty, "host_bound")
    ev = f["evidence"]
    assert ev["kind"] == "model_hooks" and ev["hooks_share"] >= 0.5
    assert {h["function"].split(".")[-1] for h in ev["hooks"]} == {"parameter_hook", "gradient_hook"}
    assert "c26_watch_hooks.py" in ev["registered"]  # the line that registered them
    assert f["est_speedup"] >= 2.0
    fixed = scenario(tmp_path, "c26_watch_hooks.py", "--variant", "fixed", "--steps", "30")
    assert all(g["evidence"].get("kind") != "model_hooks" for g in fixed["findings"] if g["id"] == "host_bound")
    assert fixed["metrics"]["steady_samples_per_s"] >= 2.5 * faulty["metrics"]["steady_samples_per_s"]


def test_pandas_row_lookups_get_a_measured_cheaper_sample_estimate(tmp_path):
    """Issue 32: per-row ``df.iloc[i]`` + a Python float per field in ``__getitem__``: the first fix
    is the cheaper sample, estimated from the stack samples' split of the loading time (measured
    plain: vectorized 4.3–4.7×, tests/scenarios/README.md), not an assumed 2×."""
    pytest.importorskip("pandas")
    faulty = scenario(tmp_path, "pandas_rows.py", "--steps", "100")
    assert faulty["verdict"] == "input_bound"
    f = finding(faulty, "input_bound")
    first = f["fix"]["options"][0]
    assert first["text"].startswith("Make each sample cheaper") and not first["assumed"]
    cost = f["evidence"]["sample_cost"]
    assert cost["removed_share_of_loading"] >= 0.8
    assert any("iloc" in (ln["code"] or "") for ln in cost["lines"])
    assert 2.0 <= f["est_speedup"] <= f["est_speedup_if_removed"]
    fixed = scenario(tmp_path, "pandas_rows.py", "--variant", "fixed", "--steps", "100")
    assert sps(fixed) >= 2.5 * sps(faulty)


def test_pil_augmentation_is_estimated_from_its_lines(tmp_path):
    """Issue 32: RandAugment-like PIL ops per sample (no decode): the cheaper-sample option is the
    batch-wise tensor augmentation with a measured estimate (not assumed)."""
    faulty = scenario(tmp_path, "randaugment_pil.py", "--steps", "120")
    f = finding(faulty, "input_bound")
    cheaper = next(o for o in f["fix"]["options"] if o["text"].startswith(("Make each sample", "All cores")))
    assert not cheaper["assumed"] and cheaper["est_speedup"] > 1.1
    assert "whole batches as tensor ops" in cheaper["text"]
    assert f["est_speedup"] is not None and f["est_speedup_if_removed"] >= f["est_speedup"]
