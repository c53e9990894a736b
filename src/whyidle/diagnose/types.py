"""The typed shape of a finding: what :func:`whyidle.diagnose.rules.finding` builds and every
renderer reads. Findings stay plain dicts at run time (they are the report's JSON,
``docs/report.md``), so these are ``TypedDict`` declarations a type checker holds the rules to.
"""

from __future__ import annotations

from typing import TypedDict


class FixOption(TypedDict):
    """One way to fix a finding's cause, ranked for the machine that ran the job."""

    text: str
    code: str | None
    #: Step-time ratio (old / new) this option gives on this machine; None: cannot be estimated.
    est_speedup: float | None
    #: When the option gains more, or when it applies (e.g. "with ≥ 8 cores"); None: always.
    condition: str | None
    #: True where ``est_speedup`` rests on an assumption ``condition`` states ("a 2× cheaper sample"):
    #: ranked with the options that cannot be estimated.
    assumed: bool


class Fix(TypedDict):
    """The printed fix: ``text``, ``code`` in the user's API, ``docs`` (URLs), the ranked ``options``."""

    text: str
    code: str | None
    docs: list[str]
    options: list[FixOption]


class Finding(TypedDict):
    """One finding of the report (``whyidle.report/1``, docs/report.md).

    ``bound``: the measured fraction (0–1) of the step (traces: of the traced time) the cause
    explains; ``est_speedup_if_removed`` = 1/(1 − bound); ``est_speedup``: what the printed fix gives
    on this machine (None: cannot be estimated). ``severity``: ``info``, ``warning`` or ``critical``.
    """

    id: str
    severity: str
    title: str
    summary: str
    evidence: dict
    bound: float | None
    est_speedup_if_removed: float | None
    est_speedup: float | None
    fix: Fix


def fix_option(text: str, est_speedup: float | None, condition: str | None = None,
               code: str | None = None, assumed: bool = False) -> FixOption:
    """One fix option of a finding: ``text`` what to do, ``est_speedup`` its step-time ratio on this
    machine (None: unknown), ``condition`` when it gains more (or when it applies), ``code``;
    ``assumed``: the estimate rests on an assumption ``condition`` states (a 2× cheaper sample)."""
    return {"text": text, "code": code, "est_speedup": round(est_speedup, 3) if est_speedup is not None else None,
            "condition": condition, "assumed": assumed}
