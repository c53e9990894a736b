"""The one verdict rule, for live runs, Keras runs and profiler traces alike.

A verdict is a claim about where the time went, so it is chosen by measured time, never by what
a fix can give on this machine: among the warning/critical findings whose ``bound`` (the measured
fraction of the step, or of the traced time, that their cause explains) is at least
``VERDICT_MIN_BOUND``, the largest ``bound`` wins. ``gpu_not_visible`` / ``wrong_device`` when
critical come first (the GPU does no work at all). ``device_bound`` only when no finding qualifies.
"""

from __future__ import annotations

from whyidle.diagnose import thresholds as T

#: Findings that mean the GPU cannot or does not do the work; they are the verdict when critical.
PLACEMENT = ("gpu_not_visible", "wrong_device")
_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def limiting(findings: list[dict]) -> list[dict]:
    """The findings that may be the verdict: warning/critical with ``bound`` ≥ ``VERDICT_MIN_BOUND``."""
    return [f for f in findings if f["severity"] != "info" and (f.get("bound") or 0.0) >= T.VERDICT_MIN_BOUND]


def choose_verdict(findings: list[dict], judged: bool = True) -> str | None:
    """The verdict id for ``findings`` (report-contract dicts with ``bound``), or None when the
    verdict is ``device_bound`` (the caller adds that finding). ``judged``: enough steps were seen
    to judge the step; without, the verdict is ``"unknown"`` unless a placement finding is
    critical. Ties on ``bound`` go to the higher severity, then to the earlier finding."""
    placement = [f for f in findings if f["id"] in PLACEMENT and f["severity"] == "critical"]
    if placement:
        return placement[0]["id"]
    if not judged:
        return "unknown"
    candidates = limiting(findings)
    if not candidates:
        return None
    return min(candidates, key=lambda f: (-(f.get("bound") or 0.0), _SEVERITY_RANK[f["severity"]]))["id"]


def order(findings: list[dict], verdict: str) -> list[dict]:
    """Findings in report order: the verdict's first, then by severity, then by ``bound`` (the
    measured share), then by ``est_speedup``."""
    ranked = sorted(findings, key=lambda f: (_SEVERITY_RANK[f["severity"]], -(f.get("bound") or 0.0),
                                             -(f.get("est_speedup") or 0.0)))
    return sorted(ranked, key=lambda f: f["id"] != verdict)
