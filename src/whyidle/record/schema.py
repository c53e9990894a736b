"""The types of the record fields the analysis reads, checked when a run directory is read.

A run directory is input like any other: a file cut short, a disk error, another tool or a person
may have written any value anywhere. Each record kind (docs/run-format.md) has a schema of the
fields the analysis uses; :func:`problem` says what is wrong with a record, and the reader
(:mod:`whyidle.record.reader`) leaves such records out and says how many, so one damaged record
costs that record, not the report. Fields not listed are not checked (nothing reads them as
numbers); kinds not listed are kept as they are.

Specs: :data:`NUM` a finite number (int or float, not bool, ``|x| < 2**63``: every whyidle number
is a count, a size, a monotonic or epoch time in ns, or a fraction), :data:`INT` an integer in
int64, :data:`TEXT`, :data:`BOOL`, :data:`ANY`; ``opt(spec)`` also null; ``list_of(spec)``;
``row(spec, ...)`` a list of at least ``min_len`` items whose first items have these specs (later
items unchecked: rows grow new columns at their end); ``map_of(spec)`` an object whose values have
``spec``; :data:`OBJ` any object; a dict is an object with those fields. A field name ending in ``?``
may be absent. Records holding both ``t0`` and ``t1`` must have ``t1 >= t0`` (an interval).
"""

from __future__ import annotations

import math

NUM = "num"
INT = "int"
TEXT = "text"
BOOL = "bool"
ANY = "any"
OBJ = "object"

_LIMIT = 2 ** 63


def opt(spec):
    """``spec`` or null."""
    return ("opt", spec)


def list_of(spec):
    """A list whose every item has ``spec``."""
    return ("list", spec)


def row(*specs, min_len: int | None = None, exact: bool = False):
    """A list whose first items have ``specs`` (at least ``min_len`` of them, default all;
    ``exact``: exactly as many items as ``specs``)."""
    return ("row", specs, len(specs) if min_len is None else min_len, exact)


def map_of(spec):
    """An object whose values all have ``spec`` (any keys)."""
    return ("map", spec)


_NAMES = {NUM: "a number", INT: "an integer", TEXT: "text", BOOL: "true/false", OBJ: "an object"}


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true/false"
    if isinstance(v, (int, float)):
        return "a number out of range" if not _number(v) else "a number"
    return {str: "text", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)


def _number(v) -> bool:
    return (type(v) is int or type(v) is float) and -_LIMIT < v < _LIMIT and not math.isnan(v)


def check(value, spec, where: str = "") -> str | None:
    """Why ``value`` does not have ``spec`` (``"sites[3][1]: an object, expected text"``), or None."""
    if spec == ANY:
        return None
    if isinstance(spec, str):
        ok = {NUM: _number, INT: lambda v: type(v) is int and -_LIMIT < v < _LIMIT,
              TEXT: lambda v: type(v) is str, BOOL: lambda v: type(v) is bool,
              OBJ: lambda v: type(v) is dict}[spec](value)
        return None if ok else f"{where or 'value'}: {_kind(value)}, expected {_NAMES[spec]}"
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where or 'record'}: {_kind(value)}, expected an object"
        for key, sub in spec.items():
            optional = key.endswith("?")
            name = key[:-1] if optional else key
            if name not in value:
                if optional:
                    continue
                return f"{where}{'.' if where else ''}{name} missing"
            why = check(value[name], sub, f"{where}{'.' if where else ''}{name}")
            if why:
                return why
        return None
    tag = spec[0]
    if tag == "opt":
        return None if value is None else check(value, spec[1], where)
    if tag == "map":
        if not isinstance(value, dict):
            return f"{where}: {_kind(value)}, expected an object"
        for key, v in value.items():
            why = check(v, spec[1], f"{where}.{key}")
            if why:
                return why
        return None
    if not isinstance(value, list):
        return f"{where}: {_kind(value)}, expected a list"
    if tag == "list":
        for i, v in enumerate(value):
            why = check(v, spec[1], f"{where}[{i}]")
            if why:
                return why
        return None
    specs, min_len, exact = spec[1], spec[2], spec[3]
    if len(value) < min_len or (exact and len(value) != len(specs)):
        return f"{where}: {len(value)} items, expected {len(specs) if exact else min_len}"
    for i, (v, sub) in enumerate(zip(value, specs)):
        why = check(v, sub, f"{where}[{i}]")
        if why:
            return why
    return None


_N = opt(NUM)
_T = opt(TEXT)
_I = opt(INT)
_B = opt(BOOL)

#: Record kind → the fields the analysis reads (docs/run-format.md). ``t`` is on every record.
SCHEMAS: dict[str, dict] = {
    # proc-<pid>.jsonl
    "proc": {"pid?": INT, "ppid?": _I, "argv?": opt(list_of(TEXT)), "framework?": _T, "framework_version?": _T,
             "started?": _N, "dist?": opt(OBJ), "threads?": _N, "cuda_build?": _T},
    "loader": {"id": INT, "num_workers?": _I, "pin_memory?": _B, "persistent_workers?": _B, "prefetch_factor?": _I,
               "batch_size?": _I, "dataset?": _T, "dataset_len?": _I, "sampler?": _T, "collate_fn?": _T,
               "drop_last?": _B, "shard?": opt(OBJ), "created?": opt(list_of(_T)), "args?": opt(map_of(TEXT)), "call?": opt(OBJ),
               "mp_context?": _T, "iterable?": _B, "worker_init_fn?": _B, "collate_user?": _B,
               "start_method_set?": _T, "platform?": _T, "dataset_code?": opt(OBJ)},
    "detail": {"step": NUM, "stride": NUM, "step_s?": _N},
    "override": {"name": TEXT, "applied": BOOL, "value?": ANY, "was?": ANY, "site?": _T, "why?": _T},
    "api": {"name": TEXT, "entry?": _T, "site?": _T, "package?": _T, "version?": _T, "config?": opt(OBJ)},
    "iter": {"t0": NUM, "t1": NUM, "loader?": _I, "rebuilt?": _B},
    "iter_first": {"t0": NUM, "t1": NUM, "loader?": _I},
    "iter_end": {"t0": NUM, "t1": NUM, "loader?": _I},
    "gpu_marks": {"h": list_of(INT), "g": list_of(NUM), "phase": list_of(_T), "kind": list_of(_T),
                  "step": list_of(_I), "extra?": opt(list_of(row(INT, ANY, exact=True)))},
    "transfers": {"step": NUM, "items?": opt(list_of(row(_T, _T, _T, _B, _B, _B, NUM, NUM, NUM, exact=True))),
                  "reads?": opt(list_of(row(_T, _T, TEXT, NUM, exact=True))), "mb?": _N},
    "module_to": {"cls?": _T, "device?": _T, "site?": _T, "leaf?": _T},
    "cuda_query": {"result?": ANY, "site?": _T, "leaf?": _T},
    "graph": {"step": NUM, "nodes": NUM},
    "devices": {"params?": opt(map_of(NUM)), "batch?": opt(list_of(_T)), "inputs?": opt(list_of(_T)),
                "param_dtypes?": opt(map_of(NUM)), "threads?": _N, "batch_tensors?": _N, "batch_bytes?": _N,
                "autocast_share?": _N, "autocast_dtypes?": opt(map_of(_T)), "cpu_matmul?": opt(OBJ),
                "shape_probe?": opt(OBJ), "dist?": opt(OBJ), "wrappers?": opt(list_of(OBJ)),
                "nccl_env?": opt(map_of(ANY)),
                "step?": _N},
    "stacks": {"hz?": _N, "n?": _N, "lost?": _N, "lost_s?": _N, "mode?": _T,
               "sites": list_of(row(TEXT, _T, _T, NUM, NUM, list_of(TEXT), min_len=4))},
    "keras_call": {"fn": TEXT, "t0": NUM, "t1": NUM, "steps_per_execution?": _N, "batch_size?": _N,
                   "epochs?": _N, "steps_per_epoch?": _N, "batches?": _N, "input?": _T, "source?": _T,
                   "workers?": _N, "max_queue_size?": _N, "batch_bytes?": _N, "input_class?": _T, "input_init?": _T,
                   "site?": _T},
    "keras_done": {"done": list_of(row(NUM, NUM, exact=True))},
    "tfdata": {"stages?": opt(list_of(OBJ)), "cardinality?": _N, "batch_size?": _N, "element_bytes?": _N,
               "source_elements?": _N, "options?": opt(OBJ)},
    "tf_devices": {"physical_gpus?": _N, "weight_dtypes?": opt(map_of(NUM)), "policy?": _T, "jit_compile?": ANY},
    "tf_window": {"t0": NUM, "t1": NUM, "first_call?": _N, "calls?": opt(list_of(row(NUM, NUM))),
                  "iterators?": opt(list_of(row(TEXT, NUM, NUM))), "parse_s?": _N, "error?": _T, "file?": _T},
    "metric": {"name": TEXT, "value": _N, "step?": _N, "n?": _N, "epoch?": _N, "source?": _T},
    "region": {"kind": TEXT, "t0": NUM, "t1": NUM, "entry?": _T, "site?": _T, "path?": _T, "bytes?": _N,
               "fs?": _T},
    "threads": {"threads": list_of({"name?": _T, "module?": _T, "cpu_s": NUM})},
    "hooks": {"hooks": list_of({"phase?": _T, "function?": _T, "defined?": _T, "registered?": _T, "owner?": _T,
                                "calls?": _N, "s": NUM})},
    "module_calls": {"steps?": _N, "step_s?": _N, "preamble_s?": _N, "root?": opt(row(_T, _T, exact=True)),
                     "modules?": opt(list_of(row(_T, _T, NUM, NUM, _N, _N, exact=True)))},
    "colls": {"rows": list_of(list_of(_N))},
    "notice": {"msg": TEXT},
    "window": {"i": INT, "t0": NUM, "t1": NUM, "start_s?": _N, "end_s?": _N, "steps?": _N, "samples_per_s?": _N,
               "verdict?": _T, "title?": _T, "bound?": _N, "shares?": opt(map_of(_N)), "departed?": opt(list_of(TEXT)),
               "slow_share?": _N},
    "deep_trace": {"id?": _T, "pid?": _I, "rank?": _I, "t0?": _N, "t1?": _N, "steps?": _N, "file?": _T,
                   "verdict?": _T, "title?": _T, "error?": _T, "reason?": _T},
    "trace_window": {"id?": _T, "t0?": _N, "t1?": _N, "steps?": _N, "file?": _T, "rank?": _I, "error?": _T,
                     "method?": _T, "calls?": opt(list_of(row(NUM, NUM)))},
    "cell": {"file": TEXT, "cell": INT, "offset?": _I, "source?": _T},
    "notebook": {"path": TEXT},
    "compile": {"t0": NUM, "t1": NUM, "id?": _T, "trig?": _T, "main?": ANY},
    "compile_frame": {"id?": _T, "fn?": _T, "file?": _T, "line?": _N, "s?": _N, "reason?": _T, "fail?": _T,
                      "fail_reason?": _T},
    "compile_limit": {"what?": _T, "limit?": _T, "fn?": _T, "reason?": _T},
    "compile_call": {"site?": _T, "dynamic?": ANY, "mode?": _T, "backend?": _T, "fullgraph?": ANY},
    "compile_summary": {"limit_hits?": _N, "breaks?": opt(list_of({"reason?": _T, "count": NUM})),
                        "unsupported?": opt(list_of({"reason?": _T, "count": NUM})), "resumes?": opt(map_of(NUM)),
                        "frames?": opt(map_of(NUM))},
    # host.jsonl
    "host_static": {"cpu_count?": _N, "cpu_count_physical?": _N, "cpu_model?": _T, "cpu_affinity?": _N,
                    "mem_total_bytes?": _N, "clk_tck?": _N, "boot_time_s?": _N},
    "host": {"t": NUM, "cpu": map_of(NUM), "percpu_busy_s?": opt(list_of(NUM)), "ctx?": _N,
             "disk_read_bytes?": _N, "mem_used_bytes?": _N, "psi_cpu_us?": _N, "psi_io_us?": _N,
             "procs": list_of(row(INT, _I, NUM, NUM, NUM, _N, _N, _N, _N, _N, _N, _N, min_len=5)),
             "cpu_throttle?": opt(list_of(row(TEXT, NUM, NUM, NUM, exact=True)))},
    "host_proc": {"pid": INT, "ppid": _I, "name?": _T, "cmdline?": opt(list_of(TEXT)), "cpu_affinity?": _N,
                  "cpu_quota?": _N, "cpu_quota_cgroup?": _T, "mem_limit_bytes?": _N},
    "host_top": {"t0": NUM, "t1": NUM, "total_cpu_s?": _N, "procs": list_of(row(INT, TEXT, NUM, exact=True)),
                 "yielding_cpu_s?": _N, "yielding_procs?": opt(list_of(row(INT, TEXT, NUM, exact=True)))},
    # gpu.jsonl
    "gpu_static": {"devices?": opt(list_of({"index": INT, "name?": _T, "uuid?": _T, "memory_total_bytes?": _N,
                                            "compute_capability?": opt(row(INT, INT)), "driver_version?": _T,
                                            "cuda_driver_version?": ANY, "gpm_supported?": ANY})),
                   "ts_domain?": _T, "cuda_visible_devices?": _T},
    "gpu_util": {"t": NUM, "dev": INT, "type": TEXT, "samples": list_of(row(NUM, NUM, min_len=2))},
    "gpu_state": {"t": NUM, "dev": INT, "mem_used_bytes?": _N, "mem_total_bytes?": _N, "sm_clock_mhz?": _N,
                  "power_w?": _N, "clocks_event_reasons?": _N, "util_pct?": _N, "mem_util_pct?": _N},
    "gpu_limits": {"dev": INT, "sm_clock_max_mhz?": _N, "power_limit_w?": _N, "power_limit_default_w?": _N,
                   "power_limit_max_w?": _N},
    "gpu_counters": {"t": NUM, "dev": INT, "throttle_ns?": opt(map_of(NUM)), "nvml_ts_us?": _N},
    "gpm": {"t": NUM, "dev": INT, "t0": NUM, "t1": NUM, "sm_active?": _N, "sm_occupancy?": _N,
            "tensor_active?": _N, "dram_active?": _N, "gr_active?": _N, "fp16_active?": _N, "fp32_active?": _N,
            "pcie_tx_mib_per_s?": _N, "pcie_rx_mib_per_s?": _N},
    "gpu_notice": {"msg": TEXT},
}

#: ``meta.json``'s fields the analysis and the report read.
META = {"format": TEXT, "name?": _T, "command?": opt(list_of(TEXT)), "cwd?": _T, "hostname?": _T, "cpu_count?": _N,
        "started_utc?": _T, "ended_utc?": _T, "anchors?": opt(list_of({"monotonic_ns": NUM, "time_ns": NUM})),
        "interval_s?": _N, "stack_hz?": _N, "root_pid?": _I, "whyidle_pid?": _I, "html?": opt(BOOL), "start_t?": _N,
        "exit_t?": _N, "end_t?": _N, "wall_s?": _N, "exit_code?": _I, "signal?": _I, "interrupted?": opt(BOOL),
        "run_dir?": _T, "tool_version?": _T, "python?": _T, "scope?": _T, "raised?": _T}


def _marks_problem(rec: dict) -> str | None:
    """``gpu_marks`` are columns: of one length, and ``extra`` indexes into them."""
    n = len(rec["h"])
    if any(len(rec[c]) != n for c in ("g", "phase", "kind", "step")):
        return "columns of different lengths"
    if any(not 0 <= idx < n for idx, _ in rec.get("extra") or []):
        return "extra: an index outside the columns"
    return None


def _compile(spec):
    """A fast ``value -> bool`` test of ``spec`` (the same rules as :func:`check`, without building
    the path of a mismatch: most records pass, and long runs read millions of them). None for
    :data:`ANY`."""
    if spec == ANY:
        return None
    if spec == NUM:
        return lambda v: (type(v) is int or type(v) is float) and -_LIMIT < v < _LIMIT  # NaN fails
    if spec == INT:
        return lambda v: type(v) is int and -_LIMIT < v < _LIMIT
    if isinstance(spec, str):
        kind = {TEXT: str, BOOL: bool, OBJ: dict}[spec]
        return lambda v: type(v) is kind
    if isinstance(spec, dict):
        fields = [(key.rstrip("?"), key.endswith("?"), _compile(sub)) for key, sub in spec.items()]

        def fields_ok(v):
            if type(v) is not dict:
                return False
            for name, optional, ok in fields:
                if name not in v:
                    if not optional:
                        return False
                elif ok is not None and not ok(v[name]):
                    return False
            return True
        return fields_ok
    tag = spec[0]
    if tag in ("list", "map") and spec[1] == NUM:  # a whole list of numbers at C speed
        if tag == "list":
            return lambda v: type(v) is list and _nums_ok(v)
        return lambda v: type(v) is dict and _nums_ok(list(v.values()))
    if tag == "row" and all(sub in _NUMERIC for sub in spec[1]):
        return _numeric_row(spec)
    inner = _compile(spec[1]) if tag in ("opt", "list", "map") else None
    if tag == "opt":
        return (lambda v: True) if inner is None else (lambda v: v is None or inner(v))
    if tag == "list":
        return (lambda v: type(v) is list) if inner is None else (lambda v: type(v) is list and all(map(inner, v)))
    if tag == "map":
        return (lambda v: type(v) is dict) if inner is None else (
            lambda v: type(v) is dict and all(map(inner, v.values())))
    tests = [(p, _compile(sub)) for p, sub in enumerate(spec[1]) if sub != ANY]
    min_len, most = spec[2], (len(spec[1]) if spec[3] else None)

    def row_ok(v):
        if type(v) is not list or len(v) < min_len or (most is not None and len(v) != most):
            return False
        n = len(v)
        for p, ok in tests:
            if p < n and not ok(v[p]):
                return False
        return True
    return row_ok


_NUM_TYPES = frozenset((int, float))
_NUMERIC = (NUM, INT, ("opt", NUM), ("opt", INT))


def _nums_ok(values: list) -> bool:
    """:data:`NUM` for every item of a list, without a Python call per item (a host tick holds
    ~60 numbers, a 24-hour run 345,600 ticks): each an int or a float (not a bool), and all within
    ±2**63 and finite (``min``/``max`` bound them; ``fsum`` is NaN or infinite when one is)."""
    if not values:
        return True
    if not set(map(type, values)) <= _NUM_TYPES:
        return False
    try:
        return -_LIMIT < min(values) and max(values) < _LIMIT and math.isfinite(math.fsum(values))
    except (ValueError, OverflowError):
        return False


def _numeric_row(spec):
    """The test of a ``row`` whose specs are all numbers (:data:`NUM`, :data:`INT`, or either or
    null), as :func:`_compile`'s general row test decides, over the whole row at once."""
    specs, min_len, exact = spec[1], spec[2], spec[3]
    most, k = (len(specs) if exact else None), len(specs)
    must = [p for p, sub in enumerate(specs) if sub in (NUM, INT)]
    ints = [p for p, sub in enumerate(specs) if sub in (INT, ("opt", INT))]
    none = type(None)
    allowed = _NUM_TYPES | {none}

    def numeric_row_ok(v):
        if type(v) is not list or len(v) < min_len or (most is not None and len(v) != most):
            return False
        head = v[:k]
        types = list(map(type, head))
        kinds = set(types)
        if not kinds <= allowed:
            return False
        n = len(head)
        if none in kinds:
            for p in must:
                if p < n and types[p] is none:
                    return False
            head = [x for x in head if x is not None]
        if float in kinds:
            for p in ints:
                if p < n and types[p] is float:
                    return False
        return _nums_ok(head)
    return numeric_row_ok


_FAST = {kind: _compile(spec) for kind, spec in SCHEMAS.items()}
_NUM_OK = _compile(NUM)


def problem(rec: dict) -> str | None:
    """What makes ``rec`` (a parsed record with a known ``k``) unusable, or None: a field of
    :data:`SCHEMAS` with the wrong type, a non-finite number, an interval that ends before it
    starts, or no time ``t`` (every record has one, docs/run-format.md). The types are tested
    first without messages (:func:`_compile`); the message is built for a record that fails."""
    kind = rec.get("k")
    fast = _FAST.get(kind)
    if not (_NUM_OK(rec.get("t")) and (fast is None or fast(rec))):
        schema = SCHEMAS.get(kind)
        return check(rec.get("t"), NUM, "t") or (check(rec, schema) if schema is not None else None) \
            or "a value of the wrong type"
    if kind == "gpu_marks":
        return _marks_problem(rec)
    t0, t1 = rec.get("t0"), rec.get("t1")
    if t0 is not None and t1 is not None and _NUM_OK(t0) and _NUM_OK(t1) and t1 < t0:
        return "t1 before t0"
    return None
