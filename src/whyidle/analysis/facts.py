"""The typed contract between analysis and diagnosis: :class:`RunFacts`, built only by
:func:`whyidle.analysis.run.analyze` (or, in unit tests, by its constructor with the parts a test
needs). Diagnosis and the renderers read it; nothing downstream reads the records.

Every field defaults to None (nothing measured), so a test states only what it measures; an
unknown field name is a ``TypeError`` at construction, never a silently ignored key. The two
parts every rule reads, the step metrics and the host metrics, are declared here as ``TypedDict``
(:class:`StepMetrics`, :class:`HostMetrics`: they are copied into the JSON report as they are), as
are the GPU metrics, the device, the training API, the loader's iterator start-ups and the Keras
input wait (:class:`GpuMetrics`, :class:`DeviceInfo`, :class:`TrainingApi`, :class:`LoaderIters`,
:class:`InputWait`), the notebook and the workers' start method (:class:`NotebookFacts`,
:class:`WorkerStart`); tests/test_facts.py checks each against what its builder returns. The
remaining parts are records as the agent wrote them (``proc``, ``loader``, ``meta``) or lists and
maps whose shape the building function documents.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict


class StepTimes(TypedDict):
    """Step time percentiles over the analyzed steps, seconds."""

    p50: float
    p90: float
    mean: float
    min: float
    max: float


class Part(TypedDict):
    """One optimizer stepping in the loop (:func:`whyidle.analysis.loop.parts`): ``name`` (the class
    of the model it trains), ``cls`` (its own class), ``params`` (count), ``steps_per_step`` and
    ``backward_per_step`` (per step of the primary optimizer)."""

    name: str
    cls: str
    params: int
    steps_per_step: float
    backward_per_step: float


class LoopFacts(TypedDict):
    """:func:`whyidle.analysis.loop.loop_facts`: ``marker`` (what ends a step), ``trains``,
    ``parts`` (the optimizers of a step), ``backward_per_step``, ``micro_batches_per_step`` (gradient
    accumulation) and ``forward_calls_per_step`` (medians; None when not recorded)."""

    marker: str | None
    trains: bool
    parts: list[Part]
    backward_per_step: float | None
    micro_batches_per_step: float | None
    forward_calls_per_step: float | None


class StepMetrics(TypedDict):
    """:func:`whyidle.analysis.steps.step_metrics` of the analyzed steps.

    ``window``: [t0, t1] monotonic ns; ``wall_s``: its length (s); ``shares``: phase name →
    fraction (0–1) of the step time without whyidle's own work (``data_wait``, ``forward``,
    ``backward``, ``optimizer``, ``eval``, ``compute`` for Keras, ``other_host``, summing to 1);
    ``data_wait_s_per_step`` / ``compute_s_per_step``: means (s); ``data_cpu_share``: CPU time of
    the main thread while waiting for data / that wait (0–1, None when not timed);
    ``main_cpu_share``: main-thread CPU / step time; ``whyidle_share``: whyidle's step-boundary
    work / step time; ``outside_share``: checkpoint saving and tracker logging inside the steps /
    step time (both left out of the shares); ``gpu_ms``: ``{p50, mean}`` GPU time per step (ms) or None.
    """

    steps: int
    window: list[int]
    wall_s: float
    samples_per_s: float | None
    steps_per_s: float
    batch_size: float | None
    batches_per_step: float
    micro_batches_per_step: float | None
    backward_per_step: float | None
    step_time_s: StepTimes
    shares: dict[str, float]
    data_wait_s_per_step: float
    compute_s_per_step: float
    data_cpu_share: float | None
    main_cpu_share: float | None
    lite_steps: int
    whyidle_share: float
    outside_share: float
    gpu_ms: dict[str, float] | None


class HostMetrics(TypedDict):
    """:func:`whyidle.analysis.host.host_metrics` over the analyzed window (definitions there).

    Units: ``*_cores`` in cores (1.0 = one core busy), ``*_share`` fractions 0–1, ``*_bytes``
    bytes, ``*_per_s`` per second, ``window_s`` seconds.
    """

    window_s: float
    cores: int
    cores_usable: float
    cores_limit_by: str | None
    cpu_affinity: int | None
    cpu_quota: float | None
    cpu_throttled_share: float | None
    cpu_throttled_s: float | None
    mem_limit_bytes: int | None
    cpu_busy_share: float
    percpu_busy_share: list[float]
    iowait_share: float
    steal_share: float
    trainer_cores: float
    workers: int
    workers_cores: float
    worker_busy_share: float | None
    tree_other_cores: float
    whyidle_cores: float
    other_procs_cores: float
    yielding_procs_cores: float
    trainer_run_delay_share: float | None
    workers_run_delay_share: float | None
    tree_run_delay_cores: float
    invol_ctx_per_s: float
    disk_read_bytes_per_s: float | None
    loader_read_bytes_per_s: float
    loader_read_bytes_per_sample: float | None
    trainer_rss_max_bytes: int | None
    tree_rss_max_bytes: int | None
    worker_rss_max_bytes: int | None
    tree_threads: int
    psi_cpu_share: float | None
    psi_io_share: float | None


class GpuMetrics(TypedDict):
    """:func:`whyidle.analysis.gpu.gpu_metrics` over the analyzed window (definitions there).

    Units: ``*_mean`` utilizations in percent (``util_mean``, ``mem_util_mean``) or fractions 0–1
    (the GPM ``*_active_mean``/``sm_occupancy_mean``), ``*_mhz`` MHz, ``*_w`` watts, ``*_bytes``
    bytes, ``throttle_s``/``throttle_observed_s`` seconds, ``throttle_share`` fractions 0–1.
    ``devices`` holds the same per device (with ``index`` and ``name``).
    """

    util_mean: float | None
    util_source: str | None
    util_samples: int
    mem_util_mean: float | None
    memory_used_max_bytes: int | None
    memory_total_bytes: int | None
    sm_clock_mean_mhz: float | None
    sm_clock_throttled_mean_mhz: float | None
    sm_clock_max_mhz: float | None
    power_mean_w: float | None
    power_limit_w: float | None
    power_limit_default_w: float | None
    power_limit_max_w: float | None
    throttle_reasons: list[str]
    throttle_share: dict[str, float]
    throttle_s: dict[str, float] | None
    throttle_source: str | None
    throttle_observed_s: float | None
    throttle_snapshots: int
    sm_active_mean: float | None
    sm_occupancy_mean: float | None
    tensor_active_mean: float | None
    dram_active_mean: float | None
    gr_active_mean: float | None
    fp16_active_mean: float | None
    fp32_active_mean: float | None
    gpm_windows: int
    device_indices: list[int]
    devices: list[dict]


class _Device(TypedDict):
    kind: str
    name: str | None
    compute_capability: str | None
    memory_total_bytes: int | None


class DeviceInfo(_Device, total=False):
    """The device the steps ran on (the report's ``device``): ``kind`` ``"cuda"`` (from
    :func:`whyidle.analysis.gpu.device_info`; ``count``: devices the command could use, present
    only for ``"cuda"``) or ``"cpu"`` (the CPU model recorded at run time); bytes."""

    count: int


class TrainingApi(TypedDict):
    """:func:`whyidle.analysis.api.training_api`: the training API (``name``, ``label``,
    ``version``), its settings at the training entry (``config``), the entry points called
    (``entries``), the user lines that called them (``entry_sites``), other APIs seen (``also``)."""

    name: str
    label: str
    version: str | None
    config: dict
    entries: list[str]
    entry_sites: list[str]
    also: list[str]


class LoaderIters(TypedDict):
    """The analyzed DataLoader's iterator start-ups: how many, and each one's seconds."""

    count: int
    seconds: list[float]


class InputWait(TypedDict, total=False):
    """:func:`whyidle.analysis.keras.input_wait`: how a Keras/TensorFlow run's input wait was
    measured (``method``: ``"tf_profiler"``, ``"fit_input"`` (the torch and JAX backends: each
    batch the trainer takes from its input, timed), ``"iterator"`` or None with the ``reason``) and, for
    the profiler, ``ratio`` (fraction of train-function time spent in ``GetNext``), ``calls``,
    ``get_next_ms_mean``/``fn_ms_mean`` (ms per call), ``fn_name``, ``iterators``, ``file`` and
    ``gpu_busy`` ([plane, fraction] pairs)."""

    method: str | None
    reason: str | None
    ratio: float
    calls: int
    get_next_ms_mean: float
    fn_ms_mean: float
    fn_name: str | None
    iterators: list
    file: str | None
    gpu_busy: list


class TimePart(TypedDict):
    """One part of the wall time (:mod:`whyidle.analysis.accounting`): ``s`` seconds, ``share`` of
    the wall time (0–1), ``count`` (regions or iterators that made it), ``every_steps`` (training
    steps between two evaluations / saves / logging calls, median; None when fewer than two), ``sites`` (busiest lines
    inside it: ``{site, function, leaf, seconds}``), ``host_sites`` (the same, outside the model and
    the data loader), ``mix`` (seconds by what ran: ``model``, ``data``, ``host``; None without
    stack samples), ``callers`` (the program's lines that opened it: ``{site, count, seconds}``),
    ``storage`` (checkpoint part: where the saves went and how fast,
    :func:`whyidle.analysis.accounting.save_storage`; None otherwise), ``split`` (start-up part:
    :func:`whyidle.analysis.startup.startup_split`; None otherwise), ``devices`` (evaluation part:
    ``model.eval()`` regions by the device type of the evaluated weights; None otherwise),
    ``gpu_util_pct`` (evaluation and training parts of a GPU run: the GPU's mean kernel-activity
    percent over the part's time; None otherwise)."""

    s: float
    share: float
    count: int
    every_steps: float | None
    sites: list[dict]
    host_sites: list[dict]
    mix: dict[str, float] | None
    callers: list[dict]
    storage: dict | None
    split: dict | None
    devices: dict[str, int] | None
    gpu_util_pct: float | None


class TimeAccounting(TypedDict):
    """:func:`whyidle.analysis.accounting.time_accounting`: ``wall_s`` (the command's wall time,
    s), ``window`` ([t0, t1] monotonic ns), ``parts`` (``startup``, ``training``, ``evaluation``,
    ``checkpoint``, ``logging``, ``epoch_boundary``, ``teardown`` → :class:`TimePart`, summing to
    ``wall_s``), ``training_span_s`` (first step's end to last step's end, s)."""

    wall_s: float
    window: list[int]
    parts: dict[str, TimePart]
    training_span_s: float


class CompileFacts(TypedDict):
    """:func:`whyidle.analysis.compile.compile_facts`: ``compilations`` (Dynamo compile ids seen),
    ``total_s`` / ``startup_s`` / ``training_s`` (seconds compiling: all, the first compilations up
    to the first step's end, the rest: the ``compile`` part), ``recompilations`` and
    ``recompile_s`` (count, seconds), ``recompiles`` (per frame: ``frame``, ``site``, ``count``,
    ``seconds``, ``reasons``: ``[{text, tensor, dim, example, count}]``), ``limit`` (the recompile
    limit was hit: ``frame``, ``limit``, ``reason``, ``hits``, ``steps_after``,
    ``compiled_step_s``, ``eager_step_s`` (median seconds; None when not measured), else None),
    ``breaks`` (graph-break sites: ``site``, ``function``, ``line``, ``file``, ``resumes``
    (compilations that broke there: Dynamo's count of the resume functions it made, not of calls),
    ``reasons``), ``compile_steps`` (steps holding a compilation), ``cudagraph_recordings`` (CUDA-graph recordings
    under ``mode="reduce-overhead"``, from the callbacks' trigger),
    ``call`` (the ``torch.compile`` call: ``site``, ``dynamic``, ``mode``, ``backend``,
    ``fullgraph``, ``code`` (its line as written, None when unreadable); None when not seen), ``observed`` (compile times came from the compiler's
    callbacks)."""

    compilations: int
    total_s: float
    startup_s: float
    training_s: float
    recompilations: int
    recompile_s: float
    recompiles: list[dict]
    limit: dict | None
    breaks: list[dict]
    compile_steps: int
    cudagraph_recordings: int
    call: dict | None
    observed: bool


class NotebookFacts(TypedDict):
    """:func:`whyidle.analysis.notebook.notebook_facts`: the trainer ran in a notebook kernel;
    ``path`` (the notebook as the kernel or the command names it, None when unknown) and
    ``dataset`` (the training loader's Dataset class when the kernel's own code defines it:
    ``class``, ``site``, ``cell``, ``calls``; None otherwise)."""

    path: str | None
    dataset: dict | None


class WorkerStart(TypedDict):
    """:func:`whyidle.analysis.notebook.worker_start`: the start method of the training
    DataLoader's workers (``method``, None when unknown), what decided it (``source``:
    ``"loader"``, ``"program"``, ``"default"``), and the ``platform`` and ``python`` version."""

    method: str | None
    source: str
    platform: str | None
    python: str | None


@dataclasses.dataclass(kw_only=True, slots=True)
class RunFacts:
    """What was measured in one run, over its analyzed (steady) steps.

    Fields (units in the builders' docstrings):

    - ``framework``: ``"torch"``, ``"keras"``, ``"tensorflow"`` or ``"none"``.
    - ``api``: the training API and its settings (:func:`whyidle.analysis.api.training_api`).
    - ``compiled``: ``torch.compile`` was used (bool); ``compile``: its compilations, recompilations,
      recompile limit and graph breaks (:func:`whyidle.analysis.compile.compile_facts`), or None.
    - ``trainers`` (pids with steps, most steps first), ``primary`` (the pid analyzed),
      ``instrumented`` (pids that imported a framework), ``proc`` (the primary's ``proc`` record),
      ``other_trainers`` (per extra trainer: ``pid``, ``steps``, ``samples_per_s``,
      ``step_time_p50_s``); ``ranks`` (a ``torch.distributed`` job's ranks with steps:
      :func:`whyidle.analysis.ranks.ranks`; empty outside one), ``straggler`` (the rank the others
      wait for: :func:`whyidle.analysis.ranks.straggler`; the primary is its process),
      ``collectives`` (the primary's own blocking collectives per step, timed on gloo/mpi:
      :func:`whyidle.analysis.collectives.program_collectives`, or None), ``accumulation``
      (gradient reductions per micro-batch: :func:`whyidle.analysis.collectives.accumulation`);
      ``loop`` (training or not, the step marker, the optimizers of a step, gradient accumulation:
      :func:`whyidle.analysis.loop.loop_facts`).
    - ``steps_info`` (:func:`whyidle.analysis.steps.select_steps`), ``step``
      (:func:`whyidle.analysis.steps.step_metrics` of the analyzed steps), ``step_rows`` (every step
      of the primary trainer) and ``analyzed_steps`` (those the metrics are over).
    - ``host`` (:func:`whyidle.analysis.host.host_metrics`), ``top_others``,
      ``host_mem_total_bytes`` (bytes).
    - ``gpu`` (:func:`whyidle.analysis.gpu.gpu_metrics`), ``gpu_static`` (the sampler's
      ``gpu_static`` record), ``gpu_idle`` (:func:`whyidle.analysis.gpu_idle.gpu_idle`),
      ``gpu_records_notices`` (the sampler's ``gpu_notice`` records), ``device`` (the device the
      steps ran on: ``kind``, ``name``, ``compute_capability``, ``memory_total_bytes``).
    - ``transfers``, ``reads``, ``placement`` (:mod:`whyidle.analysis.transfers`).
    - ``loader`` (the DataLoader that fed the analyzed steps), ``loader_iters`` (``count`` and
      ``seconds`` of its iterator start-ups), ``devices`` (the last device audit),
      ``graph_nodes`` (median autograd nodes per backward).
    - ``hotspots`` and ``focus`` (phase → :mod:`whyidle.analysis.stacks` results).
    - ``time``: the command's wall time by part (:func:`whyidle.analysis.accounting.time_accounting`);
      ``records_end_s``: seconds from the trainer's last record to the command's end when its
      records end without the agent's ``exit`` record (recording stopped early, or the process was
      killed; :func:`whyidle.analysis.run._records_end_s`), else None;
      ``job_samples_per_s``: samples trained after the first step ÷ ``time.training_span_s`` (what
      the job achieved, evaluation, checkpoints and epoch boundaries inside the training loop
      included).
    - ``module_loops``: submodules called in a Python loop in the first steps
      (:func:`whyidle.analysis.run._module_loops`); ``preamble``: the model's forward before its
      first layer (:func:`whyidle.analysis.run._preamble`); ``data_ipc_share``: with DataLoader
      workers, the fraction of the training thread's sampled data wait spent receiving batches
      from them (:data:`whyidle.analysis.stacks.IPC_LEAVES`), else None; ``data_snapshot_share``:
      with torchdata's ``StatefulDataLoader``, the fraction of that wait in its state snapshots
      (:data:`whyidle.analysis.stacks.SNAPSHOT_LEAVES`), else None; ``data_image_read_share``: the
      fraction of the training thread's sampled data wait in image decoding
      (:data:`whyidle.analysis.stacks.IMAGE_READ_LEAVES`), None without samples; ``data_decode_share``
      (Keras): the fraction of the training thread's sampled data wait spent decoding images (in
      the program's functions that mostly run :data:`whyidle.analysis.stacks.DECODE_LEAVES`,
      :func:`whyidle.analysis.stacks.function_leaf_share`), else None; ``hooks``: the
      program's own model hooks (:func:`whyidle.analysis.run._hooks`), or None when none ran.
    - ``notebook``: the trainer ran in a notebook kernel (:func:`whyidle.analysis.notebook.notebook_facts`),
      else None; ``worker_start``: the start method of the training DataLoader's workers and what
      decided it (:func:`whyidle.analysis.notebook.worker_start`), None without a DataLoader.
    - ``notices`` (texts), ``meta`` (``meta.json`` of the run), ``logged``
      (:func:`whyidle.analysis.logged.logged_metrics`).
    - Keras / TensorFlow: ``input_wait`` (:func:`whyidle.analysis.keras.input_wait`), ``tfdata``,
      ``tf_devices``, ``keras_calls``.
    - ``overrides``: a ``whyidle tune`` trial's settings where the program took them or not
      (:func:`whyidle.analysis.run._overrides`); None outside a trial.
    - ``windows``: the rolling diagnosis's ``window`` records (docs/run-format.md), in time
      order; ``deep_traces``: the deep traces taken during the run and their analyses.
    - ``threads``: the primary trainer's background Python threads and their CPU seconds
      (:mod:`whyidle.instrument.thread_cpu`: ``{name, module, cpu_s}``).
    - ``loader_workers``: the DataLoader workers' own batch times and busy shares
      (:func:`whyidle.analysis.loader_workers.worker_facts`), or None.
    """

    framework: str | None = None
    api: TrainingApi | None = None
    compiled: bool | None = None
    compile: CompileFacts | None = None
    trainers: list[int] | None = None
    primary: int | None = None
    proc: dict | None = None
    instrumented: list[int] | None = None
    steps_info: dict | None = None
    step: StepMetrics | None = None
    host: HostMetrics | None = None
    top_others: list[dict] | None = None
    gpu: GpuMetrics | None = None
    gpu_idle: dict | None = None
    transfers: dict | None = None
    reads: dict | None = None
    placement: dict | None = None
    gpu_static: dict | None = None
    device: DeviceInfo | None = None
    loader: dict | None = None
    loader_iters: LoaderIters | None = None
    devices: dict | None = None
    graph_nodes: int | None = None
    hotspots: dict | None = None
    focus: dict | None = None
    notices: list[str] | None = None
    gpu_records_notices: list[dict] | None = None
    other_trainers: list[dict] | None = None
    ranks: list[dict] | None = None
    straggler: dict | None = None
    collectives: dict | None = None
    accumulation: dict | None = None
    loop: LoopFacts | None = None
    meta: dict | None = None
    input_wait: InputWait | None = None
    tfdata: dict | None = None
    host_mem_total_bytes: int | None = None
    tf_devices: dict | None = None
    keras_calls: list[dict] | None = None
    threads: list[dict] | None = None
    overrides: list[dict] | None = None
    logged: dict | None = None
    windows: list[dict] | None = None
    deep_traces: list[dict] | None = None
    step_rows: list[Any] | None = None
    analyzed_steps: list[Any] | None = None
    time: TimeAccounting | None = None
    records_end_s: float | None = None
    job_samples_per_s: float | None = None
    module_loops: list[dict] | None = None
    preamble: dict | None = None
    data_ipc_share: float | None = None
    data_snapshot_share: float | None = None
    data_image_read_share: float | None = None
    data_decode_share: float | None = None
    hooks: dict | None = None
    notebook: NotebookFacts | None = None
    worker_start: WorkerStart | None = None
    loader_workers: dict | None = None

    def replace(self, **changes) -> RunFacts:
        """A copy with ``changes`` (field → value); unknown names raise ``TypeError``."""
        return dataclasses.replace(self, **changes)
