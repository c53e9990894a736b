"""Rules that need the CUDA timeline or the transfer audit: syncs, pageable copies, CPU tensors.

Facts read: ``gpu_idle`` (:func:`whyidle.analysis.gpu_idle.gpu_idle`), ``transfers``
(:func:`whyidle.analysis.transfers.transfer_summary`), ``step`` (step metrics). Each rule returns
a finding or ``None``; thresholds live in :mod:`whyidle.diagnose.thresholds`.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import (
    _ms,
    _pct,
    finding,
    speedup_if_removed,
)

DOCS_SYNC = "https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html"
DOCS_PINNED = "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"

_SYNC_FIX = {
    "item": "keep the running value as a tensor (total += loss.detach()) and call .item() only when you log",
    "tolist": "keep it on the GPU, or copy it every N steps",
    "cpu": "copy to the CPU every N steps, or with .to('cpu', non_blocking=True) into pinned memory and read it later",
    "numpy": "copy to the CPU every N steps, or with .to('cpu', non_blocking=True) into pinned memory",
    "print/format": "format tensors only when you log, every N steps",
    "nonzero": "avoid data-dependent shapes in the step (masks with torch.where instead of boolean indexing)",
    "bool": "do not branch in Python on a GPU tensor's value every step (torch.where, or check every N steps)",
    "copy": "copy batches from pinned memory (DataLoader pin_memory=True) with .to(device, non_blocking=True)",
    "synchronize": "remove the explicit synchronize from the step (CUDA events time GPU work without it)",
    "torch.cuda.synchronize": "remove the explicit synchronize from the step (CUDA events time GPU work without it)",
    "Event.synchronize": "query the event (event.query()) instead of waiting on it in the step",
}


def sync_bound(facts: RunFacts) -> dict | None:
    """Host↔device synchronizations expose GPU idle (share of step time ≥ ``SYNC_IDLE_WARN``).

    The idle a sync causes is the starved time from its return until the queue holds work again
    (:mod:`whyidle.analysis.gpu_idle` gives the exact rule): after a sync the queue is empty, so the
    host's following work can no longer hide behind queued kernels. ``est_speedup`` = 1/(1 − that
    share).
    """
    idle = facts.gpu_idle
    if idle is None:
        return _host_reads(facts)
    if not idle.get("syncs") or not idle["syncs"]["count"]:
        return None
    syncs = idle["syncs"]
    covered = idle["covered_s"]
    share = syncs["idle_s"] / covered if covered else 0.0
    if share < T.SYNC_IDLE_WARN:
        return None
    sites = [dict(s, share=s["idle_s"] / covered if covered else None) for s in syncs["sites"][:5]]
    top = sites[0]
    per_step = syncs.get("per_step")
    where = top["site"] or top["leaf"] or "an unknown line"
    micro = ((facts.step or {}).get("micro_batches_per_step"))
    summary = (f"{syncs['count']} host↔device syncs ({per_step or 0:.1f} per step{_per_micro(per_step, micro, ', ')}) "
               f"leave the GPU idle {_pct(share)} of the "
               f"time ({syncs['idle_s']:.2f} s); the costliest, at {where}"
               + (f" ({top['op']})" if top.get("op") else "")
               + f", runs {top['per_step'] or 0:.1f}× per step and exposes {_pct(top['share'])}.")
    hints = []
    for s in sites:
        hint = _SYNC_FIX.get(s.get("op") or "")
        if hint and hint not in hints:
            hints.append(hint)
    text = ("Each sync makes the host wait until the GPU has finished everything queued, and the GPU then waits "
            "for the host's next launches. Take syncs out of the per-step path: "
            + ("; ".join(hints) if hints else "read GPU values (loss, metrics) only every N steps") + ".")
    code = fixes.sync_code(facts)
    evidence = {"idle_share": round(share, 4), "idle_s": round(syncs["idle_s"], 4), "count": syncs["count"],
                "per_step": round(per_step, 3) if per_step is not None else None,
                "micro_batches_per_step": micro,
                "per_micro_batch": round(per_step / micro, 3) if per_step is not None and micro else None,
                "sites": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in s.items()} for s in sites]}
    severity = "critical" if share >= T.SYNC_IDLE_CRITICAL else "warning"
    return finding("sync_bound", severity, "Sync-bound: host↔device syncs stall the GPU", summary, evidence,
                   speedup_if_removed(share), text, code, [DOCS_SYNC], bound=share)


def _per_micro(per_step: float | None, micro: float | None, lead: str = " ") -> str:
    """`` (1.0 per micro-batch, 4 micro-batches of gradient accumulation per step)`` when a step holds
    several backward calls (``micro`` > 1), else ``""``."""
    if not per_step or not micro or micro <= 1:
        return ""
    text = f"{per_step / micro:.1f} per micro-batch, {micro:g} micro-batches of gradient accumulation per step"
    return f"{lead}({text})" if lead == " " else f"{lead}{text}"


def _host_reads(facts: RunFacts) -> dict | None:
    """Without a CUDA timeline (CPU-only runs): the host reads of tensor values the transfer audit
    counted, as an info ``sync_bound``: each would synchronize on a GPU (cases.md C09: "counts ~3
    sync points per step and names the call sites"). ``est_speedup`` is None: on a CPU they cost
    nothing extra."""
    reads = facts.reads
    if not reads or reads["per_step"] < 1.0:
        return None
    sites = reads["sites"][:5]
    for site in sites:
        site["op"] = "+".join(site["ops"])
    # gradient accumulation as the loop defines it (analysis/loop.py: a GAN's backward calls are
    # its optimizers' parts, not micro-batches); the audit's backward count without steps
    micro = (facts.step or {}).get("micro_batches_per_step") or reads.get("micro_batches_per_step")
    first = sites[0]
    lines = f"{len(reads['sites'])} lines" if len(reads["sites"]) > 1 else "1 line"
    n = reads["per_step"]
    summary = (f"The step reads tensor values on the host {n:.1f} times" if n < 10 else
               f"The step reads tensor values on the host {n:,.0f} times") + (
        f"{_per_micro(n, micro)}, at {lines} (the most at {first['site'] or first['leaf']}, {first['op']}). On this "
        "CPU-only run that costs nothing extra; on a GPU each read is a host↔device sync that drains the queue.")
    if all(s["ops"] == ["__bool__"] for s in sites[:2]):
        # Python branches on tensor elements (``if pred[i] == c:``): a loop to vectorize, not a value to log
        text = ("Before moving this loop to a GPU, stop branching in Python on tensor values (if t == c: on "
                "elements, one sync each): compute the whole result with tensor operations (masks, torch.where, "
                "torch.bincount) and read it once, when you log.")
        code = None
    else:
        text = ("Before moving this loop to a GPU, take the reads out of the per-step path: accumulate on the device "
                "and read every N steps.")
        code = fixes.sync_code(facts)
    evidence = {"per_step": round(reads["per_step"], 3), "sites": sites, "measured": "host reads (no GPU)",
                "micro_batches_per_step": micro,
                "per_micro_batch": round(reads["per_step"] / micro, 3) if micro else None}
    return finding("sync_bound", "info", "Host reads of tensor values every step (syncs on a GPU)", summary,
                   evidence, None, text, code, [DOCS_SYNC])


def model_not_moved(facts: RunFacts) -> dict | None:
    """The loop moves its batches with ``.to(device)`` but the model is never moved and its
    parameters are on the CPU (``wrong_device``, ``evidence.kind = "model_not_moved"``;
    cases.md C23). Only on a machine without a usable GPU, as info: the model may be moved in a
    branch that runs only with a GPU, or built on the device, which cannot be seen here; the
    summary says whether the script asks ``torch.cuda.is_available()``. With a GPU the critical
    :func:`whyidle.diagnose.rules.wrong_device` already reports the parameters on the CPU.
    """
    placement = facts.placement or {}
    devices = facts.devices or {}
    params = devices.get("params") or {}
    if not placement.get("batch_moves") or not params or set(params) != {"cpu"}:
        return None
    batch_devices = {m["device"] for m in placement["batch_moves"]}
    if any(m["device"] != "cpu" or m["device"] in batch_devices for m in placement.get("module_moves") or []):
        return None  # the model is moved, to the device its batches go to (on a CPU-only box: the CPU)
    if (facts.gpu_static or {}).get("devices") or devices.get("cuda_initialized"):
        return None  # a GPU is there: wrong_device (critical) says it with the measured placement
    move = placement["batch_moves"][0]
    queries = placement.get("cuda_queries") or []
    asked = (f" The script asks torch.cuda.is_available() ({queries[0]['site']}: {queries[0]['result']} here), so it "
             "is meant to run on a GPU." if queries else "")
    summary = (f"Every batch is moved with .to(device) ({move['site']}, to {move['device']} here) but no "
               f"Module.to()/.cuda() ran: the model's {params['cpu']:,} parameters stay on the CPU. Unless the model "
               "is moved in code that runs only with a GPU (or built with device=), on a GPU machine the batches would "
               f"go to the GPU and the model would not, so the GPU would sit idle (or the step would fail).{asked}")
    text = ("Move the model to the same device before building the optimizer (model = Model().to(device)), and give "
            "tensors created inside the model or library device=.")
    # Not verifiable without a GPU (a move under `if torch.cuda.is_available():`, a model built
    # under `with torch.device(device):`): info, never a warning.
    return finding("wrong_device", "info", "Model never moved to the device its batches go to", summary,
                   {"kind": "model_not_moved", "params": params, "batch_moves": placement["batch_moves"][:3],
                    "module_moves": placement.get("module_moves") or [], "cuda_queries": queries[:3]},
                   None, text, "model = Model().to(device)\noptimizer = torch.optim.SGD(model.parameters(), lr=...)",
                   ["https://pytorch.org/docs/stable/notes/cuda.html"])


def pageable_transfers(facts: RunFacts) -> dict | None:
    """Host→device copies come from pageable memory (source not pinned).

    Measured cost: the host time of those copies per step (the driver stages pageable memory
    synchronously); with ``pin_memory=True`` and ``non_blocking=True`` the copy returns at once and
    overlaps compute, so ``est_speedup`` = 1/(1 − pageable host time ÷ step time). Warning from
    ``PAGEABLE_HOST_WARN``, else info (the copy is not on the critical path, as in cases.md C21).
    """
    tr = facts.transfers
    step = facts.step
    if not tr or not tr.get("pageable_bytes_per_step") or not step:
        return None
    mean = step["step_time_s"]["mean"]
    host_s = tr["pageable_host_s_per_step"]
    share = host_s / mean if mean else 0.0
    mib = tr["pageable_bytes_per_step"] / 2**20
    loader = facts.loader or {}
    nb = " non_blocking=True is asked, but from pageable memory the copy cannot be asynchronous." \
        if tr.get("non_blocking_pageable") else ""
    sites = [s for s in tr["sites"] if s["pinned"] is False][:3]
    where = sites[0]["site"] or sites[0]["leaf"] if sites else "?"
    summary = (f"{mib:.1f} MiB per step are copied to the GPU from pageable memory (at {where}), taking "
               f"{_ms(host_s)} of host time per step ({_pct(share)} of the step).{nb}")
    batch = tr.get("pageable_batch")
    text = ("Pin the batch in the DataLoader (pin_memory=True) and copy with non_blocking=True, so the copy runs "
            "asynchronously and overlaps compute." if batch else
            "Allocate the source tensor in pinned memory (tensor.pin_memory(), or torch.empty(..., pin_memory=True) "
            "reused every step) and copy with non_blocking=True.")
    code = (fixes.pin_code(facts) if batch else "buf = torch.empty(shape, pin_memory=True)\n"
            "buf.copy_(src); x = buf.to(device, non_blocking=True)")
    evidence = {"pageable_bytes_per_step": round(tr["pageable_bytes_per_step"]),
                "pageable_host_s_per_step": round(host_s, 6), "share_of_step": round(share, 4),
                "pin_memory": loader.get("pin_memory"), "non_blocking": tr.get("non_blocking_pageable"),
                "sites": sites}
    severity = "warning" if share >= T.PAGEABLE_HOST_WARN else "info"
    return finding("pageable_transfers", severity, "Pageable host→device copies", summary, evidence,
                   speedup_if_removed(share), text, code, [DOCS_PINNED], bound=share)


def cpu_built_tensors(facts: RunFacts) -> dict | None:
    """Tensors built on the CPU inside the step and copied to the GPU every step (``wrong_device``
    with ``evidence.kind = "per_step_cpu_tensors"``): e.g. ``torch.tensor(labels).cuda()`` or
    ``torch.arange(n).to(device)`` in the loop. Each costs an allocation, a pageable copy and often
    a stall; built on the GPU (``device=``) or once outside the loop they cost nothing per step.
    Warning from ``CPU_BUILT_WARN`` of step time, else info. Not a placement verdict: the model
    itself is on the GPU.
    """
    tr = facts.transfers
    step = facts.step
    if not tr or not tr.get("cpu_built") or not step:
        return None
    rows = tr["cpu_built"][:5]
    host_s = sum(r["host_s_per_step"] for r in rows)
    mean = step["step_time_s"]["mean"]
    share = host_s / mean if mean else 0.0
    top = rows[0]
    summary = (f"{sum(r['per_step'] for r in rows):.0f} tensor(s) per step are built on the CPU and copied to the GPU "
               f"inside the step (first at {top['site'] or top['leaf']}), {_ms(host_s)} of host time per step "
               f"({_pct(share)}).")
    text = ("Create these tensors directly on the GPU (torch.tensor(..., device=device), torch.arange(n, "
            "device=device)) or once before the loop, instead of on the CPU followed by .to(device) every step.")
    evidence = {"kind": "per_step_cpu_tensors", "host_s_per_step": round(host_s, 6), "share_of_step": round(share, 4),
                "sites": rows}
    severity = "warning" if share >= T.CPU_BUILT_WARN else "info"
    return finding("wrong_device", severity, "Tensors built on the CPU every step", summary, evidence,
                   speedup_if_removed(share), text, "mask = torch.arange(n, device=device)  # not .to(device)",
                   ["https://pytorch.org/docs/stable/notes/cuda.html#best-practices"], bound=share)
