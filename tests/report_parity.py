"""Report parity: what a faster reading or analysis must leave as it was (issue 35: "the reports equal
today's ... same verdict, findings and shares within 0.5 pp").

:func:`digest` keeps the parts of a report a user reads as the answer: the verdict, the finding ids
in order, the step metrics and the shares. ``tests/data/report_parity.json`` holds the digests of
the golden runs (``tests/data/runs``) and of synthetic long runs (``tests/load_run.py``: 1 ms steps,
86.4 ms steps, a CUDA run) as made before the fast paths; ``python tests/report_parity.py`` writes
it again (only when a report is meant to change).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SNAPSHOT = os.path.join(HERE, "data", "report_parity.json")
RUNS = os.path.join(HERE, "data", "runs")
#: name → (steps, step_ms, cuda) of the synthetic runs (tests/load_run.py, seed 0).
SYNTHETIC = {"load-1ms": (6_000, 1.0, False), "load-86ms": (3_000, 86.4, False), "load-cuda": (3_000, 5.0, True)}
#: Tolerances: shares (fractions) in absolute terms, 0.5 pp; every other number relative (0.1 %).
SHARE_TOL, REL_TOL = 0.005, 1e-3  # reports round to 4 significant digits

_METRICS = ("steps", "steps_analyzed", "samples_per_s", "steps_per_s", "batch_size", "detailed_steps",
            "data_wait_s_per_step", "data_cpu_share", "whyidle_share", "outside_share", "wall_s", "train_wall_s")


def digest(report: dict) -> dict:
    """The verdict, findings (id, severity, rounded bound) and step metrics of a ``whyidle.report/1``."""
    m = report["metrics"]
    return {"verdict": report["verdict"], "steady_verdict": report.get("steady_verdict"),
            "findings": [f["id"] for f in report["findings"]],
            "severities": [f["severity"] for f in report["findings"]],
            "metrics": {k: m.get(k) for k in _METRICS}, "step_time_s": m.get("step_time_s"),
            "shares": m.get("shares"), "time": {k: v for k, v in (m.get("time") or {}).items()
                                                 if isinstance(v, (int, float))}}


def reports(root: str) -> dict[str, dict]:
    """name → report of every parity run (the synthetic ones written under ``root``)."""
    sys.path.insert(0, HERE)
    import load_run
    from whyidle import pipeline
    from whyidle.report.build import build_report

    def report(run_dir: str) -> dict:
        a = pipeline.analyze_run(run_dir)
        return build_report(a.facts, a.verdict, a.findings, a.run.problems)

    out = {name: report(os.path.join(RUNS, name)) for name in sorted(os.listdir(RUNS))}
    for name, (steps, ms, cuda) in SYNTHETIC.items():
        out[name] = report(load_run.write_run(os.path.join(root, name), steps, ms, cuda))
    return out


def differences(want, got, path: str = "") -> list[str]:
    """Where ``got`` departs from ``want`` beyond the tolerances (empty when in parity)."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = [f"{path}.{k}: missing" for k in want if k not in got]
        for k in want:
            if k in got:
                out += differences(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) and not isinstance(want, bool):
        tol = SHARE_TOL if ".shares." in path else REL_TOL * max(abs(want), abs(got))
        return [] if abs(want - got) <= tol else [f"{path}: {want} → {got}"]
    return [] if want == got else [f"{path}: {want!r} → {got!r}"]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        snap = {name: digest(r) for name, r in reports(root).items()}
    with open(SNAPSHOT, "w") as f:
        json.dump(snap, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {SNAPSHOT}: {', '.join(snap)}")
