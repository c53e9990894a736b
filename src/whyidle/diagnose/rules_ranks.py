"""``imbalance`` for a live ``torch.distributed`` job: the ranks wait for a straggler.

The report of a distributed job describes the straggler (:func:`whyidle.analysis.ranks.straggler`),
so its own findings name *why* it is late; this one says that the other ranks wait for it and how
much. Evidence keys follow the trace reports' ``imbalance`` (diagnose/trace_rules.py).
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import _ms, _pct, _round, finding
from whyidle.diagnose.types import Finding

DOCS_DDP = "https://pytorch.org/docs/stable/notes/ddp.html"

#: What an intermittent straggler did more in its late steps (``late_cause`` phase) → its name and
#: the fix. Evaluation: cases.md C17 (Horovod #159, the maintainer's fix: shard it, all-reduce the
#: metric).
LATE_ADVICE = {
    "evaluation": ("evaluation", "evaluation on this rank alone (rank-0-only validation) leaves the others "
                   "waiting in the next collective. Shard it across the ranks (a `DistributedSampler` over the "
                   "validation set) and all-reduce the metric once, so each rank evaluates its part at the same "
                   "time (Lightning: validation runs on every rank by default; log epoch-level metrics with "
                   "`sync_dist=True`)."),
    "checkpoint": ("checkpoint saving", "a checkpoint this rank alone writes holds the others in the next "
                   "collective. Save asynchronously (`torch.distributed.checkpoint.async_save`, Lightning's "
                   "`AsyncCheckpointIO`) or less often."),
    "logging": ("logging", "the experiment tracker's calls on this rank alone hold the others in the next "
                "collective: log less often or from a background thread (wandb and TensorBoard buffer)."),
    "other_host": ("host work outside the model", "work this rank alone does between steps (logging, metric "
                   "files, checkpoint writing, uploads) holds the others in the next collective. Do it less "
                   "often, on a background thread, or spread it over the ranks."),
    "data_wait": ("data wait", "its input pipeline stalls now and then (a slow shard or file, workers "
                  "restarting at an epoch boundary): its input findings in this report, and `persistent_workers=True`."),
    "forward": ("compute", "its device was slower in those steps (clock throttling, another process on its GPU "
                "or cores): check its clocks and what else runs there."),
}
LATE_ADVICE["eval"] = LATE_ADVICE["evaluation"]


def imbalance(facts: RunFacts, findings: list[Finding]) -> Finding | None:
    """The ranks wait for a straggler (``facts.straggler``).

    ``bound`` = the straggler's excess share of its step (the job runs at its pace) and
    ``est_speedup`` = 1 / (1 − bound), the job's gain if it did no more than the other ranks; for
    a late cause that is evaluation on that rank alone, the fix shards it, so the others still
    do their 1/world of it: 1 / (1 − bound × (1 − 1/world)). A
    warning, unless one of the straggler's own warning or critical findings holds at least half
    that excess: then its cause is the verdict with its fix, and this finding (info) says who waits.
    """
    s = facts.straggler
    if not s:
        return None
    steps = {str(r["rank"]): r["step_time_s"]["mean"] for r in facts.ranks or []}
    waits = {rank: w / steps[rank] for rank, w in s["wait_s_by_rank"].items() if steps.get(rank)}
    wait_share = sum(waits.values()) / len(waits) if waits else None
    step_s = steps.get(str(s["rank"]))
    if s.get("measured"):
        summary = (f"Rank {s['rank']} is the straggler: of {s['steps']} steps compared, a rank arrived late at the "
                   f"step's collectives in {s['late_steps']}, rank {s['rank']} in {_pct(s['culprit_share'])} of them; "
                   f"the other ranks wait {_ms(s['excess_s'])} per step for it in their collectives "
                   f"({_pct(wait_share)} of their step; timed at DDP's gradient all-reduce and buffer broadcast "
                   "and the program's own collectives).")
    else:
        forward = "forward" in s.get("waits_in", ())
        outside = "forward and backward" if forward else "backward"
        summary = (f"Rank {s['rank']} is the straggler: its work outside {outside} (data wait, "
                   + ("" if forward else "forward, ") + f"optimizer, evaluation, Python) takes {_ms(s['own_s'])} of "
                   f"each {_ms(step_s)} step against {_ms(s['others_own_s'])} on the other ranks, which wait for it "
                   + ("at the buffer broadcast in forward or the gradient all-reduce in backward" if forward else
                      "at the gradient all-reduce inside their backward")
                   + (f" ({_pct(wait_share)} of their step)" if wait_share is not None else "") + ".")
    own = [f for f in findings if f["severity"] != "info" and (f.get("bound") or 0) >= 0.5 * s["excess_share"]]
    cause = s.get("late_cause")
    shard = 1.0  # the share of the wait a fix removes
    if own:
        text = (f"Fix rank {s['rank']}'s own cause: the findings of this report are its own (`{own[0]['id']}` "
                "first); the other ranks speed up with it.")
    elif cause:
        world = len(facts.ranks or []) or 2
        name, advice = LATE_ADVICE.get(cause["phase"], LATE_ADVICE["forward"])
        if cause["phase"] in ("eval", "evaluation"):
            shard = 1.0 - 1.0 / world  # every rank does its 1/world of the evaluation
        text = (f"In the {cause['steps']} steps where rank {s['rank']} was late, its {name} took "
                f"{_ms(cause['extra_s'])} more than in its other steps: " + advice)
    else:
        late = next((r for r in facts.ranks or [] if r["rank"] == s["rank"]), None)
        phase, share = max(((k, v) for k, v in (late or {}).get("shares", {}).items()
                            if k not in s.get("waits_in", () if s.get("measured") else ("backward",))),
                           key=lambda kv: kv[1], default=("forward", None))
        where = f" ({phase.replace('_', ' ')} takes {_pct(share)} of its step)" if share is not None else ""
        text = (f"Look at what rank {s['rank']} does differently{where}: its data (a shard of longer or costlier samples: "
                "balance them per rank, e.g. bucketing by length), its host work (rank-0-only logging or "
                "evaluation), its device (clocks, placement) or its CPU share.")
    evidence = _round({"straggler_rank": s["rank"], "culprit_rank": s["rank"], "culprit_share": s.get("culprit_share"),
                       "caused_share": s.get("caused_share"), "measured": bool(s.get("measured")), "excess_s": s["excess_s"], "excess_share": s["excess_share"],
                       "own_s": s.get("own_s"), "others_own_s": s.get("others_own_s"), "wait_share": wait_share})
    evidence["step_s_by_rank"] = _round(steps)
    evidence["wait_s_by_rank"] = evidence["wait_s_per_step"] = _round(s["wait_s_by_rank"])
    est = 1.0 / (1.0 - min(s["excess_share"] * shard, 0.95))
    return finding("imbalance", "info" if own else "warning", "Imbalance: ranks wait for a straggler", summary,
                   evidence, est, text, None, [DOCS_DDP], bound=s["excess_share"])



def metric_collectives(facts: RunFacts) -> Finding | None:
    """The program all-reduces small tensors (metrics) on every step (cases.md C28: Lightning's
    ``self.log(..., sync_dist=True)`` per step, a loss averaged across ranks for a progress bar).
    Each is a collective on the step's critical path, usually with a host read after it.

    From the primary rank's own blocking collectives (``facts.collectives``, timed on gloo/mpi):
    at least one per step in at least half of the steps, most of them on ≤ ``METRIC_MAX_NUMEL`` elements
    (analysis/collectives.py). ``bound`` = their time per step / the mean step; a warning from
    ``T.HOST_SHARE_WARN`` of the step, info below. ``est_speedup`` removes that time (Amdahl).
    """
    c, step = facts.collectives, facts.step
    if not c or not step or c["small_share"] < 0.5 or c["steps"] < 0.5 * step["steps"]:
        return None
    step_s = step["step_time_s"]["mean"]
    share = min(1.0, c["s_per_step"] / step_s) if step_s > 0 else 0.0
    if share < T.HOST_SHARE_WARN and c["per_step"] < 1.5:
        return None  # one cheap collective per step: Lightning's own stop decision does that much
    summary = (f"The program runs {c['per_step']:.1f} collectives on small tensors (metrics) per step, "
               f"{_ms(c['s_per_step'])} of each {_ms(step_s)} step ({_pct(share)}), on every rank: each waits for "
               "every other rank and usually ends in a host read.")
    text = ("Accumulate the metrics locally (a running sum in a tensor on the device) and all-reduce them once "
            "when you log or at the epoch's end; rank 0 can log its own values in between. Lightning: "
            "`self.log(..., sync_dist=True)` only with `on_epoch=True, on_step=False`, or `sync_dist=False` for "
            "step values; torchmetrics syncs at `compute()`.")
    code = ("sums += torch.stack([loss.detach(), acc])   # every step: no collective\n"
            "if step % log_every == 0:\n"
            "    dist.all_reduce(sums)                  # one collective per log interval\n"
            "    log((sums / (dist.get_world_size() * log_every)).tolist())\n"
            "    sums.zero_()")
    evidence = _round({"per_step": c["per_step"], "s_per_step": c["s_per_step"], "share": share,
                       "small_share": c["small_share"], "steps": c["steps"]})
    sev = "warning" if share >= T.HOST_SHARE_WARN else "info"
    est = 1.0 / (1.0 - min(share, 0.95)) if sev != "info" else None
    return finding("metric_collectives", sev, "Per-step metric collectives", summary, evidence, est, text, code,
                   ["https://lightning.ai/docs/pytorch/stable/extensions/logging.html#logging-from-a-lightningmodule",
                    DOCS_DDP], bound=share)


def accumulation_all_reduce(facts: RunFacts) -> Finding | None:
    """Gradient accumulation that all-reduces the gradients on every micro-batch (cases.md C27:
    torchtune #1275 "more than doubled" on 8 nodes; NVIDIA cosmos #161, 1.63× with the fix), from
    ``facts.accumulation`` (the described rank's DDP reductions per optimizer step, timed on gloo).

    ``bound`` = ``redundant_s`` / the mean step (the reduction time not hidden behind backward, for
    all rounds but the last); a warning from ``T.HOST_SHARE_WARN``, info below (the redundant
    reductions still cost network time on a real cluster). ``est_speedup`` = 1 / (1 − bound).
    """
    acc, step = facts.accumulation, facts.step
    if not acc or not step:
        return None
    step_s = step["step_time_s"]["mean"]
    red = acc.get("redundant_s")
    share = min(0.95, red / step_s) if red is not None and step_s > 0 else None
    summary = (f"Gradient accumulation over {acc['micro']:g} micro-batches all-reduces the gradients "
               f"{acc['rounds']:g} times per optimizer step, once per backward"
               + (f": the reductions not hidden behind backward take {_ms(acc['exposed_s'])} of each "
                  f"{_ms(step_s)} step, {_ms(red)} of it for the {acc['rounds'] - 1:g} that only the last "
                  f"micro-batch needs ({_pct(share)})" if share is not None else "") + ".")
    text = ("Reduce only on the last micro-batch: run the others under `model.no_sync()` (DDP); FSDP2: "
            "`model.set_requires_gradient_sync(False)` on those; Accelerate: `with accelerator.accumulate(model):`; "
            "Lightning (`accumulate_grad_batches`) and the HF Trainer (`gradient_accumulation_steps`) do this "
            "themselves. If a wrapper of yours decides, check that it recognizes the model's type.")
    code = ("for k, (x, y) in enumerate(micro_batches):\n"
            "    last = k == len(micro_batches) - 1\n"
            "    with contextlib.nullcontext() if last else model.no_sync():  # no all-reduce before the last\n"
            "        (loss_fn(model(x), y) / len(micro_batches)).backward()\n"
            "optimizer.step()\n"
            "optimizer.zero_grad(set_to_none=True)")
    evidence = _round({"micro_batches": acc["micro"], "reductions_per_step": acc["rounds"],
                       "exposed_s": acc["exposed_s"], "redundant_s": red, "share": share, "steps": acc["steps"]})
    sev = "warning" if (share or 0) >= T.HOST_SHARE_WARN else "info"
    est = 1.0 / (1.0 - share) if share and sev != "info" else None
    return finding("accumulation_all_reduce", sev, "Gradient all-reduce on every micro-batch", summary, evidence,
                   est, text, code, ["https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel"
                                     ".html#torch.nn.parallel.DistributedDataParallel.no_sync", DOCS_DDP],
                   bound=share or 0.0)


#: NCCL variables that turn a transport off (NCCL's environment variables documentation): set in a
#: job's environment they force slower paths (PCIe or the network instead of NVLink/InfiniBand).
NCCL_TRANSPORT_OFF = {"NCCL_P2P_DISABLE": "peer-to-peer (NVLink/PCIe P2P)", "NCCL_IB_DISABLE": "InfiniBand",
                      "NCCL_SHM_DISABLE": "shared memory", "NCCL_NVLS_ENABLE": "NVLink SHARP"}
DOCS_NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"


#: Fewest steps, and least fraction of the longest rank's steps, by which the ranks' step counts
#: must differ to be uneven shards (a run stopped mid-step leaves one rank a step behind).
UNEVEN_MIN_STEPS = 2
UNEVEN_MIN_SHARE = 0.02

#: Repeated samples, as a fraction of the dataset, from which a padding ``DistributedSampler`` is
#: worth a line (a large dataset's few repeats change nothing).
PAD_MIN_SHARE = 0.01

UNEVEN_CODE = ("sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)   # the same batches on every rank\n"
               "loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler)\n"
               "for epoch in range(epochs):\n"
               "    sampler.set_epoch(epoch)\n"
               "    for x, y in loader:\n"
               "        ...")


def uneven_shards(facts: RunFacts) -> Finding | None:
    """The ranks' data shards differ in length.

    Measured: the ranks ran different numbers of steps (``ranks[].steps`` differ by at least
    :data:`UNEVEN_MIN_STEPS` and :data:`UNEVEN_MIN_SHARE` of the most): a rank that runs out of
    data leaves the others' collectives without it — under ``model.join()`` it shadows them with
    its device idle, without it DDP hangs in the next collective (the run then ends killed). A
    warning; ``bound`` = 1 − mean/most (the share of the longest ranks' steps that even shards of
    the same data would not need), ``est_speedup`` = most/mean. Otherwise, info when the
    training loader's ``DistributedSampler`` pads: ``drop_last=False`` with a dataset that does
    not split evenly repeats ``total_size − len(dataset)`` samples each epoch, at least
    :data:`PAD_MIN_SHARE` of them (no idle time: trained on twice, and counted twice by an
    evaluation metric); ``bound`` null. None else. A window of a running job (``meta.window``,
    :mod:`whyidle.run.rolling`) cuts the ranks' steps at a time, not at a step: its step counts
    are not compared."""
    counts = {str(r["rank"]): r["steps"] for r in facts.ranks or [] if isinstance(r.get("steps"), int)}
    if len(counts) >= 2 and not (facts.meta or {}).get("window"):
        most, least = max(counts.values()), min(counts.values())
        if most - least >= max(UNEVEN_MIN_STEPS, UNEVEN_MIN_SHARE * most):
            mean = sum(counts.values()) / len(counts)
            short = min(counts, key=counts.get)
            summary = (f"The ranks ran different numbers of steps ({', '.join(f'rank {r}: {n}' for r, n in counts.items())}): "
                       f"their data shards differ in length, so for the last {most - least} steps rank {short} had no "
                       "data while the others trained. Under `model.join()` its device idles shadowing their "
                       "collectives; without it DDP waits in the next collective for a rank that has stopped.")
            text = ("Give every rank the same number of batches: a `DistributedSampler` (it pads or, with "
                    "`drop_last=True`, trims to an even split) instead of slicing the data per rank; for an "
                    "`IterableDataset`, a number of shards divisible by the world size "
                    "(`datasets.distributed.split_dataset_by_node`) or stop every rank after the shortest shard's "
                    "batches. Keep `model.join()` for what stays uneven.")
            return finding("uneven_shards", "warning", "Uneven shards: ranks run out of data at different steps",
                           summary, {"steps_by_rank": counts, "most": most, "least": least}, most / mean, text,
                           UNEVEN_CODE, ["https://pytorch.org/tutorials/advanced/generic_join.html", DOCS_DDP],
                           bound=1.0 - mean / most)
    loader = facts.loader or {}
    shard, n = loader.get("shard") or {}, loader.get("dataset_len")
    total = shard.get("total_size")
    if (shard.get("drop_last") is False and isinstance(n, int) and isinstance(total, int) and n > 0
            and (total - n) / n >= PAD_MIN_SHARE):
        summary = (f"The training loader's `DistributedSampler` pads {n} samples to {total} for "
                   f"{shard.get('num_replicas')} ranks by repeating {total - n} of them every epoch "
                   "(`drop_last=False`): each rank gets the same number, so no rank idles, but those samples "
                   "are trained on twice, and an evaluation loader split so counts them twice in its metric.")
        text = ("Harmless for training at this size; for evaluation, `drop_last=True` drops the tail instead "
                "(or evaluate the remainder on one rank, or gather and de-duplicate the predictions).")
        return finding("uneven_shards", "info", "DistributedSampler repeats samples to even the shards", summary,
                       {"dataset_len": n, "total_size": total, "repeated": total - n,
                        "num_replicas": shard.get("num_replicas")}, None, text,
                       "DistributedSampler(dataset, shuffle=False, drop_last=True)",
                       ["https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler"])
    return None


def data_parallel(facts: RunFacts) -> Finding | None:
    """``torch.nn.DataParallel`` wraps the model (cases.md C16): one process scatters the batch,
    replicates the model on every forward and gathers the outputs on GPU 0 under one GIL (GPU 0
    70 %, the others < 20 % in the case). A warning when it spans more than one device, info
    otherwise (on one device or none it only adds a call). ``bound`` and ``est_speedup`` null."""
    dp = next((w for w in (facts.devices or {}).get("wrappers") or [] if w.get("kind") == "DataParallel"), None)
    if dp is None:
        return None
    n = dp.get("devices") or 0
    summary = (f"The model is wrapped in `torch.nn.DataParallel` over {n} device{'s' if n != 1 else ''}: one process "
               "replicates the model on every forward and gathers the outputs on the first GPU, so the others "
               "wait for it and for one Python thread.")
    text = ("Use `DistributedDataParallel`, one process per GPU: launch with `torchrun --nproc_per_node N`, call "
            "`torch.distributed.init_process_group('nccl')`, place the model on `LOCAL_RANK`'s GPU and give each "
            "rank its shard with a `DistributedSampler` (Lightning: `strategy='ddp'`; Accelerate and the HF "
            "Trainer do this under `accelerate launch` / `torchrun`).")
    code = ("local_rank = int(os.environ['LOCAL_RANK'])\n"
            "torch.distributed.init_process_group('nccl')\n"
            "torch.cuda.set_device(local_rank)\n"
            "model = DistributedDataParallel(model.cuda(local_rank), device_ids=[local_rank])   # was: DataParallel(model)\n"
            "loader = DataLoader(data, batch_size=per_gpu_batch, sampler=DistributedSampler(data))")
    return finding("data_parallel", "warning" if n > 1 else "info", "Single-process DataParallel", summary,
                   {"devices": n}, None, text, code,
                   ["https://pytorch.org/docs/stable/notes/cuda.html#cuda-nn-ddp-instead", DOCS_DDP])


def dist_config(facts: RunFacts) -> Finding | None:
    """Settings of a distributed job that cost collective speed on GPUs, as info (cases.md C37:
    NCCL silently on a slower path): gloo as the backend while the model trains on CUDA (NCCL is
    the GPU backend), and NCCL variables in the environment that turn a transport off
    (``NCCL_TRANSPORT_OFF``), with every ``NCCL_*`` variable set listed. None without either."""
    devices = facts.devices or {}
    env = devices.get("nccl_env") or {}
    backend = str((devices.get("dist") or {}).get("backend") or "")
    items = []
    if backend == "gloo" and "cuda" in (devices.get("params") or {}):
        items.append("the process group uses gloo while the model trains on CUDA: gloo copies every collective "
                     "through host memory; `init_process_group('nccl')` keeps them on the GPUs")
    off = [k for k in NCCL_TRANSPORT_OFF if str(env.get(k, "")).strip() not in ("", "0")]
    for k in off:
        items.append(f"`{k}={env[k]}` turns NCCL's {NCCL_TRANSPORT_OFF[k]} transport off")
    if not items:
        return None
    summary = "Distributed settings that slow collectives on GPUs: " + "; ".join(items) + "."
    text = ("Use NCCL for CUDA tensors, and unset the NCCL variables that turn transports off unless they work "
            "around a known fault of this cluster (check with `NCCL_DEBUG=INFO`: it logs the transport each "
            "channel uses). Ranks that each see only their own GPU (a per-task `CUDA_VISIBLE_DEVICES`) also keep "
            "NCCL off NVLink: let every rank see the node's GPUs and pick its own by `LOCAL_RANK`.")
    return finding("dist_config", "info", "Distributed settings on a slower path", summary,
                   {"backend": backend or None, "transports_off": off, "nccl_env": env}, None, text, None,
                   [DOCS_NCCL_ENV, DOCS_DDP])
