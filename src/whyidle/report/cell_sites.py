"""Notebook cell sites as people read them: ``"train.ipynb cell 5:28"`` → ``"train.ipynb cell 5, line 28"``.

The records and the report's evidence keep the parseable ``"<label>:<line> <function>"`` form of a
site (``whyidle.record.cells`` names a kernel's cell files ``cell N``); the words printed for a
person say ``cell N, line L``. :func:`readable_findings` rewrites the texts of the findings the
JSON report holds (summary, title, fix texts and code comments; never the evidence);
:func:`for_display` gives the terminal and HTML renderers a copy of the whole report with every
string rewritten. A report without a cell site is returned unchanged.
"""

from __future__ import annotations

import re

#: A cell site's ``cell N:L``.
CELL_SITE = re.compile(r"\bcell (\d+):(\d+)\b")

#: Keys of a finding (and of its ``fix`` and fix options) that hold text for people.
TEXT_KEYS = ("title", "summary", "text", "code", "condition")


def readable(text: str) -> str:
    """``text`` with every ``cell N:L`` written ``cell N, line L``."""
    return CELL_SITE.sub(r"cell \1, line \2", text) if "cell " in text else text


def _texts(d: dict) -> dict:
    return {k: readable(v) if k in TEXT_KEYS and isinstance(v, str) else v for k, v in d.items()}


def readable_findings(findings: list[dict]) -> list[dict]:
    """Findings whose texts (:data:`TEXT_KEYS` of the finding, its ``fix`` and each fix option)
    say ``cell N, line L``; ``evidence`` is kept as it is. New dicts where something changed."""
    out = []
    for f in findings:
        if not isinstance(f, dict):
            out.append(f)
            continue
        g = _texts(f)
        fix = f.get("fix")
        if isinstance(fix, dict):
            g["fix"] = _texts(fix)
            if isinstance(fix.get("options"), list):
                g["fix"]["options"] = [_texts(o) if isinstance(o, dict) else o for o in fix["options"]]
        out.append(g)
    return out


def _walk(obj):
    if isinstance(obj, str):
        return readable(obj)
    if isinstance(obj, list):
        return [_walk(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _walk(v) for k, v in obj.items()}
    return obj


def _has_cell_site(obj) -> bool:
    if isinstance(obj, str):
        return "cell " in obj and CELL_SITE.search(obj) is not None
    if isinstance(obj, list):
        return any(_has_cell_site(v) for v in obj)
    if isinstance(obj, dict):
        return any(_has_cell_site(v) for v in obj.values())
    return False


def for_display(report: dict) -> dict:
    """The report as the terminal and HTML show it: a copy with every string's ``cell N:L``
    written ``cell N, line L`` (evidence included), or ``report`` itself when it names no cell."""
    return _walk(report) if _has_cell_site(report) else report
