"""The stages' import rules (src/whyidle/pipeline.py docstring): renderers in ``whyidle.report``
read facts and findings, never the records or the runner; only the pipeline wires the stages."""

from __future__ import annotations

import ast
import os

import whyidle

PACKAGE = os.path.dirname(whyidle.__file__)


def imports_of(folder: str) -> dict[str, set[str]]:
    """``{module file: every whyidle module it imports}``, top-level and inside functions."""
    out = {}
    for name in sorted(os.listdir(os.path.join(PACKAGE, folder))):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(PACKAGE, folder, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("whyidle"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("whyidle"))
        out[f"{folder}/{name}"] = found
    return out


def test_renderers_never_read_records_or_the_runner():
    bad = {mod: sorted(m for m in mods if m.startswith(("whyidle.record", "whyidle.run", "whyidle.pipeline")))
           for mod, mods in imports_of("report").items()}
    assert not {k: v for k, v in bad.items() if v}


def test_analysis_and_diagnosis_never_import_renderers_or_the_runner():
    for folder in ("analysis", "diagnose"):
        bad = {mod: sorted(m for m in mods if m.startswith(("whyidle.report", "whyidle.run", "whyidle.pipeline")))
               for mod, mods in imports_of(folder).items()}
        assert not {k: v for k, v in bad.items() if v}, folder
