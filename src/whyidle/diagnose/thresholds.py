"""Every threshold of the diagnosis, with its reason. Fractions are 0–1 unless named otherwise."""

#: Data-wait share of step time that makes ``input_bound`` a warning. Removing it would gain at
#: least 1/(1-0.10) = 1.11×, about the run-to-run noise of a shared machine. TraceML warns at the
#: same 10 %; the PyTorch profiler's TensorBoard plugin flagged 5 %, which fires on healthy runs.
DATA_WAIT_WARN = 0.10
#: ... and critical: ≥ 1.33× available (TraceML calls 20 % critical; we want a third more
#: throughput before shouting).
DATA_WAIT_CRITICAL = 0.25

#: ``num_workers=0`` is only worth mentioning when loading costs something: with in-memory data
#: (a TensorDataset) the main process fetches a batch in microseconds and workers would only add
#: IPC. 5 % is the PyTorch TensorBoard plugin's data-loading flag.
SMELL_MIN_DATA_WAIT = 0.05
#: ... and only when the loader model (``rules.loader_model``) gives workers at least this gain on
#: this machine: a fresh user's in-memory TensorDataset was told num_workers=1 and ran 0.79x.
SMELL_MIN_WORKER_GAIN = 1.05

#: ``other_host`` share (Python, logging, loss code outside modules, copies) that makes
#: ``host_bound`` a warning: a lean loop spends 5–10 % there (zero_grad, ``.to()``), and a loss
#: computed with functions outside an nn.Module adds real compute to it on a CPU (15–17 % for the
#: vectorized triplet loss of tests/scenarios/c12), so 20 % is clearly above that floor.
HOST_SHARE_WARN = 0.20
#: Stack samples a function needs before a finding names it and credits it with a share of the
#: step: one or two samples (10-20 ms at 100 Hz) are often a garbage-collection finalizer or an
#: allocator call that happened to run then, not where the step's time goes. A share read from n
#: samples has a relative standard error of about 1/sqrt(n) (binomial); 3 is the least that names.
MIN_SITE_SAMPLES = 3
HOST_SHARE_CRITICAL = 0.30
#: A training step's backward takes about this many times its forward (two matrix products per
#: forward one: Kaplan et al. 2020, "Scaling Laws for Neural Language Models", 6N vs 2N FLOPs per
#: token); backward time beyond it, in a step whose host Python builds tensors (a loss or metric
#: over many small tensor ops), is that Python's autograd graph: ``host_bound`` counts it removable.
BWD_PER_FWD = 2.0

#: The loader is "waiting, not computing" when at least half its time is off-CPU.
LOADER_OFF_CPU = 0.5
#: Bytes returned by read() per sample in the loader processes above which the waiting is on
#: storage. DataLoader IPC moves ~1 KB per *batch* through pipes (indices, shared-memory
#: handles), a few tens of bytes per sample; reading even a 3 KB sample file is well above.
STORAGE_MIN_READ_BYTES_PER_SAMPLE = 512
#: ``input_bound`` cause ``many_tensors``: a batch holding this many tensors crosses the worker
#: boundary as as many shared-memory segments and file descriptors (cases.md C34: 114 per batch of
#: 16 paid most of the loader's cost; packing them into 9 gave 1.25–1.67×) ...
BATCH_TENSORS_MANY = 100
#: ... when at least this fraction of the sampled data wait is the training thread receiving them
#: (``RunFacts.data_ipc_share``) rather than waiting for workers to finish.
IPC_SHARE_OF_WAIT = 0.30
#: ``input_bound`` cause ``head_of_line`` (diagnose/loader_order.py): at least half the data wait
#: came with later batches already received and held for order (the loop waited behind one slow
#: batch). A throughput-bound loader with 2-4 workers in lock-step holds a batch now and then from
#: jitter (tests/test_loader_workers.py: 3 ms samples on 2 workers); the estimate, bounded by the
#: workers' pace, keeps such a run from a fix that gains nothing.
HOL_MIN_SHARE_OF_WAIT = 0.5
#: ``input_bound`` cause ``main_process_receive`` (diagnose/loader_receive.py) from the queue: less
#: than half the wait came with no batch ready and the loader was full (``prefetch_factor ×
#: num_workers`` ready) at half the fetches or more. A 2-worker loader of 3 ms samples that holds
#: the loop (tests/test_loader_workers.py) had none ready at >= 70 % of its fetches; a loader of
#: Python-list batches unpickled in the loop: 8 % of the wait with none ready, full at 88 %.
RECEIVE_MAX_EMPTY_WAIT = 0.5
RECEIVE_MIN_FULL = 0.5
#: ``input_bound`` cause ``uneven_shards`` (diagnose/loader_shards.py): the IterableDataset worker
#: with the most building time holds at least 1.5× the workers' mean (one shard 4× the others on
#: 4 workers: 2.3×); below, the epoch's tail with fewer workers is within a step or two.
SHARD_MIN_IMBALANCE = 1.5
#: The data phase decodes images when this fraction (0–1) of its stack samples ran an image decoder
#: (analysis/stacks.py IMAGE_READ_LEAVES): one sample in twenty; augmentation of in-memory images
#: (randaugment_pil) has none.
IMAGE_READ_MIN_SHARE = 0.05
#: iowait share of all cores that points at local storage whatever the read counters say.
IOWAIT_STORAGE = 0.10

#: The machine is out of cores when ≥ 90 % of all cores are busy.
CPU_SATURATED = 0.9
#: Headroom on the number of workers computed as ⌈fetch time per batch / compute time⌉
#: (cases.md C01), so the prefetch queue refills faster than it drains.
WORKER_HEADROOM = 1.25
MAX_SUGGESTED_WORKERS = 32
#: Share of the usable cores a job gets done on when its training process and loader workers keep
#: them all busy (context switches, IPC, cache misses, the sampler): the worker model's cores term
#: divides by it. Measured on the 2-core box (issue 13): the roofline's 1.77x for 2 workers on an
#: image pipeline measured 1.49-1.71x (median 1.59, ratio 0.90); Lightning's 1.98x measured
#: 1.43-1.64x (0.77); 0.85 sits between.
CPU_PARALLEL_EFFICIENCY = 0.85
#: The same where the job may use one core at most (its affinity or cgroup quota): its processes
#: take turns on that core, which stays busy while any of them can run, so no share is lost to
#: cores waiting on each other. Measured on C01 (issue 31): with 0.85 the estimates were 3-38 %
#: below the measured fix under ``taskset -c 0`` and 8-21 % under a 1-CPU quota; with 1.0, -13 to +17 %.
ONE_CORE_EFFICIENCY = 1.0
#: Loading work per batch below which worker processes cost more than they save: a worker
#: hands each batch over through a pipe and shared memory (~1 ms per batch on a small machine);
#: measured here, a 0.2 ms in-memory fetch moved to one worker made the loop 1.6× slower.
WORKER_MIN_FETCH_S = 0.002
#: Per-sample cost, relative to today's, at which "make each sample cheaper" is estimated: its gain
#: depends on how much cheaper the work gets, so the estimate is stated for a 2× cheaper sample
#: (reduced-size JPEG decode, a cached decoded array or one vectorized collate each give 2× or more).
CHEAPER_SAMPLE_COST = 0.5

#: Share of wall time the training thread sat runnable on a run-queue waiting for a core
#: (schedstat run_delay) that makes ``cpu_contention`` a warning / critical: 10 % is what
#: removing it could gain at least (1.11×); 25 % is a third more throughput.
RUN_DELAY_WARN = 0.10
RUN_DELAY_CRITICAL = 0.25
#: Share of the machine's CPU time the hypervisor gave to other guests (``/proc/stat`` steal)
#: that makes ``cpu_contention`` (cause ``hypervisor_steal``) a warning / critical; from
#: ``RUN_DELAY_WARN`` up to the warning it is info (a note beside the verdict: the job cannot win
#: it back, and 10-20 % steal came and went for minutes at a time on the shared 2-core VM this was
#: built on). A quarter of the CPU gone is what a burstable instance out of credits shows.
STEAL_WARN = 0.25
STEAL_CRITICAL = 0.5
#: Other processes using at least half a core are named as the cause of contention.
OTHER_PROCS_MIN_CORES = 0.5
#: Share of a cgroup CPU quota's enforcement periods (``cpu.stat`` nr_throttled / nr_periods) in
#: which the quota ran out, from which run-queue wait is put on the quota (``cpu_contention`` cause
#: ``cpu_quota``): each such period stops every thread of the cgroup until the next one
#: (kernel Documentation/scheduler/sched-bwc.rst), as often as the 10 % of RUN_DELAY_WARN.
QUOTA_THROTTLED_WARN = 0.10
#: Share of a cgroup memory limit that loader workers may be planned up to: the kernel reclaims
#: page cache and then OOM-kills at the limit, and allocator slack and the page cache the job
#: reads through count against it, so a tenth is left free.
MEM_LIMIT_FILL = 0.9

#: Host cost of one PyTorch operation with autograd (forward dispatch + its backward node) when
#: the op itself does almost nothing: 5 µs, measured on the 2-core CPU machine this was built on
#: (tanh(h @ w) on 4×8 tensors, 2,000-node graphs). On a GPU each op is also a kernel launch of
#: the same order (5–10 µs).
DISPATCH_S_PER_NODE = 5e-6
#: Autograd graph nodes per backward from which per-operation overhead is examined: small CNNs
#: and MLPs have tens; Python loops over time steps or elements reach hundreds to thousands of
#: tiny operations. Large models also have hundreds of nodes, but each does real work, which
#: SMALL_OP_S tells apart.
MANY_OPS_PER_STEP = 500
#: Mean forward+backward time per graph node below which the operations are "tiny": within
#: 10× of the dispatch cost, so overhead rather than arithmetic fills the step.
SMALL_OP_S = 10 * DISPATCH_S_PER_NODE
#: Per-step cost of one autograd graph node on a CPU in eager PyTorch, its forward operation and
#: backward together (dispatch, autograd, allocation): ``small_batch``'s per-step part of forward
#: and backward outside the layers' products (diagnose/batch_model.py). Measured on a 2-core EPYC,
#: PyTorch 2.13 (issue 32): the S-CNN at batch 1 spent 0.48 ms beyond its layers' products over 22
#: nodes (22 µs), the bf16 transformer at batch 2 3.0 ms over 146 (20 µs, part of it per-sample);
#: 15 µs splits the difference (calm runs at batch 32: est. 2.3× vs 2.5× measured, 4.0× vs 3.5×).
CPU_S_PER_NODE = 15e-6

#: Batches of at most this many samples are checked for ``small_batch``: per-step fixed costs
#: (optimizer, Python, kernel launches) are then rarely amortized.
SMALL_BATCH_MAX = 8
#: Batch size the ``small_batch`` estimate assumes after the fix (a common default that fits
#: most models; the estimate scales per-sample work and keeps per-step work fixed).
SMALL_BATCH_TARGET = 32

#: A fix worth a warning gains at least 10 % (``no_mixed_precision``).
VERDICT_MIN_SPEEDUP = 1.10
#: Two fix options' estimates closer than this factor are a tie (``rank_options`` keeps the rule's
#: order): the input model's estimates of different fixes differ by ±5 % between repeats of one
#: job on a shared machine (hf_trainer_input: workers 1.62-1.76x, cheaper sample 1.68-1.70x).
ESTIMATE_TIE = 1.05
#: A warning/critical finding becomes the verdict when the cause it names holds at least this
#: fraction of the step (its ``bound``), whatever its fix can give on this machine: removing it
#: would gain 1/(1 − 0.10) = 1.11×, the noise of a shared machine (as ``DATA_WAIT_WARN``). Below
#: it on every finding the verdict is ``device_bound``.
VERDICT_MIN_BOUND = 0.10
# -- torch.compile (rules_compile.py) --
#: Recompilations' share of the wall time that makes ``recompiles`` a warning (critical from the
#: second): the same shares as the other whole-job parts (``CHECKPOINT_WARN_SHARE``,
#: ``LOGGING_WARN_SHARE``); below, one recompilation at a new length is an info line.
COMPILE_WARN_SHARE = 0.10
COMPILE_CRITICAL_SHARE = 0.30
#: Share of the step that the eager code at graph breaks takes for ``graph_breaks`` to warn (as
#: ``VERDICT_MIN_BOUND``: what a shared machine's noise hides below).
BREAK_WARN_SHARE = 0.10
# -- time outside the step: eval_bound, checkpoint_bound, logging_bound, epoch_boundary (rules_job.py) --
# Shares of the command's wall time (analysis/accounting.py).

#: Evaluation share of wall time that makes ``eval_bound`` a warning: a job that validates once per
#: epoch on a tenth of the data spends well under 10 %; a fifth of the wall time is a schedule
#: choice worth questioning. A single evaluation (nothing to do less often) needs the critical share.
EVAL_WARN_SHARE = 0.20
EVAL_CRITICAL_SHARE = 0.40
#: "Evaluate less often" is priced at this factor (every 4th evaluation kept).
EVAL_LESS_OFTEN = 4
#: Share of the evaluation's sampled time in the program's own Python (not the model, not the
#: loader) above which the cause is that work (a per-sample metric, NMS) rather than the schedule.
EVAL_HOST_SHARE = 0.5
#: ... and from which vectorizing it is offered as a second option when the schedule is the cause.
EVAL_HOST_OPTION_SHARE = 0.3
#: Share of a Python per-sample loop that vectorizing removes (batched tensor ops run the same math
#: 10–100× faster; 0.9 is the conservative end).
VECTORIZED_SAVING = 0.9
#: ``eval_bound`` cause ``on_cpu`` from the GPU samples (a Keras evaluation model built under
#: ``tf.device("/cpu:0")``, cases.md C19): the GPU at most ``EVAL_GPU_IDLE_PCT`` busy during the
#: evaluation while at least ``EVAL_TRAIN_GPU_PCT`` during training. A model running on the GPU
#: keeps it well above 5 % even at batch 1 (every forward launches kernels); 30 % is a training
#: that really uses it.
EVAL_GPU_IDLE_PCT = 5.0
EVAL_TRAIN_GPU_PCT = 30.0
#: Share of the evaluation's model time that running it on the GPU removes: a datacenter GPU runs
#: a forward 10–100× faster than the host's cores (0.9 is the conservative end, as for
#: ``VECTORIZED_SAVING``).
EVAL_ON_DEVICE_SAVING = 0.9
#: Checkpoint share of wall time for ``checkpoint_bound``; the fix saves so often that saving takes
#: ``CHECKPOINT_TARGET_SHARE`` (a save every epoch of a long job is ~1 %).
CHECKPOINT_WARN_SHARE = 0.10
CHECKPOINT_CRITICAL_SHARE = 0.30
CHECKPOINT_TARGET_SHARE = 0.02
#: Write rate (bytes/s, summed bytes ÷ summed save time) below which checkpoint saving is slow
#: because of where it writes: below one spinning disk's sequential write (~100-200 MB/s); a
#: local SATA SSD writes ~500 MB/s, an NVMe drive 1-3 GB/s, and without ``fsync`` the page cache
#: takes a save at memory speed. Judged only for saves of at least ``CHECKPOINT_RATE_MIN_BYTES``:
#: smaller ones are dominated by opening the file and serializing, not by the bandwidth.
CHECKPOINT_SLOW_BPS = 100e6
CHECKPOINT_RATE_MIN_BYTES = 16 << 20
#: Tracker logging share of wall time for ``logging_bound`` (same scale as ``HOST_SHARE_WARN``'s
#: lean-loop floor); the fix logs every ``LOG_EVERY`` steps (fixes.logging_code writes 50).
LOGGING_WARN_SHARE = 0.10
LOGGING_CRITICAL_SHARE = 0.30
LOG_EVERY = 50
#: ``startup_bound``: the program's own set-up before the first step (startup_split's ``program_s``:
#: not imports, not the first step) as a share of wall time, and at least ``STARTUP_MIN_S`` seconds
#: (a one-second set-up is nothing to fix even in a short run). A long job's start-up is a few
#: percent of its wall time and never reaches it; a short or often-restarted one does.
STARTUP_WARN_SHARE = 0.20
STARTUP_CRITICAL_SHARE = 0.50
STARTUP_MIN_S = 2.0
#: Share of a data set-up that loading its saved result removes: reading prepared tensors from the
#: page cache or a local disk runs at GB/s, where tokenizing or decoding them in Python runs at
#: MB/s (the startup_prep scenario: 0.97 of it gone).
STARTUP_CACHE_SAVING = 0.9
#: Share of the set-up whose innermost frames build the model (layers' ``__init__``, weight init)
#: from which the cause is ``model_init`` rather than the data's preparation.
STARTUP_MODEL_SHARE = 0.5
#: Iterator start-up share of wall time for ``epoch_boundary`` (worker start per epoch).
EPOCH_WARN_SHARE = 0.10
EPOCH_CRITICAL_SHARE = 0.30

#: ``module_loop`` (rules_work.py): a module called this often per step (module_calls.py's
#: LOOP_MIN_CALLS) with at most this much forward time per call: small calls, whose per-call cost
#: (Python and dispatch, ~0.1–0.5 ms on a CPU; kernel launches on a GPU) folding removes. Bigger
#: calls already amortize it.
MODULE_LOOP_MIN_CALLS = 4
MODULE_LOOP_MAX_CALL_S = 0.005

#: Fewer analyzed steps than this: say so rather than guess.
MIN_STEPS = 5

# -- work size: no_mixed_precision, small_workload, GPU-aware small_batch (rules_work.py) ----------

#: Share of the model's parameters that must be float32 for ``no_mixed_precision``: autocast keeps
#: float32 weights, so a model trained with it is still ~100 % float32; a model converted with
#: ``.half()``/``.bfloat16()`` keeps at most a few float32 layers (norms), well under 90 %.
MP_MIN_FP32_PARAM_SHARE = 0.9
#: Forward + backward share of step time from which ``no_mixed_precision`` fires: mixed
#: precision speeds only the GPU math, and at half the step even the smallest per-architecture
#: factor (1.5×, analysis/capability.py) gives 1/(0.5 + 0.5/1.5) = 1.2×, above
#: ``VERDICT_MIN_SPEEDUP``; below half, the data or host findings are the ones to fix first.
MP_MIN_COMPUTE_SHARE = 0.5
#: Slowdown of a small CPU matmul in the autocast dtype against float32 from which
#: ``emulated_precision`` fires: CPUs with native bfloat16 (AMX) run a 64×64 bfloat16 matmul within
#: about float32's time (call overhead and the conversion dominate at that size), the AVX2 fallback
#: measured 12–13× here; 2× leaves room for noise on both sides.
EMULATED_MIN_SLOWDOWN = 2.0

#: The model-shape probe's slowdown stands for the model when the shapes it timed in the autocast
#: dtype hold at least half of the layers' forward time; below that the square matmul's does (an
#: emulated dtype is timed at small shapes only, instrument/shape_probe.py ``MAX_FLOPS_EMULATED``:
#: a CNN's convolutions are skipped and its last small Linear, ~0.5 % of the time, measured 1.7×
#: against 4.3× for the 32×32 matmul and 11.8× for the whole step on an AVX2 EPYC, 2026-12-05).
PROBE_MIN_COVER = 0.5

#: ``small_workload`` needs a GPU that nearly always has queued work: starved for less than 10 %
#: of the step time, which is less than removing it could gain (1.11×, as ``DATA_WAIT_WARN``).
SMALL_WORK_MAX_STARVED = 0.10
#: GPM SM activity (fraction of SM-time with at least one warp resident) below which the GPU is
#: under-used: the DCGM user guide (Profiling Metrics, SM Activity) says a value under 0.5 "likely
#: indicates ineffective GPU usage" and that 0.8 or more is needed for effective use.
SMALL_WORK_SM_ACTIVE_MAX = 0.5
#: Without GPM: peak device memory used ÷ capacity below which the work per step is small (a
#: quarter of the memory: a batch 4× as large would still fit even if all of it scaled).
SMALL_WORK_MEM_MAX = 0.25
#: ... together with a median step shorter than this (s): CIFAR-sized models (ResNet-18 at batch
#: 128 runs ~10–20 ms per step on A100-class GPUs) count, ImageNet-sized ones (ResNet-50 at batch
#: 256: ≥ 250 ms) do not. A judgement, not yet calibrated on measured runs.
SMALL_WORK_STEP_MAX_S = 0.03

#: Share of device memory a suggested bigger batch may fill in ``small_batch``: 20 % stays free
#: for allocator fragmentation, cuDNN workspaces and evaluation. Scaling batch by
#: total/used is conservative, since weights, optimizer state and the CUDA context do not grow.
SMALL_BATCH_MEM_FILL = 0.8

#: GPU idle exposed by synchronizations (share of step time) that makes ``sync_bound`` a warning:
#: removing it gains at least 1/(1 − 0.05) ≈ 1.05×; cases.md C09 reports +5–7 % from deferring
#: one of two ``.item()`` calls per step, so smaller shares are worth a finding, just not a shout.
SYNC_IDLE_WARN = 0.05
#: ... and critical: a quarter of the step, ≥ 1.33× (as ``DATA_WAIT_CRITICAL``).
SYNC_IDLE_CRITICAL = 0.25
#: Host time of copies from pageable memory (share of step time) from which ``pageable_transfers``
#: is a warning (1.03×: a pinned, non_blocking copy removes it from the critical path entirely).
PAGEABLE_HOST_WARN = 0.03
#: Host time per step of tensors built on the CPU inside the step and copied to the GPU, as a share
#: of step time, from which it is reported (warning) rather than listed as info.
CPU_BUILT_WARN = 0.02

# -- device state: throttling (rules_device.py) -----------------------------------------------------

#: Share of the analyzed window in which a power or thermal reason held the GPU's clocks that makes
#: ``throttling`` a warning: the same 10 % floor as ``DATA_WAIT_WARN``; below it are the brief
#: power-cap touches of a GPU boosting near its limit, which cost little.
THROTTLE_SHARE_WARN = 0.10
#: Seconds of the window NVML's throttle-time counters must cover before their share counts: two
#: 1 s slow ticks, so one boost transient between two reads cannot decide it.
THROTTLE_MIN_OBSERVED_S = 2.0
#: Clocks-event bitmask snapshots (one per 1 s slow tick) needed before their share counts: each
#: snapshot is an instant, and with fewer than 5 one snapshot alone is above 20 %.
THROTTLE_MIN_SNAPSHOTS = 5

#: Seconds per byte a ``keras.utils.PyDataset`` with ``use_multiprocessing=True`` takes to hand a
#: batch from its worker processes to the training process (pickled by the worker, sent through a
#: pipe, unpickled by the trainer; no shared memory): measured here (Keras 3.15, 2 workers, batches
#: of 1 and 5 MB that cost nothing to build) 3.7 and 14.4 ms per batch, ~2.8 ms per MB. It is CPU
#: work on both sides and serial through the pool's result pipe.
PYDATASET_IPC_S_PER_BYTE = 2.8e-3 / 2**20
#: Fixed cost of one call of Keras's compiled train step (tf.function dispatch, the Keras loop,
#: metric updates) that does not shrink with the batch: a two-layer Dense model took 0.4-0.5 ms
#: per step at batch 4, 8 and 32 alike on the 2-core CPU box this was built on; 0.3 ms keeps
#: the small_batch estimate conservative (batch 8 -> 32 measured 1.9-2.1x, predicted ~2.1x).
KERAS_STEP_FIXED_S = 0.0003
