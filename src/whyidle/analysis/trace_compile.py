"""torch.compile in a PyTorch profiler (Kineto) trace: compiled regions, compilations, graph breaks.

Pure and vectorized like :mod:`whyidle.analysis.trace` (columns of
:class:`~whyidle.record.trace_data.TraceData` in, a plain dict out; loops run over the string
table, frames and compilations, never over events). Times in the trace are µs; every ``*_s`` is
seconds, every share a fraction 0–1; None means the trace cannot tell.

What PyTorch writes (read in torch 2.13's source and in traces it wrote on CPU; older forms from
excerpts of earlier versions' public source):

* **Compiled regions.** Dynamo wraps each run of a frame's compiled code in a ``cpu_op``
  ``Torch-Compiled Region: F/C`` (``torch/_dynamo/convert_frame.py``: ``"Torch-Compiled Region: "
  + str(compile_id)``; ``CompileId.__str__`` in ``torch/_guards.py``): ``F`` is the frame id (one
  per Python code object dynamo converted), ``C`` the frame's compile id (0 for its first
  compilation, 1 for the first recompilation, ...). Under compiled autograd the id reads
  ``!A/F/C`` or ``!A``. Older versions (about 2.1–2.3) wrote a bare ``Torch-Compiled Region``
  (``eval_frame.c``): no frame, no compile id; traces of earlier ones hold only the graphs.
  Before each run dynamo checks its guards: ``TorchDynamo Cache Lookup``.
* **Graphs.** AOTAutograd runs a compiled forward as the autograd function ``CompiledFunction``
  and its backward as ``CompiledFunctionBackward`` (2.0 on); inductor's graph call is
  ``## Call CompiledFxGraph <key> ##`` (recent versions).
* **Compilations**, when the profiler was on during one: ``dynamo_timed`` sections, named
  ``<key> (dynamo_timed)`` since 2.0 (``_compile.<locals>.compile_inner``, later
  ``_compile.compile_inner``, ``OutputGraph.call_user_compiler``, ``compile_fx_inner``,
  ``backward._backward_impl`` for the lazy backward compile, ...), and since ~2.6 also the phase
  names ``dynamo``, ``entire_frame_compile``, ``entire_backward_compile``, ``backend_compile``,
  ``inductor_compile``, ``code_gen``, with zero-length ``<phase>_data: ..., compile_id=F/C``
  annotations inside naming the compile id.

Definitions:

* **Basis** (``basis``, ``basis_s``): the ``ProfilerStep`` windows (``"steps"``) when the trace
  has them, else the span of the host events (``"trace"``). Shares are of ``basis_s``.
* ``region_share``: length of the union (over all host threads) of compiled regions and graph
  calls inside the basis / ``basis_s`` — host time in compiled code (the GPU work it launched
  may run later).
* **Compile work**: the union of the compile events' intervals (``compile_s`` in the whole
  trace, ``compile_in_basis_s`` inside the basis), each disjoint interval of one kind: ``frame``
  (a frame's compilation: it holds ``dynamo``, ``entire_frame_compile`` or ``compile_inner``),
  ``backward`` (a lazy backward compilation, in the first backward of a new graph), ``other``
  (what follows a compilation, such as inductor's autotuning, ``CachingAutotuner.
  benchmark_all_configs``, at the graph's first run). Its compile id: that of the first ``*_data:
  ... compile_id=`` annotation starting inside it; else for a frame's compilation that of the
  first compiled region starting within :data:`REGION_AFTER_COMPILE_US` after it ends (dynamo
  runs the new code right away); else for the others the id of the interval before them.
  ``compile_count``: frame compilations.
* **Recompilations**: compile work whose compile id is ``F/C`` with ``C`` ≥ 1, and compile work
  without a known id that starts in a ``ProfilerStep`` after the first traced one (a later
  compilation of a frame never compiled before — an evaluation model first called then — is
  ``F/0`` when ids are known, and not counted). ``recompile_count``: such frame compilations;
  ``recompile_s``: the union of all such work in the basis. Frames running under more than one
  compile id within the basis had been recompiled (maybe before the trace began:
  ``frames[].compile_ids``).
* **Graph breaks**: a compiled region that starts inside another one on the same thread: the
  outer frame's code left its graph and re-entered compiled code (the resume function dynamo
  made after a graph break, or a function called from the eager part). ``broken_share``: the
  share of the outermost regions (in the basis) that hold at least one; ``per_step``: nested
  regions per ``ProfilerStep``. ``island_s``: time inside those outer regions outside the nested
  regions, the graph calls and the compilations (the eager code between the graphs, and dynamo's
  glue: guard checks, the resume call), when each
  of those outer regions holds a graph call (``CompiledFunction``, inductor's call), else None
  (``backend="eager"`` marks no graph); ``eager_ops``: the ``aten::`` ops that start there, by count.
"""

from __future__ import annotations

import re

import numpy as np

from whyidle.analysis.trace import _Cover
from whyidle.record.trace_data import TraceData

REGION_PREFIX = "Torch-Compiled Region"
CACHE_LOOKUP = "TorchDynamo Cache Lookup"
#: AOTAutograd's autograd.Function of a compiled graph (forward, backward) and inductor's call.
GRAPH_NAMES = ("CompiledFunction", "CompiledFunctionBackward")
FX_GRAPH_PREFIX = "## Call CompiledFxGraph"
#: Compile events: every ``dynamo_timed`` section, and the phases torch ≥ 2.6 also writes.
COMPILE_SUFFIX = " (dynamo_timed)"
COMPILE_PHASES = ("dynamo", "entire_frame_compile", "entire_backward_compile", "backend_compile",
                  "inductor_compile", "code_gen")
#: Compile events of a backward graph's compilation (lazy, in the first backward, in recent versions)
#: and of a frame's compilation (which may compile the backward too, as older AOTAutograd did):
#: a compilation holding the first and none of the second is a backward compilation.
BACKWARD_MARKS = ("entire_backward_compile", "backward._backward_impl", "bw_compiler")
FRAME_MARKS = ("entire_frame_compile", "compile_inner", "dynamo_data")

#: A forward compilation without a ``compile_id`` annotation takes the id of the compiled region
#: that starts at most this long after it ends (µs): dynamo runs the code it just made at once
#: (146 µs later in a torch 2.13 CPU trace); 5 ms leaves room for a slow host.
REGION_AFTER_COMPILE_US = 5000.0

#: Compilations listed in ``compiles`` (longest first), eager ops in ``graph_breaks.eager_ops``.
MAX_LISTED = 20

_ID = re.compile(r"^(.*)/(\d+)$")
_DATA_ID = re.compile(r"compile_id=([^,\s]+)")


def parse_compile_id(text: str | None) -> tuple[str | None, int | None]:
    """``(frame, compile number)`` of a dynamo compile id: ``"0/3"`` → ``("0", 3)``, compiled
    autograd's ``"!1/0/3"`` → ``("!1/0", 3)``, ``"!1"`` → ``("!1", None)``; ``None``, ``""`` or
    ``"Unknown"`` → ``(None, None)``."""
    if not text or text == "Unknown":
        return None, None
    m = _ID.match(text)
    if m:
        return m.group(1), int(m.group(2))
    return text, None


def _region_id(name: str) -> str | None:
    """The compile id written after ``Torch-Compiled Region: `` (None for the bare form)."""
    rest = name[len(REGION_PREFIX):]
    return rest[2:].strip() or None if rest.startswith(": ") else None


def _in_windows(ts: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each time, the index of the window ``[a, b)`` (sorted by ``a``) holding it and a mask."""
    if len(a) == 0 or len(ts) == 0:
        return np.full(len(ts), -1), np.zeros(len(ts), dtype=bool)
    j = np.searchsorted(a, ts, side="right") - 1
    inside = (j >= 0) & (ts < b[np.maximum(j, 0)])
    return np.where(inside, j, -1), inside


def compile_metrics(t: TraceData, step_bounds: tuple[np.ndarray, np.ndarray]) -> dict | None:
    """torch.compile as the trace shows it (module docstring), or None when the trace holds no
    compiled region, graph call or compile event (torch.compile not used, or not profiled).

    Args:
        t: one rank's trace.
        step_bounds: ``(starts, ends)`` of its ``ProfilerStep`` windows in µs, sorted by start.

    Returns ``{basis, basis_s, steps, regions, cache_lookups, graph_calls (CompiledFunction,
    CompiledFunctionBackward, CompiledFxGraph: counts), graph_calls_per_step (forward graphs per
    step when the trace names no region, as before torch 2.1; else None), region_s, region_share,
    frames, compile_s, compile_in_basis_s, compile_share, compile_count (frame compilations),
    compile_work ({frame, backward, other}: intervals of each kind), compiles (frame compilations:
    the :data:`MAX_LISTED` longest, by start), recompile_count (frame recompilations), recompile_s,
    recompile_work_s (seconds of backward and other work of recompiled ids), recompile_share,
    recompiled_frames, last_recompile_step (its ProfilerStep number), steps_after_last_recompile,
    graph_breaks}``: ``frames`` ``[{frame,
    compile_ids (running in the basis), calls, calls_per_step, compiled_ids (compiled in the trace),
    never_ran (compiled in the trace, never run as a region)}]`` (empty when the regions carry no
    id); ``compiles`` ``[{compile_id, frame, number, kind, step, start_s (from the first host
    event), dur_s, recompile}]``; ``graph_breaks`` ``{nested, outer, broken_share, per_step,
    frames ({outer frame: [nested frames]}), island_s, island_share, eager_ops}`` or None when no
    region is nested."""
    S, cpu = t.strings, t.cpu
    region_ids = {i: _region_id(s) for i, s in enumerate(S) if s.startswith(REGION_PREFIX)}
    graph_ids = np.array([i for i, s in enumerate(S) if s in GRAPH_NAMES or s.startswith(FX_GRAPH_PREFIX)],
                         dtype=np.int64)
    compile_ids = _compile_names(S)
    if not region_ids and not len(graph_ids) and not len(compile_ids):
        return None
    data_ids = {i: _DATA_ID.search(s).group(1) for i, s in enumerate(S)
                if "_data: " in s and _DATA_ID.search(s)}
    backward_ids = np.array([i for i, s in enumerate(S) if any(m in s for m in BACKWARD_MARKS)], dtype=np.int64)
    frame_ids = np.array([i for i, s in enumerate(S) if s in ("dynamo", "_compile (dynamo_timed)")
                          or any(m in s for m in FRAME_MARKS)], dtype=np.int64)
    name, ts = cpu["name"], cpu["ts"]
    end = ts + np.maximum(cpu["dur"], 0)
    tid = cpu["tid"]

    # basis: the steps, else the span of the host events
    a, b = step_bounds
    if len(a):
        basis, basis_a, basis_b = "steps", a, b
    elif len(ts):
        basis, basis_a, basis_b = "trace", np.array([ts.min()]), np.array([end.max()])
    else:
        basis, basis_a, basis_b = "trace", np.zeros(0), np.zeros(0)
    basis_us = float((basis_b - basis_a).sum())

    def share(us: float) -> float | None:
        return us / basis_us if basis_us > 0 else None

    def in_basis_us(starts, ends) -> float:
        return float(_Cover(starts, ends).between(basis_a, basis_b).sum()) if len(basis_a) else 0.0

    # compiled regions and graph calls
    rm = np.isin(name, np.array(list(region_ids), dtype=np.int64))
    gm = np.isin(name, graph_ids)
    cm = np.isin(name, compile_ids)
    if not (rm.any() or gm.any() or cm.any()):  # the names belong to other kinds of events
        return None
    r_ts, r_end, r_tid, r_name = ts[rm], end[rm], tid[rm], name[rm]
    code_us = in_basis_us(np.concatenate([r_ts, ts[gm]]), np.concatenate([r_end, end[gm]]))
    _, r_in = _in_windows(r_ts, basis_a, basis_b)
    step_j, _ = _in_windows(r_ts, a, b)
    n_steps = len(a)
    graph_calls = {"CompiledFunction": 0, "CompiledFunctionBackward": 0, "CompiledFxGraph": 0}
    if gm.any():
        g_names, g_counts = np.unique(name[gm], return_counts=True)
        for i, c in zip(g_names.tolist(), g_counts.tolist()):
            key = "CompiledFxGraph" if S[i].startswith(FX_GRAPH_PREFIX) else S[i]
            graph_calls[key] += int(c)

    # compilations: disjoint intervals of the compile events
    c_s, c_e = compile_intervals(t)
    compile_us = float((c_e - c_s).sum())
    compile_in_us = in_basis_us(c_s, c_e)
    dm = np.isin(name, np.array(list(data_ids), dtype=np.int64))
    d_ts, d_name = ts[dm], name[dm]
    d_k, d_in = _in_windows(d_ts, c_s, c_e)
    is_frame = _holds(ts[np.isin(name, frame_ids)], c_s, c_e)
    is_backward = _holds(ts[np.isin(name, backward_ids)], c_s, c_e) & ~is_frame
    first_data = np.full(len(c_s), -1, dtype=np.int64)
    order = np.flatnonzero(d_in)[::-1]  # the first annotation of each compilation wins
    first_data[d_k[order]] = d_name[order]
    # a frame's compilation without annotation: the region that starts right after it
    r_order = np.argsort(r_ts, kind="stable")
    nxt = np.searchsorted(r_ts[r_order], c_e, side="left")
    t0 = float(ts.min()) if len(ts) else 0.0
    step_of, _ = _in_windows(c_s, a, b)
    work = []
    cid = None
    for k in range(len(c_s)):  # one row per compilation interval (tens to hundreds)
        kind = "frame" if is_frame[k] else "backward" if is_backward[k] else "other"
        if first_data[k] >= 0:
            cid = data_ids[int(first_data[k])]
        elif kind == "frame":
            cid = None
            if nxt[k] < len(r_order) and r_ts[r_order[nxt[k]]] - c_e[k] <= REGION_AFTER_COMPILE_US:
                cid = region_ids[int(r_name[r_order[nxt[k]]])]
        # else: the work that follows a compilation (its lazy backward, autotuning at the first
        # run) keeps the id of the interval before it
        frame, number = parse_compile_id(cid)
        j = int(step_of[k])
        work.append({
            "compile_id": cid, "frame": frame, "number": number, "kind": kind,
            "step": int(t.steps[j][0]) if j >= 0 else None, "start_s": (float(c_s[k]) - t0) / 1e6,
            "dur_s": float(c_e[k] - c_s[k]) / 1e6,
            "recompile": bool((number is not None and number >= 1) or (cid is None and j > 0)),
        })
    compiles = [w for w in work if w["kind"] == "frame"]
    re_mask = np.array([w["recompile"] for w in work], dtype=bool)
    recompile_us = in_basis_us(c_s[re_mask], c_e[re_mask]) if re_mask.any() else 0.0
    recompile_count = sum(1 for c in compiles if c["recompile"])
    last = max((k for k, w in enumerate(work) if w["recompile"]), default=None)
    last_j = int(step_of[last]) if last is not None else -1

    # frames: compile ids running in the basis, compiled in the trace
    frames = []
    parsed = {i: parse_compile_id(cid) for i, cid in region_ids.items()}
    by_frame: dict[str, dict] = {}
    if len(r_name):
        u, cnt = np.unique(r_name[r_in], return_counts=True)
        for i, c in zip(u.tolist(), cnt.tolist()):  # one row per region name
            frame, number = parsed[i]
            if frame is None:
                continue
            row = by_frame.setdefault(frame, {"frame": frame, "compile_ids": set(), "calls": 0})
            row["calls"] += int(c)
            if number is not None:
                row["compile_ids"].add(number)
    for c in compiles:
        if c["frame"] is not None:
            row = by_frame.setdefault(c["frame"], {"frame": c["frame"], "compile_ids": set(), "calls": 0})
            row.setdefault("compiled", set()).add(c["number"])
    for frame in sorted(by_frame, key=lambda f: (len(f), f)):
        row = by_frame[frame]
        compiled = sorted(n for n in row.pop("compiled", set()) if n is not None)
        frames.append({"frame": frame, "compile_ids": sorted(row["compile_ids"]), "calls": row["calls"],
                       "calls_per_step": row["calls"] / n_steps if n_steps else None,
                       "compiled_ids": compiled,
                       "never_ran": [n for n in compiled if n not in row["compile_ids"]
                                     and not _ran_anywhere(frame, n, parsed, r_name)]})
    recompiled = [f["frame"] for f in frames if len(f["compile_ids"]) > 1 or any(n >= 1 for n in f["compiled_ids"])]

    listed = sorted(compiles, key=lambda c: -c["dur_s"])[:MAX_LISTED]
    return {
        "basis": basis, "basis_s": basis_us / 1e6, "steps": n_steps,
        "regions": int(rm.sum()), "cache_lookups": int((name == _index(S, CACHE_LOOKUP)).sum()),
        "graph_calls": graph_calls,
        "graph_calls_per_step": (graph_calls["CompiledFunction"] / n_steps
                                 if n_steps and not region_ids else None),
        "region_s": code_us / 1e6, "region_share": share(code_us),
        "frames": frames,
        "compile_s": compile_us / 1e6, "compile_in_basis_s": compile_in_us / 1e6,
        "compile_share": share(compile_in_us), "compile_count": len(compiles),
        "compile_work": {k: sum(1 for w in work if w["kind"] == k) for k in ("frame", "backward", "other")},
        "compiles": sorted(listed, key=lambda c: c["start_s"]),
        "recompile_work_s": sum(w["dur_s"] for w in work if w["recompile"] and w["kind"] != "frame"),
        "recompile_count": recompile_count, "recompile_s": recompile_us / 1e6,
        "recompile_share": share(recompile_us), "recompiled_frames": recompiled,
        "last_recompile_step": int(t.steps[last_j][0]) if last_j >= 0 else None,
        "steps_after_last_recompile": n_steps - 1 - last_j if last_j >= 0 else None,
        "graph_breaks": _graph_breaks(t, r_ts, r_end, r_tid, r_name, r_in, step_j, parsed, gm, (c_s, c_e), basis_us),
    }


def _compile_names(strings: list[str]) -> np.ndarray:
    return np.array([i for i, s in enumerate(strings) if s.endswith(COMPILE_SUFFIX) or s in COMPILE_PHASES],
                    dtype=np.int64)


def compile_intervals(t: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """The trace's torch.compile work as disjoint, sorted ``(starts, ends)`` in µs: the union of
    its compile events over all host threads (module docstring); empty arrays without any."""
    m = np.isin(t.cpu["name"], _compile_names(t.strings))
    cover = _Cover(t.cpu["ts"][m], t.cpu["ts"][m] + np.maximum(t.cpu["dur"][m], 0))
    return cover.s, cover.e


def _index(strings: list[str], s: str) -> int:
    try:
        return strings.index(s)
    except ValueError:
        return -2


def _ran_anywhere(frame: str, number: int, parsed: dict, r_name: np.ndarray) -> bool:
    ids = [i for i, p in parsed.items() if p == (frame, number)]
    return bool(ids) and bool(np.isin(r_name, ids).any())


def _graph_breaks(t: TraceData, r_ts, r_end, r_tid, r_name, r_in, step_j, parsed: dict, gm: np.ndarray,
                  compiles: tuple[np.ndarray, np.ndarray], basis_us: float) -> dict | None:
    """Nested compiled regions (module docstring), or None when none is nested."""
    n = len(r_ts)
    if n < 2:
        return None
    order = np.lexsort((-r_end, r_ts, r_tid))  # per thread by start, the longer first on ties
    s_ts, s_end, s_tid = r_ts[order], r_end[order], r_tid[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = s_tid[1:] == s_tid[:-1]
    # running reach of the earlier regions of the same thread (reset at each thread)
    reach = np.full(n, -np.inf)
    starts = np.flatnonzero(~same)
    for k, st in enumerate(starts):  # one pass per thread
        stop = starts[k + 1] if k + 1 < len(starts) else n
        seg = np.maximum.accumulate(s_end[st:stop])
        reach[st + 1:stop] = seg[:-1]
    nested_sorted = s_ts < reach
    nested = np.zeros(n, dtype=bool)
    nested[order] = nested_sorted
    if not (nested & r_in).any():
        return None
    # the outermost region holding each nested one: the last outer one starting before it (same thread)
    outer_idx = np.flatnonzero(~nested)
    outer_of = np.full(n, -1)
    for tid_ in np.unique(r_tid):  # one pass per thread
        oi = outer_idx[r_tid[outer_idx] == tid_]
        oi = oi[np.argsort(r_ts[oi], kind="stable")]
        qi = np.flatnonzero(nested & (r_tid == tid_))
        k = np.searchsorted(r_ts[oi], r_ts[qi], side="right") - 1
        outer_of[qi] = np.where(k >= 0, oi[np.maximum(k, 0)], -1)
    broken = np.zeros(n, dtype=bool)
    broken[outer_of[nested & (outer_of >= 0)]] = True
    outer_in = ~nested & r_in
    pairs: dict[str, set] = {}
    for o, q in zip(outer_of[nested & (outer_of >= 0)].tolist(), np.flatnonzero(nested & (outer_of >= 0)).tolist()):
        fo, fq = parsed[int(r_name[o])][0], parsed[int(r_name[q])][0]
        if fo is not None and fq is not None:  # at most one pair per nested region: few
            pairs.setdefault(fo, set()).add(fq)
    # eager islands: broken outer regions minus nested regions, graph calls and compilations (the
    # resume function's first compilation runs inside the outer region)
    cpu = t.cpu
    c_end = cpu["ts"] + np.maximum(cpu["dur"], 0)
    bo = broken & r_in
    o_a, o_b = r_ts[bo], r_end[bo]
    inner = _Cover(np.concatenate([r_ts[nested], cpu["ts"][gm], compiles[0]]),
                   np.concatenate([r_end[nested], c_end[gm], compiles[1]]))
    gaps = (o_b - o_a) - inner.between(o_a, o_b)
    has_graph = _holds(cpu["ts"][gm], *_sorted(o_a, o_b))
    island_us = float(np.maximum(gaps, 0).sum()) if len(o_a) and has_graph.all() else None
    # aten ops starting in the islands
    aten = np.array([i for i, s in enumerate(t.strings) if s.startswith("aten::")], dtype=np.int64)
    am = np.isin(cpu["name"], aten)
    _, a_in = _in_windows(cpu["ts"][am], *_sorted(o_a, o_b))
    a_ts = cpu["ts"][am][a_in]
    _, covered = _in_windows(a_ts, inner.s, inner.e)  # inside a nested region, graph call or compilation
    names = cpu["name"][am][a_in][~covered]
    u, cnt = np.unique(names, return_counts=True)
    top = np.argsort(-cnt, kind="stable")[:MAX_LISTED]
    nested_in = nested & r_in
    return {
        "nested": int(nested_in.sum()), "outer": int(outer_in.sum()),
        "broken_share": float((broken & r_in).sum()) / float(outer_in.sum()) if outer_in.any() else None,
        "per_step": float(nested_in.sum()) / len(t.steps) if t.steps else None,
        "steps_with_breaks": int(len(np.unique(step_j[nested & (step_j >= 0)]))) if t.steps else None,
        "frames": {k: sorted(v, key=lambda f: (len(f), f)) for k, v in pairs.items()},
        "island_s": island_us / 1e6 if island_us is not None else None,
        "island_share": island_us / basis_us if island_us is not None and basis_us > 0 else None,
        "eager_ops": [{"op": t.strings[int(u[i])], "count": int(cnt[i])} for i in top],
    }


def _holds(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each window ``[a, b)`` (sorted by ``a``), whether one of ``points`` lies in it."""
    k, inside = _in_windows(points, a, b)
    out = np.zeros(len(a), dtype=bool)
    out[k[inside]] = True
    return out


def _sorted(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(a, kind="stable")
    return a[o], b[o]
