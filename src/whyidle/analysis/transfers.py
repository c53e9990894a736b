"""Host→device copies seen by the transfer audit (pure: ``transfers`` records → a summary).

Each ``transfers`` record covers one audited step (``whyidle.instrument.transfers``); items are
``[user_site, leaf_site, device_type, pinned, non_blocking, from_batch, count, bytes, host_ns]``.
"""

from __future__ import annotations

#: Device types that are not an accelerator: copies to them are not host→device transfers.
NOT_ACCELERATORS = ("cpu", "meta")


def transfer_summary(records: list[dict]) -> dict | None:
    """Per-step host→device copy figures over the audited steps, or None when none were audited.

    Returns ``{steps, h2d_bytes_per_step, h2d_host_s_per_step, pageable_bytes_per_step,
    pageable_host_s_per_step, pageable_batch: bool, non_blocking_pageable: bool, sites: [...],
    cpu_built: [...]}``: ``pageable_*`` counts copies whose source was not pinned;
    ``non_blocking_pageable`` tells that ``non_blocking=True`` was asked from pageable memory
    (the copy is then not asynchronous); ``sites`` are the copying lines (most host time first)
    with ``{site, leaf, bytes_per_step, host_s_per_step, pinned, non_blocking, from_batch,
    per_step}``; ``cpu_built`` the subset not coming from the DataLoader batch: tensors built on
    the CPU inside the step and copied every step. Bytes are bytes, times seconds.
    """
    recs = _audited(records)
    if not recs:
        return None
    n = len({r.get("step") for r in recs})
    sites: dict[tuple, dict] = {}
    for r in recs:
        for user, leaf, dev, pinned, non_blocking, from_batch, count, nbytes, host_ns in r.get("items") or []:
            if dev in NOT_ACCELERATORS:
                continue
            key = (user or leaf, pinned, non_blocking, from_batch)
            s = sites.setdefault(key, {"site": user, "leaf": leaf, "device": dev, "pinned": pinned,
                                       "non_blocking": non_blocking, "from_batch": from_batch,
                                       "count": 0, "bytes": 0, "host_ns": 0})
            s["count"] += count
            s["bytes"] += nbytes
            s["host_ns"] += host_ns
    rows = [{"site": s["site"], "leaf": s["leaf"], "device": s["device"], "pinned": s["pinned"],
             "non_blocking": s["non_blocking"], "from_batch": s["from_batch"], "per_step": s["count"] / n,
             "bytes_per_step": s["bytes"] / n, "host_s_per_step": s["host_ns"] / 1e9 / n}
            for s in sorted(sites.values(), key=lambda s: -s["host_ns"])]
    pageable = [s for s in rows if s["pinned"] is False]
    return {
        "steps": n,
        "h2d_bytes_per_step": sum(s["bytes_per_step"] for s in rows),
        "h2d_host_s_per_step": sum(s["host_s_per_step"] for s in rows),
        "pageable_bytes_per_step": sum(s["bytes_per_step"] for s in pageable),
        "pageable_host_s_per_step": sum(s["host_s_per_step"] for s in pageable),
        "pageable_batch": any(s["from_batch"] for s in pageable),
        "non_blocking_pageable": any(s["non_blocking"] for s in pageable),
        "sites": rows,
        "cpu_built": [s for s in rows if not s["from_batch"] and s["per_step"] >= 1.0],
    }


def read_summary(records: list[dict]) -> dict | None:
    """Host reads of tensor values per audited step (``reads`` of ``transfers`` records).

    Reads at one source line are counted once per call site and step even when one expression
    reads twice (``x.cpu().numpy()``): the count of a site is the largest count of its
    operations. Returns ``{steps, per_step, sites: [{site, leaf, ops, per_step}],
    micro_batches_per_step}`` (most reads first; ``micro_batches_per_step``: median backward calls
    in the audited steps, the gradient-accumulation factor, None when not recorded) or None
    without audited steps. Steps are optimizer steps when the run has any (see :func:`_audited`).
    """
    recs = _audited(records)
    if not recs:
        return None
    steps = sorted({r.get("step") for r in recs}, key=lambda s: (s is None, s))
    if len(steps) > 1:
        # A step ends at optimizer.step(): reads made after it (where most loops log) fall in the
        # next audited step, so the first audited step lacks them. Count from the second.
        recs = [r for r in recs if r.get("step") != steps[0]]
        steps = steps[1:]
    n = len(steps)
    sites: dict[str, dict] = {}
    for r in recs:
        for user, leaf, op, count in r.get("reads") or []:
            s = sites.setdefault(user or leaf, {"site": user, "leaf": leaf, "ops": {}})
            s["ops"][op] = s["ops"].get(op, 0) + count
    rows = [{"site": s["site"], "leaf": s["leaf"], "ops": sorted(s["ops"]), "per_step": max(s["ops"].values()) / n}
            for s in sites.values()]
    rows.sort(key=lambda s: -s["per_step"])
    micro = sorted(r["mb"] for r in recs if r.get("mb"))
    return {"steps": n, "per_step": sum(s["per_step"] for s in rows), "sites": rows,
            "micro_batches_per_step": micro[len(micro) // 2] if micro else None}


def _audited(records) -> list[dict]:
    """The ``transfers`` records of the steps the analysis uses: optimizer-marked ones when there
    are any (the loader-marked micro-batches before a first accumulated optimizer step are not
    steps of the run), else all."""
    recs = [r for r in records if r.get("k") == "transfers"]
    by_optimizer = [r for r in recs if r.get("by") == "optimizer"]
    return by_optimizer or recs


def placement_summary(records: list[dict]) -> dict:
    """``module_to`` and ``cuda_query`` records of a trainer: ``{module_moves: [{cls, device, site}],
    cuda_queries: [{result, site}], batch_moves: [{site, device, non_blocking}]}`` (batch moves from the transfer
    audit: ``.to(device)`` of DataLoader batch tensors, any target)."""
    moves = [{"cls": r.get("cls"), "device": r.get("device"), "site": r.get("site") or r.get("leaf")}
             for r in records if r.get("k") == "module_to"]
    queries = [{"result": r.get("result"), "site": r.get("site")} for r in records if r.get("k") == "cuda_query"]
    batch: dict[tuple, dict] = {}
    for r in records:
        if r.get("k") != "transfers":
            continue
        for user, leaf, dev, _pinned, non_blocking, from_batch, *_ in r.get("items") or []:
            if from_batch:
                batch.setdefault((user or leaf, dev, non_blocking),
                                 {"site": user or leaf, "device": dev, "non_blocking": non_blocking})
    return {"module_moves": moves, "cuda_queries": queries, "batch_moves": list(batch.values())}
