"""GPU sampler: reads NVML through ``pynvml`` (package ``nvidia-ml-py``) and emits ``gpu.jsonl`` records.

What is read, and why (see ``/work/shared/sampling.md``):

* once, in :meth:`GpuPoller.start`: name, UUID, memory size, compute capability, driver and CUDA
  driver versions, GPM support (``gpu_static``);
* every tick, per device: the driver's own utilization sample buffers, drained incrementally with
  ``nvmlDeviceGetSamples(..., lastSeenTimeStamp)`` (§1.2: every driver sample with its timestamp, no
  aliasing, unlike polling ``nvmlDeviceGetUtilizationRates``), plus one cheap snapshot of memory,
  SM clock, power, clocks-event reasons and utilization (``gpu_util``, ``gpu_state``).

Every NVML call goes through :meth:`GpuPoller._call`: a function the device or driver does not offer
(not supported, no permission, missing symbol, library mismatch) yields ``None`` and is never called
again for that device. Nothing expensive is called per tick (no ``nvmlDeviceGetPcieThroughput``, which
blocks ~20 ms, no process enumeration: sampling.md §1.4, §1.9).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import pynvml

#: Sample types drained from the driver's buffer, with the ``type`` name used in ``gpu_util``.
SAMPLE_TYPES: dict[str, int] = {
    "gpu": pynvml.NVML_GPU_UTILIZATION_SAMPLES,
    "mem": pynvml.NVML_MEMORY_UTILIZATION_SAMPLES,
}

#: A sample timestamp belongs to a clock domain if it lags that clock's "now" by 0 to this many µs.
#: The newest sample is at most one driver period (≤ 1 s, sampling.md §1.1) old when the GPU is
#: sampled; a few seconds leave room for a slow poll.
TS_DOMAIN_MAX_LAG_US = 5_000_000

#: Errors after which a function is not called again for that device: the device or driver does not
#: offer it (nvml.h return codes; nvitop maps the same set to "not available").
_UNAVAILABLE = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_ArgumentVersionMismatch,
    pynvml.NVMLLibraryMismatchError,  # not an NVMLError subclass (sampling.md §6)
)

# Field of ``c_nvmlValue_t`` to read for each ``nvmlValueType_t`` (nvml.h).
_VALUE_FIELDS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def open_gpu_poller(period_s: float = 1.0) -> tuple[GpuPoller | None, str | None]:
    """Initializes NVML once and returns a poller over all NVIDIA devices it reports.

    Args:
        period_s: seconds between polls (1 s drains the driver's sample buffers well before they
            wrap; sampling.md §1.2, §5 tier C).

    Returns:
        ``(poller, None)`` when ``nvmlInit`` succeeds and at least one device handle can be opened;
        otherwise ``(None, reason)`` with a short human reason, e.g.
        ``"NVML not available: NVML Shared Library Not Found"`` or ``"no NVIDIA GPU found"``.
        Never raises.
    """
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, OSError) as e:
        return None, f"NVML not available: {e}"
    except Exception as e:  # the doctor must never harm the patient (DESIGN.md)
        return None, f"NVML not available: {type(e).__name__}: {e}"
    try:
        handles = []
        count = pynvml.nvmlDeviceGetCount()
        for i in range(count):
            try:
                handles.append((i, pynvml.nvmlDeviceGetHandleByIndex(i)))
            except pynvml.NVMLError:
                continue  # e.g. a GPU this container may not access
        if handles:
            return GpuPoller(handles, period_s), None
        reason = f"no accessible NVIDIA GPU ({count} found)" if count else "no NVIDIA GPU found"
    except Exception as e:
        reason = f"NVML not available: {e}"
    _shutdown()
    return None, reason


def _shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except Exception:
        pass


def _get_samples(h: Any, stype: int, last_seen_us: int) -> tuple[int, list]:
    """``nvmlDeviceGetSamples`` with "nothing new" as an empty list instead of an error.

    NotFound: no sample since ``last_seen_us`` (normal when idle, sampling.md §1.2).
    InsufficientSize: samples arrived between pynvml's count call and its fetch call; the same
    samples are read on the next tick, since ``last_seen_us`` does not move.
    """
    try:
        return pynvml.nvmlDeviceGetSamples(h, stype, last_seen_us)
    except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InsufficientSize):
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, []


def cuda_version_string(version: int | None) -> str | None:
    """``nvmlSystemGetCudaDriverVersion``'s ``1000*major + 10*minor`` (nvml.h) as ``"12.4"``."""
    if version is None:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def nvml_clock_now_us() -> dict[str, int]:
    """Now, in µs, in each clock NVML sample timestamps may use (sampling.md §1.2)."""
    now = {"epoch": time.time_ns() // 1000}
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux only
        now["boottime"] = time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1000
    return now


def detect_ts_domain(newest_ts_us: int, now_us: dict[str, int]) -> str:
    """Names the clock of an NVML sample timestamp: ``"epoch"`` (Unix time) or ``"boottime"``.

    nvml.h only says "CPU Timestamp in microseconds" for ``nvmlSample_t``; epoch and
    ``CLOCK_BOOTTIME`` have both been observed (sampling.md §1.2). The domain is the one whose "now"
    the newest sample lags by 0 to :data:`TS_DOMAIN_MAX_LAG_US`; if none fits (a stale buffer), the
    one with the smallest absolute lag, since the two clocks differ by decades.

    Args:
        newest_ts_us: the newest NVML sample timestamp (µs).
        now_us: ``nvml_clock_now_us()`` read at the same instant.
    """
    lags = {d: now - newest_ts_us for d, now in now_us.items()}
    for domain in ("epoch", "boottime"):
        if domain in lags and 0 <= lags[domain] < TS_DOMAIN_MAX_LAG_US:
            return domain
    return min(lags, key=lambda d: abs(lags[d]))


class GpuPoller:
    """NVML poller (the :class:`~whyidle.sampling.base.Poller` protocol) writing ``gpu.jsonl``.

    Build it with :func:`open_gpu_poller`, which owns the ``nvmlInit``; :meth:`close` ends it.
    Records are those of the ``gpu.jsonl`` table in ``docs/run-format.md``.

    Attributes:
        name: ``"gpu"``.
        period_s: seconds between polls.
        ts_domain: clock of NVML sample timestamps, ``"epoch"`` or ``"boottime"`` (``"epoch"`` until
            a sample has been seen).
    """

    name = "gpu"

    def __init__(self, handles: list[tuple[int, Any]], period_s: float = 1.0) -> None:
        """Args: handles: ``(NVML index, nvmlDevice_t)`` pairs; period_s: seconds between polls."""
        self.period_s = period_s
        self.ts_domain = "epoch"
        self._handles = handles
        self._disabled: set[tuple[int, str]] = set()
        self._noticed: set[str] = set()
        self._notices: list[str] = []
        # (device, type) -> newest sample timestamp seen, in NVML's own clock (never a host clock).
        self._last_seen: dict[tuple[int, str], int] = {}
        self._closed = False

    # -- NVML call wrapper -----------------------------------------------------------------------

    def _call(self, dev: int, what: str, fn: Callable, *args: Any, notice: bool = True) -> Any:
        """Calls ``fn(*args)``; returns ``None`` if it fails, and for good if it is unavailable.

        ``what`` names the call in notices; ``(dev, what)`` is disabled after NotSupported /
        NoPermission / FunctionNotFound / ArgumentVersionMismatch / LibraryMismatch. Other NVML
        errors (timeouts, a lost GPU) give ``None`` for this call only. ``notice=False`` for static
        fields, whose ``null`` already says it.
        """
        key = (dev, what)
        if key in self._disabled:
            return None
        try:
            return fn(*args)
        except _UNAVAILABLE as e:
            self._disabled.add(key)
            if notice:
                self._notice(what, f"GPU {dev}: {what} not available ({e}); no longer read")
        except pynvml.NVMLError as e:
            if notice:
                self._notice(f"{what}:{type(e).__name__}", f"GPU {dev}: {what} failed ({e})")
        return None

    def _notice(self, key: str, msg: str) -> None:
        if key not in self._noticed:  # one notice per kind of problem, not per tick
            self._noticed.add(key)
            self._notices.append(msg)

    def _take_notices(self, now_ns: int) -> list[dict]:
        out = [{"k": "gpu_notice", "t": now_ns, "msg": m} for m in self._notices]
        self._notices = []
        return out

    # -- Poller protocol -------------------------------------------------------------------------

    def start(self, now_ns: int) -> list[dict]:
        """Reads static device info and returns ``[gpu_static]``.

        Also drains each sample buffer once (its history predates the run) so that the first
        :meth:`poll` returns only new samples, and detects the timestamp domain from it.

        Args:
            now_ns: ``time.monotonic_ns()`` at the call.
        """
        def static(dev: int, fn: Callable, *args: Any) -> Any:
            return self._call(dev, fn.__name__, fn, *args, notice=False)

        driver = static(-1, pynvml.nvmlSystemGetDriverVersion)
        cuda = cuda_version_string(static(-1, pynvml.nvmlSystemGetCudaDriverVersion))
        devices = []
        newest = 0
        for dev, h in self._handles:
            cc = static(dev, pynvml.nvmlDeviceGetCudaComputeCapability, h)
            mem = self._memory_info(dev, h, notice=False)
            gpm = static(dev, pynvml.nvmlGpmQueryDeviceSupport, h)
            devices.append({
                "index": dev,
                "name": static(dev, pynvml.nvmlDeviceGetName, h),
                "uuid": static(dev, pynvml.nvmlDeviceGetUUID, h),
                "memory_total_bytes": mem.total if mem is not None else None,
                "compute_capability": list(cc) if cc is not None else None,
                "driver_version": driver,
                "cuda_driver_version": cuda,
                "gpm_supported": bool(gpm is not None and gpm.isSupportedDevice),
            })
            for type_name, stype in SAMPLE_TYPES.items():
                samples = self._samples(dev, h, type_name, stype)
                if samples:
                    self._last_seen[(dev, type_name)] = samples[-1][0]
                    newest = max(newest, samples[-1][0])
        if newest:
            self.ts_domain = detect_ts_domain(newest, nvml_clock_now_us())
        return [{
            "k": "gpu_static", "t": now_ns, "devices": devices, "ts_domain": self.ts_domain,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }]

    def poll(self, now_ns: int) -> list[dict]:
        """Returns one tick: ``gpu_util`` records for new buffer samples, one ``gpu_state`` per device,
        and ``gpu_notice`` records for calls that just became unavailable.

        Args:
            now_ns: ``time.monotonic_ns()`` at the call.
        """
        drained: list[tuple[int, str, list[tuple[int, float]]]] = []
        for dev, h in self._handles:
            for type_name, stype in SAMPLE_TYPES.items():
                samples = self._samples(dev, h, type_name, stype)
                if samples:
                    self._last_seen[(dev, type_name)] = samples[-1][0]
                    drained.append((dev, type_name, samples))
        out: list[dict] = []
        if drained:
            # Convert NVML µs to monotonic ns with offsets read at one instant (sampling.md §1.2).
            mono = time.monotonic_ns()
            now_us = nvml_clock_now_us()
            newest = max(s[-1][0] for _, _, s in drained)
            domain = detect_ts_domain(newest, now_us)
            if domain != self.ts_domain:
                self._notices.append(f"NVML sample timestamps are in the {domain} clock, "
                                     f"not {self.ts_domain}")
                self.ts_domain = domain
            offset_ns = now_us[domain] * 1000 - mono
            for dev, type_name, samples in drained:
                out.append({"k": "gpu_util", "t": now_ns, "dev": dev, "type": type_name,
                            "samples": [[ts * 1000 - offset_ns, v, ts] for ts, v in samples]})
        for dev, h in self._handles:
            out.append(self._state(dev, h, now_ns))
        return self._take_notices(now_ns) + out

    def close(self) -> None:
        """Calls ``nvmlShutdown`` once. Never raises."""
        if not self._closed:
            self._closed = True
            _shutdown()

    # -- readers -----------------------------------------------------------------------------------

    def _samples(self, dev: int, h: Any, type_name: str, stype: int) -> list[tuple[int, float]]:
        """New ``(nvml_ts_us, value)`` samples of one buffer since the last seen one, oldest first.

        ``NVMLError_NotFound`` means no new samples (normal when the GPU is idle, sampling.md §1.2).
        """
        last = self._last_seen.get((dev, type_name), 0)
        res = self._call(dev, f"nvmlDeviceGetSamples({type_name})", _get_samples, h, stype, last)
        if res is None:
            return []
        vtype, raw = res
        field = _VALUE_FIELDS.get(vtype, "uiVal")
        # The driver filters by lastSeen already; zero timestamps mark unfilled entries.
        return sorted({(s.timeStamp, getattr(s.sampleValue, field))
                       for s in raw if s.timeStamp > last})

    def _memory_info(self, dev: int, h: Any, notice: bool = True) -> Any:
        """``nvmlMemory_v2_t`` (used includes reserved memory, nvml.h), else v1 ``nvmlMemory_t``
        (old drivers lack the v2 symbol, sampling.md §1.6)."""
        mem = self._call(dev, "nvmlDeviceGetMemoryInfo_v2", pynvml.nvmlDeviceGetMemoryInfo, h,
                         pynvml.nvmlMemory_v2, notice=False)
        if mem is None:
            mem = self._call(dev, "nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h,
                             notice=notice)
        return mem

    def _state(self, dev: int, h: Any, now_ns: int) -> dict:
        """One ``gpu_state`` snapshot: bytes, MHz, W (from mW), reasons bitmask, util percent."""
        mem = self._memory_info(dev, h)
        power_mw = self._call(dev, "nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, h)
        util = self._call(dev, "nvmlDeviceGetUtilizationRates",
                          pynvml.nvmlDeviceGetUtilizationRates, h)
        return {
            "k": "gpu_state", "t": now_ns, "dev": dev,
            "mem_used_bytes": mem.used if mem is not None else None,
            "mem_total_bytes": mem.total if mem is not None else None,
            "sm_clock_mhz": self._call(dev, "nvmlDeviceGetClockInfo(SM)",
                                       pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "clocks_event_reasons": self._call(dev, "nvmlDeviceGetCurrentClocksEventReasons",
                                               pynvml.nvmlDeviceGetCurrentClocksEventReasons, h),
            "util_pct": util.gpu if util is not None else None,
            "mem_util_pct": util.memory if util is not None else None,
        }
