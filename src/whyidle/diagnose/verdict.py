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


def held_seconds(finding: dict, training_s: float | None) -> float:
    """Seconds of the job a finding's cause holds: a whole-job finding's ``evidence.part_s``
    (rules_job.py), a step finding's ``bound`` × the training steps' seconds; without time
    accounting (``training_s`` None, traces) the ``bound`` itself, so the two never mix."""
    part_s = (finding.get("evidence") or {}).get("part_s")
    bound = finding.get("bound") or 0.0
    if training_s is None:
        return bound
    return part_s if part_s is not None else bound * training_s


def choose_verdict(findings: list[dict], judged: bool = True, training_s: float | None = None) -> str | None:
    """The verdict id for ``findings`` (report-contract dicts with ``bound``), or None when the
    verdict is ``device_bound`` (the caller adds that finding). ``judged``: enough steps were seen
    to judge the step; without, the verdict is ``"unknown"`` unless a placement finding is
    critical. With ``training_s`` (the training steps' seconds, whole-job accounting) findings are
    compared by the seconds they hold (:func:`held_seconds`): evaluation that takes 70 % of the
    wall time outranks an input wait of 80 % of steps that take 20 % of it. Ties go to the higher
    severity, then to the earlier finding."""
    placement = [f for f in findings if f["id"] in PLACEMENT and f["severity"] == "critical"]
    if placement:
        return placement[0]["id"]
    if not judged:
        return "unknown"
    candidates = limiting(findings)
    if not candidates:
        return None
    return min(candidates, key=lambda f: (-held_seconds(f, training_s), _SEVERITY_RANK[f["severity"]]))["id"]


#: Findings whose cause is paid once per launch (the program's set-up before its first step, which
#: holds the first compilations too): their seconds stay the same however long the job runs, so in a
#: longer run their share of it shrinks. ``recompiles`` is not one of them: a recompilation comes
#: back with every new shape, for as long as the job runs.
ONE_TIME = ("startup_bound",)


def steady_verdict(findings: list[dict], verdict: str, training_s: float | None) -> str | None:
    """The verdict a longer run of the same job would get, when this run's verdict leads only
    because the run was short; else None.

    That is when ``verdict`` is a one-time part (:data:`ONE_TIME`: the same seconds at every
    launch) and another finding qualifies as a verdict on its own (:func:`limiting`: warning or
    critical, ``bound`` ≥ ``VERDICT_MIN_BOUND``, e.g. an input wait holding 49 % of every step):
    that finding's seconds grow with the run while the one-time part's do not, so the verdict
    rule (:func:`choose_verdict`, by held seconds) applied without the one-time parts names what
    the job is limited by once it runs for long. None when nothing else qualifies (the one-time
    part is then all there is to fix) or the verdict is not a one-time part.

    Args:
        findings: report-contract dicts with ``bound`` (share of the step, or of the wall time for
            whole-job findings) and ``evidence.part_s`` (seconds) for whole-job ones.
        verdict: the run's verdict id (:func:`choose_verdict`).
        training_s: the training steps' seconds, as for :func:`choose_verdict`.
    """
    if verdict not in ONE_TIME:
        return None
    rest = [f for f in findings if f["id"] not in ONE_TIME]
    steady = choose_verdict(rest, judged=True, training_s=training_s)
    return steady if steady not in (None, "unknown") else None


def order(findings: list[dict], verdict: str) -> list[dict]:
    """Findings in report order: the verdict's first, then by severity, then by ``bound`` (the
    measured share), then by ``est_speedup``."""
    ranked = sorted(findings, key=lambda f: (_SEVERITY_RANK[f["severity"]], -(f.get("bound") or 0.0),
                                             -(f.get("est_speedup") or 0.0)))
    return sorted(ranked, key=lambda f: f["id"] != verdict)
