"""One saved run → the facts the diagnosis needs (pure: plain records in, plain dicts out).

This is the facade over the one-question modules: :mod:`.steps` (step time and its split),
:mod:`.host` (CPU, scheduler, I/O), :mod:`.stacks` (source lines), :mod:`.gpu` (NVML).
"""

from __future__ import annotations

import numpy as np

from whyidle.analysis import accounting
from whyidle.analysis import api as api_analysis
from whyidle.analysis import collectives as coll_analysis
from whyidle.analysis import compile as compile_analysis
from whyidle.analysis import gpu as gpu_analysis
from whyidle.analysis import gpu_idle as gpu_idle_analysis
from whyidle.analysis import host as host_analysis
from whyidle.analysis import keras as keras_analysis
from whyidle.analysis import loader_workers
from whyidle.analysis import logged as logged_analysis
from whyidle.analysis import loop as loop_analysis
from whyidle.analysis import notebook as notebook_analysis
from whyidle.analysis import ranks as rank_analysis
from whyidle.analysis import stacks as stack_analysis
from whyidle.analysis import steps as step_analysis
from whyidle.analysis import transfers as transfer_analysis
from whyidle.analysis.facts import DeviceInfo, LoaderIters, RunFacts
from whyidle.analysis.stepcols import StepCols, unique_counts
from whyidle.record.reader import RunData
from whyidle.record.steptable import NULL_INT


def _first(records: list[dict], kind: str) -> dict | None:
    return next((r for r in records if r.get("k") == kind), None)


def _last(records: list[dict], kind: str) -> dict | None:
    return next((r for r in reversed(records) if r.get("k") == kind), None)


#: When one process imported several frameworks, the one it trains with: Keras runs on
#: TensorFlow (or PyTorch, or JAX) underneath, so its record wins.
FRAMEWORK_ORDER = ("keras", "tensorflow", "torch")


def _proc_record(records: list[dict], steps=()) -> dict | None:
    """The process's framework record (:data:`FRAMEWORK_ORDER`), except that a framework which
    only was imported never wins over PyTorch's training steps (``steps``: its step rows) (TensorBoard's ``SummaryWriter``
    imports TensorFlow when it is installed)."""
    procs = [r for r in records if r.get("k") == "proc"]
    kinds = {r.get("by") for r in records if r.get("k") == "step"} | {s.get("by") for s in steps}
    if kinds & {"optimizer", "loader"} and not kinds & {"keras", "iterator"}:
        procs = [r for r in procs if r.get("framework") == "torch"] or procs
    return min(procs, key=lambda r: FRAMEWORK_ORDER.index(r["framework"]) if r.get("framework") in FRAMEWORK_ORDER
               else len(FRAMEWORK_ORDER), default=None)


def _dist_identity(records: list[dict]) -> dict | None:
    """A process's place in a distributed job: the launcher's environment (``proc`` record ``dist``)
    completed by the process group seen at the device audit (``devices`` record ``dist``: rank,
    world size, backend), or None outside one."""
    proc = _proc_record(records) or {}
    group = next((r["dist"] for r in reversed(records) if r.get("k") == "devices" and r.get("dist")), None)
    if not proc.get("dist") and not group:
        return None
    ident = dict(proc.get("dist") or {})
    for k, v in (group or {}).items():
        if v is not None:
            ident[k] = v
    return ident


def _keras_devices(tfd: dict | None) -> list[dict]:
    """The Keras device facts in the shape of PyTorch's device audit (``param_dtypes``,
    ``autocast`` = a ``mixed_*`` dtype policy, ``params`` by device kind) for the shared rules."""
    if not tfd or tfd.get("weight_dtypes") is None:
        return []
    n = sum(tfd["weight_dtypes"].values())
    on = "cuda" if (tfd.get("physical_gpus") or 0) > 0 and tfd.get("backend") == "tensorflow" else None
    return [{"param_dtypes": tfd["weight_dtypes"], "autocast": str(tfd.get("policy") or "").startswith("mixed"),
             "params": {on: n} if on else None, "source": "keras"}]


def _overrides(recs: list[dict]) -> list[dict] | None:
    """A ``whyidle tune`` trial's settings as the program took them (``override`` records,
    docs/run-format.md): ``[{name, value, applied, was, site, why}]`` once per name, site and
    outcome, in the order they happened; None outside a trial."""
    seen, out = set(), []
    for r in recs:
        if r.get("k") != "override":
            continue
        key = (r["name"], r.get("site"), r["applied"])
        if key not in seen:
            seen.add(key)
            out.append({k: r.get(k) for k in ("name", "value", "applied", "was", "site", "why")})
    return out or None


def _train_loader(loaders: list[dict], analyzed: list) -> dict | None:
    """The ``loader`` record of the DataLoader that fed the analyzed steps (the one most of them
    took their last batch from, the step's ``ld``), else the first one iterated. Lightning
    iterates its validation loader first (the sanity check), so the first is not always the one
    that trains."""
    by_id = {r.get("id"): r for r in loaders}
    ids, first, n = unique_counts((a, b.ints("ld")) for a, b in StepCols(analyzed).blocks())
    order = np.argsort(first)  # ties go to the loader seen first
    counts = {key: c for key, c in zip(ids[order].tolist(), n[order].tolist()) if key in by_id}
    if counts:
        return by_id[max(counts, key=counts.get)]
    return loaders[0] if loaders else None


def _job(procs: dict, step_lists: dict, summaries: dict) -> tuple[list[dict], dict | None, int | None]:
    """A distributed job's ranks (:func:`whyidle.analysis.ranks.ranks`), straggler and the pid its
    report describes (the straggler's, else the lowest rank's; None outside a job). ``summaries``:
    pid → rank summary read instead of its records (``RunData.summaries``)."""
    ranks = rank_analysis.ranks({pid: ident for pid, r in procs.items() if (ident := _dist_identity(r))}, step_lists,
                                {pid: s.figures for pid, s in summaries.items()})

    def waits(pid: int) -> coll_analysis.StepWaits:
        s = summaries.get(pid)
        return coll_analysis.StepWaits(s.wait_steps, s.wait_ns) if s else coll_analysis.wait_arrays(procs[pid])

    measured = rank_analysis.measure_collectives(
        ranks, {r["pid"]: waits(r["pid"]) for r in ranks}, step_lists,
        {r["pid"]: [x for x in procs[r["pid"]] if x.get("k") == "region"] for r in ranks})
    late = rank_analysis.straggler(ranks, measured=measured)
    return ranks, late, rank_analysis.lead_pid(ranks, late)


def _trainers(step_lists: dict, summaries: dict) -> list[int]:
    """The processes that train first (an evaluation subprocess's inference steps are not the
    job's), most steps first; a summarized rank by its summary's ``trains`` and ``steps``."""
    def key(p: int) -> tuple[bool, int]:
        s = summaries.get(p)
        return (not s.trains, -s.steps) if s else (not loop_analysis.trains(step_lists[p]), -len(step_lists[p]))

    return sorted((pid for pid, s in step_lists.items() if s or (pid in summaries and summaries[pid].steps)), key=key)


def job_lead(run: RunData) -> int | None:
    """The pid whose records the report of ``run`` describes (see :func:`analyze`): a
    distributed job's straggler or lowest rank, else the process with most training steps; None
    without steps. Used to pick the node of a merged multi-node run and the one rank whose
    records a merge reads in full (the others' summaries tell the rest)."""
    step_lists = {pid: step_analysis.steps_of(run.steps.get(pid, recs)) for pid, recs in run.procs.items()}
    lead = _job(run.procs, step_lists, run.summaries)[2]
    trainers = _trainers(step_lists, run.summaries)
    return lead if lead in trainers or not trainers else trainers[0]


def rank_summaries(run: RunData) -> dict[int, dict]:
    """pid → :func:`whyidle.analysis.ranks.summary` of each process of ``run`` with a
    ``torch.distributed`` identity (the ranks whose summaries a merge of node runs reads)."""
    return {pid: rank_analysis.summary(recs, step_analysis.steps_of(run.steps.get(pid, recs)))
            for pid, recs in run.procs.items() if pid not in run.summaries and _dist_identity(recs)}


def _records_end_s(meta: dict, recs: list[dict], rows: list) -> float | None:
    """Seconds from the trainer's last record to the command's end (``meta.json`` ``exit_t``) when
    its records end without the agent's ``exit`` record (written at interpreter exit): the
    recording stopped early (a full, removed or read-only run directory, whyidle killed, a damaged
    or cut file) or the process was killed. None when the records end normally or it is unknown."""
    end = meta.get("exit_t")
    if not recs or end is None or any(r.get("k") == "exit" for r in recs):
        return None
    last = max([r["t"] for r in recs] + ([rows[-1]["t1"]] if rows else []))
    return max(0.0, (end - last) / 1e9)


def analyze(run: RunData) -> RunFacts:
    """Computes the facts of a run.

    Returns a :class:`~whyidle.analysis.facts.RunFacts` with: ``framework``; ``api`` (the training API and its settings,
    :func:`whyidle.analysis.api.training_api`); ``compiled`` (``torch.compile`` was used);
    ``trainers`` (pids with steps, most steps first) and
    ``primary``; ``proc`` (its ``proc`` record); ``steps_info`` (see
    :func:`whyidle.analysis.steps.select_steps`); ``step`` (:func:`step_metrics` of the analyzed
    steps, or None); ``host`` (:func:`host_metrics` over the analyzed window, or over the whole run
    when there are no steps); ``top_others``; ``gpu`` and ``device``; ``loader`` (configuration
    of the DataLoader that fed the analyzed steps, :func:`_train_loader`) and ``loader_iters`` (iterator creations and their
    seconds); ``devices`` (last device audit); ``graph_nodes`` (median autograd graph nodes per
    backward, counted at a few early steps, or None); ``hotspots`` (phase → list, see
    :func:`whyidle.analysis.stacks.hotspots`); ``focus`` (phase → the user function holding
    most of it inclusively, :func:`whyidle.analysis.stacks.focus`, or None); ``gpu_idle`` (GPU starvation from
    the CUDA timeline, :func:`whyidle.analysis.gpu_idle.gpu_idle`, or None); ``transfers``
    (:func:`whyidle.analysis.transfers.transfer_summary`), ``reads`` and ``placement`` (same module);
    ``notices``; ``instrumented`` (pids that imported
    a framework); ``other_trainers`` (per extra trainer: pid, steps, samples_per_s); Keras /
    TensorFlow: ``input_wait`` (how the input wait inside the compiled step was measured,
    :func:`whyidle.analysis.keras.input_wait`, or None), ``tfdata`` (the tf.data pipeline given to
    ``fit``), ``tf_devices`` (GPUs TensorFlow sees, its build, the dtype policy), ``keras_calls``;
    ``threads`` (the primary's background Python threads: ``{name, module, cpu_s}``, busiest first);
    ``logged`` (metrics the program reported, :func:`whyidle.analysis.logged.logged_metrics`);
    ``step_rows`` (all steps of the primary trainer, warm-up and boundaries included) and
    ``analyzed_steps`` (those the metrics are over) — step records or ``StepView`` rows; ``notebook``
    and ``worker_start`` (:mod:`whyidle.analysis.notebook`: the trainer ran in a notebook kernel, the
    start method of its DataLoader's workers); ``loader_workers`` (the workers' own batch times:
    :func:`whyidle.analysis.loader_workers.worker_facts`).
    """
    procs, summaries = run.procs, run.summaries
    step_lists = {pid: step_analysis.steps_of(run.steps.get(pid, recs)) for pid, recs in procs.items()}
    trainers = _trainers(step_lists, summaries)
    ranks, late, lead = _job(procs, step_lists, summaries)
    if lead in trainers:  # a distributed job: the straggler's report (the others wait for it), else rank 0's
        trainers = [lead] + [p for p in trainers if p != lead]
    primary = trainers[0] if trainers else None
    recs = procs.get(primary, []) if primary is not None else []

    proc = _proc_record(recs, step_lists[primary]) if primary is not None else None
    if proc is None:
        proc = next((p for p in map(_proc_record, procs.values()) if p), None)
    framework = (proc or {}).get("framework") or "none"

    input_wait = None
    if primary is not None:
        step_lists[primary], input_wait = keras_analysis.input_wait(step_lists[primary], recs)
        if not step_lists[primary]:  # eager iteration that trained nothing (analysis/keras.py)
            trainers = [p for p in trainers if p != primary]
            primary = None
    rows = step_lists[primary] if primary is not None else []
    compiled = compile_analysis.compile_facts(recs, rows, run.meta.get("cwd"))
    comps = compile_analysis.intervals(recs)
    compile_part = compile_analysis.training_intervals(comps, int(rows[0]["t1"]) if rows else None)
    analyzed, info = step_analysis.select_steps(rows, [(c["t0"], c["t1"]) for c in comps]) if primary is not None \
        else ([], {"total": 0})
    outside = accounting.merged([(r["t0"], r["t1"]) for r in recs if r.get("k") == "region"
                                 and r.get("kind") in accounting.OUTSIDE_STEP])
    step = step_analysis.step_metrics(analyzed, outside) if analyzed else None
    window = tuple(step["window"]) if step else None
    loop = loop_analysis.loop_facts(analyzed or (step_lists[primary] if primary is not None else []),
                                    _last(recs, "optimizers"))
    if step and loop:
        step["micro_batches_per_step"] = loop["micro_batches_per_step"]

    loader = _train_loader([r for r in recs if r.get("k") == "loader"], analyzed)
    iters = [r for r in recs if r.get("k") == "iter" and (loader is None or r.get("loader") == loader["id"])]
    if loader is not None and any(r.get("rebuilt") for r in iters):
        # the program builds the DataLoader again at the same line (inside its epoch loop)
        loader = {**loader, "rebuilt": sum(1 for r in iters if r.get("rebuilt"))}
    samples = None
    if step and step.get("samples_per_s"):
        samples = step["samples_per_s"] * StepCols(analyzed).total_ns() / 1e9
    loader_in_main = not loader or not loader.get("num_workers")
    whyidle_pid = run.meta.get("whyidle_pid")
    host = host_analysis.host_metrics(run.host, window, set(trainers), primary, whyidle_pid,
                                      samples_in_window=samples, loader_in_main=loader_in_main,
                                      num_workers=(loader or {}).get("num_workers") or None)
    if host is None and window is not None:  # run shorter than two host ticks inside the steps
        host = host_analysis.host_metrics(run.host, None, set(trainers), primary, whyidle_pid)

    total_s = StepCols(analyzed).total_ns() / 1e9 if analyzed else None
    phase_seconds = None
    if step:
        names = {"other": "other_host", "data": "data_wait", "forward": "forward", "backward": "backward",
                 "optimizer": "optimizer", "eval": "eval", "compute": "compute"}
        phase_seconds = {p: step["shares"][k] * total_s for p, k in names.items() if k in step["shares"]}
    api = api_analysis.training_api(recs, framework)
    entry_sites = frozenset(api["entry_sites"])
    hotspots = {
        phase: stack_analysis.hotspots(recs, {phase}, window, total_s, source_root=run.meta.get("cwd"),
                                       phase_seconds=phase_seconds, entry_sites=entry_sites)
        for phase in ("other", "data", "forward", "backward", "optimizer")
    }
    focus = {
        phase: stack_analysis.focus(recs, phase, window, (phase_seconds or {}).get(phase), run.meta.get("cwd"),
                                    entry_sites=entry_sites)
        for phase in ("other", "data", "forward")
    }
    devices = [r for r in recs if r.get("k") == "devices"] or _keras_devices(_last(recs, "tf_devices"))
    graphs = sorted(r["nodes"] for r in recs if r.get("k") == "graph")
    notices = [r["msg"] for records in procs.values() for r in records if r.get("k") == "notice"]
    other_trainers = []
    for pid in trainers[1:]:
        if pid in summaries:
            if summaries[pid].other:
                other_trainers.append({"pid": pid, **summaries[pid].other})
            continue
        a, _ = step_analysis.select_steps(step_lists[pid])
        if a:
            m = step_analysis.step_metrics(a)
            other_trainers.append({"pid": pid, "steps": m["steps"], "samples_per_s": m["samples_per_s"],
                                   "step_time_p50_s": m["step_time_s"]["p50"]})
    device: DeviceInfo = gpu_analysis.device_info(run.gpu) or {
        "kind": "cpu", "name": (_first(run.host, "host_static") or {}).get("cpu_model"), "compute_capability": None,
        "memory_total_bytes": (_first(run.host, "host_static") or {}).get("mem_total_bytes"),
    }
    audit = devices[-1] if devices else None
    time_parts = _accounting(run, recs, rows, step, entry_sites,
                             (compile_part, [(c["t0"], c["t1"]) for c in comps if (c["t0"], c["t1"]) not in compile_part]))
    if time_parts and run.gpu:
        _part_gpu_util(time_parts, run.gpu, recs, rows)
    return RunFacts(
        framework=framework,
        api=api,
        compiled=bool((audit or {}).get("compiled") or api["config"].get("compiled") or compiled),
        compile=compiled,
        trainers=trainers,
        primary=primary,
        proc=proc,
        instrumented=sorted(pid for pid, r in procs.items() if _first(r, "proc")),
        steps_info=info,
        step=step,
        host=host,
        top_others=host_analysis.top_other_processes(run.host, window),
        gpu=gpu_analysis.gpu_metrics(run.gpu, window),
        gpu_idle=gpu_idle_analysis.gpu_idle(recs, window, analyzed, run.meta.get("cwd")) if analyzed else None,
        transfers=transfer_analysis.transfer_summary(recs),
        reads=transfer_analysis.read_summary(recs),
        placement=transfer_analysis.placement_summary(recs),
        gpu_static=_first(run.gpu, "gpu_static"),
        device=device,
        loader=loader,
        loader_iters=LoaderIters(count=len(iters), seconds=[(r["t1"] - r["t0"]) / 1e9 for r in iters]),
        devices=audit,
        graph_nodes=graphs[len(graphs) // 2] if graphs else None,
        hotspots=hotspots,
        focus=focus,
        notices=notices,
        gpu_records_notices=[r for r in run.gpu if r.get("k") == "gpu_notice"],
        other_trainers=other_trainers,
        ranks=ranks,
        straggler=late,
        collectives=coll_analysis.program_collectives(recs),
        accumulation=coll_analysis.accumulation(recs, step_lists[primary]) if primary is not None else None,
        loop=loop,
        meta=run.meta,
        input_wait=input_wait,
        tfdata=_last(recs, "tfdata"),
        overrides=_overrides(recs or [r for rs in procs.values() for r in rs]),
        host_mem_total_bytes=(_first(run.host, "host_static") or {}).get("mem_total_bytes"),
        tf_devices=_last(recs, "tf_devices"),
        keras_calls=[r for r in recs if r.get("k") == "keras_call"],
        threads=(_last(recs, "threads") or {}).get("threads") or [],
        logged=logged_analysis.logged_metrics(procs),
        windows=list(run.windows),
        deep_traces=list(run.deep_traces),
        step_rows=rows,
        analyzed_steps=analyzed,
        time=time_parts,
        records_end_s=_records_end_s(run.meta, recs, rows),
        job_samples_per_s=_job_samples_per_s(rows, time_parts),
        module_loops=_module_loops(_last(recs, "module_calls")),
        preamble=_preamble(_last(recs, "module_calls"), step, hotspots.get("forward") or []),
        data_ipc_share=stack_analysis.leaf_share(recs, "data", stack_analysis.IPC_LEAVES, window)
        if (loader or {}).get("num_workers") else None,
        data_snapshot_share=stack_analysis.leaf_share(recs, "data", stack_analysis.SNAPSHOT_LEAVES, window)
        if (loader or {}).get("snapshot_every_n_steps") else None,
        data_image_read_share=stack_analysis.leaf_share(recs, "data", stack_analysis.IMAGE_READ_LEAVES, window),
        data_decode_share=stack_analysis.function_leaf_share(recs, "data", stack_analysis.DECODE_LEAVES, window)
        if framework == "keras" and window else None,
        hooks=_hooks(_last(recs, "hooks"), analyzed, step),
        notebook=notebook_analysis.notebook_facts(recs, run.meta, loader),
        worker_start=notebook_analysis.worker_start(loader, proc),
        loader_workers=loader_workers.worker_facts(
            run.loader_workers, [r for r in recs if r.get("k") == "loader_queue"],
            stack_analysis.leaf_split(recs, "data", window=window) if (loader or {}).get("num_workers") else None),
    )


def _hooks(rec: dict | None, analyzed: list, step: dict | None) -> dict | None:
    """The program's own hooks on the model (forward, backward and gradient hooks a program or a
    tracker registered; :mod:`whyidle.instrument.hooks`): ``share_of_step`` (their seconds in the
    analyzed steps that recorded them ÷ those steps' time, 0–1; inside the forward and backward
    shares), ``s_per_step`` (that share of the steady step time p50, seconds), ``by_phase``
    (``forward``/``backward`` → share of step, from the hooks' totals), ``hooks`` (the ``hooks``
    record's rows: ``phase``, ``function``, ``defined``, ``registered``, ``owner``, ``calls``,
    ``s``; costliest first). None without hook time or steady steps."""
    c = StepCols(analyzed)
    total_ns = hook_ns = 0
    for _, b in c.blocks():  # a block of steps at a time: a day of steps is 25 MB a column
        hooks = b.ints("hk")
        timed = hooks != NULL_INT
        total_ns += int(b.durations()[timed].sum())
        hook_ns += int(hooks[timed].sum())
    if not step or not total_ns or not hook_ns:
        return None
    share = min(1.0, hook_ns / total_ns)
    rows = (rec or {}).get("hooks") or []
    seconds = sum(r.get("s") or 0.0 for r in rows)
    by_phase: dict[str, float] = {}
    for r in rows:
        if seconds > 0:
            by_phase[r["phase"]] = by_phase.get(r["phase"], 0.0) + share * (r.get("s") or 0.0) / seconds
    return {"share_of_step": share, "s_per_step": share * step["step_time_s"]["p50"], "by_phase": by_phase,
            "hooks": rows}


def _module_loops(rec: dict | None) -> list[dict]:
    """Modules called in a Python loop (the ``module_calls`` record of the first steps), busiest
    first: ``cls``, ``site`` (the user's line calling it), ``calls_per_step``,
    ``forward_s_per_step`` (seconds of their forward per step), ``share_of_step`` (that ÷ the
    median step time of those steps, 0–1), ``batch`` (first input's size), ``params``."""
    if not rec or not rec.get("step_s"):
        return []
    return [{"cls": cls, "site": site, "calls_per_step": calls, "forward_s_per_step": fwd,
             "share_of_step": min(1.0, fwd / rec["step_s"]), "batch": batch, "params": params}
            for cls, site, calls, fwd, batch, params in rec.get("modules") or []]


def _preamble(rec: dict | None, step: dict | None, forward_hotspots: list[dict]) -> dict | None:
    """The model's forward before its first layer (the ``module_calls`` record of the first,
    hooked steps), or None without that record or steady steps: ``cls`` and ``site`` (the
    top-level module and the user's line calling it), ``share_of_step`` (the median preamble ÷ the
    median step time of those same steps, 0–1: the first steps run slower than the steady ones,
    their preamble too), ``s_per_step`` (that share of the steady step time p50, seconds) and
    ``sites`` (the forward phase's sampled lines that are not the model's layers (innermost frame
    under ``torch/nn/modules/``, or PyTorch called from a ``forward`` method) nor the loader: the
    preprocessing, busiest first)."""
    if not rec or not step or not rec.get("preamble_s"):
        return None
    p50 = step["step_time_s"]["p50"]
    base = rec.get("step_s") or p50
    if not p50 or not base:
        return None
    share = min(1.0, rec["preamble_s"] / base)
    cls, site = (rec.get("root") or [None, None])[:2]
    def layer(h: dict) -> bool:
        leaf = h.get("leaf") or ""
        return "torch/nn/modules/" in leaf or (h["function"].endswith(" forward") and leaf.startswith("torch/"))

    sites = [h for h in forward_hotspots if not layer(h) and accounting.mix_of_leaf(h.get("leaf")) != "data"]
    return {"cls": cls, "site": site, "s_per_step": share * p50, "share_of_step": share, "sites": sites[:3]}


def _window(meta: dict, recs: list[dict]) -> tuple[int, int] | None:
    """The command's wall window (``meta.json`` ``start_t``/``exit_t``, monotonic ns) or, for runs
    without them (a killed whyidle, an older run), the training process's own life: its
    interpreter start (``proc.started``) to its ``exit`` record or last record."""
    start, end = meta.get("start_t"), meta.get("exit_t")
    if isinstance(start, int) and isinstance(end, int) and end > start:
        return start, end
    proc = _first(recs, "proc") or {}
    start = proc.get("started") or proc.get("t")
    ts = [r["t"] for r in recs if isinstance(r.get("t"), int)]
    end = max(ts, default=None)
    if not isinstance(start, int) or end is None or end <= start:
        return None
    return start, end


def _accounting(run: RunData, recs: list[dict], rows: list, step, entry_sites, compiles=((), ())) -> dict | None:
    """:func:`whyidle.analysis.accounting.time_accounting` of the training process, or None."""
    window = _window(run.meta, recs)
    if window is None or not recs:
        return None
    steady = 0.0
    if step:
        steady = step["data_wait_s_per_step"] / max(1.0, step.get("batches_per_step") or 1.0)
    return accounting.time_accounting(
        window, rows, [r for r in recs if r.get("k") == "region"], [r for r in recs if r.get("k") == "iter"],
        [r for r in recs if r.get("k") == "iter_first"], steady, recs, run.meta.get("cwd"), entry_sites, compiles,
        [r for r in recs if r.get("k") == "iter_end"])


def _part_gpu_util(time_parts: dict, gpu: list[dict], recs: list[dict], rows: list) -> None:
    """Sets ``gpu_util_pct`` of the evaluation part (its regions' time) and of the training part
    (the first step's end to the last one's, evaluations left out): whether the evaluation used
    the GPU the training used."""
    evals = accounting.merged([(int(r["t0"]), int(r["t1"])) for r in recs
                               if r.get("k") == "region" and r.get("kind") == "evaluation"])
    parts = time_parts["parts"]
    if evals and parts["evaluation"]["s"] > 0:
        parts["evaluation"]["gpu_util_pct"] = gpu_analysis.util_over(gpu, evals)
    if len(rows) >= 2:
        span, cur = [], int(rows[0]["t1"])
        for a, b in evals:  # the training span with the evaluations cut out
            if a > cur:
                span.append((cur, min(a, int(rows[-1]["t1"]))))
            cur = max(cur, b)
        if cur < int(rows[-1]["t1"]):
            span.append((cur, int(rows[-1]["t1"])))
        parts["training"]["gpu_util_pct"] = gpu_analysis.util_over(gpu, [w for w in span if w[1] > w[0]])


def _job_samples_per_s(rows: list, time_parts: dict | None) -> float | None:
    """Samples of every training step after the first (steps whose batch size was not read count
    as the median of those that were) over the training span (the first step's end to the last
    one's: the first step is start-up), or None."""
    if not time_parts or len(rows) < 2 or time_parts["training_span_s"] <= 0:
        return None
    total = rank_analysis.samples_after_first(rows)
    return None if total is None else total / time_parts["training_span_s"]
