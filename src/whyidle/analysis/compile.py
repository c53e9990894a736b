"""torch.compile in a run: compile time, recompilations, the recompile limit, graph breaks (pure).

Reads the records of :mod:`whyidle.instrument.compile` (``compile``, ``compile_frame``,
``compile_limit``, ``compile_summary``) and :mod:`whyidle.instrument.torch`'s ``compile_call``.

- A compilation's number comes from its Dynamo compile id ``"F/C"`` (``F`` the frame, ``C`` 0 for
  its first compilation, 1 for the first recompilation; ``"F/C_A"`` a restarted attempt): ``C > 0``
  is a **recompilation**. Seconds are the compile callbacks' intervals (forward conversion and a
  lazily compiled backward of the same id together).
- **Start-up compile**: first compilations (``C == 0``) that end before the end of the first
  training step; every other compilation (recompilations anywhere, a frame first compiled later,
  an evaluation model's) is the ``compile`` part of the wall time
  (:func:`whyidle.analysis.accounting.time_accounting`).
- **Compile steps**: training steps that overlap a compilation; the steady shares leave them out
  (:func:`whyidle.analysis.steps.select_steps`).
- **Recompile limit**: Dynamo's warning (``compile_limit`` record) or its ``unimplemented`` counter
  "recompile limit exceeded": the frame runs eagerly from then on. Step time before (the compiled
  steps that hold no compilation) and after are compared.
- **Graph breaks**: the resume functions Dynamo made (``torch_dynamo_resume_in_<fn>_at_<line>``,
  from ``compile_frame`` records, with the summary's per-name counts: how many compilations broke
  there), each one a break at that line of the compiled function; reasons from the summary's ``graph_break`` / ``unimplemented``
  counters (the text names the line where Dynamo's message does).
"""

from __future__ import annotations

import re
import statistics

from whyidle.analysis import stacks
from whyidle.analysis.facts import CompileFacts
from whyidle.analysis.steps import in_spans as overlaps

RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+)_at_(?P<line>\d+)$")
#: A guard failure on a size: ``tensor 'x' size mismatch at index 1`` (2.13), ``tensor 'L['x']' ...``
#: (before: the tensor's guard source, quotes inside).
SIZE_REASON = re.compile(r"tensor '(?P<tensor>.+?)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)")
#: A guard source's local: ``L['x']`` is the argument ``x``.
LOCAL = re.compile(r"^L\['(?P<name>[^']+)'\]")
#: The function in Dynamo's recompile-limit warning: ``'forward' (/path/train.py:12)``.
FUNC_INFO = re.compile(r"^'(?P<fn>[^']+)' \((?P<file>.+):(?P<line>\d+)\)$")
LIMIT_TEXT = ("recompile limit", "cache_size_limit", "cache size limit")
#: Reasons and sites kept per list.
MAX_ITEMS = 6


def compile_number(cid: str | None) -> tuple[str | None, int | None]:
    """``(frame, recompile number)`` of a Dynamo compile id ``"F/C"`` / ``"F/C_A"`` (compiled
    autograd's ``"!A/F/C"`` keeps its last two fields); ``(None, None)`` when absent or unreadable."""
    if not cid:
        return None, None
    fields = str(cid).split("/")
    if len(fields) < 2:
        return None, None
    frame, c = fields[-2], fields[-1].split("_")[0]
    return (frame, int(c)) if c.isdigit() else (frame, None)


def intervals(records: list[dict]) -> list[dict]:
    """The ``compile`` records as ``{"t0", "t1", "id", "frame", "n", "trig", "main"}`` in time order
    (``n`` the recompile number, None when unknown)."""
    out = []
    for r in records:
        if r.get("k") == "compile" and isinstance(r.get("t0"), int) and isinstance(r.get("t1"), int):
            frame, n = compile_number(r.get("id"))
            out.append({"t0": r["t0"], "t1": r["t1"], "id": r.get("id"), "frame": frame, "n": n, "trig": r.get("trig"),
                        "main": r.get("main") is not False})
    return sorted(out, key=lambda c: c["t0"])


def training_intervals(comps: list[dict], first_end: int | None) -> list[tuple[int, int]]:
    """The compilations that are the ``compile`` part (module docstring) as ``(t0, t1)`` ns:
    recompilations, and first compilations that end after ``first_end`` (the first step's end; None:
    no steps, everything is start-up)."""
    if first_end is None:
        return []
    return [(c["t0"], c["t1"]) for c in comps if (c["n"] or 0) > 0 or c["t1"] > first_end]


def _reason_groups(frames: list[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for f in frames:
        text = f.get("reason")
        if not text:
            continue
        m = SIZE_REASON.search(text)
        tensor = LOCAL.sub(r"\g<name>", m["tensor"]) if m else None
        key = f"{tensor}:{m['what']}:{m['dim']}" if m else text.split("\n")[0][:160]
        g = groups.setdefault(key, {"text": (f"{m['what']} of tensor '{tensor}' changed at dimension {m['dim']}"
                                             if m else key),
                                    "tensor": tensor, "dim": int(m["dim"]) if m else None,
                                    "example": text.split("\n")[0][:200], "count": 0})
        g["count"] += 1
    return sorted(groups.values(), key=lambda g: -g["count"])[:MAX_ITEMS]


def _site(f: dict) -> str | None:
    if not f.get("file"):
        return None
    return f"{f['file']}:{f.get('line')} {f.get('fn')}"


def compile_facts(records: list[dict], steps: list, source_root: str | None = None) -> CompileFacts | None:
    """The run's torch.compile facts, or None when nothing was compiled.

    Args:
        records: the training process's records.
        steps: its steps in order (``t0``/``t1`` ns, warm-up included), possibly empty.
        source_root: the run's working directory, to read the ``torch.compile`` call's line (``call.code``).
    Returns: :class:`whyidle.analysis.facts.CompileFacts` (seconds; counts).
    """
    comps = intervals(records)
    frames = [r for r in records if r.get("k") == "compile_frame"]
    call = next((r for r in records if r.get("k") == "compile_call"), None)
    summary = next((r for r in reversed(records) if r.get("k") == "compile_summary"), None)
    if not comps and not frames and call is None:
        return None
    first_end = int(steps[0]["t1"]) if steps else None
    spans = training_intervals(comps, first_end)
    total = sum((c["t1"] - c["t0"]) / 1e9 for c in comps)
    in_training = sum((b - a) / 1e9 for a, b in spans)
    recomp = [c for c in comps if (c["n"] or 0) > 0]
    # per frame: the recompilations, their seconds and reasons (frames named by their compile_frame record)
    by_frame: dict[str, dict] = {}
    named = {compile_number(f.get("id"))[0]: f for f in frames if compile_number(f.get("id"))[1] == 0}
    for c in recomp:
        f = named.get(c["frame"]) or {}
        e = by_frame.setdefault(c["frame"], {"frame": f.get("fn") or f"frame {c['frame']}", "site": _site(f),
                                             "count": 0, "seconds": 0.0, "ids": set()})
        e["seconds"] += (c["t1"] - c["t0"]) / 1e9
        e["ids"].add(c["id"])
    for key, e in by_frame.items():
        e["count"] = len(e.pop("ids"))
        e["reasons"] = _reason_groups([f for f in frames if compile_number(f.get("id"))[0] == key])
    if not comps:  # old PyTorch without callbacks: the metrics' own seconds, recompilations by frame
        for f in frames:
            if f.get("reason"):
                e = by_frame.setdefault(_site(f) or f.get("fn"), {"frame": f.get("fn"), "site": _site(f),
                                                                  "count": 0, "seconds": 0.0, "of": []})
                e["count"] += 1
                e["seconds"] += f.get("s") or 0.0
                e["of"].append(f)
        for e in by_frame.values():
            e["reasons"] = _reason_groups(e.pop("of"))
    every = list(by_frame.values())
    recompiles = sorted(every, key=lambda e: -e["seconds"])[:MAX_ITEMS]

    compile_steps = [s for s in steps if overlaps(s, [(c["t0"], c["t1"]) for c in comps])]
    return {
        "compilations": len({c["id"] for c in comps if c["id"]}) or len(frames),
        "total_s": total,
        "startup_s": max(0.0, total - in_training),
        "training_s": in_training,
        "recompilations": sum(e["count"] for e in every),
        "recompile_s": sum(e["seconds"] for e in every),
        "recompiles": recompiles,
        "limit": _limit(records, summary, steps, comps),
        "breaks": _breaks(frames, summary),
        "compile_steps": len(compile_steps),
        "cudagraph_recordings": len([c for c in comps if c["trig"] == "CUDAGRAPH_RECORDING"]),
        "call": dict({k: call.get(k) for k in ("site", "dynamic", "mode", "backend", "fullgraph")},
                     code=stacks.source_line(call["site"], source_root) if call.get("site") else None) if call else None,
        "observed": bool(comps),
    }


def _limit(records: list[dict], summary: dict | None, steps: list, comps: list[dict]) -> dict | None:
    hit = next((r for r in records if r.get("k") == "compile_limit"), None)
    counted = sum(u["count"] for u in (summary or {}).get("unsupported") or ()
                  if any(t in (u.get("reason") or "").lower() for t in LIMIT_TEXT))
    if hit is None and not counted:
        return None
    fn = FUNC_INFO.match((hit or {}).get("fn") or "")
    hit_ = hit or {}
    out = {"frame": fn["fn"] if fn else hit_.get("fn"), "limit": hit_.get("limit"), "reason": hit_.get("reason"),
           "hits": max(counted, 1), "steps_after": None, "compiled_step_s": None, "eager_step_s": None}
    if hit is None or not steps:
        return out
    t = int(hit["t"])
    spans = [(c["t0"], c["t1"]) for c in comps]
    before = [(s["t1"] - s["t0"]) / 1e9 for s in steps if int(s["t1"]) <= t and not overlaps(s, spans)][1:]
    after = [(s["t1"] - s["t0"]) / 1e9 for s in steps if int(s["t0"]) >= t and not overlaps(s, spans)]
    out["steps_after"] = len(after)
    out["eager_step_s"] = statistics.median(after) if after else None
    out["compiled_step_s"] = statistics.median(before) if len(before) >= 3 else None
    return out


def _breaks(frames: list[dict], summary: dict | None) -> list[dict]:
    """Graph-break sites: one per resume function, with the calls Dynamo counted and the reasons."""
    resumes = (summary or {}).get("resumes") or {}
    sites: dict[str, dict] = {}
    for f in frames:
        m = RESUME.match(f.get("fn") or "")
        if not m:
            continue
        site = f"{f.get('file')}:{m['line']} {m['fn']}"
        sites.setdefault(site, {"site": site, "function": m["fn"], "line": int(m["line"]), "file": f.get("file"),
                                "resumes": int(resumes.get(f["fn"], 0)), "reasons": []})
    reasons = [r for r in ((summary or {}).get("breaks") or []) + ((summary or {}).get("unsupported") or [])
               if not any(t in (r.get("reason") or "").lower() for t in LIMIT_TEXT)]
    for e in sites.values():
        mine = [r for r in reasons if f"line {e['line']}" in (r.get("reason") or "")]
        e["reasons"] = [_first_line(r["reason"]) for r in (mine or (reasons if len(sites) == 1 else []))][:3]
    return sorted(sites.values(), key=lambda e: -e["resumes"])[:MAX_ITEMS]


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n")[0][:200]
