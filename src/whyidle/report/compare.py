"""``whyidle compare``: saved runs → one comparison (``whyidle.compare/1``) with plain statements.

Each run directory is analyzed as ``whyidle report`` would (:func:`whyidle.pipeline.compare`;
nothing is re-run); the statistics and their definitions are in :mod:`whyidle.analysis.compare`. The first usable run is the
baseline A; every other run is compared with it.
"""

from __future__ import annotations

import os

import numpy as np

from whyidle.analysis import compare as cmp
from whyidle.analysis.facts import RunFacts

SCHEMA = "whyidle.compare/1"
#: GPU utilization over time is summarized as the means of this many equal parts of the analyzed
#: window (first part → last part shows a trend that one mean hides).
GPU_TREND_PARTS = 4


_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class CompareError(Exception):
    """Nothing can be compared; ``str(err)`` is a one-line explanation (exit 2)."""


#: Variants one comparison takes (labelled A–Z).
MAX_VARIANTS = len(_LETTERS)


def run_summary(path: str, facts: RunFacts, verdict: str, findings: list[dict], problems: list[str], *, name: str,
                command: list, script: str | None, gpu_trend: list[float]) -> dict:
    """The per-run part of a comparison, from one run's facts and findings
    (:func:`whyidle.pipeline.summarize_run` loads them).

    Returns ``{"name", "run_dir", "command", "script", "framework", "device", "batch_size",
    "times"``, ``"samples"`` (step times in s and samples per step of :func:`training_steps`),
    ``"data_wait_share"``, ``"verdict"``, ``"gpu"`` (``{"util_mean", "util_trend"}`` in percent,
    or None without a GPU; ``util_trend`` is ``gpu_trend``, the means of
    :data:`GPU_TREND_PARTS` parts of the analyzed window), ``"metrics"`` (name → last logged
    value, None when not finite), ``"metrics_n"`` (name → examples behind it, when logged),
    ``"confounded"`` (a sentence when other processes or the hypervisor took CPU the job needed, else
    None),
    ``"problems"``}``.
    """
    from whyidle.diagnose.thresholds import OTHER_PROCS_MIN_CORES, RUN_DELAY_WARN
    from whyidle.report.build import gpu_metrics_of

    steps = training_steps(facts)
    step = facts.step
    gpu = gpu_metrics_of(facts)
    others = (facts.host or {}).get("other_procs_cores") or 0.0
    contention = next((f for f in findings if f["id"] == "cpu_contention"), None)
    causes = []
    if others >= OTHER_PROCS_MIN_CORES or (contention and contention["evidence"].get("cause") == "other_processes"):
        causes.append(f"other processes used {others:.1f} cores during its steps"
                      + (f" and the trainer waited for a CPU {contention['evidence']['run_delay_share']:.0%} of the time"
                         if contention and contention["evidence"].get("run_delay_share") is not None else ""))
    steal = (facts.host or {}).get("steal_share") or 0.0
    if steal >= RUN_DELAY_WARN:
        causes.append(f"the hypervisor gave its cores to other guests {steal:.0%} of the time (CPU steal)")
    confounded = "; ".join(causes) + ": its speed reflects the machine as much as the change" if causes else None
    logged = facts.logged or {}
    return {
        "name": name,
        "run_dir": path,
        "command": list(command),
        "script": script,
        "framework": facts.framework,
        "device": (facts.device or {}).get("name"),
        "batch_size": step.get("batch_size"),
        "times": [(s["t1"] - s["t0"]) / 1e9 for s in steps],
        "samples": _samples(steps),
        "data_wait_share": (step.get("shares") or {}).get("data_wait"),
        "verdict": verdict,
        "gpu": {"util_mean": gpu.get("util_mean"), "util_trend": gpu_trend} if gpu else None,
        "metrics": {name: m["last"] for name, m in logged.items()},
        "metrics_n": {name: m["n"] for name, m in logged.items() if m.get("n")},
        "confounded": confounded,
        "problems": list(problems),
    }


def training_steps(facts: RunFacts) -> list:
    """The steps a comparison is over: every training step after the warm-up, those holding an
    evaluation, a checkpoint or an epoch boundary included (what the job achieved: a fix that
    evaluates or saves less often shows in them); steps run under whyidle's TensorFlow profiler
    window are left out (its cost, not the job's). The analyzed steps when no row is left."""
    warm = (facts.steps_info or {}).get("warmup") or 0
    rows = [s for s in (facts.step_rows or [])[warm:] if not s.get("profiled")]
    return rows or list(facts.analyzed_steps or [])


def _samples(steps: list) -> list:
    """Samples of each step; a step whose count was not recorded (one holding an evaluation, whose
    last batch came from another loader, or one recorded with less detail) counts the median of the
    others: the same loop trained the same batch in it."""
    known = sorted(s.get("samples") for s in steps if s.get("samples") is not None)
    fill = known[len(known) // 2] if known else None
    return [s.get("samples") if s.get("samples") is not None else fill for s in steps]


def _mean(values):
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def summarize_variant(runs: list[dict], rng) -> dict:
    """Several :func:`run_summary` results of one configuration (repeats) → one column.

    Throughput and its interval come from :func:`whyidle.analysis.compare.variant_stats`; the
    data-wait share, GPU utilization and each logged metric are the means over the runs (a
    metric's ``n`` adds up). Returns the per-run keys of the first run with ``run_dirs``,
    ``stats``, ``verdicts`` and ``confounded`` (list of ``[run_dir, sentence]``).
    """
    first = runs[0]
    out = {k: first[k] for k in ("name", "command", "script", "framework", "device", "batch_size")}
    out["run_dir"] = first["run_dir"]
    out["run_dirs"] = [r["run_dir"] for r in runs]
    out["stats"] = cmp.variant_stats([(r["times"], r["samples"]) for r in runs], rng)
    out["data_wait_share"] = _mean([r["data_wait_share"] for r in runs])
    out["verdict"] = first["verdict"]
    out["verdicts"] = [r["verdict"] for r in runs]
    gpus = [r["gpu"] for r in runs if r["gpu"]]
    out["gpu"] = None if not gpus else {
        "util_mean": _mean([g["util_mean"] for g in gpus]),
        "util_trend": [round(sum(col) / len(col), 1) for col in zip(*[g["util_trend"] for g in gpus])],
    }
    names = [n for r in runs for n in r["metrics"]]
    out["metrics"] = {n: _mean([r["metrics"].get(n) for r in runs]) for n in dict.fromkeys(names)}
    out["metrics_n"] = {n: sum(r["metrics_n"].get(n, 0) for r in runs) for n in dict.fromkeys(names)
                        if all(r["metrics_n"].get(n) for r in runs)}
    out["confounded"] = [[r["run_dir"], r["confounded"]] for r in runs if r["confounded"]]
    return out


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _metric_value(change: dict, which: str) -> str:
    v = change[which]
    return f"{v * 100:.1f} %" if change["unit"] == "pt" and max(abs(change["a"]), abs(change["b"])) <= 1 else f"{v:.4g}"


def metric_phrase(change: dict) -> str:
    """One phrase for a metric's move, e.g. ``val_accuracy unchanged within 0.4 pt (91.2 % → 90.8 %)``."""
    name, a, b = change["name"], _metric_value(change, "a"), _metric_value(change, "b")
    size = f"{abs(change['change']):.1f} pt" if change["unit"] == "pt" else f"{abs(change['change']):.1%}"
    if change["unchanged"] and abs(change["change"]) < 0.05:
        return f"{name} unchanged ({a} → {b})"
    if change["unchanged"]:
        noise = (f"; differences up to {change['tolerance']:.1f} pt are noise on this many examples"
                 if change["tolerance_from"] == "binomial" else "")
        return f"{name} unchanged within {size} ({a} → {b}{noise})"
    sign = "+" if change["delta"] > 0 else "−"
    verdict = {True: "better", False: "worse", None: "changed"}[change["better"]]
    return f"{name} {verdict}: {a} → {b} ({sign}{size})"


def _who(run: dict) -> str:
    return f"{run['label']} ({run['name']})" if run.get("name") else run["label"]


def statement(base: dict, other: dict, comp: dict) -> str:
    """The plain sentence for one comparison, e.g. "B is 2.3× faster (95 % CI 2.1–2.5 over 3 and
    3 runs), data wait 61 % → 4 %, val_accuracy unchanged within 0.2 pt (…)"."""
    sp = comp["speedup"]
    who, ref = _who(other), _who(base)
    if sp["ratio"] is None:
        return f"{who} cannot be compared with {ref}: {comp['basis_reason']}."
    r, ci = sp["ratio"], sp["ci"]
    n_a, n_b = base["stats"]["runs"], other["stats"]["runs"]
    where = (("within these runs" if n_a == n_b == 1 else "within the runs") if sp["within_run"]
             else f"over {n_a} and {n_b} runs")

    def interval(lo_hi) -> str:
        return f" (95 % CI {lo_hi[0]:.2f}–{lo_hi[1]:.2f} {where})" if lo_hi else " (too few steps for an interval)"

    per = " per sample" if comp["basis"] == "sample" else ""
    if sp["claim"] == "faster":
        head = f"{who} is {r:.2f}× faster{per} than {ref}{interval(ci)}"
    elif sp["claim"] == "slower":
        head = f"{who} is {1 / r:.2f}× slower{per} than {ref}{interval([1 / ci[1], 1 / ci[0]])}"
    else:
        head = f"{who} is not measurably faster or slower than {ref}{per}: {r:.2f}×{interval(ci)}"
        if ci and sp["noise_floor"]:
            head += (f"; with one run each, changes under {sp['noise_floor']:.0%} are run-to-run noise — "
                     "repeat each run (RUN1,RUN2,...) to resolve it")
    parts = [head]
    if base["data_wait_share"] is not None and other["data_wait_share"] is not None:
        parts.append(f"data wait {_pct(base['data_wait_share'])} → {_pct(other['data_wait_share'])}")
    for c in comp["metrics"]:
        if c["name"] == comp.get("primary_metric") or c["better"] is False:
            parts.append(metric_phrase(c))
    parts += [f"{m} is not a finite number in {who if m in other['nonfinite'] else ref}" for m in comp["nonfinite"]]
    return ", ".join(parts) + "."


def compare_variants(groups: list[list[dict]], problems: list[str]) -> dict:
    """Compares variants; the first is the baseline A.

    Args:
        groups: per variant, the :func:`run_summary` of each of its runs (several: repeated runs of
            one configuration, which give intervals that include run-to-run variation).
        problems: what was left out while loading (kept first in the result's ``problems``).
    Returns the ``whyidle.compare/1`` dict: ``runs`` (per variant: :func:`summarize_variant`
    without bootstrap internals; ``label`` is its letter A, B, ... and ``name`` the run's
    name, or its directory when names repeat), ``comparable`` (False when no variant could be
    compared with A), ``comparisons`` (per other variant: ``{"run", "basis"`` (``"step"``,
    ``"sample"`` or None), ``"basis_reason"``, ``"speedup"``
    (:func:`whyidle.analysis.compare.speedup`), ``"metrics"``
    (:func:`whyidle.analysis.compare.metric_change` of each metric both logged), ``"nonfinite"``
    (metrics logged as NaN/inf by either side), ``"primary_metric"``, ``"statement"``}),
    ``problems`` (runs left out, runs of one variant that differ, confounded runs, metrics
    logged by one side only).
    Errors: :class:`CompareError` when fewer than two variants are given (26 at most are used).
    """
    problems = list(problems)
    groups = [g for g in groups[:MAX_VARIANTS] if g]
    if len(groups) < 2:
        raise CompareError("nothing to compare: " + ("; ".join(problems) if problems else "give at least two run directories")
                           + (f" ({len(groups)} usable run)" if groups else ""))
    seeds = np.random.SeedSequence(cmp.SEED).spawn(len(groups))  # independent resamples per variant
    variants = [summarize_variant(g, np.random.default_rng(seq)) for g, seq in zip(groups, seeds)]
    names = [v["name"] for v in variants]
    for letter, v, g in zip(_LETTERS, variants, groups):
        v["label"] = letter
        if names.count(v["name"]) > 1:  # e.g. every run of train.py is called "train"
            v["name"] = os.path.basename(os.path.normpath(v["run_dir"]))
        if len({(r["script"], r["batch_size"]) for r in g}) > 1:
            problems.append(f"{letter}: its runs differ in script or batch size; compared as one variant anyway")
        problems += [f"{letter}: {d}: {text}" for d, text in v["confounded"]]
        problems += [f"{letter}: {p}" for r in g for p in r["problems"]]
    base = variants[0]
    comparisons = []
    for other in variants[1:]:
        basis, reason = cmp.comparison_basis(base, other)
        sp = cmp.speedup(base["stats"], other["stats"], basis) if basis else {"ratio": None, "ci": None, "metric": None}
        common = sorted(set(base["metrics"]) & set(other["metrics"]))
        for name in sorted(set(base["metrics"]) ^ set(other["metrics"])):
            where = other["label"] if name in other["metrics"] else base["label"]
            problems.append(f"metric {name!r} was logged in {where} only; not compared")
        base["nonfinite"] = [n for n in common if base["metrics"][n] is None]
        other["nonfinite"] = [n for n in common if other["metrics"][n] is None]
        changes = [c for c in (cmp.metric_change(n, base["metrics"][n], other["metrics"][n], base["metrics_n"].get(n),
                                                 other["metrics_n"].get(n)) for n in common) if c]
        comp = {"run": other["label"], "basis": basis, "basis_reason": reason, "speedup": sp, "metrics": changes,
                "nonfinite": sorted(set(base["nonfinite"]) | set(other["nonfinite"])),
                "primary_metric": cmp.primary_metric([c["name"] for c in changes])}
        comp["statement"] = statement(base, other, comp)
        comparisons.append(comp)
    for v in variants:
        v["stats"] = {k: val for k, val in v["stats"].items() if not k.startswith("_")}
        v.pop("nonfinite", None)
    return {"schema": SCHEMA, "baseline": base["label"], "runs": variants, "comparisons": comparisons,
            "comparable": any(c["speedup"]["ratio"] is not None for c in comparisons),
            "ci_level": cmp.CI_LEVEL, "bootstrap_resamples": cmp.BOOTSTRAP_RESAMPLES, "problems": problems}
