"""tf.data pipeline lint (pure; no TensorFlow import): smells of a pipeline description → fixes.

Input: the dict of :func:`whyidle.instrument.tfdata.describe` (``stages`` source first, each with
``op``, ``parallel``, ``buffer``, ``batch_size``, ``cardinality``, ``elem_bytes`` and, for function
stages, ``fn``, ``fn_site``, ``py_func``, ``fn_ops``, ``stateful``, ``io_ops``; plus
``options``). Missing keys count as unknown, and an unknown fact keeps a smell silent.

:func:`tfdata_smells` returns one dict per smell: ``{kind, stage, text, code, docs,
auto_fixed}``. ``stage`` indexes ``stages`` (0-based; the texts count stages from 1, source = stage 1); ``text`` is one sentence with the numbers; ``code``
the fixed Python line with the user's function name; ``auto_fixed`` is True when TensorFlow's
default run-time rewrites already do what the fix does (a stateless ``map`` parallelized by
``map_parallelization``; a prefetch injected by ``inject_prefetch``, or a last stage that runs
asynchronously anyway), so it costs nothing today — the explicit line still states the intent and
survives option changes. Kinds:

* ``generator_source`` — ``Dataset.from_generator``: one Python thread makes every element.
* ``py_function_map`` — a map calling Python (``tf.py_function`` / ``tf.numpy_function``).
* ``sequential_map`` — a map without ``num_parallel_calls``.
* ``sequential_interleave`` — files read one after the other (interleave / flat_map / reader
  without parallel calls or reads).
* ``no_prefetch`` — no ``prefetch`` at the end.
* ``no_cache`` — an expensive deterministic map whose output fits in memory, recomputed every
  epoch.
* ``map_before_batch`` — a many-op per-element map directly before ``batch`` (vectorizable).
* ``tiny_shuffle`` — a shuffle buffer tiny relative to what it shuffles.

:func:`input_cause` picks the ``input_bound`` finding's ``evidence.cause``; :func:`fix_code`
rewrites the changed stages as ``ds = ...`` lines. Source for all advice: TensorFlow's "Better
performance with the tf.data API" guide (:data:`DOCS_GUIDE`); TensorFlow 2.21 behaviour (which
rewrites are on by default) was checked with ``tf.data.experimental.get_model_proto``.
"""

from __future__ import annotations

DOCS_GUIDE = "https://www.tensorflow.org/guide/data_performance"
DOCS_PARALLEL_MAP = DOCS_GUIDE + "#parallelizing_data_transformation"
DOCS_PREFETCH = DOCS_GUIDE + "#prefetching"
DOCS_INTERLEAVE = DOCS_GUIDE + "#parallelizing_data_extraction"
DOCS_CACHE = DOCS_GUIDE + "#caching"
DOCS_VECTORIZE = DOCS_GUIDE + "#vectorizing_mapping"
DOCS_OPTIMIZATIONS = "https://www.tensorflow.org/api_docs/python/tf/data/experimental/OptimizationOptions"
DOCS_FROM_GENERATOR = "https://www.tensorflow.org/api_docs/python/tf/data/Dataset#from_generator"
DOCS_PY_FUNCTION = "https://www.tensorflow.org/api_docs/python/tf/py_function"
DOCS_SHUFFLE = "https://www.tensorflow.org/guide/data#randomly_shuffling_input_data"
DOCS_TFRECORD = "https://www.tensorflow.org/tutorials/load_data/tfrecord"

#: ``tf.data.AUTOTUNE`` as recorded in ``parallel`` / ``buffer``.
AUTOTUNE = -1

#: A deterministic map counts as *expensive* (worth caching) when it reads, decodes or parses
#: (``io_ops``) or runs at least this many ops per element: a cast or a scale (1–3 ops) costs less
#: to recompute than the cache's memory is worth, while ten ops and more mean real per-element work
#: (resize, normalize, one-hot, crop). Guide, "Caching": cache after expensive, deterministic work.
EXPENSIVE_MAP_MIN_OPS = 10
#: The cached data may use at most this fraction of host RAM: ``.cache()`` holds every element
#: for the whole run, next to the framework, the model's host copies, shuffle and prefetch buffers
#: and the OS page cache (guide, "Caching": "the dataset must fit in memory").
CACHE_MAX_RAM_FRACTION = 0.25
#: A per-element map directly before ``batch`` is worth vectorizing from this many ops: tf.data
#: pays a function call per element (measured here, TF 2.21 on 2 cores: ~20 µs per element with
#: map+batch fused and parallelized, plus ~0.15 µs per op, against 1.5–4 µs per sample for the same
#: function mapped over batches of 32). Below ten ops the function is a cast or a scale whose
#: batched twin rarely matters. Guide, "Vectorizing mapping".
MAP_BEFORE_BATCH_MIN_OPS = 10
#: Per-element function-call cost quoted in the ``map_before_batch`` text (seconds; measured as
#: above).
PER_ELEMENT_CALL_S = 20e-6
#: A shuffle buffer below this fraction of the elements it shuffles is *tiny*: each output is
#: drawn from the next ``buffer`` elements only, so data stored in order (by class, by file)
#: stays in order at any scale above 1 %: a 1,000-sample class needs a buffer ≥ 1,000 to mix.
#: Guide ("Randomly shuffling input data"): a buffer ≥ the dataset gives a uniform shuffle.
TINY_SHUFFLE_FRACTION = 0.01
#: The suggested shuffle buffer may hold at most this fraction of host RAM (the buffer keeps
#: ``buffer`` elements in memory).
SHUFFLE_MAX_RAM_FRACTION = 0.10
#: Suggested shuffle buffer when the element size is unknown (strings, variable shapes): the
#: tf.data guide's examples use a few thousand to 10,000.
SHUFFLE_FALLBACK_BUFFER = 10_000

#: Option values when the description lacks them: TensorFlow 2.21's documented defaults.
OPTION_DEFAULTS = {"autotune": True, "inject_prefetch": True, "map_parallelization": True,
                   "map_and_batch_fusion": True}
#: Trailing stages that do not hide a prefetch below them (cheap, synchronous bookkeeping).
_TRAILING = ("options", "repeat", "take", "skip")
#: Op types in a function that open files by name.
_FILE_READERS = ("ReadFile", "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset")
#: Stages a deterministic element may pass through and still be cached after.
_FUNCTION_OPS = ("map", "filter", "interleave", "flat_map", "generator")
#: TensorFlow reader classes used directly as interleave / flat_map functions → their public name.
_READER_NAMES = {"TFRecordDatasetV2": "tf.data.TFRecordDataset", "TFRecordDatasetV1": "tf.data.TFRecordDataset",
                 "TextLineDatasetV2": "tf.data.TextLineDataset", "TextLineDatasetV1": "tf.data.TextLineDataset",
                 "FixedLengthRecordDatasetV2": "tf.data.FixedLengthRecordDataset"}
#: Order of :func:`tfdata_smells`' output: the kinds that most often limit throughput first.
KIND_ORDER = ("generator_source", "py_function_map", "sequential_map", "sequential_interleave", "no_prefetch",
              "no_cache", "map_before_batch", "tiny_shuffle")


# -- helpers ----------------------------------------------------------------------------------------


def _stages(pipeline: dict | None) -> list[dict]:
    return list((pipeline or {}).get("stages") or [])


def _opt(pipeline: dict, key: str) -> bool:
    value = ((pipeline or {}).get("options") or {}).get(key)
    return OPTION_DEFAULTS.get(key, True) if value is None else bool(value)


def _sequential(stage: dict) -> bool:
    """No ``num_parallel_calls`` (None) or an explicit single call (0 or 1)."""
    return stage.get("parallel") in (None, 0, 1)


def _fn(stage: dict) -> str:
    """The function name to write in code: the user's when it is an identifier, the public name of
    a TensorFlow reader class, else ``fn``."""
    name = stage.get("fn") or ""
    if name in _READER_NAMES:
        return _READER_NAMES[name]
    return name if name.isidentifier() else "fn"


def _fn_label(stage: dict) -> str:
    """``parse (train.py:12)`` for text."""
    name = stage.get("fn") or "its function"
    site = stage.get("fn_site")
    return f"{name} ({_short(site)})" if site else name


def _fn_note(stage: dict) -> str | None:
    """A code comment naming the function when its name cannot be written (a lambda)."""
    name = stage.get("fn") or ""
    if name and not name.isidentifier() and name not in _READER_NAMES:
        site = stage.get("fn_site")
        return f"fn = the {name} at {_short(site)}" if site else f"fn = the {name}"
    return None


def _short(site: str | None) -> str:
    """``path/to/train.py:12`` → ``train.py:12``."""
    if not site:
        return "?"
    return site.replace("\\", "/").rsplit("/", 1)[-1]


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _n_ops(n) -> str:
    return f"{n} op" if n == 1 else f"{n} ops"


def _share(x: float) -> str:
    return "<0.1%" if x < 0.001 else f"{x:.1%}"


def _noted(code: str, stage: dict) -> str:
    """``code`` with the :func:`_fn_note` comment appended when the function is a lambda."""
    note = _fn_note(stage)
    if not note:
        return code
    return f"{code}; {note}" if "  # " in code else f"{code}  # {note}"


def _smell(kind: str, stage: int, text: str, code: str, docs: list[str], auto_fixed: bool = False) -> dict:
    return {"kind": kind, "stage": stage, "text": text, "code": code, "docs": docs, "auto_fixed": auto_fixed}


def _reads_files(stage: dict) -> bool:
    return any(str(o).startswith(_FILE_READERS) for o in stage.get("io_ops") or [])


def _next_index(stages: list[dict], i: int, skip=("options",)) -> int | None:
    """Index of the next stage after ``i`` whose op is not in ``skip``."""
    for j in range(i + 1, len(stages)):
        if stages[j].get("op") not in skip:
            return j
    return None


def _auto_parallel(pipeline: dict, stage: dict) -> bool:
    """True when TensorFlow's ``map_parallelization`` rewrites this map to a parallel one at run
    time: a ``map`` written without ``num_parallel_calls`` whose function is stateless (no Python
    call, no random or other state-changing op), with the option on (default in TF 2.21)."""
    return (stage.get("op") == "map" and stage.get("parallel") is None and stage.get("py_func") is False
            and stage.get("stateful") is False and _opt(pipeline, "map_parallelization"))


def _why_not_parallel(pipeline: dict, stage: dict) -> str:
    if stage.get("parallel") in (0, 1):
        return "num_parallel_calls=1 pins it to one call"
    if stage.get("py_func"):
        return "TensorFlow never parallelizes a function that calls Python on its own"
    if stage.get("stateful"):
        ops = ", ".join(stage.get("stateful_ops") or []) or "stateful ops"
        return f"TensorFlow does not parallelize it on its own because the function is stateful ({ops})"
    if not _opt(pipeline, "map_parallelization"):
        return "the map_parallelization option is off"
    return "TensorFlow may not parallelize it on its own"


# -- smells -----------------------------------------------------------------------------------------


def generator_source(pipeline: dict) -> list[dict]:
    """``Dataset.from_generator`` source: TensorFlow calls the Python generator through
    ``tf.numpy_function`` from a single iterator, under the GIL, so the source can never produce
    faster than one Python thread, whatever runs downstream (``from_generator`` docs: "limited by
    the GIL"). Fix: a tf.data-native source (file names + parallel map, or TFRecord files); at
    least prefetch so the generator overlaps the step."""
    stages = _stages(pipeline)
    if not stages or stages[0].get("op") != "generator":
        return []
    st = stages[0]
    fn = _fn(st)
    text = (f"The source is Dataset.from_generator({_fn_label(st)}): every element comes from one Python thread "
            f"holding the GIL, so the pipeline can never run faster than {fn} alone; build the source from file "
            "names with a parallel map or from TFRecord files (or, keeping the generator, at least end with a "
            "prefetch).")
    code = ("ds = tf.data.Dataset.from_tensor_slices(paths).map(load, num_parallel_calls=tf.data.AUTOTUNE)"
            f"  # replaces from_generator({fn}); load(path) in TensorFlow ops")
    return [_smell("generator_source", 0, text, code, [DOCS_FROM_GENERATOR, DOCS_PARALLEL_MAP, DOCS_TFRECORD])]


def py_function_map(pipeline: dict) -> list[dict]:
    """A ``map`` whose function calls Python (``tf.py_function`` / ``tf.numpy_function``, ops
    ``EagerPyFunc`` / ``PyFunc``): each call takes the GIL, so parallel calls overlap only I/O and
    GIL-releasing work (numpy, PIL decoding), and TensorFlow never parallelizes such a map by
    itself. Fix: rewrite the function with TensorFlow ops (``tf.io``, ``tf.image``); keep
    ``num_parallel_calls`` meanwhile."""
    out = []
    for i, st in enumerate(_stages(pipeline)):
        if st.get("op") != "map" or not st.get("py_func"):
            continue
        par = st.get("parallel")
        how = ("one call at a time" if _sequential(st) else
               f"{'AUTOTUNE' if par == AUTOTUNE else par} parallel calls that still take turns on the GIL")
        text = (f"Stage {i + 1}: map({_fn_label(st)}) calls Python through tf.py_function/tf.numpy_function, run as {how}: "
                "the GIL lets parallel calls overlap only I/O and GIL-releasing work, and TensorFlow never "
                "parallelizes such a map on its own.")
        code = (f"ds = ds.map({_fn(st)}, num_parallel_calls=tf.data.AUTOTUNE)"
                f"  # rewrite {_fn(st)} with TensorFlow ops (tf.io.read_file, tf.io.decode_image, tf.image.*)")
        out.append(_smell("py_function_map", i, text, _noted(code, st), [DOCS_PY_FUNCTION, DOCS_PARALLEL_MAP]))
    return out


def sequential_map(pipeline: dict) -> list[dict]:
    """A ``map`` without ``num_parallel_calls`` (or with 1) processes one element at a time on one
    core (guide, "Parallelizing data transformation"). TensorFlow 2.21 parallelizes a *stateless*
    map by itself (``map_parallelization``, on by default; verified: the runtime model shows a
    ``ParallelMapV2`` with tunable parallelism, or an autotuned ``MapAndBatch`` when a ``batch``
    follows), but never one that calls Python or has random / stateful ops — ``auto_fixed`` says
    which case applies."""
    out = []
    for i, st in enumerate(_stages(pipeline)):
        if st.get("op") != "map" or not _sequential(st):
            continue
        auto = _auto_parallel(pipeline, st)
        written = "num_parallel_calls=1" if st.get("parallel") in (0, 1) else "no num_parallel_calls"
        if auto:
            tail = ("TensorFlow 2.21 parallelizes this stateless map at run time anyway (map_parallelization, on "
                    "by default), so the fix only makes that explicit")
        else:
            tail = f"{_why_not_parallel(pipeline, st)}, so it uses one core"
        ops = f", {_n_ops(st['fn_ops'])} per element" if isinstance(st.get("fn_ops"), int) else ""
        text = f"Stage {i + 1}: map({_fn_label(st)}{ops}) runs one element at a time ({written}); {tail}."
        code = f"ds = ds.map({_fn(st)}, num_parallel_calls=tf.data.AUTOTUNE)"
        out.append(_smell("sequential_map", i, text, _noted(code, st), [DOCS_PARALLEL_MAP, DOCS_OPTIMIZATIONS], auto))
    return out


def _file_count(stages: list[dict], i: int) -> int | None:
    """Number of files feeding stage ``i``: the cardinality of the ``files`` source when the
    stages between are pass-through."""
    if stages and stages[0].get("op") == "files":
        n = stages[0].get("cardinality")
        return n if isinstance(n, int) and n >= 0 else None
    return None


def sequential_interleave(pipeline: dict) -> list[dict]:
    """Files read one after the other: an ``interleave`` or ``flat_map`` whose function opens files
    (``TFRecordDataset``, ``ReadFile``, ...) without ``num_parallel_calls``, or a
    ``TFRecordDataset`` / ``TextLineDataset`` of several files without ``num_parallel_reads``.
    Each read then waits for storage latency alone; TensorFlow does not parallelize interleave on
    its own (TF 2.21 runtime model: a sequential ``Interleave``). Guide, "Parallelizing data
    extraction". A single file gives nothing to parallelize and is not reported."""
    out = []
    stages = _stages(pipeline)
    for i, st in enumerate(stages):
        op = st.get("op")
        files = _file_count(stages, i)
        if files is not None and files < 2:
            continue
        n_files = f"{files} files" if files is not None else "its files"
        if op in ("interleave", "flat_map") and _sequential(st) and _reads_files(st):
            cyc = st.get("cycle_length")
            cyc_arg = f", cycle_length={cyc}" if isinstance(cyc, int) and cyc > 0 else ""
            how = "flat_map" if op == "flat_map" else "interleave without num_parallel_calls"
            text = (f"Stage {i + 1}: {op}({_fn_label(st)}) reads {n_files} one after the other ({how}), so each read "
                    "waits for storage alone; TensorFlow does not parallelize it on its own.")
            code = _noted(f"ds = ds.interleave({_fn(st)}{cyc_arg}, num_parallel_calls=tf.data.AUTOTUNE)", st)
            out.append(_smell("sequential_interleave", i, text, code, [DOCS_INTERLEAVE]))
        elif op in ("tfrecord", "text_line") and st.get("parallel") in (None, 0, 1):
            cls = "tf.data.TFRecordDataset" if op == "tfrecord" else "tf.data.TextLineDataset"
            text = (f"Stage {i + 1}: {cls.rsplit('.', 1)[-1]} reads {n_files} one after the other (no "
                    "num_parallel_reads), so each read waits for storage alone.")
            code = f"ds = {cls}(filenames, num_parallel_reads=tf.data.AUTOTUNE)"
            out.append(_smell("sequential_interleave", i, text, code, [DOCS_INTERLEAVE]))
    return out


def _sink_index(stages: list[dict]) -> int | None:
    """The last stage that is not trailing bookkeeping (options, repeat, take, skip)."""
    for i in range(len(stages) - 1, -1, -1):
        if stages[i].get("op") not in _TRAILING:
            return i
    return None


def _runs_async(pipeline: dict, stages: list[dict], i: int) -> str | None:
    """Why stage ``i`` already runs ahead of the consumer at run time (None if it does not): a
    parallel map / interleave / batch has its own output buffer; a stateless sequential map is
    made parallel (``map_parallelization``); ``map`` + ``batch`` is fused into an asynchronous
    ``MapAndBatch`` (``map_and_batch_fusion``). TF 2.21 injects no prefetch after those."""
    st = stages[i]
    op = st.get("op")
    if op in ("map", "interleave", "batch") and not _sequential(st):
        return f"its parallel {op} already runs ahead with its own buffer"
    if op == "map" and _auto_parallel(pipeline, st):
        return "TensorFlow runs this stateless map in parallel (map_parallelization), which already runs ahead"
    if op == "batch" and i > 0 and _opt(pipeline, "map_and_batch_fusion"):
        j = i - 1
        while j > 0 and stages[j].get("op") == "options":
            j -= 1
        if stages[j].get("op") == "map":
            return "TensorFlow fuses the map and the batch into one asynchronous MapAndBatch (map_and_batch_fusion)"
    return None


def no_prefetch(pipeline: dict) -> list[dict]:
    """No ``prefetch`` at the end: without one, producing batch n+1 starts only when the step asks
    for it (guide, "Prefetching"). TensorFlow 2.21 often covers this at run time: with autotuning
    on (default), ``inject_prefetch`` (default True, per ``tf.data.experimental.
    OptimizationOptions``; verified in the runtime model) appends an autotuned prefetch when the
    last transformation is synchronous, and an asynchronous last stage (parallel map, fused
    map+batch) runs ahead by itself. ``auto_fixed`` says whether either applies here; a prefetch
    followed only by options / repeat / take / skip counts as last."""
    stages = _stages(pipeline)
    sink = _sink_index(stages)
    if sink is None or stages[sink].get("op") == "prefetch":
        return []
    st = stages[sink]
    ahead = _runs_async(pipeline, stages, sink)
    if ahead:
        auto, tail = True, f"{ahead}, so the step does not wait for a synchronous stage; an explicit prefetch adds a buffer of whole batches"
    elif _opt(pipeline, "autotune") and _opt(pipeline, "inject_prefetch"):
        auto, tail = True, ("TensorFlow 2.21 appends an autotuned prefetch here at run time (inject_prefetch, on by "
                            "default with autotuning), so the fix only makes that explicit")
    else:
        why = "autotuning is off" if not _opt(pipeline, "autotune") else "the inject_prefetch option is off"
        auto, tail = False, f"{why}, so TensorFlow adds none and each batch is produced only when the step asks for it"
    text = f"The pipeline ends with {st.get('op')} (stage {sink + 1}) and no prefetch; {tail}."
    return [_smell("no_prefetch", sink, text, "ds = ds.prefetch(tf.data.AUTOTUNE)", [DOCS_PREFETCH, DOCS_OPTIMIZATIONS],
                   auto)]


def _expensive(stage: dict) -> bool:
    ops = stage.get("fn_ops")
    return bool(stage.get("io_ops")) or (isinstance(ops, int) and ops >= EXPENSIVE_MAP_MIN_OPS)


def _elements_at(pipeline: dict, stages: list[dict], i: int) -> int | None:
    """Finite number of elements stage ``i`` yields per pass: its cardinality, or the source's
    when every stage up to ``i`` keeps one element per element (map / options / prefetch)."""
    n = stages[i].get("cardinality")
    if isinstance(n, int) and n >= 0:
        return n
    if n == -1:
        return None
    if all(s.get("op") in ("map", "options", "prefetch") for s in stages[1:i + 1]):
        src = (pipeline or {}).get("source_elements")
        return src if isinstance(src, int) and src >= 0 else None
    return None


def no_cache(pipeline: dict, mem_total_bytes: int | None = None) -> list[dict]:
    """An expensive, deterministic ``map`` recomputed every epoch although its output fits in
    memory. Reported for the last map of the deterministic head of the pipeline (before the first
    shuffle, repeat or stateful / Python function) that reads, decodes or runs at least
    :data:`EXPENSIVE_MAP_MIN_OPS` ops, with no ``cache`` anywhere after it, when its elements ×
    bytes per element (``cardinality`` × ``elem_bytes`` at that stage) are below
    :data:`CACHE_MAX_RAM_FRACTION` of ``mem_total_bytes`` (host RAM, bytes). Unknown size, an
    infinite stage or unknown RAM keep it silent. Guide, "Caching": cache after the expensive,
    deterministic work and before random augmentation and shuffling."""
    stages = _stages(pipeline)
    if not mem_total_bytes or mem_total_bytes <= 0:
        return []
    cand = None
    for i, st in enumerate(stages):
        op = st.get("op")
        if op in ("shuffle", "repeat", "generator"):
            break
        if op == "cache":  # what comes before is cached already; look for expensive work after it
            cand = None
            continue
        if op in _FUNCTION_OPS and (st.get("stateful") is not False or st.get("py_func") is not False):
            break
        if op == "map" and _expensive(st):
            cand = i
    if cand is None or any(s.get("op") == "cache" for s in stages[cand + 1:]):
        return []
    st = stages[cand]
    n = _elements_at(pipeline, stages, cand)
    per = st.get("elem_bytes")
    if not n or not isinstance(per, int) or per <= 0:
        return []
    total = n * per
    if total >= CACHE_MAX_RAM_FRACTION * mem_total_bytes:
        return []
    work = (f"reads/decodes ({', '.join(st['io_ops'][:3])})" if st.get("io_ops")
            else f"runs {_n_ops(st.get('fn_ops'))}")
    later = [s.get("op") for s in stages[cand + 1:] if s.get("op") in ("shuffle", "map")]
    where = " (before the shuffle and any random augmentation)" if later else ""
    text = (f"Stage {cand + 1}: map({_fn_label(st)}) is deterministic and {work} per element, and its output "
            f"({n:,} elements × {_bytes(per)} = {_bytes(total)}, {_share(total / mem_total_bytes)} of host RAM) fits "
            f"in memory, yet it is recomputed every epoch; .cache() right after it{where} computes it once.")
    code = f"ds = ds.map({_fn(st)}, num_parallel_calls=tf.data.AUTOTUNE).cache()"
    return [_smell("no_cache", cand, text, _noted(code, st), [DOCS_CACHE])]


def map_before_batch(pipeline: dict) -> list[dict]:
    """A per-element ``map`` of at least :data:`MAP_BEFORE_BATCH_MIN_OPS` ops directly before
    ``batch``, on fixed-shape elements, with no Python call and no file reading or decoding
    (those need one element at a time): tf.data pays a function call per element, which
    ``ds.batch(B).map(f_batched)`` pays once per batch (guide, "Vectorizing mapping")."""
    out = []
    stages = _stages(pipeline)
    for i, st in enumerate(stages):
        if st.get("op") != "map" or i == 0 or st.get("py_func") is not False or st.get("io_ops"):
            continue
        ops = st.get("fn_ops")
        if not isinstance(ops, int) or ops < MAP_BEFORE_BATCH_MIN_OPS:
            continue
        j = _next_index(stages, i)
        if j is None or stages[j].get("op") != "batch":
            continue
        if stages[i - 1].get("elem_bytes") is None:  # input shapes not fixed: batching first would fail
            continue
        b = stages[j].get("batch_size")
        if not isinstance(b, int) or b < 2:
            continue
        fn = _fn(st)
        text = (f"Stage {i + 1}: map({_fn_label(st)}) runs its {ops} ops once per element right before batch({b}), "
                f"paying tf.data's per-element function call (~{PER_ELEMENT_CALL_S * 1e6:.0f} µs each, measured with "
                f"TF 2.21) {b} times per batch; batching first and mapping a vectorized {fn} pays it once per batch.")
        code = (f"ds = ds.batch({b}).map({fn}_batched, num_parallel_calls=tf.data.AUTOTUNE)"
                f"  # {fn}_batched: {fn} written for a leading batch dimension")
        out.append(_smell("map_before_batch", i, text, _noted(code, st), [DOCS_VECTORIZE]))
    return out


def _shuffled_elements(stages: list[dict], i: int) -> int | None:
    """Elements a shuffle at stage ``i`` draws from per pass: its input's cardinality, or, after
    an infinite repeat, what the repeat repeats."""
    j = i - 1
    while j >= 0:
        n = stages[j].get("cardinality")
        if isinstance(n, int) and n >= 0:
            return n
        if stages[j].get("op") not in ("repeat", "options", "prefetch"):
            return None
        j -= 1
    return None


def tiny_shuffle(pipeline: dict, mem_total_bytes: int | None = None) -> list[dict]:
    """A shuffle buffer below :data:`TINY_SHUFFLE_FRACTION` of the elements it shuffles: each
    output comes from the next ``buffer`` elements only, so ordered data (by class, by file)
    reaches the model nearly in order. The suggested buffer is the whole dataset, capped at
    :data:`SHUFFLE_MAX_RAM_FRACTION` of ``mem_total_bytes`` (host RAM, bytes) when the element size
    is known, else at :data:`SHUFFLE_FALLBACK_BUFFER`."""
    out = []
    stages = _stages(pipeline)
    for i, st in enumerate(stages):
        buf = st.get("buffer")
        if st.get("op") != "shuffle" or not isinstance(buf, int) or buf < 1:
            continue
        n = _shuffled_elements(stages, i)
        if not n or buf >= TINY_SHUFFLE_FRACTION * n:
            continue
        per = st.get("elem_bytes")
        if isinstance(per, int) and per > 0 and mem_total_bytes:
            cap = int(SHUFFLE_MAX_RAM_FRACTION * mem_total_bytes // per)
        else:
            cap = SHUFFLE_FALLBACK_BUFFER
        suggested = max(buf, min(n, cap))
        if suggested <= buf:
            continue
        text = (f"Stage {i + 1}: the shuffle buffer holds {buf:,} elements, {buf / n:.2%} of the {n:,} it shuffles, so "
                f"each element is drawn from the next {buf:,} only and data stored in order stays nearly in order.")
        code = f"ds = ds.shuffle({suggested})"
        out.append(_smell("tiny_shuffle", i, text, code, [DOCS_SHUFFLE]))
    return out


# -- entry points -----------------------------------------------------------------------------------


def tfdata_smells(pipeline: dict | None, mem_total_bytes: int | None = None) -> list[dict]:
    """All smells of ``pipeline`` (a :func:`whyidle.instrument.tfdata.describe` dict), ordered by
    :data:`KIND_ORDER` then stage. ``mem_total_bytes``: host RAM in bytes (enables ``no_cache`` and
    sizes the ``tiny_shuffle`` suggestion); None when unknown. A description with an ``error``
    is linted as far as its stages go; ``None`` or no stages give ``[]``. Never raises on missing
    keys."""
    if not _stages(pipeline):
        return []
    smells = (generator_source(pipeline) + py_function_map(pipeline) + sequential_map(pipeline)
              + sequential_interleave(pipeline) + no_prefetch(pipeline) + no_cache(pipeline, mem_total_bytes)
              + map_before_batch(pipeline) + tiny_shuffle(pipeline, mem_total_bytes))
    return sorted(smells, key=lambda s: (KIND_ORDER.index(s["kind"]), s["stage"]))


def input_cause(pipeline: dict | None) -> str | None:
    """The ``input_bound`` finding's ``evidence.cause`` when the input pipeline is the bottleneck,
    most specific first: ``python_in_pipeline`` (a ``from_generator`` source or a map calling
    Python — GIL-bound whether or not its calls are parallel), ``sequential_map`` (a map left
    sequential at run time: not one TensorFlow parallelizes itself), ``sequential_interleave``,
    ``no_prefetch`` (only when TensorFlow neither injects a prefetch nor runs the last stage
    asynchronously); else None (the pipeline is parallel and prefetched: the work itself is slow)."""
    kinds = {}
    for s in tfdata_smells(pipeline):
        kinds.setdefault(s["kind"], []).append(s)
    if "generator_source" in kinds or "py_function_map" in kinds:
        return "python_in_pipeline"
    if any(not s["auto_fixed"] for s in kinds.get("sequential_map", [])):
        return "sequential_map"
    if "sequential_interleave" in kinds:
        return "sequential_interleave"
    if any(not s["auto_fixed"] for s in kinds.get("no_prefetch", [])):
        return "no_prefetch"
    return None


def fix_code(pipeline: dict | None, mem_total_bytes: int | None = None, only: set[str] | None = None) -> str:
    """The fixed pipeline lines, one ``ds = ...`` line per changed stage in pipeline order (the
    source line first, ``prefetch`` last); several smells of one map merge into one line (e.g.
    ``ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE).cache()``), and a vectorized map
    replaces its batch line. Includes fixes TensorFlow already applies at run time (they make
    the intent explicit). ``mem_total_bytes`` as in :func:`tfdata_smells`. Empty string when
    nothing needs changing. ``only``: the smell kinds to fix (all when None)."""
    smells = [s for s in tfdata_smells(pipeline, mem_total_bytes) if only is None or s["kind"] in only]
    if not smells:
        return ""
    stages = _stages(pipeline)
    by_stage: dict[int, dict[str, dict]] = {}
    for s in smells:
        if s["kind"] != "no_prefetch":
            by_stage.setdefault(s["stage"], {})[s["kind"]] = s
    lines, skip = [], set()
    for i in sorted(by_stage):
        if i in skip:
            continue
        kinds = by_stage[i]
        st = stages[i]
        if st.get("op") == "map":
            fn = _fn(st)
            notes = [n for n in [_fn_note(st)] if n]
            prefix = ""
            if "map_before_batch" in kinds:
                j = _next_index(stages, i)
                prefix = f".batch({stages[j].get('batch_size')})"
                skip.add(j)
                notes.append(f"{fn}_batched: {fn} written for a leading batch dimension")
                fn = f"{fn}_batched"
            if "py_function_map" in kinds:
                notes.append(f"rewrite {_fn(st)} with TensorFlow ops instead of tf.py_function")
            line = f"ds = ds{prefix}.map({fn}, num_parallel_calls=tf.data.AUTOTUNE)"
            if "no_cache" in kinds:
                line += ".cache()"
            lines.append(line + (f"  # {'; '.join(notes)}" if notes else ""))
        else:
            for s in kinds.values():
                lines.append(s["code"])
    lines += [s["code"] for s in smells if s["kind"] == "no_prefetch"]
    return "\n".join(dict.fromkeys(lines))
