"""Trace metrics + diagnosis → the report object (``whyidle.report/1`` with ``"source": "trace"``).

The contract's keys keep their meaning: ``metrics.gpu.busy_share``/``idle_share`` are the union
of kernel, memcpy and memset intervals over the traced GPU window (HTA's definition);
``idle_s_by_cause`` maps HTA's idle breakdown onto the contract's causes (``host`` = host wait,
``launch`` = kernel wait, ``other`` = other; ``data`` and ``sync`` are null: HTA's rule does not
separate them, see ``metrics.gpu.syncs`` and ``metrics.shares.dataloader``). Several ranks add
``ranks: [{rank, metrics}]``.
"""

from __future__ import annotations

import whyidle
from whyidle.report.build import SCHEMA, _r

#: Shares of a ProfilerStep (analysis/trace.py), in the order the terminal shows them.
TRACE_SHARES = ("dataloader", "kernel", "memcpy", "memset", "runtime", "cpu_only", "other")


def _device(m: dict, props: list[dict]) -> dict | None:
    if not m.get("has_gpu"):
        return None
    name = m.get("device_name")
    prop = next((p for p in props if p.get("name") == name), props[0] if props else {})
    major, minor = prop.get("computeMajor"), prop.get("computeMinor")
    return {"kind": "cuda", "name": name or prop.get("name") or "GPU (not named in the trace)",
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "memory_total_bytes": prop.get("totalGlobalMem")}


def _metrics(m: dict) -> dict:
    steps = m.get("steps") or {}
    step_s = steps.get("step_s") or {}
    shares = dict(steps.get("shares") or {})
    if "dataloader" in shares:
        shares["data_wait"] = shares["dataloader"]
    dev = (m.get("idle_breakdown") or {}).get("device") or {}
    gpu = None
    if m.get("has_gpu"):
        gpu = {
            "source": "trace",
            "util_mean": None, "sm_active_mean": None,
            "busy_share": m.get("busy_share"), "idle_share": m.get("idle_share"),
            "compute_busy_share": m.get("compute_busy_share"), "window_s": m.get("window_s"),
            "busy_s": m.get("gpu_busy_s"),
            "idle_s_by_cause": {"data": None, "sync": None, "host": dev.get("host_wait_s"),
                                "launch": dev.get("kernel_wait_s"), "other": dev.get("other_s")},
            "idle_breakdown": m.get("idle_breakdown"), "kernels": m.get("kernels"), "syncs": m.get("syncs"),
            "memcpy": m.get("memcpy"), "launches": m.get("launches"), "devices": m.get("devices"),
        }
    count = steps.get("count") or 0
    return {
        "steps": count, "steps_analyzed": count,
        "wall_s": m.get("window_s"), "train_wall_s": (step_s.get("mean") or 0) * count if count else None,
        "samples_per_s": None, "steps_per_s": 1.0 / step_s["mean"] if step_s.get("mean") else None,
        "batch_size": None,
        "step_time_s": {"p50": step_s.get("p50"), "p90": step_s.get("p90"), "mean": step_s.get("mean")}
        if step_s else None,
        "shares": shares or None, "host": None, "gpu": gpu,
        "events": m.get("events"), "gpu_events": m.get("gpu_events"),
        "compile": m.get("compile"),
    }


def build_trace_report(path: str, traces: list, job: dict, verdict: str, findings: list[dict],
                       notes: list[str] | None = None) -> dict:
    """The report of a trace file or folder. ``traces``: the ranks' summaries
    (:class:`whyidle.analysis.trace_job.RankSummary`: ``path``, ``rank``, ``device_properties``),
    ``job``: :func:`whyidle.analysis.trace_job.job_metrics`; ``notes``: notes to put first. The
    metrics are those of ``job["described"]``."""
    ranks = job.get("ranks") or []
    primary = next((r for r in ranks if r["rank"] == job.get("described")), ranks[0] if ranks else None)
    m = primary["metrics"] if primary else {}
    t0 = next((t for t in traces if t.rank == (primary or {}).get("rank")), traces[0] if traces else None)
    notes = list(notes or [])
    if len(ranks) > 1:
        why = " (the straggler)" if job.get("described_is_straggler") else ""
        notes.append(f"{len(ranks)} ranks; the metrics are rank {primary['rank']}'s{why}, every rank's are under `ranks`.")
    coll = job.get("collectives")
    if coll and not coll.get("steps"):
        notes.append(f"The ranks' {coll['kind']} collectives did not match in at least 2 common ProfilerSteps "
                     f"({coll['matched']} matched, {coll['skipped']} groups differ between ranks"
                     + (f", ranks without any: {coll['missing']}" if coll.get("missing") else "")
                     + "): the straggler is judged by step times.")
    if job.get("steps_differ"):
        notes.append("The ranks recorded different numbers of ProfilerSteps.")
    if m and not (m.get("steps") or {}).get("count"):
        notes.append("No ProfilerStep annotations: step figures are null (profile with schedule=... and prof.step()).")
    if m and not m.get("has_gpu"):
        notes.append("No GPU activity in the trace: GPU metrics are null.")
    comp = m.get("compile") if m else None
    if comp and comp.get("compile_in_basis_s"):
        where = "steps" if comp.get("basis") == "steps" else "trace"
        notes.append(f"The traced {where} include torch.compile compilations ({comp['compile_in_basis_s']:.2f} s, "
                     f"{comp['compile_share']:.0%} of the traced {where}; `metrics.compile`): step times and shares "
                     "include them; profile after warm-up (torch.profiler.schedule(wait=..., warmup=...)) for the "
                     "steady state.")
    rep = {
        "schema": SCHEMA, "tool_version": whyidle.__version__, "source": "trace",
        "command": [], "name": None, "trace": path, "files": [t.path for t in traces],
        "framework": "torch",
        "device": _device(m, t0.device_properties if t0 else []) or {"kind": "cpu", "name": None,
                                                                      "compute_capability": None,
                                                                      "memory_total_bytes": None},
        "verdict": verdict, "findings": findings, "metrics": _metrics(m), "loader": None,
        "run": {"run_dir": None}, "notes": notes,
    }
    if len(ranks) > 1:
        rep["ranks"] = [{"rank": r["rank"], "metrics": _metrics(r["metrics"]), "collective_s": r.get("collective_s"),
                         "wait_s": r.get("wait_s")} for r in ranks]
        rep["straggler"] = job.get("straggler")
        rep["collectives"] = coll
    return _r(rep)
