"""`whyidle compare`: bootstrap statistics, comparison basis, metric changes, and the command on
saved run directories (synthetic ones, written the way `whyidle run` writes them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import observe, write_script
from conftest import run_whyidle as _run_whyidle
from whyidle.analysis import compare as cmp
from whyidle.pipeline import compare as compare_runs
from whyidle.report.compare import CompareError


# -- statistics -------------------------------------------------------------------------------

def test_run_stats_point_estimates_and_intervals():
    rng = np.random.default_rng(1)
    times = 0.050 + rng.normal(0, 0.002, 400)
    s = cmp.run_stats(times, [32] * 400)
    assert s["p50_s"] == pytest.approx(np.median(times))
    assert s["p90_s"] == pytest.approx(np.percentile(times, 90))
    assert s["steps_per_s"] == pytest.approx(400 / times.sum())
    assert s["samples_per_s"] == pytest.approx(32 * 400 / times.sum())
    for key, value in (("p50_s", s["p50_s"]), ("steps_per_s", s["steps_per_s"]), ("samples_per_s", s["samples_per_s"])):
        lo, hi = s["ci"][key]
        assert lo < value < hi
    # the mean of 400 steps with sd 2 ms: half-width ≈ 1.96 × 0.1 ms (≈ 0.4 % of 50 ms)
    lo, hi = s["ci"]["steps_per_s"]
    assert 0.002 < (hi - lo) / s["steps_per_s"] < 0.02


def test_unknown_batch_sizes_give_samples_per_s_from_known_steps_only():
    s = cmp.run_stats([0.1] * 10 + [0.3] * 10, [None] * 10 + [8] * 10)
    assert s["samples_per_s"] == pytest.approx(80 / 3.0)
    assert cmp.run_stats([0.1] * 10, [None] * 10)["samples_per_s"] is None
    few = cmp.run_stats([0.1, 0.2], [8, 8])
    assert few["ci"]["p50_s"] is None and few["_boot"] is None
    with pytest.raises(ValueError):
        cmp.run_stats([], [])


def _ar1(rng, n, phi, mean, sd):
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + rng.normal(0, sd * np.sqrt(1 - phi**2))
    return mean + x


def test_ratio_interval_covers_the_true_speedup_on_correlated_steps():
    """Steps with AR(1) correlation (slow stretches): the 95 % interval of the throughput ratio
    holds the true ratio (2.0) in most of 60 repetitions; an i.i.d. bootstrap would be too narrow."""
    rng = np.random.default_rng(7)
    hits = 0
    trials = 60
    for _ in range(trials):
        a = cmp.run_stats(_ar1(rng, 150, 0.6, 0.100, 0.010), [32] * 150, rng)
        b = cmp.run_stats(_ar1(rng, 150, 0.6, 0.050, 0.005), [32] * 150, rng)
        lo, hi = cmp.speedup(a, b, "step")["ci"]
        hits += lo <= 2.0 <= hi
    assert hits / trials >= 0.85


def test_block_length_grows_as_the_cube_root():
    assert [cmp.block_length(n) for n in (1, 8, 27, 100, 1000)] == [1, 2, 3, 5, 10]


def test_comparison_basis():
    a = {"script": "train", "batch_size": 32}
    assert cmp.comparison_basis(a, {"script": "train", "batch_size": 32})[0] == "step"
    basis, why = cmp.comparison_basis(a, {"script": "train", "batch_size": 64})
    assert basis == "sample" and "batch sizes differ (32 vs 64)" in why and "per sample" in why
    assert cmp.comparison_basis(a, {"script": "other", "batch_size": 32})[0] == "sample"
    basis, why = cmp.comparison_basis(a, {"script": "other", "batch_size": None})
    assert basis is None and "unknown" in why


def test_metric_changes():
    c = cmp.metric_change("val_accuracy", 0.912, 0.910)
    assert c["unit"] == "pt" and c["change"] == pytest.approx(-0.2) and c["unchanged"] and c["better"] is None
    c = cmp.metric_change("val_accuracy", 0.90, 0.85)
    assert not c["unchanged"] and c["better"] is False and c["tolerance_from"] == "fixed"
    c = cmp.metric_change("val_acc", 91.0, 93.0)  # in percent
    assert c["change"] == pytest.approx(2.0) and c["better"] is True
    # 160 examples: 2 pt is noise (binomial), 10 pt is not
    c = cmp.metric_change("val_accuracy", 0.90, 0.88, 160, 160)
    assert c["unchanged"] and c["tolerance_from"] == "binomial" and 5 < c["tolerance"] < 8
    assert not cmp.metric_change("val_accuracy", 0.90, 0.80, 160, 160)["unchanged"]
    c = cmp.metric_change("val_loss", 0.50, 0.40)
    assert c["unit"] == "rel" and c["change"] == pytest.approx(-0.2) and c["better"] is True
    assert cmp.metric_change("val_loss", 0.5, 0.505)["unchanged"]
    assert cmp.metric_change("throughput_thing", 1.0, 2.0)["better"] is None
    assert cmp.metric_change("val_loss", None, 0.4) is None
    assert cmp.primary_metric(["loss", "val_loss", "val_accuracy", "accuracy"]) == "val_accuracy"
    assert cmp.primary_metric(["loss", "val_loss"]) == "val_loss"


# -- saved runs -------------------------------------------------------------------------------

def run_whyidle(args):
    return _run_whyidle(args, env={**os.environ, "COLUMNS": "200"})


def write_run(path, step_s, samples=32, script="train.py", metrics=(), steps=40, fmt="whyidle.run/1", pid=4242,
              name=None, eval_every=None, eval_s=1.0):
    """A run directory as `whyidle run` writes it: meta.json and one trainer's proc file; with
    ``eval_every``, every such step also holds an ``eval_s`` evaluation (a boundary step whose
    sample count was not recorded, as the instrument writes it)."""
    os.makedirs(path)
    t0 = 10**12
    meta = {"format": fmt, "tool_version": "0.1.0", "name": name or os.path.basename(path), "command": ["python", script],
            "cpu_count": 2, "anchors": [{"monotonic_ns": t0, "time_ns": 1_700_000_000 * 10**9}], "whyidle_pid": 1}
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f)
    rng = np.random.default_rng(sum(map(ord, os.path.basename(str(path)))))  # not tmp_path: same runs every time
    recs = [{"k": "proc", "t": t0, "pid": pid, "ppid": 1, "framework": "torch", "framework_version": "2.13.0"}]
    t = t0 + 10**9
    for i in range(steps):
        dur = int(step_s * (1 + rng.normal(0, 0.03)) * 1e9)
        evaluates = bool(eval_every) and i % eval_every == eval_every - 1
        ev = int(eval_s * 1e9) if evaluates else 0
        recs.append({"k": "step", "t": t + dur + ev, "i": i, "t0": t, "t1": t + dur + ev, "by": "optimizer",
                     "data": dur // 2, "fwd": dur // 4, "bwd": dur // 8, "opt": 0, "eval": ev, "batches": 1,
                     "samples": None if evaluates else samples, "cpu": dur, "boundary": evaluates})
        dur += ev
        t += dur
    for name, value, n in metrics:
        recs.append({"k": "metric", "t": t, "name": name, "value": value, "step": steps, "n": n,
                     "source": "log_metric"})
    with open(os.path.join(path, f"proc-{pid}.jsonl"), "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def test_compare_two_runs_statement_and_json(tmp_path):
    a = write_run(tmp_path / "before", 0.100, metrics=[("val_accuracy", 0.912, None), ("val_loss", 0.3, None)])
    b = write_run(tmp_path / "after", 0.040, metrics=[("val_accuracy", 0.910, None), ("val_loss", 0.3, None)])
    result = compare_runs([a, b])
    comp = result["comparisons"][0]
    assert comp["basis"] == "step"
    assert comp["speedup"]["ratio"] == pytest.approx(2.5, rel=0.05)
    lo, hi = comp["speedup"]["ci"]
    assert lo < comp["speedup"]["ratio"] < hi and lo > 2.2 and hi < 2.8
    assert comp["primary_metric"] == "val_accuracy"
    st = comp["statement"]
    assert st.startswith("B (after) is 2.") and "× faster than A (before) (95 % CI 2." in st
    assert "within these runs)" in st and comp["speedup"]["within_run"] and comp["speedup"]["claim"] == "faster"
    assert "data wait 50% → 50%" in st and "val_accuracy unchanged within 0.2 pt (91.2 % → 91.0 %)" in st
    proc = run_whyidle(["compare", a, b, "--json", "-"])
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "whyidle.compare/1" and out["baseline"] == "A"
    assert [r["name"] for r in out["runs"]] == ["before", "after"]
    assert "_boot" not in out["runs"][0]["stats"]
    proc = run_whyidle(["compare", a, b])
    assert proc.returncode == 0 and "speed-up vs A" in proc.stdout and "× faster" in proc.stdout


def test_bad_inputs_are_named_and_the_rest_compared(tmp_path):
    a = write_run(tmp_path / "a", 0.1, metrics=[("val_accuracy", 0.9, None)])
    b = write_run(tmp_path / "b", 0.05)
    old = write_run(tmp_path / "old", 0.05, fmt="whyidle.run/0")
    empty = write_run(tmp_path / "empty", 0.05, steps=0)
    proc = run_whyidle(["compare", a, str(tmp_path / "missing"), old, empty, b])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "missing: no such run directory; left out" in out
    assert "unknown format 'whyidle.run/0'" in out
    assert "no training steps were recorded" in out
    assert "metric 'val_accuracy' was logged in A only; not compared" in out
    assert "Traceback" not in proc.stderr


def test_nothing_to_compare_exits_2(tmp_path):
    a = write_run(tmp_path / "a", 0.1)
    proc = run_whyidle(["compare", a, str(tmp_path / "nope")])
    assert proc.returncode == 2 and "nothing to compare" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_whyidle(["compare", a])
    assert proc.returncode == 2 and "at least two run directories" in proc.stderr
    with pytest.raises(CompareError):
        compare_runs([a])
    # different scripts and no batch size: the table is shown, then exit 2
    b = write_run(tmp_path / "b", 0.05, samples=None, script="other.py")
    proc = run_whyidle(["compare", a, b])
    assert proc.returncode == 2 and "not comparable" in proc.stdout and "no run could be compared" in proc.stderr


def test_different_batch_sizes_are_compared_per_sample(tmp_path):
    a = write_run(tmp_path / "small", 0.050, samples=32)
    b = write_run(tmp_path / "large", 0.080, samples=128)
    comp = compare_runs([a, b])["comparisons"][0]
    assert comp["basis"] == "sample" and comp["speedup"]["metric"] == "samples_per_s"
    assert comp["speedup"]["ratio"] == pytest.approx(4 * 0.05 / 0.08, rel=0.05)  # 2.5× the samples/s
    assert "faster per sample" in comp["statement"]
    proc = run_whyidle(["compare", a, b])
    assert "batch sizes differ (32 vs 128): compared per sample (samples/s), not per step" in proc.stdout


def test_a_run_against_itself_is_not_a_change(tmp_path):
    """Each variant resamples independently: the same run twice gives an interval around 1, no claim."""
    a = write_run(tmp_path / "a", 0.05)
    sp = compare_runs([a, a])["comparisons"][0]["speedup"]
    assert sp["ratio"] == pytest.approx(1.0) and sp["ci"][0] < 0.995 < 1.005 < sp["ci"][1]
    assert sp["claim"] == "none"


def test_single_runs_claim_nothing_under_the_noise_floor(tmp_path):
    a = write_run(tmp_path / "a", 0.050, steps=400)
    b = write_run(tmp_path / "b", 0.0485, steps=400)  # 3 % faster: outside the within-run interval
    comp = compare_runs([a, b])["comparisons"][0]
    assert comp["speedup"]["ci"][0] > 1.0 and comp["speedup"]["claim"] == "none"
    assert comp["speedup"]["ratio"] == pytest.approx(1.03, abs=0.015)
    assert f"is not measurably faster or slower than A (a): {comp['speedup']['ratio']:.2f}×" in comp["statement"]
    assert "changes under 5% are run-to-run noise" in comp["statement"]


def test_repeated_runs_give_intervals_over_runs(tmp_path):
    """Comma-separated runs are repeats of one variant: run-to-run variation widens the interval."""
    a = [write_run(tmp_path / f"a{i}", s, name="train") for i, s in enumerate((0.095, 0.100, 0.106))]
    b = [write_run(tmp_path / f"b{i}", s, name="train") for i, s in enumerate((0.049, 0.050, 0.052))]
    result = compare_runs([",".join(a), ",".join(b)])
    va, vb = result["runs"]
    assert va["stats"]["runs"] == 3 and len(va["stats"]["per_run"]) == 3 and va["run_dirs"] == a
    assert (va["name"], vb["name"]) == ("a0", "b0")  # both named "train": told apart by directory
    comp = result["comparisons"][0]
    assert "over 3 and 3 runs)" in comp["statement"] and comp["speedup"]["claim"] == "faster"
    lo, hi = comp["speedup"]["ci"]
    assert lo < 2.0 < hi
    single = compare_runs([a[1], b[1]])["comparisons"][0]["speedup"]["ci"]
    assert hi - lo > 2 * (single[1] - single[0])  # the spread between runs shows in the interval


def test_a_metric_that_is_not_finite_is_said(tmp_path):
    a = write_run(tmp_path / "a", 0.1, metrics=[("val_loss", 0.4, None)])
    b = write_run(tmp_path / "b", 0.05, metrics=[("val_loss", None, None)])  # log_metric(nan) → null
    comp = compare_runs([a, b])["comparisons"][0]
    assert comp["nonfinite"] == ["val_loss"]
    assert comp["statement"].endswith("val_loss is not a finite number in B (b).")


# -- whyidle.log_metric -----------------------------------------------------------------------

@pytest.mark.slow
def test_log_metric_under_whyidle_run_and_without(tmp_path):
    post = """
import whyidle
print("outside-or-inside", whyidle.log_metric("val_accuracy", 0.75, n=200))
whyidle.log_metric("val_accuracy", torch.tensor(0.8125), step=40, n=160)  # 0-d tensor: float()
whyidle.log_metric("val_loss", float("nan"))
whyidle.log_metric("broken", "not a number")
"""
    script = write_script(tmp_path / "train.py", steps=30)
    with open(script, "a") as f:
        f.write(post)
    alone = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0 and "outside-or-inside False" in alone.stdout  # no whyidle: a no-op
    proc, report, run_dir = observe(tmp_path, [sys.executable, script], html=True)
    assert proc.returncode == 0, proc.stderr
    assert "outside-or-inside True" in proc.stdout
    with open(os.path.join(run_dir, "report.html"), encoding="utf-8") as f:
        assert "val_accuracy 0.8125 (n=160) · val_loss n/a" in f.read()  # the page's header
    shown = _run_whyidle(["report", run_dir], env={**os.environ, "COLUMNS": "200"}).stdout
    assert "logged val_accuracy 0.8125 (n=160) · val_loss n/a" in shown
    logged = report["logged_metrics"]
    assert logged["val_accuracy"]["last"] == 0.8125 and logged["val_accuracy"]["count"] == 2
    assert logged["val_accuracy"]["step"] == 40 and logged["val_accuracy"]["n"] == 160
    assert logged["val_loss"]["last"] is None and logged["val_loss"]["count"] == 1  # NaN kept as null
    assert "broken" not in logged
    assert proc.stderr.count("whyidle.log_metric('broken', ...) not recorded") == 1


def test_evaluating_less_often_shows_in_the_comparison(tmp_path):
    """The comparison is over every training step after the warm-up: the steps that hold an
    evaluation count (the steady-state metrics leave them out), and their unrecorded sample counts
    are the run's median batch, so a per-sample comparison sees the job's rate too."""
    a = write_run(tmp_path / "every10", 0.05, steps=60, eval_every=10)
    b = write_run(tmp_path / "every40", 0.05, steps=60, eval_every=40, script="train_fixed.py")
    result = compare_runs([a, b])
    comp = result["comparisons"][0]
    assert comp["basis"] == "sample"
    # A: 58 steps of 0.05 s + 6 evaluations of 1 s; B: the same steps + 1 evaluation
    assert comp["speedup"]["ratio"] == pytest.approx((58 * 0.05 + 6) / (58 * 0.05 + 1), rel=0.05)
    assert comp["speedup"]["claim"] == "faster"
    assert result["runs"][0]["stats"]["steps"] == 58
