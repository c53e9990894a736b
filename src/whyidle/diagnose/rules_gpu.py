"""Rules that need the CUDA timeline or the transfer audit: syncs, pageable copies, CPU tensors.

Facts read: ``gpu_idle`` (:func:`whyidle.analysis.gpu_idle.gpu_idle`), ``transfers``
(:func:`whyidle.analysis.transfers.transfer_summary`), ``step`` (step metrics). Each rule returns
a finding or ``None``; thresholds live in :mod:`whyidle.diagnose.thresholds`.
"""

from __future__ import annotations

from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import _ms, _pct, finding

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
    "synchronize": "remove the explicit synchronize from the step (CUDA events time GPU work without it)",
    "torch.cuda.synchronize": "remove the explicit synchronize from the step (CUDA events time GPU work without it)",
    "Event.synchronize": "query the event (event.query()) instead of waiting on it in the step",
}


def sync_bound(facts: dict) -> dict | None:
    """Host↔device synchronizations expose GPU idle (share of step time ≥ ``SYNC_IDLE_WARN``).

    The idle a sync causes is the starved time from its return until the host's next phase
    boundary (:mod:`whyidle.analysis.gpu_idle`): after a sync the queue is empty, so the host's
    following work can no longer hide behind queued kernels. ``est_speedup`` = 1/(1 − that share).
    """
    idle = facts.get("gpu_idle")
    if not idle or not idle.get("syncs") or not idle["syncs"]["count"]:
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
    summary = (f"{syncs['count']} host↔device syncs ({per_step:.1f} per step) leave the GPU idle {_pct(share)} of the "
               f"time ({syncs['idle_s']:.2f} s); the costliest, at {where}"
               + (f" ({top['op']})" if top.get("op") else "")
               + f", runs {top['per_step']:.1f}× per step and exposes {_pct(top['share'])}.")
    hints = []
    for s in sites:
        hint = _SYNC_FIX.get(s.get("op") or "")
        if hint and hint not in hints:
            hints.append(hint)
    text = ("Each sync makes the host wait until the GPU has finished everything queued, and the GPU then waits "
            "for the host's next launches. Take syncs out of the per-step path: "
            + ("; ".join(hints) if hints else "read GPU values (loss, metrics) only every N steps") + ".")
    code = ("running_loss += loss.detach()        # stays on the GPU, no sync\n"
            "if step % 50 == 0:\n"
            "    print(running_loss.item() / 50)  # one sync per 50 steps\n"
            "    running_loss.zero_()")
    evidence = {"idle_share": round(share, 4), "idle_s": round(syncs["idle_s"], 4), "count": syncs["count"],
                "per_step": round(per_step, 3) if per_step is not None else None,
                "sites": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in s.items()} for s in sites]}
    severity = "critical" if share >= T.SYNC_IDLE_CRITICAL else "warning"
    return finding("sync_bound", severity, "Sync-bound: host↔device syncs stall the GPU", summary, evidence,
                   1.0 / (1.0 - min(share, 0.95)), text, code, [DOCS_SYNC])


def pageable_transfers(facts: dict) -> dict | None:
    """Host→device copies come from pageable memory (source not pinned).

    Measured cost: the host time of those copies per step (the driver stages pageable memory
    synchronously); with ``pin_memory=True`` and ``non_blocking=True`` the copy returns at once and
    overlaps compute, so ``est_speedup`` = 1/(1 − pageable host time ÷ step time). Warning from
    ``PAGEABLE_HOST_WARN``, else info (the copy is not on the critical path, as in cases.md C21).
    """
    tr = facts.get("transfers")
    step = facts.get("step")
    if not tr or not tr.get("pageable_bytes_per_step") or not step:
        return None
    mean = step["step_time_s"]["mean"]
    host_s = tr["pageable_host_s_per_step"]
    share = host_s / mean if mean else 0.0
    mib = tr["pageable_bytes_per_step"] / 2**20
    loader = facts.get("loader") or {}
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
    code = ("loader = DataLoader(dataset, batch_size=..., num_workers=..., pin_memory=True)\n"
            "x = x.to(device, non_blocking=True)" if batch else "buf = torch.empty(shape, pin_memory=True)\n"
            "buf.copy_(src); x = buf.to(device, non_blocking=True)")
    evidence = {"pageable_bytes_per_step": round(tr["pageable_bytes_per_step"]),
                "pageable_host_s_per_step": round(host_s, 6), "share_of_step": round(share, 4),
                "pin_memory": loader.get("pin_memory"), "non_blocking": tr.get("non_blocking_pageable"),
                "sites": sites}
    severity = "warning" if share >= T.PAGEABLE_HOST_WARN else "info"
    return finding("pageable_transfers", severity, "Pageable host→device copies", summary, evidence,
                   1.0 / (1.0 - min(share, 0.95)), text, code, [DOCS_PINNED])


def cpu_built_tensors(facts: dict) -> dict | None:
    """Tensors built on the CPU inside the step and copied to the GPU every step (``wrong_device``
    with ``evidence.kind = "per_step_cpu_tensors"``): e.g. ``torch.tensor(labels).cuda()`` or
    ``torch.arange(n).to(device)`` in the loop. Each costs an allocation, a pageable copy and often
    a stall; built on the GPU (``device=``) or once outside the loop they cost nothing per step.
    Warning from ``CPU_BUILT_WARN`` of step time, else info. Not a placement verdict: the model
    itself is on the GPU.
    """
    tr = facts.get("transfers")
    step = facts.get("step")
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
                   1.0 / (1.0 - min(share, 0.95)), text, "mask = torch.arange(n, device=device)  # not .to(device)",
                   ["https://pytorch.org/docs/stable/notes/cuda.html#best-practices"])
