"""Describes a ``tf.data.Dataset`` as the user wrote it, for the tf.data lint
(:mod:`whyidle.diagnose.rules_tfdata`).

Runs inside the user's training process, once per ``fit``, on the dataset object given to it.
It walks the *Python* dataset objects (``ds._inputs()``: each transformation keeps its input and
its arguments as attributes) and the traced graphs of the user's functions; it never serializes
the dataset graph (``_as_serialized_graph`` would copy in-memory constants such as a
``from_tensor_slices`` of a numpy array) and never iterates the dataset. TensorFlow is imported
lazily, inside :func:`describe`: the caller only calls it when the program already uses
TensorFlow. Everything here is private TensorFlow API read defensively (``getattr`` with
defaults), checked against TensorFlow 2.21; what cannot be read stays ``None``.

How TensorFlow 2.21 builds some datasets (what the walk has to undo):

- ``Dataset.from_generator(gen, ...)`` is ``Dataset.from_tensors(0).flat_map(flat_map_fn)``;
  ``flat_map_fn`` (qualname ``_from_generator.<locals>.flat_map_fn``) creates a
  ``_GeneratorDataset`` whose ``next_func`` calls ``gen`` through ``tf.numpy_function`` (or
  ``tf.py_function`` with ``output_signature``). The pair is reported as one ``generator`` source
  stage; the user's generator is found in the closures (``generator_next_fn`` →
  ``generator_state._generator``).
- ``TFRecordDataset(files, num_parallel_reads=n)`` (and ``TextLineDataset``) is one Python object
  whose input is the file-name dataset (``_TensorSliceDataset`` built with ``is_files=True``); it
  reads with a ``flat_map`` (``n`` None: one file after the other), an ``interleave`` (AUTOTUNE)
  or a ``ParallelInterleaveDataset`` (``n`` files at once).
- ``map`` without ``num_parallel_calls`` is ``_MapDataset``, with it ``_ParallelMapDataset``;
  ``batch`` with it is ``_ParallelBatchDataset``; ``with_options`` adds an ``_OptionsDataset``.

At run time TensorFlow rewrites the pipeline (static optimizations, on by default in 2.21 —
verified with ``tf.data.experimental.get_model_proto``): ``map_parallelization`` turns a
sequential ``map`` of a *stateless* function into a parallel map with AUTOTUNE (never one with
``py_function``, ``numpy_function`` or random ops); ``map_and_batch_fusion`` fuses ``map`` +
``batch`` into one asynchronous ``MapAndBatch``; ``inject_prefetch`` appends an autotuned
``prefetch`` when the last transformation is synchronous (e.g. ``batch``, a stateful ``map``)
and autotuning is on. This module records what the user wrote, plus the options that decide
those rewrites (``options``).
"""

from __future__ import annotations

import sys

#: At most this many stages are described (the walk stops there, nearest the sink kept, and sets
#: ``truncated``): real pipelines have 3–15; the cap bounds the cost of pathological ones.
MAX_STAGES = 64
#: At most this many function graphs (the function and its nested cond / while bodies) are
#: scanned per function stage.
MAX_FN_GRAPHS = 32
#: Entries kept in the ``io_ops`` / ``stateful_ops`` lists of a function stage.
MAX_OP_NAMES = 8

#: Class name (leading underscores stripped) → normalized op.
_OPS = {
    "RangeDataset": "range",
    "TensorSliceDataset": "tensor_slices",
    "SparseTensorSliceDataset": "tensor_slices",
    "TensorDataset": "tensors",
    "GeneratorDataset": "generator",
    "TFRecordDataset": "tfrecord", "TFRecordDatasetV1": "tfrecord", "TFRecordDatasetV2": "tfrecord",
    "TextLineDataset": "text_line", "TextLineDatasetV1": "text_line", "TextLineDatasetV2": "text_line",
    "MapDataset": "map", "ParallelMapDataset": "map",
    "BatchDataset": "batch", "ParallelBatchDataset": "batch",
    "PaddedBatchDataset": "padded_batch",
    "PrefetchDataset": "prefetch",
    "CacheDataset": "cache",
    "ShuffleDataset": "shuffle",
    "RepeatDataset": "repeat",
    "InterleaveDataset": "interleave", "ParallelInterleaveDataset": "interleave",
    "FlatMapDataset": "flat_map",
    "FilterDataset": "filter",
    "TakeDataset": "take",
    "SkipDataset": "skip",
    "UnbatchDataset": "unbatch",
    "OptionsDataset": "options",
    "ZipDataset": "zip",
    "ConcatenateDataset": "concatenate",
}
#: Attribute holding the StructuredFunctionWrapper of each function stage.
_FN_ATTRS = ("_map_func", "_predicate", "_next_func")
#: Ops that run Python (``tf.py_function``, ``tf.numpy_function``, ``tf.compat.v1.py_func``).
PY_FUNC_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
#: Bookkeeping ops present in every traced function; not counted in ``fn_ops``.
_BOOKKEEPING_OPS = frozenset({"Placeholder", "Const", "Identity", "IdentityN", "NoOp"})
#: Ops TensorFlow marks stateful that neither randomize nor change the output: assertions,
#: printing, variable reads (e.g. a Keras ``Normalization`` layer's mean), and call / control-flow
#: wrappers whose bodies are scanned themselves. Dataset ops (names ending in ``Dataset``,
#: stateful in TF's registry) read deterministically and are skipped too.
_BENIGN_STATEFUL = frozenset({
    "Assert", "Print", "PrintV2", "ReadVariableOp", "VarHandleOp", "VariableShape", "DestroyResourceOp",
    "If", "While", "Case", "StatefulPartitionedCall", "PartitionedCall", "StatelessIf", "StatelessWhile",
})
#: Op-name prefixes that read files, decode or parse records (the expensive, cacheable kind).
_IO_PREFIXES = ("ReadFile", "Decode", "Parse", "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset",
                "ExtractJpegShape", "MatchingFiles")


def describe(dataset) -> dict:
    """Describes the tf.data pipeline ``dataset`` (what the user passed to ``fit``).

    Returns a JSON-serializable dict (the record's ``k``/``t`` are added by the caller):

    - ``stages``: the main chain, source first, sink last (at a multi-input stage the walk
      follows the first input and counts the others in ``branches``). Every stage has ``op``
      (normalized name, see :data:`_OPS`; ``files`` for a source of path strings —
      ``list_files``, ``from_tensor_slices(paths)`` — that a later stage opens, ``generator``
      for ``from_generator``, ``other`` for the rest), ``cls`` (class name),
      ``parallel`` (``num_parallel_calls`` / ``num_parallel_reads``: int, -1 = AUTOTUNE, None =
      sequential or not applicable), ``buffer`` (prefetch / shuffle buffer in elements, -1 =
      AUTOTUNE), ``batch_size``, ``deterministic`` (None = the options' default), ``cache_file``
      (``""`` = in memory; only on cache), ``cardinality`` (elements this stage yields per pass:
      int, -1 infinite, -2 unknown, None unreadable) and ``elem_bytes`` (bytes of one output
      element when every shape is fully defined and no component is a string, else None).
      Some stages add ``branches``, ``drop_remainder``, ``count`` (repeat/take/skip),
      ``cycle_length``. Function stages (map, filter, interleave, flat_map, generator) add
      ``fn`` (the Python function's ``__name__``), ``fn_site`` (``"path:line"`` of its
      definition), ``py_func`` (the function runs Python through ``PyFunc`` / ``EagerPyFunc`` /
      ``PyFuncStateless``), ``fn_ops`` (ops in the traced graph and its nested cond / while
      bodies, bookkeeping ops excluded; None for a generator), ``stateful`` (random or other
      state-changing ops other than the Python calls — such output must not be cached),
      ``stateful_ops`` and ``io_ops`` (op types that read files, decode or parse).
    - ``cardinality``: elements per pass at the sink (-1 infinite, -2 unknown).
    - ``batch_size``: of the last batch stage (None without one, or after an unbatch).
    - ``element_bytes``: bytes of one *sample* at the sink (a leading batch dimension removed)
      when every component's shape is otherwise fully defined; None otherwise.
    - ``source_elements``: the source's cardinality when finite, else None.
    - ``options``: effective values (TensorFlow's documented defaults filled in) of
      ``autotune``, ``inject_prefetch``, ``map_parallelization``, ``map_and_batch_fusion``,
      ``apply_default_optimizations`` (None = not set), ``deterministic``.
    - ``tf_version``, ``truncated`` (the walk stopped before the source: more than
      :data:`MAX_STAGES` stages, or an error; ``stages`` then lacks the source).

    Never raises: on any failure it returns what was collected plus ``error`` (the exception's
    ``repr``). Cost: a walk of the Python objects plus one eager ``cardinality`` per stage, a few
    milliseconds; nothing is iterated.
    """
    out: dict = {"stages": [], "cardinality": None, "batch_size": None, "element_bytes": None,
                 "source_elements": None, "options": {}, "tf_version": None, "truncated": False}
    try:
        _describe(dataset, out)
    except Exception as exc:  # the doctor must never harm the patient
        out["error"] = repr(exc)[:500]
    return out


def _describe(dataset, out: dict) -> None:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        import tensorflow as tf  # noqa: F811 — only reached when the caller already uses TF
    out["tf_version"] = getattr(tf, "__version__", None)
    ds = _unwrap(dataset)
    if not hasattr(ds, "_inputs"):
        raise TypeError(f"not a tf.data.Dataset: {type(dataset).__name__}")
    eager = bool(tf.executing_eagerly())
    chain = []  # sink first
    node = ds
    try:
        while node is not None:
            if len(chain) >= MAX_STAGES:
                break
            stage, node = _stage(tf, node, eager)
            chain.append(stage)
    finally:  # on an error, the stages read so far (nearest the sink) are still reported
        chain.reverse()
        out["stages"] = chain
        out["truncated"] = node is not None
    _mark_file_lists(chain)
    if eager:
        out["cardinality"] = _card(tf, ds)
        src = chain[0].get("cardinality") if chain and not out["truncated"] else None
        out["source_elements"] = src if isinstance(src, int) and src >= 0 else None
    out["batch_size"] = _sink_batch_size(chain)
    out["element_bytes"] = _sample_bytes(tf, ds.element_spec, out["batch_size"])
    out["options"] = _options(ds, eager)


def _unwrap(obj):
    """The tf.data dataset inside a V1 adapter or a ``tf.distribute`` distributed dataset."""
    for _ in range(4):
        inner = getattr(obj, "_dataset", None) if type(obj).__name__ == "DatasetV1Adapter" else None
        if inner is None and not hasattr(obj, "_variant_tensor"):
            inner = getattr(obj, "_original_dataset", None)
        if inner is None:
            return obj
        obj = inner
    return obj


def _name(node) -> str:
    return type(node).__name__.lstrip("_")


def _inputs(node) -> list:
    try:
        ins = node._inputs()
    except Exception:
        one = getattr(node, "_input_dataset", None)
        ins = [one] if one is not None else []
    return [_unwrap(i) for i in ins if i is not None]


def _static_int(tf, value):
    """A Python int from an int / eager tensor / constant graph tensor; None when not static."""
    if value is None:
        return None
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    try:
        v = tf.get_static_value(value)
        return None if v is None else int(v)
    except Exception:
        return None


def _static_bool(tf, value):
    if isinstance(value, bool) or value is None:
        return value
    try:
        v = tf.get_static_value(value)
        return None if v is None else bool(v)
    except Exception:
        return None


def _det(value):
    """``_deterministic`` ("default"/"true"/"false") → None/True/False."""
    return {"true": True, "false": False}.get(str(value).lower()) if value is not None else None


def _card(tf, node):
    try:
        return int(node.cardinality())
    except Exception:
        return None


def _is_generator_flat_map(node) -> bool:
    fn = getattr(getattr(node, "_map_func", None), "_func", None)
    qual = getattr(fn, "__qualname__", "") or ""
    return _name(node) == "FlatMapDataset" and "from_generator" in qual and qual.endswith("flat_map_fn")


def _stage(tf, node, eager: bool):
    """One stage dict for ``node`` and the next node upstream (None at the source)."""
    name = _name(node)
    op = _OPS.get(name, "other")
    stage: dict = {"op": op, "cls": type(node).__name__, "parallel": None, "buffer": None, "batch_size": None,
                   "deterministic": None, "cache_file": None,
                   "cardinality": _card(tf, node) if eager else None,
                   "elem_bytes": _spec_bytes(tf, getattr(node, "element_spec", None))}
    ins = _inputs(node)
    if len(ins) > 1:
        stage["branches"] = len(ins) - 1
    upstream = ins[0] if ins else None

    if _is_generator_flat_map(node):
        stage["op"] = "generator"
        _generator_info(node, stage)
        # The from_tensors(0) dummy feeding the flat_map is TF's plumbing: skip it.
        if upstream is not None and _name(upstream) == "TensorDataset" and not _inputs(upstream):
            upstream = None
        return stage, upstream

    if op == "map" or op == "interleave" or name == "ParallelBatchDataset":
        stage["parallel"] = _static_int(tf, getattr(node, "_num_parallel_calls", None))
        stage["deterministic"] = _det(getattr(node, "_deterministic", None))
    if type(node).__name__ == "ParallelInterleaveDataset":  # experimental.parallel_interleave, num_parallel_reads=n
        stage["parallel"] = _static_int(tf, getattr(node, "_cycle_length", None))
    if op == "interleave":
        stage["cycle_length"] = _static_int(tf, getattr(node, "_cycle_length", None))
    if op in ("batch", "padded_batch"):
        stage["batch_size"] = _static_int(tf, getattr(node, "_batch_size", None))
        stage["drop_remainder"] = _static_bool(tf, getattr(node, "_drop_remainder", None))
    if op in ("prefetch", "shuffle"):
        stage["buffer"] = _static_int(tf, getattr(node, "_buffer_size", None))
    if op == "cache":
        try:
            f = tf.get_static_value(getattr(node, "_filename", None))
            stage["cache_file"] = f.decode() if isinstance(f, bytes) else (None if f is None else str(f))
        except Exception:
            pass
    if op in ("repeat", "take", "skip"):
        stage["count"] = _static_int(tf, getattr(node, "_count", None))
    if op in ("tfrecord", "text_line"):
        stage["parallel"] = _static_int(tf, getattr(node, "_num_parallel_reads", None))

    wrapper = next((getattr(node, a) for a in _FN_ATTRS if getattr(node, a, None) is not None), None)
    if wrapper is not None:
        _function_info(wrapper, stage)
    if stage["op"] == "tensor_slices":
        stage["strings"] = _is_string_scalar(getattr(node, "element_spec", None))
    return stage, upstream


#: Stages a file-name list may pass through on its way to the stage that reads the files.
_PASSTHROUGH = ("shuffle", "repeat", "options", "take", "skip", "prefetch", "cache")
#: Op types (in a function) that open files by name.
_FILE_READERS = ("ReadFile", "TFRecordDataset", "TextLineDataset", "FixedLengthRecordDataset")


def _mark_file_lists(chain: list) -> None:
    """Renames the source to ``files`` when it is a list of path strings (``list_files``,
    ``from_tensor_slices(paths)``) that a later stage opens: a reader (TFRecord / text lines), or
    an interleave / flat_map / map whose function reads files."""
    if not chain or chain[0]["op"] != "tensor_slices" or not chain[0].pop("strings", False):
        for st in chain:
            st.pop("strings", None)
        return
    for st in chain[1:]:
        if st["op"] in _PASSTHROUGH:
            continue
        reads = st["op"] in ("tfrecord", "text_line") or any(o.startswith(_FILE_READERS) for o in st.get("io_ops") or [])
        if reads:
            chain[0]["op"] = "files"
        return


def _is_string_scalar(spec) -> bool:
    try:
        return spec.dtype.name == "string" and spec.shape.rank == 0
    except Exception:
        return False


# -- functions --------------------------------------------------------------------------------------


def _py_callable(fn):
    """The user's Python function behind ``fn`` (tf.function, partial, bound method, callable
    object): returns (name, code object or None)."""
    for _ in range(6):
        inner = getattr(fn, "python_function", None) or getattr(fn, "func", None) \
            if not hasattr(fn, "__code__") else None
        if inner is None:
            break
        fn = inner
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__name__", None)
    if code is None and not isinstance(fn, type):
        meth = getattr(type(fn), "call", None) or getattr(type(fn), "__call__", None)
        code = getattr(meth, "__code__", None)
        name = name or type(fn).__name__
    return name, code


def _site(code) -> str | None:
    if code is None:
        return None
    return f"{code.co_filename}:{code.co_firstlineno}"


def _closure_var(fn, name):
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return None
    for var, cell in zip(code.co_freevars, cells):
        if var == name:
            try:
                return cell.cell_contents
            except ValueError:
                return None
    return None


def _generator_info(node, stage: dict) -> None:
    stage.update(py_func=True, fn_ops=None, fn=None, fn_site=None, stateful=False, stateful_ops=[], io_ops=[])
    flat_map_fn = node._map_func._func
    next_fn = _closure_var(flat_map_fn, "generator_next_fn")
    state = _closure_var(next_fn, "generator_state") if next_fn is not None else None
    gen = getattr(state, "_generator", None)
    if gen is not None:
        stage["fn"], code = _py_callable(gen)
        stage["fn_site"] = _site(code)


def _graph_of(fn):
    for attr in ("_cached_graph", "graph", "_graph"):
        try:
            g = getattr(fn, attr, None)
        except Exception:
            g = None
        if g is not None and hasattr(g, "get_operations"):
            return g
    return None


def _function_info(wrapper, stage: dict) -> None:
    """Adds fn, fn_site, py_func, fn_ops, stateful, stateful_ops, io_ops for a function stage."""
    stage.update(fn=None, fn_site=None, py_func=None, fn_ops=None, stateful=None, stateful_ops=[], io_ops=[])
    user = getattr(wrapper, "_func", None)
    if user is not None:
        stage["fn"], code = _py_callable(user)
        stage["fn_site"] = _site(code)
    graph = _graph_of(getattr(wrapper, "function", None) or getattr(wrapper, "_function", None))
    if graph is None:
        return
    ops = 0
    py = False
    stateful: dict = {}
    io: dict = {}
    todo, seen = [graph], set()
    while todo and len(seen) < MAX_FN_GRAPHS:
        g = todo.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        for op in g.get_operations():
            t = op.type
            if t in _BOOKKEEPING_OPS:
                continue
            ops += 1
            if t in PY_FUNC_OPS:
                py = True
                continue
            if t.startswith(_IO_PREFIXES):
                io[t] = None
            if t not in _BENIGN_STATEFUL and not t.endswith("Dataset") and "Dataset" not in t:
                try:
                    if op.op_def.is_stateful:
                        stateful[t] = None
                except Exception:
                    pass
        for f in (getattr(g, "_functions", None) or {}).values():
            sub = _graph_of(f)
            if sub is not None:
                todo.append(sub)
    stage.update(py_func=py, fn_ops=ops, stateful=bool(stateful),
                 stateful_ops=sorted(stateful)[:MAX_OP_NAMES], io_ops=sorted(io)[:MAX_OP_NAMES])


# -- element sizes ----------------------------------------------------------------------------------


def _flat_specs(tf, spec):
    try:
        return tf.nest.flatten(spec)
    except Exception:
        return None


def _dims(s):
    try:
        return s.shape.as_list() if s.shape.rank is not None else None
    except Exception:
        return None


def _dtype_bytes(s):
    try:
        dt = s.dtype
        if dt.name in ("string", "variant", "resource"):
            return None
        return int(dt.size)
    except Exception:
        return None


def _spec_bytes(tf, spec):
    """Bytes of one element of ``spec`` when every component is a dense tensor of fully defined
    shape and fixed-size dtype; else None."""
    specs = _flat_specs(tf, spec) if spec is not None else None
    if not specs:
        return None
    total = 0
    for s in specs:
        if type(s).__name__ != "TensorSpec":
            return None
        dims, size = _dims(s), _dtype_bytes(s)
        if dims is None or size is None or any(d is None for d in dims):
            return None
        n = size
        for d in dims:
            n *= d
        total += n
    return total


def _sample_bytes(tf, spec, batch_size):
    """Bytes of one sample at the sink: with a batch stage, the leading dimension (None or the
    batch size) is removed from every component; without one, shapes must be fully defined."""
    if batch_size is None:
        return _spec_bytes(tf, spec)
    specs = _flat_specs(tf, spec)
    if not specs:
        return None
    total = 0
    for s in specs:
        if type(s).__name__ != "TensorSpec":
            return None
        dims, size = _dims(s), _dtype_bytes(s)
        if not dims or size is None or dims[0] not in (None, batch_size) or any(d is None for d in dims[1:]):
            return None
        n = size
        for d in dims[1:]:
            n *= d
        total += n
    return total


def _sink_batch_size(chain: list) -> int | None:
    for stage in reversed(chain):
        if stage["op"] in ("batch", "padded_batch"):
            return stage.get("batch_size")
        if stage["op"] in ("unbatch", "flat_map", "interleave"):
            return None
    return None


# -- options ----------------------------------------------------------------------------------------

#: TensorFlow 2.21's documented defaults (``tf.data.Options`` docstrings) for options left None.
OPTION_DEFAULTS = {"autotune": True, "inject_prefetch": True, "map_parallelization": True,
                   "map_and_batch_fusion": True, "deterministic": True}


def _options(ds, eager: bool) -> dict:
    """Effective option values: the user's where set, else TensorFlow's default. The three
    default optimizations count as off when ``apply_default_optimizations`` is False and they
    were not set explicitly."""
    try:
        opts = ds.options() if eager else getattr(ds, "_options_attr", None)
    except Exception:
        opts = getattr(ds, "_options_attr", None)
    if opts is None:
        return {}
    out = {}
    opt = getattr(opts, "experimental_optimization", None)
    apply_default = getattr(opt, "apply_default_optimizations", None)
    raw = {
        "autotune": getattr(getattr(opts, "autotune", None), "enabled", None),
        "inject_prefetch": getattr(opt, "inject_prefetch", None),
        "map_parallelization": getattr(opt, "map_parallelization", None),
        "map_and_batch_fusion": getattr(opt, "map_and_batch_fusion", None),
        "deterministic": getattr(opts, "deterministic", None),
    }
    for key, value in raw.items():
        if value is None:
            value = OPTION_DEFAULTS[key]
            if apply_default is False and key in ("inject_prefetch", "map_parallelization", "map_and_batch_fusion"):
                value = False
        out[key] = bool(value)
    out["apply_default_optimizations"] = apply_default
    return out
