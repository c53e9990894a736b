"""torch.compile findings: ``recompiles``, ``recompile_limit``, ``graph_breaks``.

Facts from :func:`whyidle.analysis.compile.compile_facts` (the compiler's own callbacks, metrics
and counters). ``recompiles`` and ``recompile_limit`` are whole-job findings like those of
:mod:`whyidle.diagnose.rules_job`: ``bound`` is a share of the command's wall time,
``evidence.part_s`` the seconds the verdict compares, ``est_speedup`` a wall-time ratio.
``graph_breaks`` is a step finding: ``bound`` is the share of the steady step that the eager code
at the breaks took (stack samples at the breaking lines): a lower bound of what the breaks cost,
since the fusion lost across a break is not measured (``fullgraph=True`` or ``whyidle tune`` says).
"""

from __future__ import annotations

import os
import re

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import finding, fix_option
from whyidle.diagnose.rules_job import wall_gain
from whyidle.diagnose.types import Finding

DOCS_RECOMPILE = "https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html#recompilation"
DOCS_DYNAMIC = "https://docs.pytorch.org/docs/stable/torch.compiler_dynamic_shapes.html"
DOCS_BREAKS = "https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html#graph-breaks"


def _short(site: str | None) -> str:
    if not site:
        return "the compiled function"
    path, _, rest = site.partition(":")
    return f"{os.path.basename(path)}:{rest}"


def _sev(share: float, warn: float, critical: float) -> str:
    return "critical" if share >= critical else ("warning" if share >= warn else "info")


def _compile_call(code: str | None, dynamic: str) -> str | None:
    """The program's ``torch.compile(...)`` line as written with its ``dynamic=`` argument set to
    ``dynamic`` (``"True"``) or removed (``""``): its variable names, backend and mode kept; a
    removed argument's text is kept in a comment. None when the line holds no ``compile(`` call."""
    if not code:
        return None
    at = code.find("compile(")
    if at < 0:
        return None
    depth, i = 0, at + len("compile")
    for i in range(at + len("compile"), len(code)):
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        if depth == 0:
            break
    else:
        return None  # the call goes on past this line
    args = code[at + len("compile(") : i]
    m = re.search(r"(,\s*)?\bdynamic\s*=\s*([^,()]+(?:\([^()]*\))?)", args)
    if m:
        was = m.group(2).strip()
        if dynamic:
            new_args = args[:m.start(2)] + dynamic + args[m.end(2):]
        else:
            new_args = (args[:m.start()] + args[m.end():]).strip().strip(",").strip()
        comment = f"   # was dynamic={was}"
    elif dynamic:
        new_args, comment = f"{args.rstrip()}, dynamic={dynamic}" if args.strip() else f"dynamic={dynamic}", ""
    else:
        return None
    return code[:at + len("compile(")] + new_args + code[i:] + comment


def _dim_fix(c: dict, reasons: list[dict], gain: float | None, one_s: float) -> tuple[str, str, list]:
    """``(text, code, options)`` that stop the recompilations, in the program's own ``torch.compile``
    line; ``options`` as ``(kind, text, code, est_speedup)``. ``gain``: the wall-time ratio without
    the recompilations; ``one_s``: one recompilation's seconds (the default ``dynamic=None`` still
    recompiles once, so dropping ``dynamic=False`` gains less)."""
    call = c.get("call") or {}
    size = next((r for r in reasons if r.get("tensor") and r.get("dim") is not None), None)
    where = f" (torch.compile at {_short(call['site'])})" if call.get("site") else ""
    frame = (c.get("recompiles") or [{}])[0]
    opts = []
    if size is None and reasons:  # a guard on a value, not a size: dynamic shapes do not help
        text = (f"Dynamo guards on a value that changes between calls ({reasons[0]['example']}): keep it a tensor "
                "inside the compiled code (no .item() / float() on it, or pass it as a tensor argument), so one "
                "graph serves every value.")
        return text, None, [("value", text, None, gain)]
    if size is not None:
        t, d = size["tensor"], size["dim"]
        var = t if t.isidentifier() else "x"  # Dynamo's name of an input may be an expression (args[0])
        mark = (f"torch._dynamo.mark_dynamic({var}, {d})   # before each call of the compiled model: "
                f"{_short(frame.get('site'))} receives it as {t}")
        opts.append(("mark_dynamic", f"Mark dimension {d} of `{t}` dynamic before each call of the compiled model "
                                     f"(torch._dynamo.mark_dynamic): one compilation serves every size.", mark, gain))
    dyn_code = _compile_call(call.get("code"), "True") or "model = torch.compile(model, dynamic=True)"
    opts.append(("dynamic", f"Compile with dynamic shapes from the start{where}: dynamic=True (every size "
                            "dimension symbolic; kernels may be a little slower than static ones).", dyn_code, None))
    if call.get("dynamic") is False:  # dynamic=False recompiles for every new size (and ignores mark_dynamic)
        drop = _compile_call(call.get("code"), "") or "model = torch.compile(model)   # was dynamic=False"
        opts.insert(1 if size is not None else 0,
                    ("drop", f"Remove dynamic=False{where}: with it every new size recompiles; with the default "
                             "Dynamo makes the dimension dynamic after its first change (one recompilation left).",
                     drop, None))
        if size is not None:  # the mark needs the default dynamic: both changes together
            kind, text, mark, est = opts[0]
            opts[0] = (kind, f"Remove dynamic=False{where} and mark dimension {size['dim']} of `{size['tensor']}` "
                             "dynamic before each call (torch._dynamo.mark_dynamic): one compilation serves every "
                             "size.", f"{drop}\n{mark}", est)
    opts.append(("bucket", "Pad the inputs to a few fixed lengths (buckets: round each batch's length up to a "
                           "multiple of 64, or sort by length and pad per bucket): one compilation per bucket and "
                           "static kernels, at the cost of the padding's compute.", None, None))
    return opts[0][1], opts[0][2], opts


#: Why a fix option has no estimate of its own. Every size dimension symbolic (``dynamic=True``)
#: saves the recompilations but can make each step slower than one marked dimension: measured on the
#: 2-core box, tests/scenarios/compile_varlen.py under aot_eager ran its 200 steps in 5.0-5.6 s with
#: dynamic=True against 4.1-4.9 s with the default (one recompilation) and mark_dynamic(x, 1).
_CONDITIONS = {"dynamic": "saves the recompilations (≈{gain:.2f}×) but makes every size symbolic: steps may get "
                          "slower; whyidle tune measures it",
               "bucket": "padding adds compute: whyidle tune measures it"}


def recompiles(facts: RunFacts) -> Finding | None:
    """torch.compile recompiled during the job (``recompilations`` ≥ 1): the recompilations' seconds
    as a share of the wall time (``COMPILE_WARN_SHARE`` warning, ``COMPILE_CRITICAL_SHARE``
    critical, else info), their reasons grouped (which tensor and dimension) and the fix that makes
    that dimension dynamic (``mark_dynamic``, ``dynamic=True``), or drops ``dynamic=False``."""
    c = facts.compile
    if not c or not c["recompilations"] or not facts.time:
        return None
    wall = facts.time["wall_s"]
    saved = c["recompile_s"]
    share = saved / wall if wall > 0 else 0.0
    sev = _sev(share, T.COMPILE_WARN_SHARE, T.COMPILE_CRITICAL_SHARE)
    top = c["recompiles"][0]
    reasons = top.get("reasons") or []
    why = "; ".join(f"{r['text']} ({r['count']}×)" for r in reasons[:3]) or "reason not recorded by this PyTorch"
    gain = wall_gain(facts, saved)
    one = saved / max(1, c["recompilations"])
    text, code, opts = _dim_fix(c, reasons, gain, one)
    options = [fix_option(t, est if k != "drop" else wall_gain(facts, max(0.0, saved - one)),
                          _CONDITIONS.get(k, "").format(gain=gain) or None, code=cd) for k, t, cd, est in opts]
    summary = (f"torch.compile recompiled `{top['frame']}` ({_short(top.get('site'))}) {c['recompilations']} "
               f"time{'s' if c['recompilations'] != 1 else ''}: {saved:.1f} s, {share:.0%} of the wall time, "
               f"because the input changed: {why}.")
    evidence = {"part_s": round(saved, 3), "share_of_wall": round(share, 4), "recompilations": c["recompilations"],
                "frames": c["recompiles"], "compile_s": round(c["total_s"], 3), "call": c.get("call"),
                "limit_hit": bool(c.get("limit"))}
    return finding("recompiles", sev, "torch.compile recompiles", summary, evidence, gain, text, code,
                   docs=[DOCS_RECOMPILE, DOCS_DYNAMIC], bound=share, options=options)


def recompile_limit(facts: RunFacts) -> Finding | None:
    """A compiled frame hit ``torch._dynamo.config.recompile_limit`` and runs eagerly since (silent
    in PyTorch but for one log line). ``bound``: the steps since, times their extra seconds over
    the compiled steps before (medians), as a share of the wall time, when both were measured;
    otherwise the finding says so (warning, no bound)."""
    c = facts.compile
    lim = (c or {}).get("limit")
    if not lim or not facts.time:
        return None
    wall = facts.time["wall_s"]
    eager, comp, n = lim.get("eager_step_s"), lim.get("compiled_step_s"), lim.get("steps_after") or 0
    lost = n * (eager - comp) if eager and comp and eager > comp else None
    share = lost / wall if lost and wall > 0 else None
    frame = lim.get("frame") or (c["recompiles"][0]["frame"] if c["recompiles"] else "a compiled function")
    limit = lim.get("limit") or "8"
    reasons = c["recompiles"][0].get("reasons") if c["recompiles"] else []
    gain = wall_gain(facts, lost) if lost else None
    text, code, opts = _dim_fix(c, reasons or [], gain, 0.0)
    if eager and comp and eager > comp:
        measured = f" Steps since take {eager * 1e3:.1f} ms against {comp * 1e3:.1f} ms compiled ({eager / comp:.2f}×, {n} steps)."
    elif eager and comp:
        measured = (f" Steps since ({eager * 1e3:.1f} ms) are not slower than the compiled ones measured before "
                    f"({comp * 1e3:.1f} ms) here.")
    else:
        measured = (" The compiled steps before could not be timed apart from their compilations: whyidle tune "
                    "measures the fix." if n else "")
    summary = (f"`{frame}` hit torch._dynamo's recompile limit ({limit}) after {c['recompilations']} "
               f"recompilations and runs eagerly (uncompiled) from then on.{measured}")
    options = [fix_option(t, gain if k in ("mark_dynamic", "drop", "value") else None,
                          _CONDITIONS.get(k, "").format(gain=gain or 1.0) or None, code=cd) for k, t, cd, _e in opts]
    evidence = {"part_s": round(lost, 3) if lost else 0.0, "limit": limit, "frame": frame,
                "steps_after": n, "eager_step_s": eager, "compiled_step_s": comp, "reason": lim.get("reason")}
    sev = "warning" if share is None else _sev(share, T.COMPILE_WARN_SHARE, T.COMPILE_CRITICAL_SHARE)
    if sev == "info":
        sev = "warning"  # the program believes it runs compiled: always worth saying
    return finding("recompile_limit", sev, "torch.compile gave up: the model runs eagerly", summary, evidence, gain,
                   text, code, docs=[DOCS_RECOMPILE], bound=share, options=options)


def graph_breaks(facts: RunFacts) -> Finding | None:
    """Dynamo split a compiled function at graph breaks (resume functions recorded): each break
    runs the code at its line eagerly, every call. ``bound``: the stack samples of the steady steps'
    forward whose program line is a breaking line, over the step time (``BREAK_WARN_SHARE`` makes
    it a warning); the fusion lost across breaks is not in it."""
    c = facts.compile
    if not c or not c["breaks"]:
        return None
    sampled = facts.hotspots or {}
    step_s = (facts.step or {}).get("step_time_s", {}).get("mean") if facts.step else None
    island = 0.0
    sites = []
    for b in c["breaks"]:
        key = (os.path.basename(b.get("file") or ""), b["line"])
        secs = sum(h.get("seconds") or 0.0 for phase in ("forward", "backward", "other")
                   for h in sampled.get(phase) or () if _line_of(h.get("site")) == key)
        island += secs
        sites.append(dict(b, seconds=round(secs, 4)))
    total = sum((s["t1"] - s["t0"]) / 1e9 for s in facts.analyzed_steps or ()) or None
    share = island / total if total else 0.0
    sev = "warning" if share >= T.BREAK_WARN_SHARE else "info"
    b0 = sites[0]
    reason = (b0.get("reasons") or ["reason not recorded"])[0]
    n = len(sites)
    text, code = _break_fix(reason, b0)
    summary = (f"Dynamo splits the compiled `{b0['function']}` at {n} graph break{'s' if n != 1 else ''} "
               f"(first at {_short(b0['site'])}: {reason}); the code at the breaks runs eagerly on every call"
               + (f", {share:.0%} of the step" if share >= 0.005 else "")
               + (f" ({step_s * 1e3:.1f} ms steps)" if step_s else "")
               + ". Fusion across a break is lost as well (not measured).")
    evidence = {"breaks": sites, "island_share": round(share, 4), "island_s": round(island, 4)}
    return finding("graph_breaks", sev, "Graph breaks split the compiled model", summary, evidence,
                   1.0 / (1.0 - min(share, 0.9)) if share else None, text, code, docs=[DOCS_BREAKS], bound=share)


def _line_of(site: str | None) -> tuple[str, int] | None:
    if not site:
        return None
    path, _, rest = site.partition(":")
    line = rest.split(" ")[0]
    return (os.path.basename(path), int(line)) if line.isdigit() else None


def _break_fix(reason: str, site: dict) -> tuple[str, str | None]:
    """The rewrite for a break's reason: ``.item()`` out of the compiled region, a tensor branch
    as ``torch.where``/``torch.cond``, else ``fullgraph=True`` to list every break."""
    low = reason.lower()
    where = _short(site.get("site"))
    if "item()" in low or "capture_scalar" in low:
        return (f"Keep the value a tensor at {where}: use it in tensor ops instead of `.item()` (or move the "
                ".item() out of the compiled model, after the step); or set "
                "torch._dynamo.config.capture_scalar_outputs = True to trace it.",
                "torch._dynamo.config.capture_scalar_outputs = True   # or: no .item() inside forward")
    if "data-dependent" in low or "branch" in low or "jump" in low:
        return (f"Make the branch at {where} branchless: `h = torch.where(cond, a, b)` computes both sides on the "
                "device, or `torch.cond(pred, true_fn, false_fn, (h,))` keeps one graph.",
                "h = torch.where(h.mean() > 0, h * 2, h)   # instead of: if h.mean() > 0: h = h * 2")
    return (f"Rewrite the code at {where} in operations Dynamo traces; compile with fullgraph=True once to list "
            "every break with its reason.", "model = torch.compile(model, fullgraph=True)   # raises at each break")


RULES = (recompiles, recompile_limit)
