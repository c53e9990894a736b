"""A fake NVIDIA driver behind the real ``pynvml`` wrappers (sampling.md §6, layer 2).

``pynvml`` reaches the driver only through ``_nvmlGetFunctionPointer(name)`` once ``nvmlLib`` is
loaded. Patching those two makes every ``pynvml.nvml*`` wrapper run unmodified against the Python
functions below, which behave like the C functions: they take the same ctypes arguments, write
results through ``byref`` pointers and return ``nvmlReturn_t`` codes.

Usage::

    from fake_nvml import FakeDevice, FakeNvml

    def test_x(monkeypatch):
        fake = FakeNvml([FakeDevice(name="NVIDIA H200")]).install(monkeypatch)
        fake.devices[0].add_samples(pynvml.NVML_GPU_UTILIZATION_SAMPLES, [(ts_us, 100), ...])
        assert fake.calls["nvmlDeviceGetSamples"] == 0

or the ``fake_nvml`` fixture (import it into the test module), a factory with ``FakeNvml``'s
arguments that installs the fake for one test.

GPM (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc/Get/Free``, ``nvmlGpmMetricsGet`` with a
``nvmlReturn`` per metric) and field values (``nvmlDeviceGetFieldValues`` with a ``nvmlReturn`` per
value) are scripted per device (:class:`FakeDevice`); ``FakeNvml.errors`` makes any C function fail
from a given moment on (e.g. ``GPU_IS_LOST`` mid-run).

Replay: :func:`load_script` builds a fake from a JSON script (format ``whyidle.fake_nvml/1``,
see :func:`script_from_gpu_records`), e.g. one made from the ``gpu.jsonl`` of a run on a real GPU,
so recorded NVML/GPM sequences can be replayed through the real pynvml wrappers as fixtures under
``tests/data/``.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import pynvml
import pytest

_HANDLE_BASE = 0x1000  # fake nvmlDevice_t values: _HANDLE_BASE + index (never dereferenced)
_GPM_SAMPLE_BASE = 0x70000  # fake nvmlGpmSample_t values (never dereferenced)
SCRIPT_FORMAT = "whyidle.fake_nvml/1"


@dataclass
class FakeDevice:
    """One fake GPU. Sizes in bytes, clocks in MHz, power in mW, utilization in percent.

    ``samples`` maps an NVML sampling type (``pynvml.NVML_GPU_UTILIZATION_SAMPLES`` ...) to the
    driver's buffer: ``(timestamp_us, value)`` pairs, oldest first.

    GPM: ``gpm_supported`` answers ``nvmlGpmQueryDeviceSupport``. Each ``nvmlGpmMetricsGet`` (one
    window) takes the next entry of ``gpm_script`` (metric id → value as NVML gives it: percent
    0–100, MiB/s), the last one again once the script is used up, or ``gpm_values`` without a
    script; metrics in neither read 0.0. ``gpm_metric_errors``: metric id → the ``nvmlReturn`` of
    that metric in every window.

    Field values: ``fields`` maps a field id to its value, or to a list of values returned one per
    ``nvmlDeviceGetFieldValues`` call (the last one again once used up); a field in neither
    ``fields`` nor ``field_errors`` gets ``NVML_ERROR_NOT_SUPPORTED``. ``field_errors``: field id →
    the ``nvmlReturn`` of that value.
    """

    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total: int = 150_754_820_096
    memory_used: int = 1_048_576_000
    compute_capability: tuple[int, int] = (9, 0)
    sm_clock_mhz: int = 1980
    power_mw: int = 123_456
    clocks_event_reasons: int = 0
    util: tuple[int, int] = (0, 0)  # (gpu, memory) of nvmlDeviceGetUtilizationRates
    gpm_supported: bool = True
    sm_clock_max_mhz: int = 1980
    power_limit_mw: int = 700_000
    power_limit_default_mw: int = 700_000
    power_limit_max_mw: int = 700_000
    samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    gpm_values: dict[int, float] = field(default_factory=dict)
    gpm_script: list[dict[int, float]] = field(default_factory=list)
    gpm_metric_errors: dict[int, int] = field(default_factory=dict)
    fields: dict[int, int | list[int]] = field(default_factory=dict)
    field_errors: dict[int, int] = field(default_factory=dict)
    gpm_windows: int = 0  # nvmlGpmMetricsGet calls answered so far
    field_reads: int = 0  # nvmlDeviceGetFieldValues calls answered so far

    def add_samples(self, sampling_type: int, samples: list[tuple[int, int]]) -> None:
        """Appends ``(timestamp_us, value)`` samples to one buffer, as the driver would."""
        self.samples.setdefault(sampling_type, []).extend(samples)


def now_us(domain: str = "epoch") -> int:
    """The current time in µs in the clock NVML may stamp samples with (``epoch`` or ``boottime``)."""
    if domain == "epoch":
        return time.time_ns() // 1000
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000


class FakeNvml:
    """The fake driver.

    Args:
        devices: the GPUs, NVML index = position.
        driver_version: ``nvmlSystemGetDriverVersion``.
        cuda_driver_version: ``nvmlSystemGetCudaDriverVersion`` (``1000*major + 10*minor``).
        unsupported: C function names that return ``NVML_ERROR_NOT_SUPPORTED``.
        missing: C function names absent from the library (pynvml raises FunctionNotFound).
        init_error: an ``NVML_ERROR_*`` code for ``nvmlInitWithFlags`` to return.

    Attributes:
        errors: C function name → ``NVML_ERROR_*`` code it returns from now on (set it mid-test
            to fail a call mid-run, e.g. ``GPU_IS_LOST``).
        calls: how often each C function was called (missing ones are never called).
        lookups: how often pynvml asked for each function pointer (missing ones included).
        sample_queries: ``(device index, sampling type, lastSeenTimeStamp)`` of every
            ``nvmlDeviceGetSamples`` call.
        gpm_samples: allocated GPM sample address → ``(device index, nth nvmlGpmSampleGet of that
            device)`` once filled, ``None`` before; freed samples are removed.
        gpm_queries: ``(device index, nth of sample1, nth of sample2)`` of every
            ``nvmlGpmMetricsGet`` call.
        field_queries: ``(device index, [field ids])`` of every ``nvmlDeviceGetFieldValues`` call.
        initialized: nvmlInit refcount (nvmlShutdown decrements).
    """

    def __init__(self, devices: list[FakeDevice] | None = None, *, driver_version: str = "550.54.15",
                 cuda_driver_version: int = 12040, unsupported: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), init_error: int | None = None) -> None:
        self.devices = list(devices) if devices is not None else [FakeDevice()]
        self.driver_version = driver_version
        self.cuda_driver_version = cuda_driver_version
        self.unsupported = set(unsupported)
        self.missing = set(missing)
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.lookups: Counter[str] = Counter()
        self.sample_queries: list[tuple[int, int, int]] = []
        self.errors: dict[str, int] = {}
        self.gpm_samples: dict[int, tuple[int, int] | None] = {}
        self.gpm_queries: list[tuple[int, int, int]] = []
        self.field_queries: list[tuple[int, list[int]]] = []
        self._gpm_next = _GPM_SAMPLE_BASE
        self._gpm_seq: Counter[int] = Counter()
        self.initialized = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Puts this fake behind pynvml for the current test (undone by ``monkeypatch``)."""
        monkeypatch.setattr(pynvml, "nvmlLib", object())  # skips CDLL("libnvidia-ml.so.1")
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", self.function_pointer)
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", pynvml._nvmlLib_refcount)
        return self

    def function_pointer(self, name: str) -> Callable[..., Any]:
        """Replacement for ``pynvml._nvmlGetFunctionPointer``.

        Returns a plain function (pynvml sets ``restype`` on some), counting calls.
        """
        self.lookups[name] += 1
        impl = getattr(self, "_" + name, None)
        if impl is None or name in self.missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

        def c_function(*args: Any) -> Any:
            self.calls[name] += 1
            if name in self.unsupported:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
            if name in self.errors:
                return self.errors[name]
            if not self.initialized and name not in ("nvmlInitWithFlags", "nvmlErrorString"):
                return pynvml.NVML_ERROR_UNINITIALIZED
            return impl(*args)

        return c_function

    # -- helpers --------------------------------------------------------------------------------

    def _index(self, handle: Any) -> int:
        return ctypes.cast(handle, ctypes.c_void_p).value - _HANDLE_BASE

    def _dev(self, handle: Any) -> FakeDevice:
        return self.devices[self._index(handle)]

    # -- C functions (same names and arguments as nvml.h; pointers arrive as byref objects) --------

    def _nvmlInitWithFlags(self, flags: int) -> int:
        if self.init_error is not None:
            return self.init_error
        self.initialized += 1
        return pynvml.NVML_SUCCESS

    def _nvmlShutdown(self) -> int:
        self.initialized -= 1
        return pynvml.NVML_SUCCESS

    def _nvmlErrorString(self, code: int) -> bytes:
        return b"Fake NVML error %d" % code

    def _nvmlSystemGetDriverVersion(self, buf: Any, size: Any) -> int:
        buf.value = self.driver_version.encode()
        return pynvml.NVML_SUCCESS

    def _nvmlSystemGetCudaDriverVersion(self, version: Any) -> int:
        version._obj.value = self.cuda_driver_version
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = len(self.devices)
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetHandleByIndex_v2(self, index: Any, device: Any) -> int:
        if not 0 <= index.value < len(self.devices):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        ctypes.c_void_p.from_buffer(device._obj).value = _HANDLE_BASE + index.value
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetName(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._dev(handle).name.encode()
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetUUID(self, handle: Any, buf: Any, size: Any) -> int:
        buf.value = self._dev(handle).uuid.encode()
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> int:
        major._obj.value, minor._obj.value = self._dev(handle).compute_capability
        return pynvml.NVML_SUCCESS

    def _nvmlGpmQueryDeviceSupport(self, handle: Any, support: Any) -> int:
        if support._obj.version != pynvml.NVML_GPM_SUPPORT_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        support._obj.isSupportedDevice = int(self._dev(handle).gpm_supported)
        return pynvml.NVML_SUCCESS

    @staticmethod
    def _address(pointer: Any) -> int | None:
        return ctypes.cast(pointer, ctypes.c_void_p).value

    def _nvmlGpmSampleAlloc(self, sample: Any) -> int:
        self._gpm_next += 0x10
        ctypes.c_void_p.from_buffer(sample._obj).value = self._gpm_next
        self.gpm_samples[self._gpm_next] = None
        return pynvml.NVML_SUCCESS

    def _nvmlGpmSampleFree(self, sample: Any) -> int:
        if self.gpm_samples.pop(self._address(sample), False) is False:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        return pynvml.NVML_SUCCESS

    def _nvmlGpmSampleGet(self, handle: Any, sample: Any) -> int:
        """nvml.h: fills an allocated sample with the device's counters; NOT_SUPPORTED on a device
        that is not GPM capable."""
        address = self._address(sample)
        if address not in self.gpm_samples:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        index = self._index(handle)
        if not self.devices[index].gpm_supported:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        self._gpm_seq[index] += 1
        self.gpm_samples[address] = (index, self._gpm_seq[index])
        return pynvml.NVML_SUCCESS

    def _nvmlGpmMetricsGet(self, request: Any) -> int:
        """nvml.h: metrics between ``sample1`` and the later ``sample2`` of one device, each with its
        own ``nvmlReturn``."""
        req = request._obj
        if req.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        first = self.gpm_samples.get(self._address(req.sample1))
        second = self.gpm_samples.get(self._address(req.sample2))
        if first is None or second is None or first[0] != second[0] or first[1] >= second[1]:
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        self.gpm_queries.append((first[0], first[1], second[1]))
        d = self.devices[first[0]]
        values = d.gpm_script[min(d.gpm_windows, len(d.gpm_script) - 1)] if d.gpm_script else d.gpm_values
        d.gpm_windows += 1
        for i in range(req.numMetrics):
            m = req.metrics[i]
            m.nvmlReturn = d.gpm_metric_errors.get(m.metricId, pynvml.NVML_SUCCESS)
            m.value = float(values.get(m.metricId, 0.0)) if m.nvmlReturn == pynvml.NVML_SUCCESS else 0.0
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> int:
        """nvml.h: fills each requested value and its own ``nvmlReturn``; the call itself succeeds."""
        d = self._dev(handle)
        array = values._obj  # the c_nvmlFieldValue_t array pynvml passed byref
        ids = [array[i].fieldId for i in range(count.value)]
        self.field_queries.append((self._index(handle), ids))
        ts = time.time_ns() // 1000
        for i, fid in enumerate(ids):
            v = array[i]
            v.timestamp, v.latencyUsec = ts, 1
            if fid in d.field_errors:
                v.nvmlReturn = d.field_errors[fid]
            elif fid in d.fields:
                script = d.fields[fid]
                value = script[min(d.field_reads, len(script) - 1)] if isinstance(script, list) else script
                v.nvmlReturn = pynvml.NVML_SUCCESS
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = int(value)
            else:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        d.field_reads += 1
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        if clock_type.value != pynvml.NVML_CLOCK_SM:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        mhz._obj.value = self._dev(handle).sm_clock_max_mhz
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, mw: Any) -> int:
        mw._obj.value = self._dev(handle).power_limit_mw
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, mw: Any) -> int:
        mw._obj.value = self._dev(handle).power_limit_default_mw
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, lo: Any, hi: Any) -> int:
        lo._obj.value, hi._obj.value = 100_000, self._dev(handle).power_limit_max_mw
        return pynvml.NVML_SUCCESS

    def _memory(self, handle: Any, mem: Any) -> int:
        d = self._dev(handle)
        mem._obj.total, mem._obj.used = d.memory_total, d.memory_used
        mem._obj.free = d.memory_total - d.memory_used
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetMemoryInfo(self, handle: Any, mem: Any) -> int:
        return self._memory(handle, mem)

    def _nvmlDeviceGetMemoryInfo_v2(self, handle: Any, mem: Any) -> int:
        if mem._obj.version != pynvml.nvmlMemory_v2:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        return self._memory(handle, mem)

    def _nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, mhz: Any) -> int:
        if clock_type.value != pynvml.NVML_CLOCK_SM:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        mhz._obj.value = self._dev(handle).sm_clock_mhz
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetPowerUsage(self, handle: Any, mw: Any) -> int:
        mw._obj.value = self._dev(handle).power_mw
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, reasons: Any) -> int:
        reasons._obj.value = self._dev(handle).clocks_event_reasons
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetUtilizationRates(self, handle: Any, util: Any) -> int:
        util._obj.gpu, util._obj.memory = self._dev(handle).util
        return pynvml.NVML_SUCCESS

    def _nvmlDeviceGetSamples(self, handle: Any, sampling_type: Any, last_seen: Any,
                              value_type: Any, count: Any, buf: Any) -> int:
        """nvml.h: samples newer than ``lastSeenTimeStamp`` (0 = all); NULL buffer → count only;
        ``NVML_ERROR_NOT_FOUND`` when there is none. (pynvml's first, size-only call must return
        ``NVML_SUCCESS``: its wrapper raises on anything else.)"""
        self.sample_queries.append((self._index(handle), sampling_type.value, last_seen.value))
        buffer = self._dev(handle).samples.get(sampling_type.value, [])
        new = [s for s in buffer if s[0] > last_seen.value]
        if not new:
            return pynvml.NVML_ERROR_NOT_FOUND
        value_type._obj.value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        if buf is None:
            count._obj.value = len(new)
            return pynvml.NVML_SUCCESS
        if count._obj.value < len(new):
            count._obj.value = len(new)
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        for i, (ts, value) in enumerate(new):
            buf[i].timeStamp = ts
            buf[i].sampleValue.uiVal = value
        count._obj.value = len(new)
        return pynvml.NVML_SUCCESS


# -- replay: JSON scripts ---------------------------------------------------------------------------

#: ``FakeDevice`` fields a script may set directly (the rest are built from ``samples`` etc.).
_SCALAR_FIELDS = {f.name for f in fields(FakeDevice)} - {
    "samples", "gpm_values", "gpm_script", "gpm_metric_errors", "fields", "field_errors",
    "gpm_windows", "field_reads"}


def _metric_id(key: str | int) -> int:
    """A GPM metric id from a number, a numeric string or a ``gpm`` record key (``"sm_active"``)."""
    from whyidle.sampling.nvml import GPM_METRICS
    return GPM_METRICS[key][0] if key in GPM_METRICS else int(key)


def _field_id(key: str | int) -> int:
    """A field id from a number, a numeric string or a reason name (``"SwPowerCap"``)."""
    from whyidle.sampling.nvml import THROTTLE_COUNTER_FIELDS
    return THROTTLE_COUNTER_FIELDS[key] if key in THROTTLE_COUNTER_FIELDS else int(key)


def _sampling_type(key: str | int) -> int:
    from whyidle.sampling.nvml import SAMPLE_TYPES
    return SAMPLE_TYPES[key] if key in SAMPLE_TYPES else int(key)


def load_script(source: str | os.PathLike | dict, shift_samples_to_us: int | None = None) -> FakeNvml:
    """Builds a :class:`FakeNvml` from a script (a dict, or the path of a JSON file).

    Script format ``whyidle.fake_nvml/1``::

        {"format": "whyidle.fake_nvml/1",
         "source": "where the sequence comes from (machine, driver, date), or 'synthetic'",
         "driver_version": "550.54.15", "cuda_driver_version": 12040,
         "unsupported": ["nvmlDeviceGetSamples"], "missing": [],
         "devices": [{"name": "NVIDIA H200", ...any scalar FakeDevice field...,
                      "samples": {"gpu": [[ts_us, percent], ...], "mem": [...]},
                      "gpm_script": [{"sm_active": 41.5, "3": 20.0}, ...],
                      "gpm_values": {...}, "gpm_metric_errors": {"sm_occupancy": 3},
                      "fields": {"SwPowerCap": [ns, ns, ...], "270": 0},
                      "field_errors": {"HwPowerBrakeSlowdown": 4}}]}

    GPM metric keys are ids or ``gpm`` record keys; field keys are ids or reason names; values are
    as NVML returns them (percent, MiB/s, ns). The sampler treats samples already in a buffer at
    ``start()`` as history, so a test that replays them as new adds them after ``start()``, or
    loads with ``shift_samples_to_us`` (moves all sample timestamps so the newest is that time).
    Not installed: call ``.install(monkeypatch)``.
    """
    if isinstance(source, dict):
        script = source
    else:
        with open(source) as fh:
            script = json.load(fh)
    if script.get("format") != SCRIPT_FORMAT:
        raise ValueError(f"not a {SCRIPT_FORMAT} script: format={script.get('format')!r}")
    devices = []
    newest = max((ts for d in script.get("devices", []) for pts in (d.get("samples") or {}).values()
                  for ts, _ in pts), default=None)
    shift = shift_samples_to_us - newest if shift_samples_to_us is not None and newest else 0
    for d in script.get("devices", []):
        kwargs = {k: v for k, v in d.items() if k in _SCALAR_FIELDS}
        if "compute_capability" in kwargs:
            kwargs["compute_capability"] = tuple(kwargs["compute_capability"])
        if "util" in kwargs:
            kwargs["util"] = tuple(kwargs["util"])
        dev = FakeDevice(**kwargs)
        for stype, pts in (d.get("samples") or {}).items():
            dev.add_samples(_sampling_type(stype), [(int(ts) + shift, v) for ts, v in pts])
        dev.gpm_script = [{_metric_id(k): float(v) for k, v in w.items()} for w in d.get("gpm_script") or []]
        dev.gpm_values = {_metric_id(k): float(v) for k, v in (d.get("gpm_values") or {}).items()}
        dev.gpm_metric_errors = {_metric_id(k): int(v) for k, v in (d.get("gpm_metric_errors") or {}).items()}
        dev.fields = {_field_id(k): v for k, v in (d.get("fields") or {}).items()}
        dev.field_errors = {_field_id(k): int(v) for k, v in (d.get("field_errors") or {}).items()}
        devices.append(dev)
    kwargs = {k: script[k] for k in ("driver_version", "cuda_driver_version") if script.get(k) is not None}
    return FakeNvml(devices, unsupported=tuple(script.get("unsupported", ())),
                    missing=tuple(script.get("missing", ())), **kwargs)


def script_from_gpu_records(records: list[dict], source: str) -> dict:
    """A replay script (see :func:`load_script`) from the ``gpu.jsonl`` records of a run: the
    recorder is whyidle's own sampler, so a run on a real GPU becomes a fixture with
    ``save_script(script_from_gpu_records(read_jsonl(".../gpu.jsonl"), "H200, driver ..."), path)``.

    Kept: static info, the first non-null snapshot values, limits, every buffer sample (NVML
    timestamps), every GPM window in order (a metric null in every window becomes
    ``NVML_ERROR_NOT_SUPPORTED``; null in some windows reads 0.0 there) and every counter read in
    order. Not kept: which calls failed transiently, and GPM that failed at start (the replay then
    runs GPM with zeros where ``gpm_supported`` was true).
    """
    from whyidle.sampling.nvml import GPM_METRICS, SAMPLE_TYPES, THROTTLE_COUNTER_FIELDS

    static = next(r for r in records if r.get("k") == "gpu_static")
    type_names = {name for name in SAMPLE_TYPES}
    out_devices = []
    first = static["devices"][0] if static["devices"] else {}
    for d in static["devices"]:
        i = d["index"]
        dev: dict[str, Any] = {k: d[k] for k in ("name", "uuid", "compute_capability", "gpm_supported")
                               if d.get(k) is not None}
        if d.get("memory_total_bytes") is not None:
            dev["memory_total"] = d["memory_total_bytes"]
        mine = [r for r in records if r.get("dev") == i]
        for r in mine:
            if r["k"] == "gpu_state":
                pairs = {"memory_used": r.get("mem_used_bytes"), "sm_clock_mhz": r.get("sm_clock_mhz"),
                         "power_mw": round(r["power_w"] * 1000) if r.get("power_w") is not None else None,
                         "clocks_event_reasons": r.get("clocks_event_reasons")}
                for k, v in pairs.items():
                    if v is not None and k not in dev:
                        dev[k] = v
                if "util" not in dev and r.get("util_pct") is not None:
                    dev["util"] = [r["util_pct"], r.get("mem_util_pct") or 0]
            elif r["k"] == "gpu_limits":
                for k, src, scale in (("sm_clock_max_mhz", "sm_clock_max_mhz", 1),
                                      ("power_limit_mw", "power_limit_w", 1000),
                                      ("power_limit_default_mw", "power_limit_default_w", 1000),
                                      ("power_limit_max_mw", "power_limit_max_w", 1000)):
                    if r.get(src) is not None:
                        dev[k] = round(r[src] * scale)
        samples: dict[str, list] = {}
        for r in mine:
            if r["k"] == "gpu_util" and r.get("type") in type_names:
                samples.setdefault(r["type"], []).extend([s[2], s[1]] for s in r["samples"])
        if samples:
            dev["samples"] = samples
        windows = [r for r in mine if r["k"] == "gpm"]
        if windows:
            dev["gpm_script"] = [{str(mid): w[key] / scale for key, (mid, scale) in GPM_METRICS.items()
                                  if w.get(key) is not None} for w in windows]
            dead = [key for key in GPM_METRICS if all(w.get(key) is None for w in windows)]
            if dead:
                dev["gpm_metric_errors"] = {str(GPM_METRICS[k][0]): pynvml.NVML_ERROR_NOT_SUPPORTED for k in dead}
        counters = [r for r in mine if r["k"] == "gpu_counters"]
        if counters:
            dev["fields"] = {str(fid): [c["throttle_ns"][name] for c in counters if name in c["throttle_ns"]]
                             for name, fid in THROTTLE_COUNTER_FIELDS.items()
                             if any(name in c["throttle_ns"] for c in counters)}
        out_devices.append(dev)
    cuda = first.get("cuda_driver_version")
    major, _, minor = (cuda or "").partition(".")
    return {"format": SCRIPT_FORMAT, "source": source, "driver_version": first.get("driver_version"),
            "cuda_driver_version": int(major) * 1000 + int(minor) * 10 if cuda else None,
            "devices": out_devices}


def save_script(script: dict, path: str | os.PathLike) -> None:
    """Writes a replay script as indented JSON (for ``tests/data/``)."""
    with open(path, "w") as fh:
        json.dump(script, fh, indent=1)
        fh.write("\n")


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Factory fixture: ``fake_nvml(devices, **kwargs)`` builds and installs a :class:`FakeNvml`."""

    def make(devices: list[FakeDevice] | None = None, **kwargs: Any) -> FakeNvml:
        return FakeNvml(devices, **kwargs).install(monkeypatch)

    return make
