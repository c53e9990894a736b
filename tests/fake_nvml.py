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
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml
import pytest

_HANDLE_BASE = 0x1000  # fake nvmlDevice_t values: _HANDLE_BASE + index (never dereferenced)


@dataclass
class FakeDevice:
    """One fake GPU. Sizes in bytes, clocks in MHz, power in mW, utilization in percent.

    ``samples`` maps an NVML sampling type (``pynvml.NVML_GPU_UTILIZATION_SAMPLES`` ...) to the
    driver's buffer: ``(timestamp_us, value)`` pairs, oldest first.
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
    samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

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
        calls: how often each C function was called (missing ones are never called).
        lookups: how often pynvml asked for each function pointer (missing ones included).
        sample_queries: ``(device index, sampling type, lastSeenTimeStamp)`` of every
            ``nvmlDeviceGetSamples`` call.
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
        support._obj.isSupportedDevice = int(self._dev(handle).gpm_supported)
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


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    """Factory fixture: ``fake_nvml(devices, **kwargs)`` builds and installs a :class:`FakeNvml`."""

    def make(devices: list[FakeDevice] | None = None, **kwargs: Any) -> FakeNvml:
        return FakeNvml(devices, **kwargs).install(monkeypatch)

    return make
