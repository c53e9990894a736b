"""Findings from a profiler trace (``whyidle trace``): the same ids as live runs where a trace
supports them. Pure: reads the dict of :func:`whyidle.analysis.trace.job_metrics` plus a few facts
the trace's strings give (which DataLoader iterator ran). Thresholds come from
:mod:`whyidle.diagnose.thresholds`, shared with live runs.
"""

from __future__ import annotations

from whyidle.analysis.trace_job import STEP_STRAGGLER_MIN_SHARE
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import (
    ACCUMULATE_CODE,
    DOCS_DATALOADER,
    DOCS_TUNING,
    _ms,
    _pct,
    bound_of,
    finding,
    printed_fix_first,
)
from whyidle.diagnose.rules import speedup_if_removed as _speedup
from whyidle.diagnose.rules_ranks import DOCS_DDP
from whyidle.diagnose.trace_compile_rules import compile_findings
from whyidle.diagnose.verdict import choose_verdict, order

#: A straggler rank whose median step is this much longer than the others' median makes the job
#: wait at every collective (the threshold the job analysis describes it from).
IMBALANCE_WARN = STEP_STRAGGLER_MIN_SHARE

#: Share of GPU kernel time in short kernels (see analysis/trace.py) from which an idle GPU waiting
#: on the host is called launch-bound rather than held by Python work.
SHORT_KERNELS_LAUNCH_BOUND = 0.5


#: Pageable copies taking less than this share of step time are not worth a line (a few small
#: copies of scalars or indices); C21's copies of whole batches take percents.
PAGEABLE_MIN_SHARE = 0.001


def input_bound(m: dict, loader: str | None) -> dict | None:
    """The step waits in the DataLoader (``enumerate(DataLoader)``/``__next__`` events) while the
    GPU has nothing to run: ``steps.shares.dataloader`` ≥ ``DATA_WAIT_WARN`` (loader time spent
    while the GPU also waits; host loading that overlaps GPU work costs nothing). Cause from the
    iterator class seen: ``loader_in_main_process`` (``_SingleProcessDataLoaderIter``),
    ``too_few_workers`` (``_MultiProcessingDataLoaderIter``), else ``unknown``.
    est = 1/(1 − share)."""
    steps = m.get("steps") or {}
    share = (steps.get("shares") or {}).get("dataloader")
    if share is None or share < T.DATA_WAIT_WARN:
        return None
    raw = steps.get("dataloader_share")
    cause = {"single": "loader_in_main_process", "multi": "too_few_workers"}.get(loader or "", "unknown")
    step_s = (steps.get("step_s") or {}).get("mean")
    reason = {"loader_in_main_process": "batches are prepared in the training process (num_workers=0)",
              "too_few_workers": "the DataLoader workers do not keep up",
              "unknown": "the DataLoader kind is not recorded in the trace"}[cause]
    gpu = m.get("has_gpu")
    summary = (f"Each ProfilerStep spends {_pct(raw)} of its time in the DataLoader "
               f"({_ms(raw * step_s if step_s and raw is not None else None)} of {_ms(step_s)})"
               + (f", {_pct(share)} with the GPU idle" if gpu else ", while the training waits") + f": {reason}.")
    pin = ", pin_memory=True" if gpu else ""
    fix = (f"Load in worker processes (num_workers ≥ 2, persistent_workers=True{pin}, prefetch_factor=4) "
           "so loading overlaps the step." if cause != "too_few_workers" else
           "Raise num_workers (and prefetch_factor) until the DataLoader share is small; if all cores are busy, make "
           "each sample cheaper (cache decoded data" + (", augment on the GPU)." if gpu else ")."))
    return finding("input_bound", "critical" if share >= T.DATA_WAIT_CRITICAL else "warning",
                   "Input-bound: the step waits for data", summary,
                   {"cause": cause, "data_wait_share": round(share, 4),
                    "dataloader_share": round(raw, 4) if raw is not None else None, "step_time_s_mean": step_s,
                    "est_speedup_if_removed": round(_speedup(share), 3)},
                   _speedup(share), fix,
                   "loader = DataLoader(dataset, batch_size=..., num_workers=4, persistent_workers=True,\n"
                   f"                    {'pin_memory=True, ' if gpu else ''}prefetch_factor=4)",
                   [DOCS_DATALOADER, DOCS_TUNING], bound=share)


def sync_bound(m: dict) -> dict | None:
    """GPU idle after synchronizations (``syncs.idle_after_s``) ≥ ``SYNC_IDLE_WARN`` of the GPU
    window. est = 1/(1 − share)."""
    syncs = m.get("syncs") or {}
    window = m.get("window_s")
    if not syncs.get("count") or not window:
        return None
    share = (syncs.get("idle_after_s") or 0.0) / window
    if share < T.SYNC_IDLE_WARN:
        return None
    sites = [{"site": e.get("op") or e.get("name"), "leaf": e.get("name"), "op": e.get("name"),
              "count": e.get("count"), "idle_s": e.get("idle_after_s"),
              "share": (e.get("idle_after_s") or 0.0) / window} for e in (syncs.get("events") or [])[:5]]
    top = sites[0] if sites else {}
    summary = (f"{syncs['count']} synchronizations leave the GPU idle {_pct(share)} of the traced time; the costliest "
               f"is {top.get('op')}" + (f" inside {top['site']}" if top.get("site") != top.get("op") else "") + ".")
    return finding("sync_bound", "critical" if share >= T.SYNC_IDLE_CRITICAL else "warning",
                   "Sync-bound: host↔device syncs stall the GPU", summary,
                   {"idle_share": round(share, 4), "count": syncs["count"], "per_step": syncs.get("per_step"),
                    "sites": sites}, _speedup(share),
                   "Take synchronizations out of the step: read values (.item(), .cpu()) every N steps, avoid "
                   "explicit synchronize calls, keep data-dependent shapes off the hot path.",
                   ACCUMULATE_CODE,
                   ["https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html"], bound=share)


def host_bound(m: dict) -> dict | None:
    """The GPU waits for the host to launch work: device-level host-wait idle (HTA's rule) less the
    part spent in the DataLoader (that is ``input_bound``'s) ≥ ``HOST_SHARE_WARN`` of the GPU
    window, less the share of the traced steps spent in torch.compile's compilations
    (``compile.compile_share``: those are ``recompiles``' or start-up, not the loop's host work).
    With mostly short kernels it is launch-bound (``evidence.kind = "launch_bound"``:
    per-kernel overhead; fix: fewer, larger kernels); else the host's own work
    (``python_compute``). est = 1/(1 − share)."""
    window = m.get("window_s")
    dev = ((m.get("idle_breakdown") or {}).get("device")) or {}
    if not window or dev.get("host_wait_s") is None:
        return None
    loading = ((m.get("steps") or {}).get("shares") or {}).get("dataloader") or 0.0
    compiling = (m.get("compile") or {}).get("compile_share") or 0.0
    share = max(0.0, dev["host_wait_s"] / window - loading - compiling)
    if share < T.HOST_SHARE_WARN:
        return None
    k = m.get("kernels") or {}
    short = k.get("short_time_share") or 0.0
    launch = short >= SHORT_KERNELS_LAUNCH_BOUND
    delay = (k.get("launch_overhead_us") or {}).get("p50")
    summary = (f"The GPU waits for the host to launch work {_pct(share)} of the traced time"
               + (f"; {_pct(short)} of kernel time is in kernels under {k.get('short_threshold_us')} µs, so per-kernel "
                  f"launch overhead (median {delay:.1f} µs) is the limit" if launch and delay is not None else
                  "; the host's own work between launches holds it") + ".")
    text = ("Issue fewer, larger kernels: torch.compile (fuses elementwise ops), CUDA graphs "
            "(torch.compile(mode='reduce-overhead')), bigger batches, fused optimizers (foreach/fused=True)."
            if launch else
            "Move Python work (logging, metrics, per-sample loops) out of the step or make it cheaper; "
            "the host must stay ahead of the GPU.")
    return finding("host_bound", "critical" if share >= T.HOST_SHARE_CRITICAL else "warning",
                   "Host-bound: the GPU waits for launches" if launch else "Host-bound: the GPU waits for the host",
                   summary, {"kind": "launch_bound" if launch else "python_compute", "host_wait_share": round(share, 4),
                             "short_kernel_time_share": round(short, 4), "launch_overhead_us_p50": delay,
                             "hotspots": []},
                   _speedup(share), text, "model = torch.compile(model)" if launch else None, [DOCS_TUNING],
                   bound=share)


def pageable_transfers(m: dict) -> dict | None:
    """Memcpy activities from pageable memory; warning when their time is ≥ ``PAGEABLE_HOST_WARN``
    of the step, info from :data:`PAGEABLE_MIN_SHARE` (est from that share, cases.md C21)."""
    mc = m.get("memcpy") or {}
    if not mc.get("pageable_count"):
        return None
    share = mc.get("pageable_share_of_step") or 0.0
    if share < PAGEABLE_MIN_SHARE:
        return None
    summary = (f"{mc['pageable_count']} copies ({(mc.get('pageable_bytes') or 0) / 2**20:.1f} MiB) came from pageable "
               f"memory, {_ms(mc.get('pageable_s'))} in all ({_pct(share)} of step time).")
    return finding("pageable_transfers", "warning" if share >= T.PAGEABLE_HOST_WARN else "info",
                   "Pageable host→device copies", summary,
                   {"pageable_count": mc["pageable_count"], "pageable_bytes": mc.get("pageable_bytes"),
                    "pageable_s": mc.get("pageable_s"), "share_of_step": round(share, 4),
                    "h2d_gbps": mc.get("h2d_gbps")}, _speedup(share),
                   "Pin host memory (DataLoader pin_memory=True) and copy with .to(device, non_blocking=True).",
                   "loader = DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
                   ["https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"], bound=share)


#: Why a measured straggler is late (``straggler.cause.part``) → what it does more and the fix.
CAUSE_ADVICE = {
    "data_wait": ("its DataLoader takes {extra} more per step than on the other ranks ({others})",
                  ("Fix that rank's input pipeline: its shard's files or its node's storage and cores are slower "
                   "(more DataLoader workers, pinned memory and prefetching there; the findings of this report are "
                   "its own).")),
    "compute": ("its {device} {extra} more per step than on the other ranks ({others})",
                ("Give every rank the same work (equal batch and sequence lengths: bucket by length, pad to the "
                 "same size) or look at that rank's device: clocks and throttling (nvidia-smi -q -d "
                 "PERFORMANCE,CLOCK), another process on it or on its cores, its PCIe/NVLink placement.")),
    "host": ("neither its DataLoader nor its device's work takes longer than on the other ranks': its host does other work",
             ("Find what that rank's host does alone (rank-0-only logging, evaluation or checkpoint writing, "
              "Python outside the model): shard it across the ranks, do it less often or on a background thread.")),
}


def imbalance(job: dict, own: list[dict] = ()) -> dict | None:
    """The ranks wait for a straggler (``job["straggler"]``, :func:`whyidle.analysis.trace_job.job_metrics`).

    Measured at the collectives (``straggler.measured``): ``bound`` = the wait per step it causes
    each other rank, as a share of their step (``excess_share``), ``est_speedup`` = 1/(1 − bound)
    (the job at the other ranks' pace), the fix by its ``cause``; a warning, or info when one of
    ``own`` (the straggler's own findings) is a warning holding at least half the excess (that
    one names the cause and its fix). From step times: the straggler's median step exceeds the
    others' by ≥ :data:`IMBALANCE_WARN`; est = 1 + excess share."""
    s = job.get("straggler")
    if not s or s.get("excess_share") is None:
        return None
    by_rank = job.get("step_s_by_rank")
    if s.get("measured"):
        coll = job.get("collectives") or {}
        waits = {str(r["rank"]): r["wait_s"] for r in job.get("ranks") or [] if r["rank"] != s["rank"]}
        cause = s.get("cause") or {"part": "host", "extra_s": None, "others_s": None}
        why, fix = CAUSE_ADVICE[cause["part"]]
        gpu = any(r["metrics"].get("has_gpu") for r in job.get("ranks") or [])
        why = why.format(extra=_ms(cause.get("extra_s")), others=_ms(cause.get("others_s")),
                         device="GPU work outside the collectives takes" if gpu else
                         "operators (the cores are its device here) take")
        summary = (f"Rank {s['rank']} is the straggler: of {s['steps']} steps compared at their {coll.get('kind')} "
                   f"collectives ({coll.get('matched')} matched per rank), a rank arrived late in {s['late_steps']}, "
                   f"rank {s['rank']} in {_pct(s['culprit_share'])} of them; the other ranks wait "
                   f"{_ms(s['excess_s'])} per step for it ({_pct(s['excess_share'])} of their step). It is late "
                   f"because {why}.")
        strong = [f for f in own if f["severity"] != "info" and (f.get("bound") or 0) >= 0.5 * s["excess_share"]]
        if strong:
            fix = (f"Fix rank {s['rank']}'s own cause: the findings of this report are its own (`{strong[0]['id']}` "
                   "first); the other ranks speed up with it.")
        est = 1.0 / (1.0 - min(s["excess_share"], 0.95))
        return finding("imbalance", "info" if strong else "warning", "Imbalance: ranks wait for a straggler", summary,
                       {"straggler_rank": s["rank"], "culprit_rank": s["rank"], "culprit_share": s["culprit_share"],
                        "caused_share": s.get("caused_share"), "measured": True, "late_steps": s["late_steps"], "steps": s["steps"],
                        "excess_s": s["excess_s"], "excess_share": s["excess_share"], "cause": cause,
                        "wait_s_per_step": waits, "step_s_by_rank": by_rank, "collectives": coll},
                       est, fix, None, [DOCS_DDP], bound=s["excess_share"])
    if s["excess_share"] < IMBALANCE_WARN:
        return None
    summary = (f"Rank {s['rank']} is the straggler: its median step is {_ms(s.get('excess_s'))} "
               f"({_pct(s['excess_share'])}) longer than the other ranks', and every collective waits for it.")
    return finding("imbalance", "warning", "Imbalance: ranks wait for a straggler", summary,
                   {"straggler_rank": s["rank"], "culprit_rank": s["rank"], "culprit_share": None, "measured": False,
                    "excess_s": s.get("excess_s"), "excess_share": s["excess_share"],
                    "step_s_by_rank": by_rank}, 1.0 + s["excess_share"],
                   "Compare the straggler's trace with another rank's (its DataLoader, host work, GPU clocks and "
                   "placement); balance the data per rank (equal sequence lengths / bucketing).", None, [],
                   bound=bound_of(1.0 + s["excess_share"]))


def device_bound(m: dict) -> dict:
    """Nothing upstream holds the GPU back in this trace."""
    return finding("device_bound", "info", "Device-bound: the GPU is kept busy",
                   f"The GPU ran work {_pct(m.get('busy_share'))} of the traced time; nothing upstream holds it back.",
                   {"busy_share": m.get("busy_share")}, None,
                   "For more speed: mixed precision on tensor-core GPUs, torch.compile, or a bigger GPU.", None,
                   [DOCS_TUNING], bound=m.get("busy_share"))


def _own(m: dict, loader: str | None) -> list[dict]:
    """One rank's own findings (without GPU activity, only ``input_bound`` and the torch.compile
    findings: the cores are the device, and the GPU rules have nothing to read)."""
    rules = (input_bound(m, loader), sync_bound(m), host_bound(m), pageable_transfers(m)) if m.get("has_gpu") else (
        input_bound(m, loader),)
    return [f for f in rules if f] + compile_findings(m)


def no_gpu_activity(ranks: list[dict]) -> dict:
    """The note of a trace without GPU activity."""
    return finding("no_steps", "info", "No GPU activity in the trace",
                   "The trace holds no kernel, memcpy or memset events (a CPU-only run, or the profiler did not "
                   "record CUDA activities): only the DataLoader, torch.compile and the ranks' collectives are "
                   "judged.",
                   {"events": sum(r["metrics"].get("events") or 0 for r in ranks)}, None,
                   "Profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA].",
                   "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], ...)",
                   ["https://pytorch.org/docs/stable/profiler.html"])


def diagnose_trace(job: dict, loader: str | None = None) -> tuple[str, list[dict]]:
    """``(verdict, findings)`` for a job (:func:`whyidle.analysis.trace_job.job_metrics`), judged on
    the rank it describes (``job["described"]``: the straggler when one stands out, else the first
    rank with GPU activity); ``imbalance`` uses all ranks, and caps the described rank's own
    estimates at its own (the job gets no faster than the other ranks' pace, as for live runs),
    except for causes another rank has as well (a warning there too: fixing it speeds them all;
    nor do those name why the straggler is late). Verdict as for live runs
    (:func:`whyidle.diagnose.verdict.choose_verdict`: the largest measured ``bound``), else
    ``device_bound`` (``unknown`` when the device's activity spans no measurable time, e.g. one
    instant). Without GPU activity on any rank only ``input_bound``, the torch.compile findings
    (:mod:`whyidle.diagnose.trace_compile_rules`) and ``imbalance`` are judged (verdict
    ``unknown`` when none qualifies), with a ``no_steps`` note."""
    from whyidle.diagnose import _cap_at_the_others_pace

    ranks = job.get("ranks") or []
    gpu = any(r["metrics"].get("has_gpu") for r in ranks)
    usable = [r for r in ranks if r["metrics"].get("has_gpu") or not gpu]
    row = next((r for r in usable if r.get("rank") == job.get("described")), usable[0] if usable else None)
    m = row["metrics"] if row else {}
    findings = _own(m, loader)
    other = next((r["metrics"] for r in usable if r is not row), None)
    shared = frozenset(f["id"] for f in _own(other, loader) if f["severity"] != "info") if other else frozenset()
    late = imbalance(job, [f for f in findings if f["id"] not in shared])  # what only the straggler has
    if late:
        _cap_at_the_others_pace(findings, late, shared)
        findings.append(late)
    printed_fix_first(findings)
    verdict = choose_verdict(findings)
    if not gpu:
        verdict = verdict or "unknown"
        return verdict, order(findings, verdict) + [no_gpu_activity(ranks)]
    if verdict is None and m.get("busy_share") is None:  # device activity without a span to measure
        return "unknown", order(findings, "unknown")
    if verdict is None:
        verdict = "device_bound"
        findings.insert(0, device_bound(m))
    return verdict, order(findings, verdict)
