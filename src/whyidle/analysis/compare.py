"""Controlled comparison of runs: step-time statistics with bootstrap confidence intervals (pure).

Definitions:

- A run's statistics are over its training steps after the warm-up, in step order, the steps
  holding an evaluation, a checkpoint or an epoch boundary included (what the job achieved;
  :func:`whyidle.report.compare.training_steps`), whyidle's profiled steps left out.
- Throughput is total work over total time: steps/s = steps / summed step time; samples/s =
  summed samples / summed step time (steps whose batch size is known).
- Runs of the same script with the same batch size are compared **per step** (steps/s); other
  pairs **per sample** (samples/s), which needs both batch sizes; otherwise they are not
  comparable. The speed-up of run X over the baseline A is throughput(X) / throughput(A).
- Confidence intervals (95 %) come from a circular block bootstrap (Politis & Romano 1992, "A
  circular block-resampling procedure for stationary data"): consecutive steps are correlated
  (a slow stretch while another process runs, a loader refilling its queue), so steps are resampled
  in blocks of ``ceil(n ** (1/3))`` consecutive steps (the usual rate for block length, Hall,
  Horowitz & Jing 1995), wrapping around at the end. The ratio's interval resamples both runs
  independently, :data:`BOOTSTRAP_RESAMPLES` times, with a fixed seed so a comparison
  re-renders identically.
"""

from __future__ import annotations

import math

import numpy as np

#: Bootstrap resamples per statistic; 2,000 keeps the Monte-Carlo error of a 95 % percentile
#: interval's ends well under 1 % of the statistic (Efron & Tibshirani, "An Introduction to the
#: Bootstrap", ch. 13 recommends ≥ 1,000 for percentile intervals).
BOOTSTRAP_RESAMPLES = 2000
#: Two-sided confidence level of every interval.
CI_LEVEL = 0.95
#: Fewer analyzed steps than this give no interval (a block bootstrap of 2–4 values says nothing).
MIN_STEPS_FOR_CI = 5
#: Resampled values held in memory at once (rows × steps), ~80 MB of float64.
_MAX_CELLS = 10_000_000
#: Seed of the bootstrap generators, so a comparison re-renders identically.
SEED = 20261130


def block_length(n: int) -> int:
    """Block length of the circular block bootstrap for ``n`` steps: ``ceil(n ** (1/3))``."""
    return max(1, math.ceil(n ** (1 / 3)))


def _block_indexes(rng: np.random.Generator, n: int, rows: int, length: int) -> np.ndarray:
    """``rows`` resamples of ``n`` step indexes, each made of blocks of ``length`` consecutive
    indexes starting anywhere and wrapping around. Shape (rows, n)."""
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n, size=(rows, blocks))
    idx = (starts[:, :, None] + np.arange(length)[None, None, :]) % n
    return idx.reshape(rows, blocks * length)[:, :n]


def _resample(times: np.ndarray, samples: np.ndarray | None, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Bootstrap distributions of p50, p90 (s), steps/s and samples/s of one run."""
    n = len(times)
    length = block_length(n)
    out = {k: np.empty(BOOTSTRAP_RESAMPLES) for k in ("p50", "p90", "steps_per_s", "samples_per_s")}
    chunk = max(1, _MAX_CELLS // n)
    for start in range(0, BOOTSTRAP_RESAMPLES, chunk):
        rows = min(chunk, BOOTSTRAP_RESAMPLES - start)
        idx = _block_indexes(rng, n, rows, length)
        t = times[idx]
        total = t.sum(axis=1)
        part = slice(start, start + rows)
        out["p50"][part] = np.median(t, axis=1)
        out["p90"][part] = np.percentile(t, 90, axis=1)
        out["steps_per_s"][part] = n / total
        out["samples_per_s"][part] = samples[idx].sum(axis=1) / total if samples is not None else np.nan
    return out


def _ci(values: np.ndarray) -> list[float] | None:
    tail = (1 - CI_LEVEL) / 2 * 100
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return None
    lo, hi = np.percentile(finite, [tail, 100 - tail])
    return [float(lo), float(hi)]


def run_stats(step_times_s, samples, rng: np.random.Generator | None = None) -> dict:
    """Statistics of one run's analyzed steps.

    Args:
        step_times_s: step times in seconds, in step order (length n ≥ 1).
        samples: samples per step, same length; None entries for unknown batch sizes.
        rng: numpy generator (default: a fixed seed).
    Returns:
        ``{"steps", "p50_s", "p90_s", "mean_s", "steps_per_s", "samples_per_s"`` (None when no
        step has a batch size), ``"ci": {"p50_s", "p90_s", "steps_per_s", "samples_per_s"}``
        (``[low, high]`` or None), ``"_boot"`` (the bootstrap distributions, for ratios; None
        under :data:`MIN_STEPS_FOR_CI` steps)``}``. Times in seconds.
    Errors: ``ValueError`` for no steps.
    """
    times = np.asarray(step_times_s, dtype=float)
    n = len(times)
    if n == 0:
        raise ValueError("no steps")
    known = np.array([s is not None for s in samples], dtype=bool)
    sam = np.array([s if s is not None else 0 for s in samples], dtype=float)
    # samples/s over the steps with a known batch size (as whyidle.analysis.steps.step_metrics)
    s_times, s_samples = times[known], sam[known]
    stats = {
        "steps": n,
        "p50_s": float(np.median(times)),
        "p90_s": float(np.percentile(times, 90)),
        "mean_s": float(times.mean()),
        "steps_per_s": float(n / times.sum()),
        "samples_per_s": float(s_samples.sum() / s_times.sum()) if known.any() else None,
        "ci": {"p50_s": None, "p90_s": None, "steps_per_s": None, "samples_per_s": None},
        "_boot": None,
    }
    if n < MIN_STEPS_FOR_CI:
        return stats
    rng = rng or np.random.default_rng(SEED)
    boot = _resample(times, sam if known.all() else None, rng)
    if not known.all() and known.sum() >= MIN_STEPS_FOR_CI:
        boot["samples_per_s"] = _resample(s_times, s_samples, rng)["samples_per_s"]
    stats["ci"] = {"p50_s": _ci(boot["p50"]), "p90_s": _ci(boot["p90"]), "steps_per_s": _ci(boot["steps_per_s"]),
                   "samples_per_s": _ci(boot["samples_per_s"])}
    stats["_boot"] = boot
    return stats


def _run_sums(times: np.ndarray, samples: np.ndarray, known: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Within-run bootstrap sums of one run, shape (3, B): summed step time, summed time of the
    steps with a known batch size, summed samples."""
    n = len(times)
    out = np.empty((3, BOOTSTRAP_RESAMPLES))
    t_known, s_known = np.where(known, times, 0.0), np.where(known, samples, 0.0)
    chunk = max(1, _MAX_CELLS // n)
    for start in range(0, BOOTSTRAP_RESAMPLES, chunk):
        rows = min(chunk, BOOTSTRAP_RESAMPLES - start)
        idx = _block_indexes(rng, n, rows, block_length(n))
        part = slice(start, start + rows)
        out[0, part] = times[idx].sum(axis=1)
        out[1, part] = t_known[idx].sum(axis=1)
        out[2, part] = s_known[idx].sum(axis=1)
    return out


def variant_stats(runs: list[tuple[list, list]], rng: np.random.Generator | None = None) -> dict:
    """Statistics of one variant: one run, or repeated runs of the same configuration.

    Args:
        runs: per run, ``(step_times_s, samples)`` as for :func:`run_stats` (each ≥ 1 step).
        rng: numpy generator (default: a fixed seed).
    Returns:
        :func:`run_stats` of all the runs' steps pooled, plus ``"runs"`` (count) and
        ``"per_run"`` (``[{steps, steps_per_s, samples_per_s}]``). With two or more runs the
        throughput intervals (and ``_boot``) come from a two-stage bootstrap — runs resampled with
        replacement, then each chosen run's steps block-resampled (Davison & Hinkley 1997,
        "Bootstrap Methods and their Application", §3.8, hierarchical data) — so they include
        run-to-run variation; p50/p90 intervals stay over the pooled steps.
    Errors: ``ValueError`` for no runs or a run without steps.
    """
    if not runs or any(len(t) == 0 for t, _ in runs):
        raise ValueError("no steps")
    rng = rng or np.random.default_rng(SEED)
    pooled = run_stats([t for ts, _ in runs for t in ts], [x for _, ss in runs for x in ss], rng)
    pooled["runs"] = len(runs)
    pooled["per_run"] = []
    arrays = []
    for ts, ss in runs:
        t = np.asarray(ts, dtype=float)
        known = np.array([x is not None for x in ss], dtype=bool)
        sam = np.array([x if x is not None else 0 for x in ss], dtype=float)
        pooled["per_run"].append({"steps": len(t), "steps_per_s": float(len(t) / t.sum()),
                                  "samples_per_s": float(sam[known].sum() / t[known].sum()) if known.any() else None})
        arrays.append((t, sam, known))
    if len(runs) < 2 or pooled["_boot"] is None:
        return pooled
    k, B = len(runs), BOOTSTRAP_RESAMPLES
    sums = np.stack([_run_sums(t, sam, known, rng) for t, sam, known in arrays])  # (k, 3, B)
    steps = np.array([len(t) for t, _, _ in arrays], dtype=float)
    picks = rng.integers(0, k, size=(B, k))
    # the j-th pick of resample b uses within-run resample (b + j·stride) of its run, so a run
    # picked twice does not repeat one within-run resample
    cols = (np.arange(B)[:, None] + np.arange(k)[None, :] * (B // k + 1)) % B
    total, total_known, total_samples = (sums[picks, i, cols].sum(axis=1) for i in range(3))
    boot = pooled["_boot"]
    boot["steps_per_s"] = steps[picks].sum(axis=1) / total
    boot["samples_per_s"] = np.where(total_known > 0, total_samples / np.where(total_known > 0, total_known, 1), np.nan)
    pooled["ci"]["steps_per_s"] = _ci(boot["steps_per_s"])
    pooled["ci"]["samples_per_s"] = _ci(boot["samples_per_s"]) if pooled["samples_per_s"] is not None else None
    return pooled


def comparison_basis(a: dict, b: dict) -> tuple[str | None, str]:
    """How two runs can be compared: ``("step" | "sample" | None, reason)``.

    ``a``/``b`` hold ``script`` (what ran: the script or module) and ``batch_size`` (median
    samples per step or None).
    """
    same_script = a.get("script") == b.get("script")
    ba, bb = a.get("batch_size"), b.get("batch_size")
    if same_script and ba == bb:
        return "step", "same script and batch size: compared per step"
    why = "different scripts" if not same_script else f"batch sizes differ ({_num(ba)} vs {_num(bb)})"
    if ba and bb:
        return "sample", f"{why}: compared per sample (samples/s), not per step"
    return None, f"{why} and the batch size of {'the first' if not ba else 'the second'} run is unknown: not comparable"


def _num(x) -> str:
    return "unknown" if x is None else f"{x:g}"


#: With one run per variant the interval holds only the variation within those runs, not between
#: runs (another process, clocks, file-cache state, data order); a change smaller than this is not
#: claimed. Identical runs on a shared 2-core machine differed by 2–9 % in throughput (A/A trial,
#: 5 runs), within-run intervals were ±1–2 %.
SINGLE_RUN_NOISE = 0.05


def speedup(base: dict, other: dict, basis: str) -> dict:
    """Throughput ratio other / base with its bootstrap interval, and what may be claimed.

    Args:
        base, other: :func:`variant_stats` (or :func:`run_stats`) results.
        basis: ``"step"`` (steps/s) or ``"sample"`` (samples/s).
    Returns:
        ``{"ratio", "ci"`` ([low, high] or None), ``"metric"`` (``"steps_per_s"`` or
        ``"samples_per_s"``), ``"within_run"`` (True when a side has a single run: the interval
        leaves out run-to-run variation), ``"noise_floor"`` (:data:`SINGLE_RUN_NOISE` then, else
        0), ``"claim"`` (``"faster"`` / ``"slower"`` when the interval clears 1 ± the noise
        floor, else ``"none"``)``}``; ratio None when a throughput is missing.
    """
    key = "steps_per_s" if basis == "step" else "samples_per_s"
    a, b = base.get(key), other.get(key)
    ratio = b / a if a and b else None
    ci = None
    if ratio is not None and base.get("_boot") is not None and other.get("_boot") is not None:
        ci = _ci(other["_boot"][key] / base["_boot"][key])
    within = min(base.get("runs", 1), other.get("runs", 1)) < 2
    floor = SINGLE_RUN_NOISE if within else 0.0
    lo, hi = ci if ci else (ratio, ratio) if ratio is not None else (None, None)
    claim = "none"
    if lo is not None and lo > 1 + floor:
        claim = "faster"
    elif hi is not None and hi < 1 / (1 + floor):
        claim = "slower"
    if ci is None:
        claim = "none"  # too few steps: no claim either way
    return {"ratio": ratio, "ci": ci, "metric": key, "within_run": within, "noise_floor": floor, "claim": claim}


#: A validation accuracy-like metric whose last value moved by at most this many percentage points
#: is called unchanged when the validation set's size is not known: on 1,000–2,000 examples the
#: binomial standard error of an accuracy near 90 % is 0.7–0.9 pt, so smaller moves are noise.
METRIC_UNCHANGED_PT = 1.0
#: The same for other metrics (losses), as a relative change.
METRIC_UNCHANGED_REL = 0.02
_HIGHER = ("acc", "f1", "auc", "precision", "recall", "iou", "map", "bleu", "rouge", "top")
_LOWER = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "ppl", "wer", "cer")


def metric_kind(name: str) -> str:
    """``"higher"`` (accuracy-like), ``"lower"`` (loss-like) or ``"unknown"``, from the name."""
    n = name.lower()
    if any(w in n for w in _LOWER):
        return "lower"
    if any(w in n for w in _HIGHER):
        return "higher"
    return "unknown"


def metric_change(name: str, a: float | None, b: float | None, n_a: int | None = None,
                  n_b: int | None = None) -> dict | None:
    """How a logged metric's last value moved from run A to run B.

    Args:
        name: the metric's name (its direction comes from :func:`metric_kind`).
        a, b: the last values in A and B.
        n_a, n_b: examples behind each value (``log_metric(..., n=)``), or None.
    Returns:
        ``{"name", "a", "b", "kind", "delta"`` (b − a), ``"unit"`` (``"pt"``: percentage points,
        for accuracy-like metrics in 0–1 or 0–100; ``"rel"``: relative change), ``"change"``
        (delta in that unit), ``"tolerance"`` (the largest change still called unchanged, same
        unit), ``"tolerance_from"`` (``"binomial"`` when both n are known: 1.96 × the standard
        error of a difference of two proportions, a two-sided 95 % z-test; else ``"fixed"``:
        :data:`METRIC_UNCHANGED_PT` / :data:`METRIC_UNCHANGED_REL`), ``"unchanged"``, ``"better"``
        (True/False, None when unchanged or the direction is unknown)``}``; None when a value is
        missing.
    """
    if a is None or b is None:
        return None
    kind = metric_kind(name)
    delta = b - a
    tolerance_from = "fixed"
    if kind == "higher" and 0 <= a <= 100 and 0 <= b <= 100:
        scale = 100.0 if max(abs(a), abs(b)) <= 1.0 else 1.0
        unit, change, tolerance = "pt", delta * scale, METRIC_UNCHANGED_PT
        if n_a and n_b:
            pa, pb = a * scale / 100, b * scale / 100
            se = math.sqrt(pa * (1 - pa) / n_a + pb * (1 - pb) / n_b)
            tolerance, tolerance_from = max(1.96 * se * 100, 100 / min(n_a, n_b)), "binomial"
    else:
        unit, tolerance = "rel", METRIC_UNCHANGED_REL
        change = delta / abs(a) if a else (0.0 if delta == 0 else math.inf)
    unchanged = abs(change) <= tolerance
    better = None
    if not unchanged and kind != "unknown":
        better = (delta > 0) == (kind == "higher")
    return {"name": name, "a": a, "b": b, "kind": kind, "delta": delta, "unit": unit, "change": change,
            "tolerance": tolerance, "tolerance_from": tolerance_from, "unchanged": unchanged, "better": better}


def primary_metric(names) -> str | None:
    """The metric a plain statement names: a validation accuracy-like metric first, then any
    validation metric, then any accuracy-like one, else the first name (sorted)."""
    names = sorted(names)
    val = [n for n in names if n.lower().startswith(("val", "valid", "eval", "test"))]
    for group in ([n for n in val if metric_kind(n) == "higher"], val,
                  [n for n in names if metric_kind(n) == "higher"], names):
        if group:
            return group[0]
    return None
