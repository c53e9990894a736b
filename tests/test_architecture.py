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


#: The small shared modules at the bottom (``../shared/DESIGN.md``, "Architecture"): every layer may
#: read them and they read no layer.
SHARED = ("whyidle.vocab", "whyidle.mounts", "whyidle.cmdline", "whyidle.redact", "whyidle.jsonsafe", "whyidle.gcpause")
LAYERS = ("whyidle.cli", "whyidle.pipeline", "whyidle.tune", "whyidle.run", "whyidle.report", "whyidle.env",
          "whyidle.diagnose", "whyidle.analysis", "whyidle.instrument", "whyidle.sampling", "whyidle.record",
          "whyidle.export", "whyidle.demo")


def _imports_of_top(name: str) -> set[str]:
    with open(os.path.join(PACKAGE, name), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("whyidle"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("whyidle"))
    return found


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_analysis_and_diagnosis_never_import_the_recording_side():
    """The vocabularies the instrument writes and the analysis reads (tracker names, region kinds,
    file-system classes) live in :mod:`whyidle.vocab` and :mod:`whyidle.mounts`, not upstairs."""
    for folder in ("analysis", "diagnose"):
        bad = {mod: sorted(m for m in mods if _under(m, ("whyidle.instrument", "whyidle.env", "whyidle.run",
                                                         "whyidle.tune", "whyidle.cli")))
               for mod, mods in imports_of(folder).items()}
        assert not {k: v for k, v in bad.items() if v}, folder


def test_the_pipeline_never_imports_the_runner():
    """``whyidle.run.session`` calls the pipeline; the pipeline must not call back (no cycle)."""
    assert not [m for m in _imports_of_top("pipeline.py") if _under(m, ("whyidle.run", "whyidle.tune", "whyidle.cli"))]


def test_the_instrument_reads_only_records_and_shared_modules():
    """The agent runs inside the user's program: it never loads the analysis, the rules, the
    renderers or ``whyidle env`` (whose package imports all of them)."""
    allowed = ("whyidle.instrument", "whyidle.record") + SHARED
    bad = {mod: sorted(m for m in mods if m != "whyidle" and not _under(m, allowed))
           for mod, mods in imports_of("instrument").items()}
    assert not {k: v for k, v in bad.items() if v}


def test_shared_modules_import_no_layer():
    for name in SHARED:
        path = name.split(".")[1] + ".py"
        bad = sorted(m for m in _imports_of_top(path) if _under(m, LAYERS))
        assert not bad, (name, bad)
