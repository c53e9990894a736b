"""The start-up split: what a job did before its first training step (pure).

The ``startup`` part of :func:`whyidle.analysis.accounting.time_accounting` runs from the command's
start to the end of the first step. It is split into, in order:

- ``framework_import_s``: the command's start to the framework's import (``proc`` record ``t``):
  the interpreter, whyidle's bootstrap and the imports before the framework's (not sampled);
- ``imports_s``: sampled start-up time in imports: samples taken while a library was being
  imported (phase ``"import"``: ``importlib`` below the program's innermost line, e.g.
  ``torch._dynamo`` imported by the first ``Optimizer``), or whose program line is an ``import``
  statement;
- ``program_s``: the rest of the sampled start-up: the program's own set-up (reading, decoding or
  tokenizing a dataset, building the model), with ``program_sites``, the lines that held it;
- ``framework_s``: sampled start-up time after the program called a training framework's entry
  point (Lightning ``Trainer.fit``, HF ``Trainer.train``, Keras ``fit``: phase ``"framework"``):
  the framework's own start before its first step (a sanity check is evaluation, not this);
- ``compile_s``: torch.compile's first compilations up to the end of the first step (measured by
  the compiler's callbacks, :mod:`whyidle.analysis.compile`; their samples, phase ``"compile"``,
  are in no other item);
- ``first_step_s``: the rest of the first training step (its other one-time costs: tracing, the
  DataLoader workers' first start).

The samples are the start-up sampler's (:mod:`whyidle.instrument.startup`, phases ``"setup"`` and
``"import"``),
taken from the framework's import to the first training activity; their seconds are scaled to that
span. ``program_model_share`` is the fraction of ``program_s`` whose innermost frame builds the
model (``torch/nn/``, Keras layers, ``transformers`` model code).
"""

from __future__ import annotations

import re

from whyidle.analysis import stacks as stack_analysis
from whyidle.analysis.setup_block import anchor, setup_block

IMPORT_STATEMENT = re.compile(r"^\s*(import\s|from\s+\S+\s+import\s)")
#: Innermost frames that build the model during start-up (layers' ``__init__``, weight init).
MODEL_BUILD_LEAVES = ("torch/nn/", "keras/src/layers", "keras/src/models", "transformers/modeling_utils.py",
                      "transformers/models/")
#: Innermost frames that leave a sample out of the cache's block (:mod:`whyidle.analysis.setup_block`):
#: building the model, and the TensorFlow / Keras graph work a Keras model's construction runs.
NOT_DATA_LEAVES = MODEL_BUILD_LEAVES + ("keras/src/", "tensorflow/python/", "tf_keras/")
PROGRAM_SITES = 3


def is_import(phase: str, user_site: str | None, source_root: str | None) -> bool:
    """A start-up sample that is module loading: taken during a library's import (phase
    ``"import"``), or the program's own line an ``import`` statement."""
    if phase == "import":
        return True
    text = stack_analysis.source_line(user_site, source_root) if user_site else None
    return bool(text and IMPORT_STATEMENT.match(text))


def startup_split(records: list[dict], window: tuple[int, int], steps: list, startup_s: float,
                  source_root: str | None = None, compiles: list | None = None) -> dict | None:
    """Splits the start-up (module docstring).

    Args:
        records: the training process's records (``proc`` and ``stacks`` are read).
        window: the command's ``(t0, t1)``, monotonic ns.
        steps: the process's steps in order (``t0``/``t1`` ns); None or empty: no split.
        startup_s: the ``startup`` part's seconds; the parts below are trimmed to it (an evaluation
            before the first step takes its time, :data:`whyidle.analysis.accounting.PRIORITY`).
        source_root: the run's working directory (to read the program's lines).
        compiles: torch.compile's start-up compilations, ``(t0, t1)`` ns.
    Returns:
        ``{"framework_import_s", "imports_s", "program_s", "framework_s", "compile_s", "first_step_s", "sampled": bool,
        "program_model_share", "program_sites": [{"site", "function", "leaf", "seconds", "code"}],
        "block": ...}``: ``program_sites`` the innermost program lines, ``block`` the statements
        that ran the set-up (:func:`whyidle.analysis.setup_block.setup_block`: what a cache goes
        around, its seconds scaled like ``program_s``; None without program samples)
        (seconds; ``sampled`` false when no start-up samples were recorded: ``imports_s`` and
        ``program_s`` are then 0 and their span is left in no part), or None without steps or a
        ``proc`` record.
    """
    procs = [r["t"] for r in records if r.get("k") == "proc" and isinstance(r.get("t"), int)]
    if not steps or not procs:
        return None
    w0 = int(window[0])
    installed = max(w0, min(procs))
    s0, s1 = int(steps[0]["t0"]), int(steps[0]["t1"])
    before = (installed - w0) / 1e9
    span = max(0.0, (s0 - installed) / 1e9)
    first = max(0.0, (s1 - max(s0, installed)) / 1e9)
    in_span = sum(max(0, min(b, s0) - max(a, installed)) for a, b in compiles or ()) / 1e9
    in_first = sum(max(0, min(b, s1) - max(a, s0, installed)) for a, b in compiles or ()) / 1e9
    span, first = max(0.0, span - in_span), max(0.0, first - in_first)
    imports = program = model = framework = 0.0
    by_site: dict[str, dict] = {}
    by_anchor: dict[str, float] = {}
    for phase, user, leaf, _count, seconds, callers in stack_analysis.sampled_sites(records, {"setup", "import", "framework"}, None):
        if is_import(phase, user, source_root):
            imports += seconds
            continue
        if phase == "framework":
            framework += seconds
            continue
        program += seconds
        key = user or leaf or "(unknown)"
        entry = by_site.setdefault(key, {"site": key, "function": _function(key), "leaf": leaf, "seconds": 0.0})
        entry["seconds"] += seconds
        if any(p in (leaf or "") for p in MODEL_BUILD_LEAVES):
            model += seconds
        if any(p in (leaf or "") for p in NOT_DATA_LEAVES):
            continue  # building the model is not what a data cache goes around
        outer = anchor([user, *callers], source_root) or key
        by_anchor[outer] = by_anchor.get(outer, 0.0) + seconds
    sampled = imports + program + framework
    scale = span / sampled if sampled > 0 else 0.0
    imports_s, program_s, framework_s = imports * scale, program * scale, framework * scale
    # trim to the part's seconds: what came first stays (the import, then the set-up, then the step)
    room = max(0.0, startup_s)
    out = {}
    for name, s in (("framework_import_s", before), ("imports_s", imports_s), ("program_s", program_s),
                    ("framework_s", framework_s), ("compile_s", in_span + in_first), ("first_step_s", first)):
        out[name] = min(s, room)
        room -= out[name]
    keep = out["program_s"] / program if program > 0 else 0.0
    sites = sorted(by_site.values(), key=lambda e: -e["seconds"])[:PROGRAM_SITES]
    out["program_sites"] = [dict(e, seconds=e["seconds"] * keep,
                                 code=stack_analysis.source_line(e["site"], source_root)) for e in sites]
    block = setup_block(by_anchor, source_root)
    out["block"] = dict(block, seconds=block["seconds"] * keep) if block else None
    out["program_model_share"] = model / program if program > 0 else 0.0
    out["sampled"] = sampled > 0
    return out


def _function(site: str) -> str:
    path, _line, func = stack_analysis.split_site(site)
    return f"{path} {func}"
