"""Diagnosis rules for Keras / TensorFlow runs (pure; no framework imports).

* :func:`input_bound` — the compiled train step waits for tf.data (measured by whyidle's
  TensorFlow profiler window, or by the eager iterator in custom loops), with the cause and the
  exact tf.data lines from the pipeline lint (:mod:`whyidle.diagnose.rules_tfdata`).
* :func:`input_pipeline_config` — the lint's other smells, as info.
* :func:`gpu_not_visible` — NVML sees a GPU, TensorFlow does not.

Facts come from :func:`whyidle.analysis.run.analyze` (``input_wait``, ``tfdata``,
``tf_devices``); findings follow :func:`whyidle.diagnose.rules.finding`.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes, keras_input, rules_tfdata
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import _ms, _pct, _round, finding, fix_option, rank_options, speedup_if_removed, whole_cores

DOCS_TFDATA = "https://www.tensorflow.org/guide/data_performance"
DOCS_TF_PROFILER = "https://www.tensorflow.org/guide/profiler#input_pipeline_analyzer"
DOCS_TF_GPU = "https://www.tensorflow.org/install/pip"

#: Causes whose fix runs the slow stage in parallel, up to one call per core (tf.data's AUTOTUNE
#: caps map parallelism at the cores it may use).
_PARALLEL_CAUSES = ("sequential_map", "sequential_interleave")
#: Parallel calls suggested for Python loading that mostly waits on I/O: threads that wait cost
#: no core, so more of them than cores overlap more waiting (tf.data's AUTOTUNE stops at the
#: core count, so the count is set explicitly, with a thread pool as large).
IO_PARALLEL_CALLS = 16
_METHOD_TEXT = {
    "tf_profiler": "measured with the TensorFlow profiler over {n} steps: IteratorGetNext inside the compiled step",
    "iterator": "measured around each next() on the tf.data iterator",
    "fit_input": "measured around each batch fit takes from its input",
}
DOCS_PYDATASET = "https://keras.io/api/utils/python_utils/#pydataset-class"


def is_tf(facts: RunFacts) -> bool:
    """True for runs whose framework is Keras or TensorFlow."""
    return facts.framework in ("keras", "tensorflow")


def _fix_model(step: dict, cause: str, cores: int, has_prefetch: bool, trainer_cores: float | None) -> dict:
    """What the fix should give, per step (seconds).

    - ``fetch_s``: loading work per step: the wait itself without prefetch; wait + the rest of
      the step with it (prefetching already overlapped that much).
    - ``load_cpu_share``: the part of that loading spent on a CPU, estimated from the training
      process's CPU per step (``trainer_cores`` × step) less the rest of the step (assumed to keep
      at least one core busy), 0–1; None without host samples.
    - ``parallel``: how much faster loading gets. Parallel causes: up to ``cores`` calls
      (tf.data's AUTOTUNE never runs more than its thread pool, sized to the cores).
      ``python_in_pipeline`` with Python that mostly waits (I/O): explicit parallelism beyond the
      cores, min(``IO_PARALLEL_CALLS`` / cores, 1 / CPU share) over today's. Otherwise 1. The
      CPU share is not used to limit a map calling Python: TensorFlow's thread pools spin while
      they wait, which inflates the process's CPU (cases.md C03's sleep-bound map shows 0.8
      cores), so it only bounds the step through the floor below.
    - ``cpu_floor_s``: the process's CPU per step spread over every core: no fix makes the step
      shorter than that (conservative for the same reason).
    - ``predicted_step_s`` = max(rest, fetch / parallel, floor), at most today's step.
    """
    mean = step["step_time_s"]["mean"]
    wait = step["data_wait_s_per_step"]
    rest = max(mean - wait, 1e-6)
    fetch = wait + (rest if has_prefetch else 0.0)
    cpu_step = (trainer_cores or 0.0) * mean
    cpu_share = None if trainer_cores is None else min(1.0, max(0.0, cpu_step - rest) / max(fetch, 1e-9))
    floor = cpu_step / max(1, cores)
    parallel = 1.0
    if cause in _PARALLEL_CAUSES:
        parallel = float(max(1, cores))
    elif cause == "python_in_pipeline" and cpu_share is not None and cpu_share < T.LOADER_OFF_CPU:
        parallel = max(1.0, min(IO_PARALLEL_CALLS / max(1, cores), 1.0 / max(cpu_share, 1e-3)))
    predicted = min(mean, max(rest, fetch / parallel, floor))
    return {"fetch_s": fetch, "parallel": parallel, "load_cpu_share": cpu_share, "cpu_floor_s": floor,
            "predicted_step_s": predicted, "est_speedup": mean / predicted}


def _cause(smells: list[dict]) -> str | None:
    """The bottleneck's cause from the lint, the most actionable first: a map left sequential at
    run time (``sequential_map``: parallel calls fix it, even for a map calling Python when that
    Python waits on I/O, as in cases.md C03), ``sequential_interleave``, Python in the pipeline
    (``python_in_pipeline``: a ``from_generator`` source, or a Python map already parallel), a
    missing prefetch TensorFlow does not make up for (``no_prefetch``); else None."""
    kinds = {}
    for s in smells:
        if not s.get("auto_fixed"):
            kinds.setdefault(s["kind"], s)
    for kind, cause in (("sequential_map", "sequential_map"), ("sequential_interleave", "sequential_interleave"),
                        ("generator_source", "python_in_pipeline"), ("py_function_map", "python_in_pipeline"),
                        ("no_prefetch", "no_prefetch")):
        if kind in kinds:
            return cause
    return None


def input_bound(facts: RunFacts) -> dict | None:
    """The compiled train step waits for the next batch (data-wait share ≥ ``DATA_WAIT_WARN``).

    Needs a measured input wait (``facts.input_wait["method"]`` not None). ``evidence.cause``
    comes from the tf.data lint (:func:`whyidle.diagnose.rules_tfdata.input_cause`):
    ``python_in_pipeline``, ``sequential_map``, ``sequential_interleave``, ``no_prefetch``, else
    ``cpu_preprocessing`` when the pipeline is already parallel and prefetched, or ``unknown``
    without a pipeline description — ``python_in_pipeline`` too when ``fit`` took a Python
    generator or ``PyDataset`` itself (``evidence.fit_input``, ``input_source``: its function), with
    a vectorize-the-batch fix first and a ``PyDataset`` with worker processes as an option. On the
    torch and JAX backends (``input_wait.method == "fit_input"``) a ``PyDataset``, generator or
    torch ``DataLoader`` gets the options of :mod:`whyidle.diagnose.keras_input` instead, each
    estimated on this machine (workers; caching decoded data), the vectorized batch as an
    unestimated option; a ``DataLoader`` is cause ``loader_in_main_process`` (``num_workers=0``) or
    ``too_few_workers``. ``est_speedup`` follows :func:`_fix_model` (parallel calls
    and prefetching) for ``sequential_map``, ``sequential_interleave`` and ``no_prefetch``,
    capped by 1/(1 − share) (``evidence.est_speedup_if_removed``); for the other causes the fix
    removes the per-element work, so it is 1/(1 − share).
    """
    step = facts.step
    method = (facts.input_wait or {}).get("method")
    if not step or method is None:
        return None
    share = step["shares"]["data_wait"]
    if share < T.DATA_WAIT_WARN:
        return None
    pipeline = facts.tfdata
    host = facts.host or {}
    cores = whole_cores(host)  # the cores the job may use (affinity, cgroup quota)
    mem = facts.host_mem_total_bytes
    smells = rules_tfdata.tfdata_smells(pipeline, mem) if pipeline else []
    cause = _cause(smells)
    fit_input, source = _fit_input(facts)
    if cause is None:
        cause = "cpu_preprocessing" if pipeline and not pipeline.get("error") else "unknown"
    # the torch and JAX backends: each batch fit takes from a Python input was timed, the workers known
    timed = method == "fit_input" and cause == "unknown" and fit_input in keras_input.PYTHON_INPUTS
    python_source = cause == "unknown" and fit_input in ("generator", "PyDataset")
    if python_source:
        cause = "python_in_pipeline"  # fit draws batches from the program's Python, one at a time
    elif timed:  # a torch DataLoader handed to fit
        cause = "too_few_workers" if keras_input.current_workers(keras_input.fit_call(facts)) else \
            "loader_in_main_process"
    ops = [s.get("op") for s in (pipeline or {}).get("stages") or []]
    prefetched = bool(ops) and not any(s["kind"] == "no_prefetch" for s in smells)
    model = _fix_model(step, cause, cores, prefetched, host.get("trainer_cores"))
    removed = speedup_if_removed(share)
    io_python = cause == "python_in_pipeline" and model["parallel"] > 1 and not python_source
    # Parallel calls and prefetching are what the fix changes for the parallel causes and for Python
    # that waits on I/O; for Python that computes, or work already parallel, the fix removes the
    # per-element work itself (1/(1 - share)).
    if cause in ("unknown", "cpu_preprocessing") or (cause == "python_in_pipeline" and not io_python):
        est = removed
    else:
        est = min(model["est_speedup"], removed)
    est = round(est, 3)
    iw = facts.input_wait
    how = _METHOD_TEXT.get(method, method).format(n=iw.get("calls") or "a few")
    wait = step["data_wait_s_per_step"]
    mean = step["step_time_s"]["mean"]
    lead = [s for s in smells if s["kind"] == {"python_in_pipeline": "generator_source"}.get(cause, cause)] or smells
    why = f": {lead[0]['text'].rstrip('.')}" if lead else ""
    if python_source or timed:
        why = f": fit draws its batches from a Python {fit_input}" + (f", `{source.split()[-1]}` at {source.split()[0]}"
                                                                      if source else "")
        if timed:
            n = keras_input.current_workers(keras_input.fit_call(facts))
            why += (f", built in {n} worker{'s' if n != 1 else ''} the step still waits for" if n else
                    ", built in the training thread one batch at a time")
    summary = (f"The train step waits for the next batch {_pct(share)} of each step ({_ms(wait)} of {_ms(mean)}, "
               f"{how}){why}.")
    code = rules_tfdata.fix_code(pipeline, mem) if pipeline else None
    if cause in _PARALLEL_CAUSES or cause == "no_prefetch":
        text = (f"Run the slow stage in parallel and prefetch: tf.data.AUTOTUNE picks the parallelism (up to the "
                f"{cores} cores here) and .prefetch overlaps loading with the step; about {est:.2f}× per step.")
        if any(s["kind"] == "py_function_map" for s in smells):
            text += (" The map calls Python (tf.py_function / tf.numpy_function): parallel calls overlap its I/O and "
                     "GIL-releasing work only, so CPU-heavy Python there needs rewriting in TensorFlow ops.")
            if (model["load_cpu_share"] or 0) >= T.LOADER_OFF_CPU:
                text += (f" Here about {_pct(model['load_cpu_share'])} of the loading time looks like CPU work (the "
                         f"process used {host.get('trainer_cores'):.1f} cores): if the parallel map gains little, "
                         "that Python is the limit.")
    elif io_python:
        text = (f"The pipeline's Python mostly waits (I/O: {_pct(model['load_cpu_share'])} of its time on a CPU), so "
                f"more parallel calls than the {cores} cores overlap more of it: "
                f"num_parallel_calls={IO_PARALLEL_CALLS} with a thread pool as large "
                f"(options.threading.private_threadpool_size = {IO_PARALLEL_CALLS}; AUTOTUNE stops at the core "
                f"count), about {est:.2f}× per step; reading the files with tf.io ops in a parallel map avoids the "
                "GIL altogether.")
    elif python_source:
        what = f"`{source.split()[-1]}` ({source.split()[0]})" if source else f"the {fit_input}"
        text = (f"fit takes each batch from {what}, Python that builds it one sample at a time while the step "
                "waits: make it build the whole batch with array operations (one numpy call over the batch instead "
                "of a loop over samples and rows), or precompute what does not change between epochs.")
        if fit_input == "PyDataset":
            code = ("def __getitem__(self, i):               # your PyDataset, vectorized over the batch\n"
                    "    idx = self.order[i * BATCH:(i + 1) * BATCH]\n"
                    "    x = self.images[idx]                 # (batch, H, W, C): one array\n"
                    "    x = (x - x.mean(axis=(1, 2), keepdims=True)) / (x.std(axis=(1, 2), keepdims=True) + 1e-6)\n"
                    "    return x, self.labels[idx]")
        else:
            code = ("def batches(batch=64):                  # your generator, vectorized over the batch\n"
                    "    while True:\n"
                    "        idx = rng.integers(0, len(images), batch)\n"
                    "        x = images[idx]                     # (batch, H, W, C): one array\n"
                    "        x = (x - x.mean(axis=(1, 2), keepdims=True)) / (x.std(axis=(1, 2), keepdims=True) + 1e-6)\n"
                    "        yield x, labels[idx]")
    elif cause == "python_in_pipeline":
        text = ("The pipeline runs Python (from_generator / py_function / numpy_function), which holds the GIL: "
                "parallel calls overlap only its I/O. Move the per-element work into TensorFlow ops (tf.io, "
                "tf.image) or precompute it into files (TFRecord) read with a parallel map; prefetch meanwhile.")
    elif cause == "cpu_preprocessing":
        text = ("The pipeline is already parallel: the per-element work itself is too expensive for these "
                f"{cores} cores. Cache what is deterministic (.cache() after the expensive map), vectorize by "
                "batching before the map, or precompute the preprocessing once.")
    elif fixes.speaks_tensorflow(facts):
        text = "Give fit a tf.data pipeline with parallel map calls and a final prefetch, then re-run whyidle."
    else:
        text = ("Keras slices each batch from the arrays in the training thread: give fit a keras.utils.PyDataset "
                "with workers (and use_multiprocessing=True) that builds batch i, or raise batch_size.")
    alternatives = _alternatives(smells, pipeline, mem, cause, removed)
    extra: dict = {}
    if timed:  # measured: worker and cache options in Keras terms, each estimated here; array operations assumed
        alternatives, extra = keras_input.options(facts, removed)
        vectorize = [fix_option(text, est, "if array operations make the batch cheap", code, assumed=True)]
        options = rank_options((vectorize if python_source else []) + alternatives)
    elif python_source and fit_input == "generator":
        alternatives.append(fix_option(
            f"Prepare batches in {max(1, cores - 1)} worker process{'es' if cores > 2 else ''}: a keras.utils.PyDataset "
            "whose __getitem__ builds batch i, with workers and use_multiprocessing=True (a generator runs in one "
            "thread, under the GIL).", None, "gains only with cores the step leaves free",
            "class Batches(keras.utils.PyDataset):\n"
            f"    def __init__(self):\n        super().__init__(workers={max(1, cores - 1)}, use_multiprocessing=True)\n"
            "    def __len__(self):\n        return steps_per_epoch\n"
            "    def __getitem__(self, i):\n        return make_batch(i)      # the body of your generator's loop\n\n"
            "model.fit(Batches(), epochs=epochs)"))
    if not timed:
        options = rank_options([fix_option(text, est, _parallel_condition(cause, cores, est, removed), code)]
                               + alternatives)
    text, code, est = options[0]["text"], options[0]["code"], options[0]["est_speedup"]
    evidence = _round({
        "cause": cause, "data_wait_share": share, "data_wait_s_per_step": wait, "step_time_s_mean": mean,
        "cores": cores, "predicted_step_s": model["predicted_step_s"], "fetch_s_per_step": model["fetch_s"],
        "load_cpu_share": model["load_cpu_share"], "parallel_gain": model["parallel"], "cpu_floor_s": model["cpu_floor_s"],
        "est_speedup_if_removed": round(removed, 3),  # as est_speedup: never below it once rounded
    })
    evidence.update(_round(extra))
    evidence["fit_input"] = fit_input
    evidence["input_source"] = source
    evidence["input_wait_method"] = method
    evidence["input_wait_steps"] = iw.get("calls")
    evidence["smells"] = [s["kind"] for s in smells]
    evidence["pipeline"] = ops
    evidence["runtime_stages"] = (iw.get("iterators") or [])[:4]
    severity = "critical" if share >= T.DATA_WAIT_CRITICAL else "warning"
    docs = [DOCS_PYDATASET] if timed else [DOCS_TFDATA, DOCS_TF_PROFILER]
    return finding("input_bound", severity, "Input-bound: the step waits for data", summary, evidence, est,
                   text, code, docs, bound=share, options=options)


def _fit_input(facts: RunFacts) -> tuple[str | None, str | None]:
    """What the last ``fit`` took as ``x`` (``keras_call`` ``input``: ``tf.data``, ``generator``,
    ``PyDataset``, ``numpy`` …) and where a Python source is defined (``source``), or Nones."""
    call = keras_input.fit_call(facts)
    return call.get("input"), call.get("source")


def _parallel_condition(cause: str, cores: int, est: float, removed: float) -> str | None:
    """When the parallel-map fix gains more than here: with more cores, up to removing the wait."""
    if cause not in _PARALLEL_CAUSES or est >= removed - 1e-3:
        return None
    return f"grows with cores (AUTOTUNE runs up to one call per core; {cores} here), up to {removed:.1f}×"


def _alternatives(smells: list[dict], pipeline: dict | None, mem: int | None, cause: str,
                  removed: float) -> list[dict]:
    """Fix options besides parallel calls, each cutting the per-element work itself (their gain
    depends on how much cheaper it gets, so not estimated): cache the mapped elements once
    (``no_cache`` smell), vectorize a map over whole batches (``map_before_batch``), move Python
    out of the pipeline (``python_in_pipeline`` when the printed fix is parallel calls)."""
    kinds = {s["kind"]: s for s in smells if not s.get("auto_fixed")}
    out = []
    if "no_cache" in kinds:
        out.append(fix_option(
            "Cache the elements once the expensive map has run: .cache() after it, so later epochs skip the work "
            "(the map must give the same result every epoch: keep random augmentation after the cache).", None,
            f"from the second epoch, up to {removed:.1f}× when the cached dataset fits in memory",
            rules_tfdata.fix_code(pipeline, mem, only={"no_cache"}) or None))
    if "map_before_batch" in kinds:
        out.append(fix_option(
            "Batch before the map and write the map for whole batches: one call per batch instead of per element.",
            None, f"up to {removed:.1f}× if the per-element overhead dominates",
            rules_tfdata.fix_code(pipeline, mem, only={"map_before_batch"}) or None))
    if cause in _PARALLEL_CAUSES and ("py_function_map" in kinds or "generator_source" in kinds):
        out.append(fix_option(
            "Move the Python in the pipeline into TensorFlow ops (tf.io, tf.image) or precompute it into TFRecord "
            "files read with a parallel map: Python holds the GIL, so parallel calls overlap only its waiting.",
            None, f"up to {removed:.1f}× if loading cost nothing"))
    return out


def input_pipeline_config(facts: RunFacts, already: set[str]) -> dict | None:
    """tf.data smells (:func:`whyidle.diagnose.rules_tfdata.tfdata_smells`) not already the
    ``input_bound`` cause, as one info finding with their fixed lines."""
    pipeline = facts.tfdata
    if not pipeline:
        return None
    smells = [s for s in rules_tfdata.tfdata_smells(pipeline, facts.host_mem_total_bytes)
              if s["kind"] not in already]
    if not smells:
        return None
    summary = "tf.data pipeline: " + "; ".join(s["text"].rstrip(".") for s in smells) + "."
    code = rules_tfdata.fix_code(pipeline, facts.host_mem_total_bytes, only={s["kind"] for s in smells})
    return finding("input_pipeline_config", "info", "Input pipeline configuration", summary,
                   {"smells": [s["kind"] for s in smells], "pipeline": [s.get("op") for s in pipeline.get("stages") or []]},
                   None, "Apply these tf.data changes; they cost nothing when the pipeline is not today's bottleneck.",
                   code or None, [DOCS_TFDATA])


def gpu_not_visible(facts: RunFacts) -> dict | None:
    """NVML sees a GPU but TensorFlow lists none (``tf.config.list_physical_devices("GPU")``
    empty): a CPU-only build, or a CUDA build whose CUDA/cuDNN libraries or driver do not match.
    Never for Keras on the torch or JAX backend (TensorFlow may be installed CPU-only beside them)."""
    tfd = facts.tf_devices or {}
    static = facts.gpu_static or {}
    if not fixes.speaks_tensorflow(facts):  # Keras on torch or JAX: TensorFlow's GPUs are not the job's
        return None
    gpus = len(static.get("devices") or [])
    if not gpus or tfd.get("physical_gpus") is None or tfd["physical_gpus"] > 0:
        return None
    drv = (static.get("devices") or [{}])[0].get("cuda_driver_version")
    cuda, cudnn = tfd.get("cuda_build"), tfd.get("cudnn_build")
    if not tfd.get("is_cuda_build"):
        why = f"this TensorFlow {tfd.get('tf_version')} is a CPU-only build"
        code = "pip uninstall -y tensorflow-cpu && pip install \"tensorflow[and-cuda]\""
    else:
        why = (f"TensorFlow {tfd.get('tf_version')} was built for CUDA {cuda} / cuDNN {cudnn}, the driver supports "
               f"CUDA {drv}, and TensorFlow could not load a GPU (missing CUDA/cuDNN libraries or a driver older "
               "than the build; TensorFlow's start-up log says which library failed)")
        code = "pip install \"tensorflow[and-cuda]\"   # ships the CUDA and cuDNN libraries this build expects"
    summary = (f"{gpus} NVIDIA GPU{'s are' if gpus > 1 else ' is'} present (driver supports CUDA {drv}) but "
               f"TensorFlow sees none: {why}, so everything runs on the CPU.")
    return finding("gpu_not_visible", "critical", "GPU not visible to TensorFlow", summary,
                   {"gpus": gpus, "cuda_driver_version": drv, "tensorflow": tfd.get("tf_version"),
                    "is_cuda_build": tfd.get("is_cuda_build"), "cuda_build": cuda, "cudnn_build": cudnn,
                    "tf_physical_gpus": 0}, None,
                   "Install a TensorFlow GPU build whose CUDA version the driver supports (the driver's CUDA version "
                   "must be ≥ the build's).", code, [DOCS_TF_GPU])
