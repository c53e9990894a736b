"""torch.compile findings from a profiler trace (``whyidle trace``): ``recompiles`` and
``graph_breaks``, the ids live runs use. Pure: reads ``metrics["compile"]``
(:func:`whyidle.analysis.trace_compile.compile_metrics`). A trace shows when compiled code ran
and when a compilation ran, never why: the guard that failed or the line that broke the graph
is not in it, so the findings say how to get those (``TORCH_LOGS``) instead of guessing.
"""

from __future__ import annotations

from whyidle.diagnose.rules import _pct, finding
from whyidle.diagnose.rules import speedup_if_removed as _speedup

#: Share of the traced time in recompilations (or in the eager code between broken graphs) that
#: makes a finding a warning / critical: as ``DATA_WAIT_WARN``/``_CRITICAL``, removing it would
#: gain at least 1.11× (about the run-to-run noise of a shared machine) / 1.33×.
COMPILE_WARN = 0.10
COMPILE_CRITICAL = 0.25

#: Traced steps without any compilation after the last recompilation from which the
#: recompilations count as settled (warm-up: automatic dynamic shapes recompile once per new
#: dynamic dimension, then reuse the dynamic graph): the finding is info, whatever their share.
SETTLED_STEPS = 5

#: torch._dynamo.config.recompile_limit's default (``cache_size_limit`` before 2.6): compilations
#: of one frame past it are not made; the frame runs eagerly for inputs its graphs do not fit.
DEFAULT_RECOMPILE_LIMIT = 8

#: A frame is "broken" in the trace when at least this share of its runs in the traced time held a
#: nested compiled region (a resume function after a graph break): once is chance, most runs is the code.
BROKEN_MIN_SHARE = 0.5

DOCS_RECOMPILES = "https://pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html"
DOCS_TROUBLESHOOTING = "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html"

RECOMPILES_CODE = ("# a few fixed lengths: pad each batch up to its bucket\n"
                   "x = torch.nn.functional.pad(x, (0, bucket_len - x.shape[-1]))\n"
                   "# or mark the varying dimension dynamic before the first call\n"
                   "torch._dynamo.mark_dynamic(x, 1)\n"
                   "# or\n"
                   "model = torch.compile(model, dynamic=True)")


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.1f} ms"


def _times(n: float) -> str:
    if n == 1:
        return "once"
    return f"{n:.0f} times" if float(n).is_integer() else f"{n:.1f} times"


def _where(c: dict) -> str:
    return "steps" if c.get("basis") == "steps" else "trace"


def _severity(share: float | None) -> str:
    if share is None or share < COMPILE_WARN:
        return "info"
    return "critical" if share >= COMPILE_CRITICAL else "warning"


def recompiles(m: dict) -> dict | None:
    """Recompilations seen in the trace: compilations of a compile id ``F/C`` with ``C`` ≥ 1 (or
    without an id, in a ProfilerStep after the first), or a frame running more than one compile id
    in the traced time (recompiled, maybe before the trace began). ``bound`` = the traced time the
    recompilations (forward and their lazy backward compilations) hold; warning from
    :data:`COMPILE_WARN`, critical from :data:`COMPILE_CRITICAL`, info below, when no
    compilation is in the trace, or when the last one is followed by :data:`SETTLED_STEPS` traced
    steps without any. ``est_speedup`` = 1/(1 − bound): the recompilations gone (bucketed lengths
    leave a few compilations, paid once); null when settled (a one-time cost in a longer run).
    None when the trace shows no recompilation."""
    c = m.get("compile") or {}
    several = [f for f in c.get("frames") or [] if len(f.get("compile_ids") or []) > 1]
    count = c.get("recompile_count") or 0
    if not count and not several and not (c.get("recompile_s") or 0):
        return None
    seen = bool(count or (c.get("recompile_s") or 0) > 0)  # compilations in the trace, not only their results
    share = c.get("recompile_share") if seen else None
    after = c.get("steps_after_last_recompile")
    settled = seen and after is not None and after >= SETTLED_STEPS
    where = _where(c)
    rows = [x for x in c.get("compiles") or [] if x.get("recompile")]
    parts = []
    if seen:
        ids = ", ".join((x["compile_id"] or "id not recorded")
                        + (f" in ProfilerStep#{x['step']}" if x.get("step") is not None else "")
                        for x in rows[:6]) + (", …" if max(len(rows), count) > 6 else "")
        bw = (f" with the work that follows {'it' if count == 1 else 'them'} (backward compilation, autotuning)"
              if c.get("recompile_work_s") else "")
        parts.append(f"{count} recompilation{'s' if count != 1 else ''} in the trace ({ids}): "
                     f"{_s(c.get('recompile_s'))}{bw} in the traced {where}, {_pct(share)} of them.")
    for f in several[:3]:
        ids = f["compile_ids"]
        parts.append(f"Frame {f['frame']} ran {len(ids)} different compiled graphs ({f['frame']}/{ids[0]} … "
                     f"{f['frame']}/{ids[-1]}): it was compiled again for inputs (shapes, dtypes) or state "
                     "(train/eval, a Python value) that its earlier graphs' guards rejected"
                     + ("" if seen else ", before the trace began (no compilation is in the trace)") + ".")
    limit = [(f["frame"], n) for f in c.get("frames") or [] for n in f.get("never_ran") or []
             if n >= DEFAULT_RECOMPILE_LIMIT]
    for frame, n in limit[:2]:
        parts.append(f"Compilation {frame}/{n} never ran: most likely dynamo stopped at the frame's recompile_limit "
                     f"(default {DEFAULT_RECOMPILE_LIMIT}) and runs the frame eagerly for inputs its graphs do not "
                     "fit.")
    if settled:
        parts.append(f"None after ProfilerStep#{c.get('last_recompile_step')} ({after} traced steps compiled nothing): "
                     "a warm-up cost if it stays so.")
    parts.append("The trace does not record why (the guard that failed): TORCH_LOGS=recompiles prints it.")
    severity = "info" if settled or not seen else _severity(share)
    return finding(
        "recompiles", severity, "Recompilations: torch.compile compiles again during training", " ".join(parts),
        {"source": "trace", "count": count, "recompile_s": c.get("recompile_s"),
         "share": round(share, 4) if share is not None else None, "basis": c.get("basis"),
         "compiles": rows[:10], "frames": several, "recompile_limit_frames": [f for f, _ in limit],
         "last_recompile_step": c.get("last_recompile_step"), "steps_after_last_recompile": after,
         "settled": settled},
        _speedup(share) if share and not settled else None,
        "Keep the shapes the compiled code sees few: pad or bucket variable lengths to a few sizes, mark the varying "
        "dimension dynamic before the first call (torch._dynamo.mark_dynamic), or compile with dynamic=True; "
        "TORCH_LOGS=recompiles names the guard that failed.",
        RECOMPILES_CODE, [DOCS_RECOMPILES, DOCS_TROUBLESHOOTING], bound=share)


def graph_breaks(m: dict) -> dict | None:
    """Graph breaks seen in the trace: compiled regions nested in another (dynamo's resume
    function after a break, entered from the eager part of the outer frame) in at least
    :data:`BROKEN_MIN_SHARE` of the outer regions of the traced time, and at least twice.
    ``bound`` = the time in the eager code between the graphs (``island_share``); warning from
    :data:`COMPILE_WARN`, critical from :data:`COMPILE_CRITICAL`, info below or when that time
    cannot be told (no graph-call events). ``est_speedup`` = 1/(1 − bound). None otherwise: a few
    compiled regions per step side by side are separately compiled modules, not breaks."""
    c = m.get("compile") or {}
    gb = c.get("graph_breaks") or {}
    if (gb.get("nested") or 0) < 2 or (gb.get("broken_share") or 0) < BROKEN_MIN_SHARE:
        return None
    share = gb.get("island_share")
    where = _where(c)
    pairs = "; ".join(f"frame {o} → {', '.join(q)}" for o, q in (gb.get("frames") or {}).items())
    pairs = pairs or "frames not named"
    ops = gb.get("eager_ops") or []
    per = f"{_times(gb['per_step'])} per ProfilerStep" if gb.get("per_step") is not None else _times(gb["nested"])
    summary = (f"The compiled code leaves its graph and re-enters compiled code {per} ({pairs}; in "
               f"{_pct(gb.get('broken_share'))} of the outer frame's runs): a graph break, each a separate graph with "
               "eager Python between them. ")
    if share is not None:
        summary += (f"The eager code between the graphs takes {_s(gb.get('island_s'))}, {_pct(share)} of the "
                    f"traced {where}")
        listed = ", ".join("%s (%d)" % (o["op"], o["count"]) for o in ops[:4])
        summary += f"; its ops: {listed}. " if ops else ". "
    else:
        summary += "Its time cannot be told apart from the graphs' own (no graph-call events: backend='eager'?). "
    item = any(o["op"] in ("aten::item", "aten::_local_scalar_dense") for o in ops)
    if item:
        summary += "aten::item there is a tensor read into Python (.item(), int(t), a branch on a tensor). "
    summary += "The trace does not show the line that breaks: TORCH_LOGS=graph_breaks prints each with its reason."
    fix = ("Remove the break: " + ("take the .item() (or the branch on a tensor value) out of the compiled code — "
                                   "read it every N steps outside, or keep it a tensor; " if item else "")
           + "replace Python branches on tensor values with torch.where or torch.cond, move print/logging and "
             "unsupported calls out of the compiled function, and find each break with torch.compile(..., "
             "fullgraph=True) or TORCH_LOGS=graph_breaks.")
    return finding(
        "graph_breaks", _severity(share), "Graph breaks: the compiled model runs in pieces", summary,
        {"source": "trace", "nested_regions": gb.get("nested"), "per_step": gb.get("per_step"),
         "broken_share": gb.get("broken_share"), "frames": gb.get("frames"), "island_s": gb.get("island_s"),
         "share": round(share, 4) if share is not None else None, "eager_ops": ops[:10],
         "steps_with_breaks": gb.get("steps_with_breaks")},
        _speedup(share) if share else None, fix,
        "model = torch.compile(model, fullgraph=True)  # raises at the first graph break, with its line\n"
        "# TORCH_LOGS=graph_breaks python train.py     # or list them all",
        [DOCS_TROUBLESHOOTING], bound=share)


def compile_findings(m: dict) -> list[dict]:
    """The torch.compile findings of one rank's metrics (empty without torch.compile)."""
    if not m.get("compile"):
        return []
    return [f for f in (recompiles(m), graph_breaks(m)) if f]
