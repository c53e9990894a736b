"""Diagnosis rules: facts (from :func:`whyidle.analysis.run.analyze`) → findings.

One small function per finding id; each returns a finding dict or ``None``. A finding follows
the report contract (docs/report.md): ``{id, severity, title, summary, evidence, bound,
est_speedup_if_removed, est_speedup, fix: {text, code, docs, options}}``. ``bound`` is the measured
fraction of the step the cause holds (the verdict is chosen by it, :mod:`whyidle.diagnose.verdict`);
``est_speedup`` is the predicted step-time ratio once the printed fix is applied on this machine
(for ``small_batch``: the samples/s ratio at the target batch size); ``None`` when it cannot be
estimated. Thresholds live in :mod:`whyidle.diagnose.thresholds`.
"""

from __future__ import annotations

import math
import re

from whyidle.analysis.facts import RunFacts
from whyidle.analysis.stacks import OUTPUT_MODULES
from whyidle.diagnose import fixes, loader_order, loader_receive, loader_shards, loader_smells, notebook, sample_cost
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.fixes import ACCUMULATE_CODE  # noqa: F401  (trace_rules imports it from here)
from whyidle.diagnose.loader_call import Change, operand
from whyidle.diagnose.types import Finding, FixOption, fix_option  # noqa: F401  (fix_option: the rule modules import it from here)

DOCS_DATALOADER = "https://pytorch.org/docs/stable/data.html#multi-process-data-loading"
DOCS_TUNING = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
DOCS_THREADS = "https://pytorch.org/docs/stable/notes/cpu_threading_torchscript_inference.html"

#: Words in a hotspot's function name that mark logging / progress / formatting work (fix: do it
#: every N steps) rather than computation (fix: vectorize). Matched as whole words of the name
#: split at "_" and case changes, so ``log_softmax``'s "log" counts but ``logits`` does not.
LOGGING_WORDS = {"log", "logs", "logger", "logging", "print", "progress", "tqdm", "display", "report", "write",
                 "flush", "format", "dump", "emit", "status", "bar", "tensorboard", "wandb", "csv", "json"}
#: Words that look like logging but name math (``log_softmax``, ``logsumexp``, ``log_prob``).
MATH_WORDS = {"softmax", "sumexp", "prob", "probs", "likelihood", "det", "sigmoid", "1p", "cosh", "normal"}


def finding(fid: str, severity: str, title: str, summary: str, evidence: dict,
            est_speedup: float | None, fix_text: str, code: str | None = None,
            docs: list[str] | None = None, bound: float | None = None,
            options: list[FixOption] | None = None) -> Finding:
    """Builds one finding of the report contract (:class:`whyidle.diagnose.types.Finding`).

    ``bound``: the measured fraction (0–1) of the step (traces: of the traced time) that the
    cause explains; ``est_speedup_if_removed`` = 1/(1 − bound) follows from it
    (:func:`speedup_if_removed`). ``est_speedup``: what the printed fix gives on this machine
    (None: cannot be estimated). ``options``: the fix options ranked for this machine, each
    ``{text, code, est_speedup, condition}`` (:func:`fix_option`), the first the printed fix (empty:
    the finding has only that fix).
    """
    return {
        "id": fid, "severity": severity, "title": title, "summary": summary,
        "evidence": evidence,
        "bound": round(min(max(bound, 0.0), 1.0), 4) if bound is not None else None,
        "est_speedup_if_removed": round(speedup_if_removed(bound), 3) if bound is not None else None,
        "est_speedup": round(est_speedup, 3) if est_speedup is not None else None,
        "fix": {"text": fix_text, "code": code, "docs": docs or [], "options": options or []},
    }


def printed_fix_first(findings: list[dict]) -> None:
    """Makes every finding's printed fix its first option: ``est_speedup``, ``fix.text`` and
    ``fix.code`` are ``fix.options[0]``'s wherever there are options, so the JSON's estimate is the
    gain of the fix the terminal prints, whatever a rule or a later link between findings changed."""
    for f in findings:
        options = (f.get("fix") or {}).get("options") or []
        if options:
            first = options[0]
            f["est_speedup"] = first["est_speedup"]
            f["fix"]["text"], f["fix"]["code"] = first["text"], first["code"]


def bound_of(est_speedup: float | None) -> float | None:
    """The step fraction a cause holds when removing it gives ``est_speedup`` (1 − 1/est): for
    findings whose fix removes the whole cause (Amdahl's law read backwards)."""
    return None if est_speedup is None or est_speedup <= 0 else max(0.0, 1.0 - 1.0 / est_speedup)


def speedup_if_removed(share: float) -> float:
    """Step-time ratio when a share (0–1) of the step disappears: 1/(1 − share), the share capped
    at 0.95 so a measurement artefact cannot promise more than 20×."""
    return 1.0 / (1.0 - min(share, 0.95))


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f} ms"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def _round(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, float):
            v = round(v, 4) if abs(v) < 100 else round(v, 1)
        out[k] = v
    return out


def usable_cores(host: dict) -> float:
    """Cores the job may use (``cores_usable``: the machine's cores, less what its affinity mask or
    cgroup CPU quota leaves it), else the smaller of the machine's cores and the affinity (runs
    recorded before the quota was). A float: a quota of 1.5 CPUs is 1.5 cores."""
    cores = host.get("cores") or 1
    return host.get("cores_usable") or min(cores, host.get("cpu_affinity") or cores)


def whole_cores(host: dict) -> int:
    """:func:`usable_cores` as a count of threads or processes that fit them (at least 1)."""
    return max(1, int(usable_cores(host) + 1e-9))


def cores_text(host: dict) -> str:
    """The cores said in a finding: ``"2 cores"``, or where fewer may be used than the machine has,
    ``"1 usable core (cgroup quota)"``."""
    n = usable_cores(host)
    why = host.get("cores_limit_by")
    return f"{n:g} {'usable ' if why else ''}core{'s' if n != 1 else ''}" + (f" ({why})" if why else "")


def job_busy_share(host: dict) -> float | None:
    """How busy the cores the job may use are (0–1): the machine's ``cpu_busy_share``, or where its
    affinity or quota leaves it fewer cores, at least the job's own CPU (whyidle's included) over
    those."""
    busy = host.get("cpu_busy_share")
    if not host.get("cores_limit_by"):
        return busy
    own = sum(host.get(k) or 0.0 for k in ("trainer_cores", "workers_cores", "tree_other_cores", "whyidle_cores"))
    return min(1.0, max(busy or 0.0, own / usable_cores(host)))


def _workers_by_memory(host: dict, nw: int) -> tuple[int | None, str | None]:
    """The most loader workers that fit the cgroup memory limit, and a sentence about it (Nones
    without a limit). Each worker is counted at the largest resident memory one worker had
    (``worker_rss_max_bytes``; shared pages count in each, so this errs toward fewer), added to the
    job's largest resident memory, against ``MEM_LIMIT_FILL`` of the limit; without a worker in
    the run its memory is unknown: no cap, and the sentence says so."""
    limit = host.get("mem_limit_bytes")
    if not limit:
        return None, None
    used = host.get("tree_rss_max_bytes") or 0
    per = host.get("worker_rss_max_bytes")
    gb = f"the cgroup memory limit is {limit / 1e9:.1f} GB and the job used up to {used / 1e9:.1f} GB"
    if not nw or not per:
        return None, f"{gb}; a worker's memory was not measured (no worker ran): watch it against the limit"
    most = nw + max(0, math.floor((limit * T.MEM_LIMIT_FILL - used) / per))
    return most, f"{gb}, each worker up to {per / 1e9:.2f} GB: at most {most} worker{'s' if most != 1 else ''} fit"


def _loader_extras(loader: dict) -> str:
    """The worker options the loader fix adds beside ``num_workers``, as a sentence ending
    (``", keep them alive across epochs and queue batches ahead"``); only what the loader does not do
    already (:func:`whyidle.diagnose.fixes.loader_code` writes them)."""
    parts = []
    if not loader.get("persistent_workers"):
        parts.append("keep them alive across epochs")
    if (loader.get("prefetch_factor") or 2) < fixes.PREFETCH:
        parts.append("queue batches ahead")
    return (", " + " and ".join(parts)) if parts else ""


def loader_model(facts: RunFacts, cost: float | None = None) -> dict:
    """What more DataLoader workers would do on this machine, from the measured step (seconds per
    batch; CPU in core-seconds per batch); ``cost``: each sample's work after the "cheaper sample"
    fix as a fraction (0–1) of today's (measured: :func:`whyidle.diagnose.sample_cost.measured_cost`;
    None: ``T.CHEAPER_SAMPLE_COST``, an assumption).

    - ``fetch_s``: loader work per batch in one process: the data wait itself with
      ``num_workers=0``; ``num_workers`` × step time with workers (each worker delivers one batch
      per ``num_workers`` steps while the loop waits on them). ``compute_s``: the rest of the step.
    - ``need``: ⌈fetch / compute × headroom⌉ workers (cases.md C01), capped at the usable cores
      when the loader is on a CPU at least half its time (``cpu_bound``), else at 4 per core, and at
      the workers that fit a cgroup memory limit (``memory_cap``, ``memory_note``:
      :func:`_workers_by_memory`).
    - The step with ``w`` workers is a roofline, continuous in the CPU the job uses:
      max(compute, fetch / w, (loader CPU + training-process CPU) / usable cores), usable cores =
      the smaller of the machine's cores − other processes and the cores the job may use (its
      affinity mask, its cgroup CPU quota: :func:`usable_cores`), less whyidle's own. On a
      CPU-only run the cores *are* the device: when the cores the model's compute keeps busy (its measured CPU ÷ compute time, at most its intra-op
      threads) plus ``w`` workers exceed the usable cores, the fix also lowers
      ``torch.set_num_threads`` to cores − w (``threads``) and the compute is counted as slower in
      proportion (measured on 2 cores: 2 workers beside 2 busy intra-op threads made a 12 ms
      compute 4× slower; with 1 thread it took 2.3×).
    - ``workers``: of the counts up to ``need`` whose predicted step is within 3 % of the best, the
      smallest when the cores cap it, else the largest (headroom); one more than today at least,
      unless fetching is cheaper than a worker's IPC (``WORKER_MIN_FETCH_S``). The cores term is
      divided by ``CPU_PARALLEL_EFFICIENCY`` (``ONE_CORE_EFFICIENCY`` where the job may use one core).
    - ``limit``: what caps the prediction: ``cores``, ``compute`` or ``workers``;
      ``cores_for_all`` / ``est_speedup_unbounded``: the cores at which enough workers (``need``)
      would reach the compute-only step, and that gain.
    - ``est_speedup_cheaper``: the gain of each sample costing ``cost`` × today's work with
      today's workers (their fetch and CPU scaled; without workers the wait shrinks);
      ``est_speedup_cheaper_workers``: the same with ``workers`` workers too (the two fixes together).
    """
    step = facts.step
    host = facts.host or {}
    loader = facts.loader or {}
    nw = loader.get("num_workers") or 0
    cores = usable_cores(host)
    per_batch = 1 / max(1.0, step.get("batches_per_step") or 1)
    now = step["step_time_s"]["mean"] * per_batch
    wait = step["data_wait_s_per_step"] * per_batch
    fetch = wait if nw == 0 else nw * now
    compute = max(step["compute_s_per_step"] * per_batch, 1e-6)
    busy = cpu_given(step.get("data_cpu_share") if nw == 0 else host.get("worker_busy_share"), host)
    demand = (busy or 0.0) + (host.get("workers_run_delay_share") or 0.0 if nw else 0.0)
    cpu_bound = demand >= T.LOADER_OFF_CPU
    loader_cpu = (busy or 0.0) * wait if nw == 0 else (host.get("workers_cores") or 0.0) * now
    trainer_cpu = (host.get("trainer_cores") or step.get("main_cpu_share") or 1.0) * now
    compute_cpu = max(trainer_cpu - (loader_cpu if nw == 0 else 0.0), 0.0)
    own = host.get("whyidle_cores") or 0.0
    usable = max(1.0, min((host.get("cores") or 1) - (host.get("other_procs_cores") or 0.0), cores) - own)
    on_cpu = (facts.device or {}).get("kind") == "cpu"
    threads = (facts.devices or {}).get("threads") or (facts.proc or {}).get("threads") or 1
    compute_cpu = min(compute_cpu, compute * min(threads, usable))  # no more cores than its threads, or the box
    # cores the model's own compute keeps busy, measured (its intra-op threads at work)
    parallel = min(max(1.0, compute_cpu / compute), usable, float(threads))

    # one core, known from the records (an unknown host counts as one core, but may have more)
    efficiency = T.ONE_CORE_EFFICIENCY if host.get("cores") and cores <= 1 else T.CPU_PARALLEL_EFFICIENCY

    def predict(w: int, cost: float = 1.0) -> tuple[float, int, str]:
        """The step with ``w`` workers and each sample ``cost`` × today's work (threads, limit)."""
        t = threads
        comp = compute
        taken = w * (busy if busy is not None else 1.0)  # cores w workers keep busy at today's CPU share
        if on_cpu and w and parallel + taken > usable:  # the workers take cores the model's threads use
            t = max(1, round(usable - taken))
            comp = compute * max(1.0, parallel / t)
        terms = {"compute": comp, "workers": fetch * cost / w if w else fetch * cost + comp,
                 "cores": (loader_cpu * cost + compute_cpu) / (usable * efficiency)}
        limit = max(terms, key=terms.get)
        return min(now, terms[limit]) if w else now - fetch * (1.0 - cost), t, limit

    need = math.ceil(fetch / compute * T.WORKER_HEADROOM)
    whole = whole_cores(host)
    cap = min(whole if cpu_bound else max(4, 4 * whole), T.MAX_SUGGESTED_WORKERS)
    memory_cap, memory_note = _workers_by_memory(host, nw)
    if memory_cap is not None:
        cap = min(cap, memory_cap)
    tiny = fetch < T.WORKER_MIN_FETCH_S
    if tiny or (memory_cap is not None and memory_cap <= nw):
        workers = nw
    else:
        tried = {w: predict(w)[0] for w in range(nw + 1, max(nw + 1, min(need, cap)) + 1)}
        best = min(tried.values())
        near = [w for w, t in tried.items() if t <= best * 1.03]
        # headroom: where workers would just keep up, the largest count as fast (up to ``need``), so
        # the queue refills faster than it drains; where the cores cap it, more would only compete
        workers = min(near) if predict(min(near))[2] == "cores" else max(near)
    predicted, new_threads, limit = predict(workers)
    cheaper = T.CHEAPER_SAMPLE_COST if cost is None else min(max(cost, 0.0), 1.0)
    cpu_total = loader_cpu + compute_cpu
    floor = max(compute, fetch / max(1, need))
    return {"fetch_s": fetch, "compute_s": compute, "need": need, "cpu_bound": cpu_bound, "tiny_fetch": tiny,
            "workers": workers, "step_s": now, "predicted_step_s": predicted, "est_speedup": now / predicted,
            "demand": demand, "threads": new_threads if new_threads != threads else None, "limit": limit,
            "loader_cpu_s": loader_cpu, "compute_cpu_s": compute_cpu, "usable_cores": usable,
            "memory_cap": memory_cap, "memory_note": memory_note,
            "cores_for_all": math.ceil(cpu_total / floor) if floor > 0 else None,
            "est_speedup_unbounded": now / floor if floor > 0 else None,
            "est_speedup_cheaper": now / max(predict(nw, cheaper)[0], 1e-9),
            "est_speedup_cheaper_workers": now / max(predict(workers, cheaper)[0], 1e-9)}


def cpu_given(share: float | None, host: dict) -> float | None:
    """A process's CPU time per wall second (``share``, fraction of a core) as a fraction of the
    CPU the machine was given: on a virtual machine the hypervisor lends the cores to other guests
    ``host["steal_share"]`` of the time (``/proc/stat`` steal), which no process's CPU time
    counts, so a loader that computes all the time reads ``1 − steal`` busy. None stays None."""
    if share is None:
        return None
    steal = min(host.get("steal_share") or 0.0, 0.9)
    return share / (1.0 - steal)


def _workers_condition(model: dict, host: dict) -> str | None:
    """When more workers would give more than they do here (``None`` when the cores the job may
    use are not what caps them): ``"≈8.6× with ≥ 11 cores and 10 workers"``."""
    big = model.get("est_speedup_unbounded")
    need_cores = model.get("cores_for_all")
    if model["limit"] != "cores" or not big or not need_cores or need_cores <= usable_cores(host) \
            or big < model["est_speedup"] * T.VERDICT_MIN_SPEEDUP:
        return None
    n, why = usable_cores(host), host.get("cores_limit_by")
    here = (f"the job may use {n:g} core{'s' if n != 1 else ''} here: its {why}" if why
            else f"the {n:g} cores here cap it")
    return f"≈{big:.1f}× with ≥ {need_cores} cores and {model['need']} workers ({here})"


def rank_options(options: list[dict]) -> list[dict]:
    """Fix options, the one that gains most *here* first: options estimated at ≥
    ``VERDICT_MIN_SPEEDUP`` by their estimate, then those that cannot be estimated, or only under an
    assumption (``assumed``: their gain depends on how much cheaper the work gets), then those
    estimated below it. Estimates within ``ESTIMATE_TIE`` of the best one's are a tie, kept in the
    rule's order (its first option is the plainest change: a setting before a rewrite)."""
    estimates = [o["est_speedup"] for o in options if o["est_speedup"] is not None and not o.get("assumed")]
    best = max(estimates, default=0.0)

    def key(o: dict) -> tuple[int, float]:
        est = o["est_speedup"]
        if est is None or o.get("assumed"):
            return (1, 0.0)
        return (0 if est >= T.VERDICT_MIN_SPEEDUP else 2, -(best if est * T.ESTIMATE_TIE >= best else est))
    return sorted(options, key=key)


def suggested_workers(facts: RunFacts) -> int:
    """The ``num_workers`` to recommend (see :func:`loader_model`)."""
    return loader_model(facts)["workers"]


def gpu_idle_share(facts: RunFacts, cause: str) -> float | None:
    """Share of step time the GPU sat idle for ``cause`` (``data``, ``sync``, ``host``,
    ``launch``), measured by the CUDA timeline (:mod:`whyidle.analysis.gpu_idle`); None on runs
    without one. On a GPU this, not the host's time in a phase, is what removing the cause gains:
    host time spent while the GPU still has queued work costs nothing."""
    idle = facts.gpu_idle
    if not idle:
        return None
    return (idle.get("idle_share_by_cause") or {}).get(cause)


#: The ``many_tensors`` fix: a collate that returns a few batch tensors instead of one per sample
#: and field (the layout of cases.md C34's merged fix).
PACKED_COLLATE = """def packed_collate(samples):                # runs in the DataLoader workers
    images = torch.stack([s[0] for s in samples])
    targets = [s[-1] for s in samples]          # per-sample dicts of small tensors
    packed = {}
    for k in targets[0]:
        parts = [t[k] for t in targets]
        if all(p.shape == parts[0].shape for p in parts):
            packed[k] = torch.stack(parts)      # the same shape in every sample
        else:                                   # variable length: sample i is rows offsets[i]:offsets[i+1]
            packed[k] = torch.cat(parts)
            packed[k + "_offsets"] = torch.tensor([0] + [len(p) for p in parts]).cumsum(0)
    return images, packed                       # a few tensors per batch, the same bytes
"""


#: Innermost frames of image decoding and augmentation in the data phase.
IMAGE_LEAVES = ("PIL/", "cv2", "torchvision/io", "torchvision/transforms", "imageio/", "skimage/", "albumentations/")


def _leaves(facts: RunFacts) -> list[str]:
    """The innermost frames of the data phase's hotspots and their lines."""
    data = (facts.hotspots or {}).get("data", [])
    return [h.get("leaf") or "" for h in data] + [ln.get("leaf") or "" for h in data for ln in h.get("lines") or []]


def _images(facts: RunFacts) -> bool:
    """The data phase runs image code (:data:`IMAGE_LEAVES`)."""
    return any(p in leaf for leaf in _leaves(facts) for p in IMAGE_LEAVES)


def _decodes(facts: RunFacts) -> bool:
    """The data phase decodes images: a cheaper sample there means decoding at reduced size or
    caching decoded images, which leaves part of the time, so the measured "its time removed"
    estimate ranks as an assumption, after the workers' (image_decode_main: 2 workers measured
    1.49-1.71x, printed first; the removal estimate said 6.0x). PIL augmentation without decoding
    keeps its measured rank (randaugment_pil: 1.61x estimated, 1.48x measured)."""
    return _images(facts) and _decoding(facts)


def _decoding(facts: RunFacts) -> bool:
    """The data phase decodes images: its hot lines say so (:func:`sample_cost.decoding`), or at
    least ``T.IMAGE_READ_MIN_SHARE`` of its stack samples ran an image decoder (the hot lines name
    each line's most-sampled frame only: image_decode_main's decoding under a line whose top frame
    is the resize after it)."""
    return (sample_cost.decoding((facts.hotspots or {}).get("data"))
            or (facts.data_image_read_share or 0.0) >= T.IMAGE_READ_MIN_SHARE)


def _cheaper_sample(facts: RunFacts) -> str:
    """How to make each sample cheaper, by what the data phase's samples ran: image decoding, image
    augmentation (PIL operations without decoding), or PyTorch's own per-sample indexing and
    collation of in-memory tensors, else either."""
    images = _images(facts)
    gpu = (facts.device or {}).get("kind") == "cuda"
    if images and not _decoding(facts):
        return ("The images are augmented one at a time: run the augmentation on whole batches as tensor ops "
                "(torchvision.transforms.v2 or Kornia on a uint8 batch, one random op and magnitude per image)"
                + (" on the GPU" if gpu else "") + " instead of per-sample PIL calls in __getitem__.")
    if images:
        return ("Decode at reduced size (PIL Image.draft / reduce, torchvision decode_jpeg at lower resolution), resize "
                "before colour conversion and normalisation, or cache decoded samples once (a uint8 array or memmap)"
                + (", or decode and augment on the GPU on whole batches (torchvision.io.decode_jpeg(device=\"cuda\"), "
                   "DALI)." if gpu else "."))
    if (facts.loader or {}).get("dataset") == "TensorDataset":
        return ("The samples are in-memory tensors: the time is indexing them one sample at a time and collating the "
                "batch. Index whole batches instead: DataLoader(ds, sampler=BatchSampler(RandomSampler(ds), batch_size, "
                "drop_last=False), batch_size=None) calls the TensorDataset once per batch with a list of indices, or "
                "x[idx] with a shuffled index tensor.")
    return ("Cache the prepared samples once (tokenized ids or decoded arrays as one int/uint8 array or memmap), do "
            "per-batch work on whole batches in collate_fn, and keep Python out of the per-sample path.")


def data_wait_with_boundaries(facts: RunFacts) -> float | None:
    """The data wait per step (seconds) over the analyzed steps *and* the steps that began an epoch,
    which the shares leave out (:func:`whyidle.analysis.steps.select_steps`): what a data-time meter
    in the loop (the ImageNet example's ``data_time``) averages, a new iterator's start-up and its
    workers' first batches included. None when no such step was left out or it had no data wait."""
    info = facts.steps_info or {}
    extra, n_extra = info.get("boundary_data_s") or 0.0, info.get("boundary_excluded") or 0
    n = (facts.step or {}).get("steps") or 0
    if not extra or not n_extra or not n:
        return None
    return (facts.step["data_wait_s_per_step"] * n + extra) / (n + n_extra)


#: ``input_bound`` causes read from inside a multi-worker DataLoader, whose fix is not more workers.
LOADER_PART_CAUSES = ("uneven_shards", "main_process_receive", "head_of_line")


def _loader_part(cause: str, shards: dict | None, receive: dict | None, hol: dict | None) -> dict | None:
    """``evidence.loader_part`` of ``input_bound``: the measured figures behind the causes read from
    inside a multi-worker DataLoader (docs/report.md), None for the other causes."""
    if cause == "uneven_shards":
        return _round({"batches_by_worker": {str(k): v for k, v in shards["batches"].items()},
                       "imbalance": shards["imbalance"]})
    if cause == "main_process_receive":
        return _round({"part": receive["part"], "share_of_wait": receive["share"],
                       "conversion": receive["conversion"]})
    if cause == "head_of_line":
        return _round({"behind_s_per_step": hol["behind_s"], "pace_s_per_step": hol["pace_s"],
                       "slowest_pace_s_per_step": hol["slowest_pace_s"], "slow_worker": hol["slow_worker"]["worker"],
                       "suggested_prefetch_factor": hol["prefetch"]})
    return None


def _building(facts: RunFacts) -> str:
    """How much of the time the workers spent building batches, from their own tallies
    (``metrics.loader_workers``), for when the host sampler did not see them; ``""`` without."""
    rows = (facts.loader_workers or {}).get("workers") or []
    if not rows:
        return ""
    return f"(building batches {_pct(sum(w['busy_share'] for w in rows) / len(rows))} of the time on average)"


def input_bound(facts: RunFacts) -> dict | None:
    """The step waits for the next batch (data-wait share ≥ ``DATA_WAIT_WARN``).

    Cause, first match wins: ``unknown`` (no DataLoader configuration recorded); ``many_tensors``
    (workers hand over batches of ``T.BATCH_TENSORS_MANY``+ tensors and the training thread spends
    ``T.IPC_SHARE_OF_WAIT``+ of its wait receiving them, cases.md C34); ``uneven_shards`` (an
    IterableDataset's workers hold unequal work: :mod:`whyidle.diagnose.loader_shards`);
    ``main_process_receive`` (batches were ready; the training process's receiving holds the wait:
    :mod:`whyidle.diagnose.loader_receive`); ``head_of_line`` (the loop waits behind one slow batch
    while others are ready: :mod:`whyidle.diagnose.loader_order`); ``storage``
    (the loader is mostly off-CPU, not even waiting for a core, while reading files; or iowait
    is high); ``loader_in_main_process`` (``num_workers=0``); ``cpu_preprocessing`` (workers
    want a core all the time and the machine is out of cores: more workers cannot help);
    ``too_few_workers``. Source lines of the loading work are named only with
    ``num_workers=0``: with workers the training thread just waits on their queue (the workers'
    own stacks are not sampled).

    ``est_speedup`` is what the recommended fix should give (:func:`loader_model`: more workers,
    limited by the cores there are); ``evidence.est_speedup_if_removed`` is 1/(1 − share), the
    gain if the wait disappeared entirely (for ``cpu_preprocessing`` that is the estimate).
    """
    step = facts.step
    if not step:
        return None
    host_share = step["shares"]["data_wait"]
    gpu_share = gpu_idle_share(facts, "data")
    share = host_share if gpu_share is None else gpu_share  # on a GPU: the idle the GPU felt
    if share < T.DATA_WAIT_WARN:
        return None
    host = facts.host or {}
    loader = facts.loader or {}
    nw = loader.get("num_workers")
    cores = usable_cores(host)
    busy = cpu_given(step.get("data_cpu_share") if not nw else host.get("worker_busy_share"), host)
    # time the loader wanted a core and waited for one (the workers', or with num_workers=0 the
    # training thread's): not off-CPU time, so not a sign of storage
    waiting_for_cpu = (host.get("workers_run_delay_share") if nw else host.get("trainer_run_delay_share")) or 0.0
    off_cpu = None if busy is None else max(0.0, 1.0 - busy - waiting_for_cpu)
    per_sample = host.get("loader_read_bytes_per_sample")
    iowait = host.get("iowait_share") or 0.0
    cpu_busy = job_busy_share(host)
    reads = (per_sample or 0) >= T.STORAGE_MIN_READ_BYTES_PER_SAMPLE or iowait >= T.IOWAIT_STORAGE
    measured = sample_cost.measured_cost((facts.hotspots or {}).get("data"), host_share, nw,
                                         (facts.focus or {}).get("data") if not nw else None)
    model = loader_model(facts, measured.cost if measured else None) if loader else None
    tensors = (facts.devices or {}).get("batch_tensors") or 0
    ipc = facts.data_ipc_share
    shards = loader_shards.uneven(facts) if nw else None
    receive = loader_receive.main_process(facts) if nw and not shards else None
    hol = loader_order.head_of_line(facts) if nw and not shards else None
    if receive and hol:  # the larger part of the wait: receiving batches, or waiting behind a slow one
        receive, hol = (None, hol) if hol["behind_s"] > (receive["share"] or 0) * step["data_wait_s_per_step"] \
            else (receive, None)
    if not loader:
        cause = "unknown"
    elif nw and tensors >= T.BATCH_TENSORS_MANY and (ipc or 0) >= T.IPC_SHARE_OF_WAIT:
        cause = "many_tensors"
    elif shards:
        cause = "uneven_shards"
    elif receive:
        cause = "main_process_receive"
    elif hol:
        cause = "head_of_line"
    elif (off_cpu is not None and off_cpu >= T.LOADER_OFF_CPU and reads) or (busy is None and iowait >= T.IOWAIT_STORAGE):
        cause = "storage"
    elif not nw:
        cause = "loader_in_main_process"
    elif model["cpu_bound"] and ((cpu_busy or 0) >= T.CPU_SATURATED or model["est_speedup"] < T.VERDICT_MIN_SPEEDUP):
        cause = "cpu_preprocessing"  # the workers are on a CPU and more of them would not gain here
    else:
        cause = "too_few_workers"
    workers = model["workers"] if model else 2
    if cause in LOADER_PART_CAUSES:
        workers = nw  # more workers are not the fix (suggested_num_workers stays the loader's own)
    wait = step["data_wait_s_per_step"]
    mean = step["step_time_s"]["mean"]
    wait_all = data_wait_with_boundaries(facts)
    hot = [h for h in (facts.hotspots or {}).get("data", []) if not h["library"]][:3] if not nw else []
    # With workers the training thread only waits on their queue: its stack shows the loop line.
    focus = (facts.focus or {}).get("data") if not nw else None
    hot_text = (f" {_pct(focus['share_of_phase'])} of the loading time is inside `{focus['function']}` "
                f"({focus['site']})." if focus else "")
    reason = {
        "many_tensors": f"the training process spends {_pct(ipc)} of that wait receiving each batch's {tensors} "
                        f"tensors ({((facts.devices or {}).get('batch_bytes') or 0) / 1024:.0f} KiB in all) from the "
                        f"{nw} workers: each tensor crosses on its own (a shared-memory segment and a file "
                        "descriptor), so the hand-off costs per tensor, not per byte",
        "storage": f"the loader is off-CPU {_pct(off_cpu)} of the time, waiting on reads "
                   f"({(per_sample or 0) / 1024:.1f} KiB read per sample, iowait {_pct(iowait)})",
        "loader_in_main_process": f"batches are prepared in the training process itself (num_workers=0), "
                                  f"{_pct(busy)} of that time on the CPU",
        "cpu_preprocessing": f"the {'job' if host.get('cores_limit_by') else 'machine'}'s {cores_text(host)} "
                             f"{'is' if cores == 1 else 'are'} {_pct(cpu_busy)} busy and the {nw} DataLoader "
                             f"worker{'s' if nw != 1 else ''} ({_pct(busy)} busy on CPU each) cannot prepare "
                             "samples any faster",
        "too_few_workers": f"{nw} DataLoader worker{'s' if nw != 1 else ''} cannot keep up "
                           + (f"(each {_pct(busy)} busy on CPU)" if busy is not None else _building(facts)),
        "uneven_shards": shards["reason"] if shards else "",
        "head_of_line": hol["reason"] if hol else "",
        "main_process_receive": receive["reason"] if receive else "",
        "unknown": "the cause could not be narrowed down",
    }[cause]
    summary = (f"The training loop waits for the next batch {_pct(host_share)} of each step "
               f"({_ms(wait)} of {_ms(mean)})"
               + (f", and the GPU sits idle {_pct(gpu_share)} of the time for it" if gpu_share is not None else "")
               + f": {reason}.{hot_text}")
    if wait_all is not None and wait_all > wait * 1.1:
        nb = (facts.steps_info or {}).get("boundary_excluded") or 0
        restart = ", its workers started again" if nw and not loader.get("persistent_workers") else ""
        summary += (f" Counting the {nb} step{'s' if nb != 1 else ''} that began an epoch (left out of the shares: a new "
                    f"iterator{restart}), the wait is {_ms(wait_all)} a step, what a data-time meter in the loop shows.")
    removed = speedup_if_removed(share)
    gain = None if model is None else min(model["est_speedup"], removed)
    code = fixes.loader_code(facts, workers)
    where = fixes.loader_where(facts)
    also = _loader_extras(loader)
    grows = _workers_condition(model, host) if model else None
    threads = ""
    if model and model["threads"]:
        threads = (f"; give the training process {model['threads']} intra-op thread{'s' if model['threads'] != 1 else ''} "
                   f"(torch.set_num_threads({model['threads']})) so the workers do not stall the model's own threads")
        code = f"torch.set_num_threads({model['threads']})   # leave cores to the workers\n" + (code or "")
    worker_text = {
        "storage": f"Reads wait on storage. Overlap more of them with num_workers={workers}{where}{threads}.",
        "loader_in_main_process": f"Prepare batches in {workers} worker process{'es' if workers != 1 else ''}{where} "
                                  f"so loading overlaps the training step{also}{threads}.",
        "too_few_workers": f"Raise num_workers from {nw} to {workers}{where}{also}{threads}.",
        "unknown": f"Try num_workers={workers}{where}{also}, then re-run whyidle.",
    }
    options = []
    # in a notebook: a spawned worker cannot import a cell's Dataset class; persistent workers and
    # torch.set_num_threads outlive the cell (diagnose/notebook.py; nothing outside a notebook)
    nb_notes = notebook.worker_notes(facts, workers, threads=bool(model and model["threads"]))
    full = model is not None and model["memory_cap"] is not None and model["memory_cap"] <= (nw or 0)
    if full:  # no more workers fit the cgroup memory limit
        summary += f" No more workers fit the memory: {model['memory_note']}."
        worker_text["unknown"] = ("More workers would not fit the cgroup memory limit; make each worker lighter (load "
                                  "samples lazily, keep large arrays in a memmap shared by the workers), or raise "
                                  "the limit.")
    elif model and not model["tiny_fetch"] and cause in worker_text:
        memory = f" Memory: {model['memory_note']}." if model["memory_note"] else ""
        worker_fix, worker_code = notebook.with_notes(worker_text[cause] + memory, code, nb_notes)
        options.append(fix_option(worker_fix, gain, grows, worker_code))
    if cause == "many_tensors":
        # the workers mostly wait for the training process to take their batches: packing removes
        # the wait (measured 4-10x where this estimates 4x: tests/scenarios/README.md)
        packed_fix, packed_code = notebook.with_notes(
            f"Pack each batch into a few tensors in the DataLoader's collate_fn{where}, which the workers run: "
            "concatenate every per-sample field across the batch, with an offsets tensor to split it again, or "
            "return NumPy arrays / one buffer per field. A higher file-descriptor limit only hides the cost.",
            PACKED_COLLATE + fixes.collate_code(facts, "packed_collate"),
            [notebook.dataset_note(facts, nw or 0, defines=("packed_collate",))])
        options.append(fix_option(packed_fix, removed, None, packed_code))
    if cause == "uneven_shards":
        options += loader_shards.options(shards)
    if cause == "head_of_line":
        options += loader_order.options(facts, hol)
    if cause == "main_process_receive":
        options += loader_receive.options(receive)
    if cause == "storage":
        options.append(fix_option("Copy the dataset to local disk or RAM (/dev/shm), or pack small files into large "
                                  "shards (tar/WebDataset, LMDB) so each read fetches many samples.", removed,
                                  f"up to {removed:.1f}× if reads cost nothing", assumed=True))
    if model and model["tiny_fetch"] and cause in ("loader_in_main_process", "too_few_workers"):
        options.append(fix_option(
            f"Each batch takes only {_ms(model['fetch_s'])} to load, less than a worker process costs per batch "
            "(pickling, a pipe, shared memory), so workers would slow this loop down. The step itself is tiny: use "
            "bigger batches, or index in-memory tensors directly (x[idx] with a shuffled index) instead of a "
            "per-sample Dataset.", removed, f"up to {removed:.1f}× if loading cost nothing", assumed=True))
    cpu_work = cause in ("loader_in_main_process", "cpu_preprocessing", "too_few_workers") and (busy or 0) >= T.LOADER_OFF_CPU
    cpu_work = cpu_work or (measured is not None and cause == "loader_in_main_process")
    if cpu_work and not (model and model["tiny_fetch"]):
        name = f"`{focus['function'].split()[-1]}`" if focus else "each sample's preparation"
        lead = ("All cores are already busy preparing samples, so more workers will not help: make each sample "
                "cheaper. " if cause == "cpu_preprocessing" else "Make each sample cheaper: ")
        cheaper = min(model["est_speedup_cheaper"], removed) if model else None
        split = ""
        if measured is not None and cheaper is not None:
            both = min(model["est_speedup_cheaper_workers"], removed)
            with_workers = (f"with num_workers={workers} as well ≈{both:.1f}×; "
                            if workers > (nw or 0) and both > cheaper * T.VERDICT_MIN_SPEEDUP else "")
            split = (f" Measured: {sample_cost.describe(measured)}; with it vectorized over the batch or computed "
                     f"once and cached (its time removed, the DataLoader's collation and any image decoding kept) "
                     f"≈{cheaper:.1f}×.")
            condition = f"{with_workers}up to {removed:.1f}× if loading cost nothing"
        else:
            condition = (f"estimated for a {1 / T.CHEAPER_SAMPLE_COST:g}× cheaper sample; up to "
                         f"{removed:.1f}× if loading cost nothing")
        options.append(fix_option(lead + f"the work in {name} runs on a CPU every epoch. " + _cheaper_sample(facts)
                                  + split, cheaper, condition, assumed=measured is None or _decodes(facts)))
    if not options:
        fallback = (worker_text["unknown"], None) if full else notebook.with_notes(worker_text["unknown"], code, nb_notes)
        options.append(fix_option(fallback[0], None if full else gain, None, fallback[1]))
    options = rank_options(options)
    # a worker option estimated to gain nothing here is not offered beside a better one (on 2 busy
    # cores "1 worker + 1 thread", est. 1.00×, measured 0.74×): the summary says why instead
    useless = [o for o in options[1:] if o["est_speedup"] is not None and not o["assumed"]
               and o["est_speedup"] < T.VERDICT_MIN_SPEEDUP and "num_workers" in (o["code"] or "")]
    if useless and options[0]["est_speedup"] is not None and options[0]["est_speedup"] >= T.VERDICT_MIN_SPEEDUP:
        options = [o for o in options if o not in useless]
        summary += (f" More workers would not help here (est. {useless[0]['est_speedup']:.2f}×: "
                    f"{cores_text(host)}, {_pct(cpu_busy)} busy).")
    text, code, est = options[0]["text"], options[0]["code"], options[0]["est_speedup"]
    evidence = _round({
        "cause": cause, "data_wait_share": host_share, "gpu_idle_share": gpu_share,
        "data_wait_s_per_step": wait, "data_wait_s_per_step_with_boundaries": wait_all, "step_time_s_mean": mean,
        "num_workers": nw, "suggested_num_workers": workers,
        "max_workers_by_memory": model["memory_cap"] if model else None,
        "suggested_threads": model["threads"] if model else None, "loader_cpu_busy_share": busy,
        "loader_read_bytes_per_sample": per_sample, "iowait_share": iowait, "cpu_busy_share": cpu_busy,
        "cores": cores, "cores_limit_by": host.get("cores_limit_by"), "pin_memory": loader.get("pin_memory"),
        "persistent_workers": loader.get("persistent_workers"), "prefetch_factor": loader.get("prefetch_factor"),
        "fetch_s_per_batch": model["fetch_s"] if model else None,
        "est_speedup_if_removed": round(removed, 3),  # as est_speedup: never below it once rounded
        "est_terms": "step", "batch_tensors": tensors or None,
        "batch_bytes": (facts.devices or {}).get("batch_bytes"), "ipc_share_of_wait": ipc,
    })
    evidence["hotspots"] = hot
    evidence["focus"] = focus
    evidence["loader_part"] = _loader_part(cause, shards, receive, hol)
    evidence["sample_cost"] = None if measured is None else {
        "lines": [{"site": h.site, "code": h.code, "share_of_loading": round(h.share, 4), "leaf": h.leaf}
                  for h in measured.lines],
        "removed_share_of_loading": round(measured.removed, 4),
        "est_speedup": round(model["est_speedup_cheaper"], 3) if model else None,
        "est_speedup_with_workers": round(model["est_speedup_cheaper_workers"], 3) if model else None}
    severity = "critical" if share >= T.DATA_WAIT_CRITICAL else "warning"
    if model and model["tiny_fetch"]:
        severity = "warning"
    return finding("input_bound", severity, "Input-bound: the step waits for data", summary, evidence,
                   est, text, code, [DOCS_DATALOADER, DOCS_TUNING], bound=share, options=options)


def _words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return {w for w in re.split(r"[^A-Za-z0-9]+|_", spaced.lower()) if w}


def _is_logging(h: dict) -> bool:
    """True when a hotspot is logging/progress/formatting work (see LOGGING_WORDS and
    :data:`whyidle.analysis.stacks.OUTPUT_MODULES`)."""
    leaf = h.get("leaf") or ""
    leaf_path = leaf.rsplit(":", 1)[0]
    if any(m in leaf_path for m in OUTPUT_MODULES):
        return True
    func = (h.get("function") or "").split(" ")[-1]
    words = _words(func) | _words(re.sub(r"[\"'].*?[\"']", " ", h.get("code") or ""))  # name + code, not strings
    return bool(words & LOGGING_WORDS) and not (words & MATH_WORDS)


def _logging_line(h: dict) -> bool:
    """The hotspot's line is a logging call (its code has logging words) while its function's name
    is not logging: the line, not the whole function, should run less often."""
    func = (h.get("function") or "").split(" ")[-1]
    code_words = _words(re.sub(r"[\"'].*?[\"']", " ", h.get("code") or ""))
    return bool(code_words & LOGGING_WORDS) and not (code_words & MATH_WORDS) and not (_words(func) & LOGGING_WORDS)


def host_bound(facts: RunFacts) -> dict | None:
    """Host work outside data loading, forward, backward and optimizer holds the step.

    ``other_host`` share ≥ ``HOST_SHARE_WARN``. The work is named by the user function that holds
    most of that time inclusively (``facts.focus["other"]``), else by the top sampled lines.
    ``est_speedup`` removes that function's time (or the top three lines' time; the whole share
    without samples) and, for work that is not logging, the backward beyond ``T.BWD_PER_FWD`` × the
    forward (``evidence.backward_excess_share``: the autograd graph of its tensor ops; c12's
    pairwise loss: est 5.6x → 10.8x, measured 26-29x). The time in the program's own collectives is left out
    (``rules_ranks.metric_collectives`` holds it).
    """
    step = facts.step
    if not step:
        return None
    share = step["shares"]["other_host"]
    gpu_share = gpu_idle_share(facts, "host")
    if gpu_share is not None:  # host work while the GPU still has queued work costs nothing
        share = min(share, gpu_share)
    coll = facts.collectives
    if coll and step["step_time_s"]["mean"] > 0:  # the program's collectives: metric_collectives' time
        share = max(0.0, share - coll["s_per_step"] / step["step_time_s"]["mean"])
    if share < T.HOST_SHARE_WARN:
        return None
    # a function named by fewer than MIN_SITE_SAMPLES samples is chance, not where the time goes
    spots = [h for h in (facts.hotspots or {}).get("other", []) if (h.get("samples") or 0) >= T.MIN_SITE_SAMPLES]
    # the framework's own progress bar / logging (Lightning's TQDMProgressBar, HF's callbacks) is
    # named like user code: its settings are the user's to change
    output = [h for h in spots if h.get("framework") and _is_logging(h)][:1]
    user = sorted([h for h in spots if not h["library"]][:3] + output, key=lambda h: -h["seconds"])[:3] or spots[:3]
    focus = (facts.focus or {}).get("other")
    if focus and focus.get("samples", T.MIN_SITE_SAMPLES) < T.MIN_SITE_SAMPLES:
        focus = None
    framework_output = not focus and bool(output) and user[0] is output[0]
    if framework_output:
        top = user[0]
        attributed = top["share"]
        label = (facts.api or {}).get("label") or "the framework"
        where = (f"{label}'s own progress bar and logging take {_pct(attributed)} of step time (called from "
                 f"{top['function'].split(' inside ', 1)[-1]}, in {top['leaf']})")
    elif focus:
        attributed = share * focus["share_of_phase"]
        where = (f"`{focus['function']}` holds {_pct(focus['share_of_phase'])} of it "
                 f"({_pct(attributed)} of step time, at {focus['site']})")
    elif user:
        attributed = sum(h["share"] or 0 for h in user)
        top = user[0]
        where = f"`{top['function']}` takes {_pct(top['share'])} of step time (at {top['site']}"
        where += f", inside {top['leaf']})" if top.get("leaf") and top["leaf"] != top["site"] else ")"
    else:
        attributed = None
        where = ("too few stack samples landed in it to name the lines (a longer run, or a higher --stack-hz, names them)"
                 if (facts.hotspots or {}).get("other") else "no stack samples were recorded to name the lines")
    removable = share if attributed is None else min(share, attributed)
    received, conv_line = 0.0, False
    logging_work = any(_is_logging(h) for h in ([focus] if focus else []) + user[:1])
    summary = (f"Host work outside data loading and the model takes {_pct(share)} of each step "
               f"({_ms(share * step['step_time_s']['mean'])}); {where}.")
    name = focus["function"].split()[-1] if focus else (user[0]["function"].split()[-1] if user else "this work")
    named = focus or (user[0] if user else None)
    if name == "<module>" or (logging_work and named and _logging_line(named)):
        # top-level script code, or a logging call inside a function that does more: name the line
        call = named.get("code") or named["site"]
        name = f"the code at {named['site'].split()[0]}"
    else:
        call = f"{name}(...)"
    if framework_output:
        text, code = fixes.framework_output_code(facts)
    elif logging_work:
        text = (f"Run {name if name.startswith('the code') else f'`{name}`'} every N steps instead of every step "
                "(log, print and refresh progress less often); keep running metrics as tensors and read them "
                "(.item()/.cpu()) only when you log.")
        api_text, code = fixes.logging_code(facts, call)
        text += (" " + api_text) if api_text else ""
        if facts.framework in ("keras", "tensorflow"):
            text = (f"Run {name if name.startswith('the code') else f'`{name}`'} every N batches instead of every "
                    "batch: in a Keras callback, return early from on_train_batch_end unless batch % 50 == 0 (or use "
                    "the epoch-level hooks). Keras converts the logs to NumPy for any callback with a batch-end hook, "
                    "and runs it in the training loop unless the callback sets async_safe = True.")
            body = "...                 # the logging it does today" if name.startswith("on_") else call
            code = ("def on_train_batch_end(self, batch, logs=None):\n"
                    "    if batch % 50:          # was: every batch\n"
                    "        return\n"
                    f"    {body}")
    else:
        what = f"`{name}`" if not name.startswith("the code") and name != "this work" else name
        if name == "this work":
            what = "the host work between steps (no stack samples named it)"
        text = (f"Move {what} out of the per-step path or make it cheaper: vectorize Python loops over "
                "tensor elements into whole-tensor ops (masks, torch.bincount, torch.cdist, topk, amin/amax), avoid "
                "per-element .item()/min()/max() in Python"
                + ("." if facts.compiled else ", or compile it with torch.compile."))
        code = fixes.metric_code(facts, name)
        if fixes.api_name(facts) == "lightning" and _in_training_step(focus, user):
            text += (" Lightning runs training_step inside optimizer.step's closure: this is your training_step's "
                     "own Python, measured apart from forward and backward.")
        if facts.framework in ("keras", "tensorflow"):
            text, code = fixes.keras_host_text(facts, what), None
        conv = loader_receive.conversion(facts)
        if conv and attributed and conv["share"] >= 0.5 * attributed:  # the batch's Python lists made tensors here
            # the same fix takes their receiving out of the data wait: estimated as input_bound does
            text, code, received = loader_receive.conversion_text(conv), None, loader_receive.received_share(facts)
            conv_line = True
    # the program's own tensor code in the step (a loss over pairs, a per-element metric) also
    # builds an autograd graph: the backward beyond BWD_PER_FWD × the forward is its, and goes with it
    sh = step["shares"]
    excess = 0.0
    if not logging_work and not framework_output and attributed is not None and facts.framework == "torch":
        excess = max(0.0, sh.get("backward", 0.0) - T.BWD_PER_FWD * sh.get("forward", 0.0))
    evidence = _round({"other_host_share": share, "attributed_share": attributed,
                       "step_time_s_mean": step["step_time_s"]["mean"], "backward_excess_share": excess or None})
    evidence["focus"] = focus
    evidence["hotspots"] = user
    evidence["kind"] = "logging" if logging_work else "batch_conversion" if conv_line else "python_compute"
    # Severity follows what fixing the named work would gain, so it agrees with est_speedup.
    if removable >= T.HOST_SHARE_CRITICAL:
        severity = "critical"
    elif removable >= T.HOST_SHARE_WARN:
        severity = "warning"
    else:
        severity = "info"
    return finding("host_bound", severity, "Host-bound: Python work in the step holds the device", summary,
                   evidence, speedup_if_removed(min(0.95, removable + excess + received)), text, code, [DOCS_TUNING],
                   bound=share)


def _in_training_step(focus: dict | None, hotspots: list[dict]) -> bool:
    """The named host work is a ``training_step`` or runs under one (the focus function's callers)."""
    names = [focus["function"].split()[-1]] + list(focus.get("callers") or []) if focus else []
    names += [(h.get("function") or "").split()[-1] for h in hotspots[:1] if h.get("function")]
    return "training_step" in names


def many_small_ops(facts: RunFacts) -> dict | None:
    """Forward and backward are made of thousands of tiny operations: per-op overhead (Python,
    the dispatcher, autograd; kernel launches on a GPU) rather than arithmetic fills them.

    Signal: ≥ ``MANY_OPS_PER_STEP`` autograd graph nodes per step whose mean forward+backward
    time is ≤ ``SMALL_OP_S``. The overhead share of the step is (forward + backward share) ×
    min(1, ``DISPATCH_S_PER_NODE`` / mean time per node); ``est_speedup`` assumes vectorizing
    removes 90 % of it. Reported as ``host_bound`` with ``evidence.kind = "many_small_ops"``.
    """
    step = facts.step
    nodes = facts.graph_nodes
    if not step or not nodes:
        return None
    sh = step["shares"]
    compute_share = sh["forward"] + sh["backward"]
    per_batch = step["step_time_s"]["mean"] / max(1.0, step.get("batches_per_step") or 1)  # one backward each
    per_node = compute_share * per_batch / nodes
    if nodes < T.MANY_OPS_PER_STEP or per_node > T.SMALL_OP_S or per_node <= 0:
        return None
    overhead = compute_share * min(1.0, T.DISPATCH_S_PER_NODE / per_node)
    launch = gpu_idle_share(facts, "launch")
    if launch is not None:  # on a GPU: the idle the launches really left (measured)
        overhead = launch
    if overhead < T.HOST_SHARE_WARN:
        return None
    focus = (facts.focus or {}).get("forward")
    where = f"; `{focus['function']}` holds {_pct(focus['share_of_phase'])} of the forward ({focus['site']})" if focus else ""
    summary = (f"Each batch runs about {nodes:,} operations (autograd graph nodes), {per_node * 1e6:.1f} µs each in "
               f"forward and backward, close to the ~{T.DISPATCH_S_PER_NODE * 1e6:.0f} µs a PyTorch operation costs "
               f"in overhead alone: about {_pct(overhead)} of the step is per-operation overhead (on a GPU: "
               f"kernel launches){where}.")
    name = focus["function"].split()[-1] if focus else "the model"
    compile_code = fixes.compile_code(facts)
    text = (f"Issue fewer, larger operations in `{name}`: vectorize Python loops over time steps or elements into "
            "batched tensor ops, use fused modules (nn.LSTM/nn.GRU instead of a loop over cells)"
            + (", or compile it (torch.compile; CUDA graphs on a GPU)." if compile_code else
               ". The model is already compiled: the operations left run outside the compiled graph (graph breaks, "
               "code outside the compiled module; list them with TORCH_LOGS=graph_breaks).")
            + " A bigger batch also spreads the per-operation cost.")
    evidence = _round({"graph_nodes": nodes, "s_per_node": per_node, "overhead_share": overhead,
                       "compute_share": compute_share})
    evidence["focus"] = focus
    evidence["kind"] = "many_small_ops"
    evidence["hotspots"] = []
    severity = "critical" if overhead >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("host_bound", severity, "Host-bound: thousands of tiny operations per step", summary, evidence,
                   1.0 / (1.0 - 0.9 * min(overhead, 0.95)), text, compile_code, [DOCS_TUNING], bound=overhead)


def loading_in_trainer(facts: RunFacts) -> dict | None:
    """The step if the DataLoader's workers' loading ran in the training process instead
    (``num_workers=0``), on a CPU-only job whose training thread waits for cores: the compute
    without the run-queue wait the workers' CPU caused (the compute phases less the trainer's
    run-queue share of the step, at most half of them) plus the workers' CPU per step, run at one
    core (their own IPC and pickling counted in, so this errs toward keeping the workers).

    Returns ``{step_s, predicted_step_s, loader_cpu_s, est_speedup}`` (seconds per step), or None
    without workers, a step, or a CPU-only device.
    """
    host, step = facts.host or {}, facts.step or {}
    if not (host.get("workers") and step and (facts.device or {}).get("kind") == "cpu"):
        return None
    now = step["step_time_s"]["mean"]
    loader_cpu = (host.get("workers_cores") or 0.0) * now
    compute = step.get("compute_s_per_step") or 0.0
    waited = (host.get("trainer_run_delay_share") or 0.0) * now
    predicted = max(compute - waited, compute * 0.5) + loader_cpu
    if predicted <= 0:
        return None
    return {"step_s": now, "predicted_step_s": predicted, "loader_cpu_s": loader_cpu, "est_speedup": now / predicted}


def zero_worker_changes(facts: RunFacts) -> list[Change]:
    """The DataLoader changes for ``num_workers=0``: the settings PyTorch refuses without workers
    (``persistent_workers=True``, a ``prefetch_factor``) reset with it."""
    loader = facts.loader or {}
    passed = {a.get("name") for a in ((loader.get("call") or {}).get("args") or []) if isinstance(a, dict)}
    changes = [Change("num_workers", "0", now=loader.get("num_workers"), replace=True)]
    if loader.get("persistent_workers"):
        changes.append(Change("persistent_workers", "False", now=True, replace=True))
    if "prefetch_factor" in passed or (not passed and loader.get("prefetch_factor") is not None):
        changes.append(Change("prefetch_factor", "None", now=loader.get("prefetch_factor"), replace=True))
    return changes


def cpu_contention(facts: RunFacts) -> dict | None:
    """The training thread waits for a CPU core (run-queue wait ≥ ``RUN_DELAY_WARN`` of wall time).

    Cause ``hypervisor_steal`` when the virtual machine's cores were lent to other guests
    (``/proc/stat`` steal) ≥ ``RUN_DELAY_WARN`` of the time and the run-queue wait is below that,
    or steal ≥ ``STEAL_WARN`` and at least the run-queue wait: the thread was "running" as far as
    the kernel knew, and no process of this machine is to blame (severity by ``STEAL_WARN`` /
    ``STEAL_CRITICAL``, info below); ``cpu_quota`` when the job's cgroup ran out of its CPU quota
    in ≥ ``QUOTA_THROTTLED_WARN`` of the quota's periods (cgroup ``cpu.stat``): a throttled cgroup's
    threads wait on the run queue for the next period, which reads as run-queue wait whatever
    else runs on the machine (``est_speedup`` null: the gain depends on the limit set);
    ``other_processes`` when processes outside the job use ≥ ``OTHER_PROCS_MIN_CORES``;
    ``own_threads`` (info below ``RUN_DELAY_CRITICAL``, else warning; ``est_speedup`` null) when the job has no loader workers and its training
    processes' compute threads fit the cores: the wait is the job's other threads taking turns;
    else ``oversubscription`` (the job's own threads and processes want more cores than exist).
    """
    host = facts.host or {}
    delay = host.get("trainer_run_delay_share")
    steal = host.get("steal_share") or 0.0
    waited = delay is not None and delay >= T.RUN_DELAY_WARN
    stolen = steal >= T.RUN_DELAY_WARN and (not waited or (steal >= T.STEAL_WARN and steal >= delay))
    if not stolen and (delay is None or delay < T.RUN_DELAY_WARN):
        return None
    cores = whole_cores(host)
    here = cores_text(host)
    others = host.get("other_procs_cores") or 0.0
    throttled = host.get("cpu_throttled_share")
    top = facts.top_others or []
    proc = facts.proc or {}
    devices = facts.devices or {}
    threads = devices.get("threads") or proc.get("threads")
    trainers = max(1, len(facts.trainers or []))
    workers = host.get("workers") or 0
    gain = speedup_if_removed(delay) if delay else None  # the printed fix removes the wait
    alone = None  # the step with the workers' loading in the training process (oversubscription)
    if stolen:
        cause = "hypervisor_steal"
        reason = (f"the hypervisor gave this virtual machine's {host.get('cores') or 1} cores to other guests {_pct(steal)} of the time "
                  "(CPU steal): every CPU phase of the step took longer for it")
        text = ("Nothing on this machine can win that time back: run on a dedicated or non-burstable instance (or "
                "one with spare credits), and compare runs only when the steal share of both is low "
                "(`whyidle compare` shows it).")
        code = None
        gain = None  # depends on the host's other tenants, not on the job
        delay = steal
    elif throttled is not None and throttled >= T.QUOTA_THROTTLED_WARN:
        cause = "cpu_quota"
        quota = host.get("cpu_quota") or usable_cores(host)
        reason = (f"the job's cgroup allows {quota:g} CPU{'s' if quota != 1 else ''} and used it up in {_pct(throttled)} "
                  f"of the quota's periods ({host.get('cpu_throttled_s') or 0:.1f} s throttled): the kernel stops "
                  f"its threads until the next period ({trainers} training process{'es' if trainers > 1 else ''} × "
                  f"{threads} thread{'s' if threads != 1 else ''}{f' + {workers} loader workers' if workers else ''})")
        fit = max(1, math.floor(quota))
        text = (f"The job wants more CPU than its quota of {quota:g}: raise the limit (docker --cpus, Kubernetes "
                f"resources.limits.cpu, Slurm --cpus-per-task) to cover its busy threads, which removes this wait (up "
                f"to {speedup_if_removed(delay):.1f}×), or fit the job to the quota: {fit} busy thread{'s' if fit != 1 else ''} "
                "in all (torch.set_num_threads, OMP_NUM_THREADS; loader workers that compute count too), so no "
                "thread spins on CPU time the work itself needs.")
        code = None
        gain = None  # depends on the limit set, and on how much of the quota the threads' spinning takes
    elif others >= T.OTHER_PROCS_MIN_CORES:
        cause = "other_processes"
        names = ", ".join(f"`{p['command']}` (pid {p['pid']}, {p['cores']:.1f} cores)" for p in top[:3])
        reason = f"other processes use {others:.1f} of {host.get('cores') or 1} cores" + (f": {names}" if names else "")
        text = ("Other processes take the cores this job needs: stop or move them, run the job on an idle machine, "
                "or give it dedicated cores (taskset / cgroups / the scheduler's CPU request).")
        code = None
    else:
        cause = "oversubscription"
        per = max(1, cores // trainers)
        reason = (f"{trainers} training process{'es' if trainers > 1 else ''} × {threads} thread{'s' if threads != 1 else ''}"
                  f"{f' + {workers} loader workers' if workers else ''} compete for {here} "
                  f"({host.get('tree_threads')} threads in the job, {host.get('invol_ctx_per_s', 0):.0f} forced "
                  f"context switches/s)")
        if (threads or 1) > per:
            text = (f"Give each process at most cores ÷ processes threads ({per} here) and one thread per DataLoader "
                    "worker; set OMP_NUM_THREADS before start-up so OpenMP pools are sized right.")
            own = fixes.written(facts, "worker_init_fn")
            code = "\n".join([
                f"torch.set_num_threads({per})   # or OMP_NUM_THREADS={per} in the environment\n",
                "def one_thread(worker_id):      # a named function: it must pickle for spawned workers",
                "    torch.set_num_threads(1)"] + ([f"    {operand(own)}(worker_id)   # the program's own worker_init_fn"]
                                                   if own and own != "None" else []) + [""]
                + fixes.in_api(facts, fixes.loader_lines(facts, [Change("worker_init_fn", "one_thread", note="",
                                                                        replace=True)]), tail=False))
            text, code = notebook.with_notes(text, code, [  # a notebook: one_thread importable, threads outlive the cell
                notebook.dataset_note(facts, workers, defines=("one_thread",)), notebook.threads_note(facts)])
        elif not workers and trainers * (threads or 1) <= cores:
            # the compute threads fit the cores: the training thread takes turns with the job's other
            # threads (a tracker's writer, prefetch threads, OpenMP threads spinning after each
            # parallel region, whyidle's samplers). No setting is known to win that time back here.
            cause = "own_threads"
            gain = None
            text = (f"The job's compute threads ({trainers} × {threads}) fit the {here}; the wait is its other "
                    f"threads ({host.get('tree_threads')} in all: a tracker's or logger's writer, prefetch threads, OpenMP "
                    "threads spinning between parallel regions) taking turns with the training thread. Move background "
                    f"work off the training loop's path or measure torch.set_num_threads({max(1, cores - 1)}) (one core left "
                    "for them; it can also slow the step's own compute).")
            code = None
            text, _ = notebook.with_notes(text, None, [notebook.threads_note(facts)])
        else:
            busy = trainers + workers
            wait = ((facts.step or {}).get("shares") or {}).get("data_wait")
            # the most workers worth running here: what the input model advises for these cores
            limit = max(1, cores - trainers, suggested_workers(facts) if facts.loader and facts.step else 0)
            alone = loading_in_trainer(facts) if workers else None
            code = None
            if alone is not None and alone["est_speedup"] >= T.VERDICT_MIN_SPEEDUP:
                # the workers' loading in the training process, without their contention, is faster:
                # the workers cost more cores than the loading itself needs here
                gain = alone["est_speedup"]
                text = (f"{trainers} training process{'es' if trainers > 1 else ''} × {threads} thread"
                        f"{'s' if threads != 1 else ''} and {workers} loader workers share {here}: the workers' loading "
                        f"takes {_ms(alone['loader_cpu_s'])} of CPU a step, which the training process would do itself "
                        f"in less than the step loses waiting for cores. Load in the training process (num_workers=0): "
                        f"est. {gain:.2f}× (step {_ms(alone['step_s'])} → {_ms(alone['predicted_step_s'])}).")
                code = "\n".join(fixes.in_api(facts, fixes.loader_lines(facts, zero_worker_changes(facts)), tail=False))
            elif workers and workers <= limit:
                # the job's own loading keeps the cores busy: the wait for a core is the price of
                # preparing samples here. Fewer workers would only move the wait to the data wait,
                # so no gain is promised (never advise undoing what input_bound advised).
                gain = None
                keeps = (f"the workers are what keeps the data wait at {_pct(wait)}: fewer of them would bring it back"
                         if wait is not None and wait < T.DATA_WAIT_WARN else
                         f"the step still waits for data {_pct(wait)} of the time, and fewer workers would make that "
                         "longer" if wait is not None else "fewer workers would make the step wait for data")
                text = (f"Threads are already {threads} per process; {trainers} training process"
                        f"{'es' if trainers > 1 else ''} and {workers} loader worker{'s' if workers != 1 else ''} share "
                        f"{here}, and {keeps}. This contention is the price of preparing samples on these cores: "
                        "make each sample cheaper (decode at reduced size, cache decoded samples) or use a machine with "
                        "more cores.")
            else:
                fewer = (f"use at most {limit} loader worker{'s' if limit != 1 else ''} per process, "
                         if workers > limit else "")
                text = (f"Threads are already {threads} per process, but {busy} busy process{'es' if busy != 1 else ''} ({trainers} training, "
                        f"{workers} loader workers) share {here}: {fewer}fewer processes per machine, or a "
                        "machine with more cores.")
    summary = (f"The training thread lost its CPU {_pct(delay)} of the time: {reason}." if stolen else
               f"The training thread waited for a free CPU core {_pct(delay)} of the time: {reason}.")
    evidence = _round({"cause": cause, "run_delay_share": host.get("trainer_run_delay_share"), "steal_share": steal,
                       "cores": usable_cores(host), "cores_limit_by": host.get("cores_limit_by"),
                       "cpu_quota": host.get("cpu_quota"), "cpu_throttled_share": throttled,
                       "cpu_throttled_s": host.get("cpu_throttled_s"), "other_procs_cores": others,
                       "cpu_busy_share": host.get("cpu_busy_share"), "intra_op_threads": threads,
                       "processes": trainers, "workers": workers, "tree_threads": host.get("tree_threads"),
                       "invol_ctx_per_s": host.get("invol_ctx_per_s")})
    # the printed fix: loading in the training process (num_workers=0), its gain a whole-step prediction
    evidence["no_workers"] = (None if cause != "oversubscription" or not alone or gain != alone["est_speedup"]
                              else _round(alone))
    evidence["top_other_processes"] = top
    if stolen:
        severity = "critical" if steal >= T.STEAL_CRITICAL else "warning" if steal >= T.STEAL_WARN else "info"
    elif cause == "own_threads":  # the job's own threads on cores it fills: a warning only when critical
        severity = "warning" if delay >= T.RUN_DELAY_CRITICAL else "info"
    else:
        severity = "critical" if delay >= T.RUN_DELAY_CRITICAL else "warning"
    return finding("cpu_contention", severity, "CPU contention: the job waits for cores", summary, evidence,
                   gain, text, code, [DOCS_THREADS], bound=delay)


def _gpu_count(facts: RunFacts) -> int:
    static = facts.gpu_static or {}
    return len(static.get("devices") or [])


def wrong_device(facts: RunFacts) -> dict | None:
    """A GPU is present (NVML sees one, or CUDA is initialized) but the model's parameters or the
    batches stay on the CPU. Not raised when PyTorch is a CPU-only build (see ``gpu_not_visible``)."""
    devices = facts.devices
    gpus = _gpu_count(facts)
    if not devices or not (gpus or devices.get("cuda_initialized")):
        return None
    if (facts.proc or {}).get("cuda_build") is None and not devices.get("cuda_initialized"):
        return None
    params = devices.get("params") or {}
    inputs = devices.get("inputs") or []
    on_cpu = params.get("cpu", 0)
    if params and on_cpu and "cuda" not in params:
        what = f"all {on_cpu:,} model parameters are on the CPU"
    elif params and on_cpu:
        what = f"{on_cpu:,} of {sum(params.values()):,} parameters are on the CPU"
    elif inputs == ["cpu"] and "cuda" in params:
        what = "the model's inputs arrive on the CPU"
    else:
        return None
    summary = f"A GPU is available ({gpus or 'CUDA initialized'}) but {what}, so the work runs on the CPU."
    text = ("Create the model on the GPU (or call model.to(device) before building the optimizer), move each batch "
            "with .to(device, non_blocking=True), and give library-internal tensors device=.")
    code = ("device = torch.device('cuda')\nmodel = Model().to(device)\noptimizer = torch.optim.SGD(model.parameters(), ...)\n"
            "for x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)")
    api_fix = fixes.device_code(facts)
    if api_fix:
        text, code = api_fix
    evidence = {"gpus": gpus, "params": params, "inputs": inputs, "batch": devices.get("batch"),
                "cuda_initialized": devices.get("cuda_initialized")}
    return finding("wrong_device", "critical", "Wrong device: the model is not on the GPU", summary, evidence,
                   None, text, code, ["https://pytorch.org/docs/stable/notes/cuda.html"])


def gpu_not_visible(facts: RunFacts) -> dict | None:
    """NVML sees a GPU but the PyTorch build has no CUDA support (``torch.version.cuda`` is None)."""
    proc = facts.proc or {}
    gpus = _gpu_count(facts)
    if not gpus or proc.get("framework") != "torch" or proc.get("cuda_build") is not None:
        return None
    static = facts.gpu_static or {}
    drv = (static.get("devices") or [{}])[0].get("cuda_driver_version")
    summary = (f"{gpus} NVIDIA GPU{'s are' if gpus > 1 else ' is'} present (driver supports CUDA {drv}) but this "
               f"PyTorch {proc.get('framework_version')} is a CPU-only build, so nothing can run on the GPU.")
    return finding("gpu_not_visible", "critical", "GPU not visible to PyTorch", summary,
                   {"gpus": gpus, "cuda_driver_version": drv, "torch": proc.get("framework_version"),
                    "cuda_build": None}, None,
                   "Install a CUDA build of PyTorch that the driver supports (CUDA version ≤ the driver's).",
                   "pip install torch --index-url https://download.pytorch.org/whl/cu124",
                   ["https://pytorch.org/get-started/locally/"])


def input_pipeline_config(facts: RunFacts, already: set[str]) -> dict | None:
    """Static DataLoader smells, reported as info even when they are not today's bottleneck.

    ``already`` holds causes reported elsewhere (not repeated here).
    """
    loader = facts.loader
    if not loader:
        return None
    smells = []
    nw = loader.get("num_workers") or 0
    params = (facts.devices or {}).get("params") or {}
    share = ((facts.step or {}).get("shares") or {}).get("data_wait") or 0.0
    if nw == 0 and "loader_in_main_process" not in already and share >= T.SMELL_MIN_DATA_WAIT and facts.step:
        # only where the loader model gives a worker a gain here: an in-memory TensorDataset's
        # batches cost less than a worker's hand-off, and on busy cores a worker slows the model
        model = loader_model(facts)
        if not model["tiny_fetch"] and model["est_speedup"] >= T.SMELL_MIN_WORKER_GAIN:
            smells.append("num_workers=0: batches are prepared in the training process, serially with the step "
                          f"(workers would give ≈{model['est_speedup']:.2f}× here)")
    if "cuda" in params and not loader.get("pin_memory"):
        smells.append("pin_memory=False while the model is on CUDA: host→device copies come from pageable memory")
    placement = facts.placement or {}
    blocking = [m for m in placement.get("batch_moves") or [] if not m.get("non_blocking")]
    if "cuda" not in params and not loader.get("pin_memory") and blocking and placement.get("cuda_queries"):
        # a CPU-only run of a script meant for a GPU (it asks torch.cuda.is_available()): cases.md C21
        smells.append(f"pin_memory=False and batches moved with a blocking .to(device) ({blocking[0]['site']}): on a "
                      "GPU each copy would come from pageable memory and block the host "
                      "(pin_memory=True with .to(device, non_blocking=True) overlaps it)")
    smells += loader_smells.settings(facts)
    iters = facts.loader_iters or {}
    restarts = (((facts.time or {}).get("parts") or {}).get("epoch_boundary") or {})
    if nw > 0 and not loader.get("persistent_workers") and restarts.get("count"):
        # the restarts' whole cost (iterator and the workers' first batches), as epoch_boundary says
        smells.append(f"persistent_workers=False: {nw} worker{'s are' if nw != 1 else ' is'} started again every epoch "
                      f"({restarts['count']} restarts, {restarts['s'] / restarts['count']:.2f} s each)")
    elif nw > 0 and not loader.get("persistent_workers") and iters.get("count", 0) >= 2:
        secs = iters.get("seconds") or [0.0]
        smells.append(f"persistent_workers=False: {nw} worker{'s are' if nw != 1 else ' is'} started again every epoch "
                      f"({iters['count']} times, {sum(secs) / len(secs) * 1000:.0f} ms each to create the iterator)")
    if not smells:
        return None
    summary = "DataLoader configuration: " + "; ".join(smells) + "."
    # The code goes with input_bound when that is reported; here only the options that differ.
    code = None if already else fixes.loader_code(facts, max(nw, 1) if nw else 1)
    text = ("Keep workers alive between epochs (persistent_workers=True) and pin host memory when training on CUDA "
            "(pin_memory=True); use workers when loading costs more than a few ms per batch.")
    if code is not None:
        text, code = notebook.with_notes(text, code, notebook.worker_notes(facts, max(nw, 1)))
    return finding("input_pipeline_config", "info", "Input pipeline configuration", summary,
                   {"smells": smells, "loader": {k: loader.get(k) for k in (
                       "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size", "dataset")}},
                   None, text, code, [DOCS_DATALOADER])


def device_bound(facts: RunFacts, findings: list[dict] = ()) -> dict:
    """No cause upstream of the device holds ``VERDICT_MIN_BOUND`` of the step: the verdict when no
    finding qualifies (:func:`whyidle.diagnose.verdict.choose_verdict`). ``bound`` is the device's
    own share (forward, backward, optimizer, compiled compute). The summary states that share and,
    when it is under half the step or other findings hold a smaller part, names them, so it never
    contradicts the shares printed with it."""
    step = facts.step
    sh = step["shares"]
    # forward passes without grad in the steady steps are model work too (a teacher or target
    # network in every step; inference's whole forward)
    compute = sh["forward"] + sh["backward"] + sh["optimizer"] + sh.get("compute", 0.0) + sh.get("eval", 0.0)
    trains = not facts.loop or facts.loop["trains"]
    if not trains:
        work = "the model's forward passes take"
    elif sh.get("eval", 0.0) >= 0.005:
        work = "forward (its no-grad passes included), backward and optimizer take"
    else:
        work = "forward, backward and optimizer take"
    device = facts.device or {}
    if device.get("kind") == "cpu":
        where = ("this run has no GPU, so the device is the CPU itself; faster "
                 + ("training" if trains else "inference") + " needs a faster device, a smaller model or less work "
                 "per sample")
    else:
        where = f"the {device.get('name') or 'GPU'} is the limit"
    minor = [f for f in findings if f.get("bound")]
    rest = ", ".join(f"{f['id']} {_pct(f['bound'])}" for f in sorted(minor, key=lambda f: -f["bound"])[:3])
    if compute >= 0.5:
        summary = (f"Nothing upstream holds the device back: {work} {_pct(compute)} of "
                   f"each {_ms(step['step_time_s']['mean'])} step; {where}"
                   + (f" (smaller causes: {rest})." if rest else "."))
    else:
        spread = rest or f"data wait {_pct(sh['data_wait'])}, other host work {_pct(sh['other_host'])}"
        summary = (f"No single cause holds {T.VERDICT_MIN_BOUND:.0%} of the step: {work} "
                   f"{_pct(compute)} of each {_ms(step['step_time_s']['mean'])} step and the rest is spread thin "
                   f"({spread}).")
    evidence = _round({"compute_share": compute, "data_wait_share": sh["data_wait"],
                       "other_host_share": sh["other_host"]})
    text = f"Nothing to fix upstream. For more speed: {fixes.faster_device_options(facts)}."
    iw = facts.input_wait
    if iw is not None:  # Keras / TensorFlow
        evidence["input_wait_measured"] = iw.get("method") is not None
        text = ("Nothing to fix upstream. For more speed: the mixed_float16 / mixed_bfloat16 policy on GPUs with "
                f"tensor cores, {fixes.keras_jit_text(facts)}, or a bigger device.")
        if iw.get("method") is None:
            summary += (f" The input wait inside Keras's compiled step was not measured ({iw.get('reason')}), so part "
                        "of the compute share may be waiting for data.")
    return finding("device_bound", "info", "Device-bound: compute fills the step", summary, evidence, None,
                   text, None, [DOCS_TUNING], bound=compute)
