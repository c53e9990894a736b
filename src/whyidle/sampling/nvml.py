"""GPU sampler: reads NVML through ``pynvml`` (package ``nvidia-ml-py``) and emits ``gpu.jsonl`` records.

What is read, and why (see ``/work/shared/sampling.md``):

* once, in :meth:`GpuPoller.start`: name, UUID, memory size, compute capability, driver and CUDA
  driver versions, GPM support (``gpu_static``);
* every tick, per device: the driver's own utilization sample buffers, drained incrementally with
  ``nvmlDeviceGetSamples(..., lastSeenTimeStamp)`` (§1.2: every driver sample with its timestamp, no
  aliasing, unlike polling ``nvmlDeviceGetUtilizationRates``), plus one cheap snapshot of memory,
  SM clock, power, clocks-event reasons and utilization (``gpu_util``, ``gpu_state``).

* every slow tick, per device: the cumulative clocks-event-reason counters (ns of throttling per
  reason) with one ``nvmlDeviceGetFieldValues`` call (§1.5, §1.7; ``gpu_counters``);
* on Hopper and newer (GPM, §1.8): SM activity, SM occupancy, tensor-pipe, DRAM-bandwidth, FP16/FP32
  pipe and PCIe use over contiguous windows of at least 100 ms from two ping-pong GPM samples
  (``gpm``); and once, the clock and power limits (``gpu_limits``).

Every NVML call goes through :meth:`GpuPoller._call`: a function the device or driver does not offer
(not supported, no permission, missing symbol, library mismatch) yields ``None`` and is never called
again for that device. A device that is gone (:data:`_GONE`: a lost GPU, an unloaded or upgraded
driver) is no longer read; when no device is left, or every call failed in :data:`DEAD_POLLS` polls in
a row (``NVML_ERROR_UNKNOWN`` from some point on), the poller stops for good with one ``gpu_notice``
(it raises :class:`~whyidle.sampling.base.SamplerStopped`); the samples before it stay. GPM has its own guard: any failure stops GPM on that device with one notice
(:meth:`GpuPoller._gpm_fail`). Nothing expensive is called per tick (no
``nvmlDeviceGetPcieThroughput``, which blocks ~20 ms, no process enumeration: sampling.md §1.4, §1.9).

Tiers: by default every :meth:`GpuPoller.poll` is a slow tick (buffers, snapshot, counters) and a GPM
window ends at every poll at least :data:`GPM_MIN_WINDOW_S` after the previous one. With
``gpm_window_s`` (e.g. :data:`GPM_WINDOW_S`) the poller ticks at that period while GPM runs, and does
the slow work only once per ``period_s`` (sampling.md §5: GPM in tier B, the rest in tier C).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

import pynvml

from whyidle.sampling.base import SamplerStopped

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

#: ``nvmlReturn_t`` codes after which a device gives nothing any more until the driver is reloaded:
#: it fell off the bus, the driver was unloaded, or upgraded under the running process.
_GONE = {
    pynvml.NVML_ERROR_GPU_IS_LOST,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    pynvml.NVML_ERROR_UNINITIALIZED,
}

#: Polls in a row in which every NVML call failed (and none succeeded) after which the GPU sampler
#: stops: ~3 s at the default 1 s period. A single failing poll (a timeout) is not the end.
DEAD_POLLS = 3

#: nvml.h (GPM functions): "The interval between two nvmlGpmSampleGet() calls should be greater than
#: 100ms due to the internal sample refresh rate". A poll sooner than this after the previous GPM
#: sample takes no sample: the current window simply grows until the next poll.
GPM_MIN_WINDOW_S = 0.1

#: GPM window to pass as ``gpm_window_s``: 4 Hz, inside sampling.md §5 tier B's 4–10 Hz and 2.5× the
#: 100 ms floor, so scheduling jitter never makes a window too short; short enough to separate phases
#: of a few hundred ms (an eval pass, an epoch boundary) that a 1 s window would blur, and cheap
#: (two NVML calls per device per window).
GPM_WINDOW_S = 0.25

#: GPM metrics taken each window: record key → (``nvmlGpmMetricId_t`` from nvml.h, scale to the
#: stored unit). Percent metrics (NVML 0.0–100.0) are stored as fractions 0–1; PCIe as NVML gives it,
#: MiB/s. Numeric ids, since older ``nvidia-ml-py`` releases lack some names. DCGM equivalents in
#: sampling.md §1.8 (SM_UTIL ≈ DCGM_FI_PROF_SM_ACTIVE, ANY_TENSOR_UTIL ≈ PIPE_TENSOR_ACTIVE, ...).
GPM_METRICS: dict[str, tuple[int, float]] = {
    "gr_active": (1, 0.01),        # NVML_GPM_METRIC_GRAPHICS_UTIL: time any compute/graphics app ran
    "sm_active": (2, 0.01),        # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    "sm_occupancy": (3, 0.01),     # NVML_GPM_METRIC_SM_OCCUPANCY: active warps vs theoretical max
    "tensor_active": (5, 0.01),    # NVML_GPM_METRIC_ANY_TENSOR_UTIL: any tensor-core pipe busy
    "dram_active": (10, 0.01),     # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth used vs max
    "fp32_active": (12, 0.01),     # NVML_GPM_METRIC_FP32_UTIL: non-tensor FP32 pipe
    "fp16_active": (13, 0.01),     # NVML_GPM_METRIC_FP16_UTIL: non-tensor FP16 pipe
    "pcie_tx_mib_per_s": (20, 1.0),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC: from the GPU, MiB/s
    "pcie_rx_mib_per_s": (21, 1.0),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC: to the GPU, MiB/s
}

#: Cumulative throttle-time counters (ns, nvml.h; sampling.md §1.5) read with
#: ``nvmlDeviceGetFieldValues``: clocks-event reason name (as in ``analysis.gpu.THROTTLE_REASONS``)
#: → ``NVML_FI_DEV_CLOCKS_EVENT_REASON_*`` field id. Numeric ids, since older ``nvidia-ml-py``
#: releases lack the names (74 and 76 are the former ``NVML_FI_DEV_PERF_POLICY_POWER`` /
#: ``_SYNC_BOOST``). They replace the deprecated ``nvmlDeviceGetViolationStatus``.
THROTTLE_COUNTER_FIELDS: dict[str, int] = {
    "SwPowerCap": 74,
    "SyncBoost": 76,
    "SwThermalSlowdown": 269,
    "HwThermalSlowdown": 270,
    "HwPowerBrakeSlowdown": 271,
}

#: Per-value ``nvmlReturn`` codes after which a field is not requested again for that device.
_FIELD_UNAVAILABLE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_INVALID_ARGUMENT,  # a field id this driver does not know
}

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


def open_gpu_poller(period_s: float = 1.0,
                    gpm_window_s: float | None = None) -> tuple[GpuPoller | None, str | None]:
    """Initializes NVML once and returns a poller over all NVIDIA devices it reports.

    Args:
        period_s: seconds between slow ticks (1 s drains the driver's sample buffers well before
            they wrap; sampling.md §1.2, §5 tier C).
        gpm_window_s: seconds per GPM window while GPM runs on some device (e.g.
            :data:`GPM_WINDOW_S`); the poller then ticks at this period. ``None``: one GPM window
            per poll. See :class:`GpuPoller`.

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
            return GpuPoller(handles, period_s, gpm_window_s=gpm_window_s), None
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


class _GpmState:
    """Ping-pong GPM samples of one device: ``samples[0]`` holds the window's start, taken at
    ``t_prev`` (monotonic ns, read right after its ``nvmlGpmSampleGet``); ``samples[1]`` receives the
    next one, then the two swap, so windows are contiguous (sampling.md §1.8)."""

    def __init__(self, samples: list[Any], t_prev: int) -> None:
        self.samples = samples
        self.t_prev = t_prev


class GpuPoller:
    """NVML poller (the :class:`~whyidle.sampling.base.Poller` protocol) writing ``gpu.jsonl``.

    Build it with :func:`open_gpu_poller`, which owns the ``nvmlInit``; :meth:`close` ends it.
    Records are those of the ``gpu.jsonl`` table in ``docs/run-format.md``.

    GPM (Hopper and newer, sampling.md §1.8) runs on each device whose
    ``nvmlGpmQueryDeviceSupport(h).isSupportedDevice`` is true: two samples are allocated at
    :meth:`start`, a window ends at every poll at least :data:`GPM_MIN_WINDOW_S` after the previous
    sample, and :meth:`close` frees the samples. Any GPM failure (NotSupported, NoPermission,
    FunctionNotFound, a library without the GPM symbols, an error mid-run such as a lost GPU) stops
    GPM on that device with one ``gpu_notice``; the other readings go on. MIG: samples are taken with
    the device handle, which on a MIG-enabled GPU covers the whole GPU; per-instance GPM
    (``nvmlGpmMigSampleGet`` with a GPU instance id) is not done.

    Attributes:
        name: ``"gpu"``.
        period_s: seconds until the loop polls again: the slow period, or ``gpm_window_s`` while
            GPM runs on some device when that was given.
        ts_domain: clock of NVML sample timestamps, ``"epoch"`` or ``"boottime"`` (``"epoch"`` until
            a sample has been seen).
        clock_ns: the monotonic clock GPM windows and counters are stamped with
            (``time.monotonic_ns``; replaceable in tests).
    """

    name = "gpu"

    def __init__(self, handles: list[tuple[int, Any]], period_s: float = 1.0,
                 gpm_window_s: float | None = None) -> None:
        """Args: handles: ``(NVML index, nvmlDevice_t)`` pairs; period_s: seconds between slow
        ticks; gpm_window_s: seconds per GPM window (``None``: one window per poll), see
        :func:`open_gpu_poller`."""
        self.period_s = period_s
        self.ts_domain = "epoch"
        self.clock_ns: Callable[[], int] = time.monotonic_ns
        self._slow_period_s = period_s
        self._gpm_window_s = (max(gpm_window_s, GPM_MIN_WINDOW_S)
                              if gpm_window_s is not None and gpm_window_s < period_s else None)
        self._next_slow_ns: int | None = None
        self._handles = handles
        self._disabled: set[tuple[int, str]] = set()
        self._noticed: set[str] = set()
        self._notices: list[str] = []
        # (device, type) -> newest sample timestamp seen, in NVML's own clock (never a host clock).
        self._last_seen: dict[tuple[int, str], int] = {}
        self._gpm: dict[int, _GpmState] = {}
        # device -> field ids of THROTTLE_COUNTER_FIELDS still worth requesting
        self._fields: dict[int, list[int]] = {
            dev: list(THROTTLE_COUNTER_FIELDS.values()) for dev, _ in handles}
        self._pending: list[dict] = []  # records read at start, written at the first poll
        self._closed = False
        self._lost: dict[int, str] = {}  # device (-1: the driver) -> why it is gone (_GONE)
        self._ok = self._failed = 0  # NVML calls of the current poll that succeeded / failed
        self._dead = 0  # polls in a row in which every call failed
        self._held: list[str] = []  # notices of those polls: said only if a poll succeeds again

    # -- NVML call wrapper -----------------------------------------------------------------------

    def _call(self, dev: int, what: str, fn: Callable, *args: Any, notice: bool = True) -> Any:
        """Calls ``fn(*args)``; returns ``None`` if it fails, and for good if it is unavailable.

        ``what`` names the call in notices; ``(dev, what)`` is disabled after NotSupported /
        NoPermission / FunctionNotFound / ArgumentVersionMismatch / LibraryMismatch. Other NVML
        errors (timeouts, a lost GPU) give ``None`` for this call only. ``notice=False`` for static
        fields, whose ``null`` already says it.
        """
        key = (dev, what)
        if key in self._disabled or dev in self._lost or -1 in self._lost:
            return None
        try:
            out = fn(*args)
        except _UNAVAILABLE as e:
            self._disabled.add(key)
            if notice:
                self._notice(what, f"GPU {dev}: {what} not available ({e}); no longer read")
        except pynvml.NVMLError as e:
            self._failed += 1
            if getattr(e, "value", None) in _GONE:
                self._lose(dev, f"{what} failed ({e})")
            elif notice:
                self._notice(f"{what}:{type(e).__name__}", f"GPU {dev}: {what} failed ({e})")
        else:
            self._ok += 1
            return out
        return None

    def _lose(self, dev: int, why: str) -> None:
        """Stops reading device ``dev`` (-1: every device, the driver is gone) for good."""
        if dev not in self._lost:
            self._lost[dev] = f"GPU {dev}: {why}" if dev >= 0 else why
            for d in [d for d in self._gpm if dev in (-1, d)]:
                self._gpm_free(d)

    def _live(self) -> list[tuple[int, Any]]:
        """The ``(index, handle)`` pairs of the devices still read."""
        if -1 in self._lost:
            return []
        return [(d, h) for d, h in self._handles if d not in self._lost]

    def _check_alive(self, mark: int) -> None:
        """Ends a poll: raises :class:`SamplerStopped` when no device is left or every call failed
        in :data:`DEAD_POLLS` polls in a row; holds back the notices (from index ``mark`` on) of a
        poll in which every call failed, as they would only say the same thing."""
        if not self._live():
            why = next(iter(self._lost.values()), "no device left")
            raise SamplerStopped(f"GPU sampling stopped: {why}; the samples before it are kept")
        if self._failed and not self._ok:
            self._dead += 1
            self._held += self._notices[mark:]
            del self._notices[mark:]
            if self._dead >= DEAD_POLLS:
                raise SamplerStopped(f"GPU sampling stopped: every NVML call failed in {self._dead} polls in a "
                                     f"row ({'; '.join(self._held[:2]) or 'no reason given'}); the samples "
                                     "before it are kept")
        elif self._ok:  # a poll that called nothing (a GPM window not yet due) changes nothing
            self._dead = 0
            self._notices[mark:mark] = self._held
            self._held = []
        for dev, why in self._lost.items():
            self._notice(f"lost:{dev}", f"{why}: no longer sampled")

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
        :meth:`poll` returns only new samples, and detects the timestamp domain from it; takes the
        first GPM sample of each device that supports GPM; reads the clock and power limits, which
        the first :meth:`poll` returns as ``gpu_limits``.

        Args:
            now_ns: ``time.monotonic_ns()`` at the call.
        """
        def static(dev: int, fn: Callable, *args: Any) -> Any:
            return self._call(dev, fn.__name__, fn, *args, notice=False)

        driver = static(-1, pynvml.nvmlSystemGetDriverVersion)
        cuda = cuda_version_string(static(-1, pynvml.nvmlSystemGetCudaDriverVersion))
        devices = []
        newest = 0
        for dev, h in self._live():
            cc = static(dev, pynvml.nvmlDeviceGetCudaComputeCapability, h)
            mem = self._memory_info(dev, h, notice=False)
            query = getattr(pynvml, "nvmlGpmQueryDeviceSupport", None)
            gpm = static(dev, query, h) if query is not None else None
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
            self._pending.append(self._limits(dev, h, now_ns))
            if devices[-1]["gpm_supported"]:
                self._gpm_open(dev, h)
        if newest:
            self.ts_domain = detect_ts_domain(newest, nvml_clock_now_us())
        self._set_period()
        if not self._live():
            raise SamplerStopped(f"GPU sampling stopped: {next(iter(self._lost.values()))}")
        return [{
            "k": "gpu_static", "t": now_ns, "devices": devices, "ts_domain": self.ts_domain,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }]

    def poll(self, now_ns: int) -> list[dict]:
        """Returns one tick: on a slow tick, ``gpu_util`` records for new buffer samples, one
        ``gpu_state`` and (where the driver has the counters) one ``gpu_counters`` per device; a
        ``gpm`` record per device whose GPM window ended; ``gpu_limits`` at the first poll; and
        ``gpu_notice`` records, first, for what just became unavailable. Never raises for NVML,
        but :class:`~whyidle.sampling.base.SamplerStopped` once no device can be read any more.

        Args:
            now_ns: ``time.monotonic_ns()`` at the call.
        """
        out: list[dict] = self._pending
        self._pending = []
        mark = len(self._notices)
        self._ok = self._failed = 0
        if self._slow_tick(now_ns):
            out += self._slow(now_ns)
        for dev, h in self._live():
            if dev in self._gpm:
                rec = self._gpm_window(dev, h)
                if rec is not None:
                    out.append(rec)
        self._set_period()
        self._check_alive(mark)
        return self._take_notices(now_ns) + out

    def _slow_tick(self, now_ns: int) -> bool:
        """Whether this poll does the slow work: always unless GPM runs at its own period; then once
        per slow period of ``now_ns`` (absolute deadlines, half a GPM period early is on time)."""
        if self._gpm_window_s is None or not self._gpm:
            return True
        slow_ns = int(self._slow_period_s * 1e9)
        due = self._next_slow_ns
        if due is not None and now_ns < due - int(self._gpm_window_s * 1e9) // 2:
            return False
        self._next_slow_ns = now_ns + slow_ns if due is None else max(due + slow_ns, now_ns + slow_ns // 2)
        return True

    def _set_period(self) -> None:
        """Polls at the GPM period while GPM runs on some device, else at the slow period."""
        fast = self._gpm_window_s is not None and bool(self._gpm)
        self.period_s = self._gpm_window_s if fast else self._slow_period_s

    def _slow(self, now_ns: int) -> list[dict]:
        """The slow tier: buffer samples, snapshots and throttle counters of every device."""
        drained: list[tuple[int, str, list[tuple[int, float]]]] = []
        for dev, h in self._live():
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
        for dev, h in self._live():
            out.append(self._state(dev, h, now_ns))
        for dev, h in self._live():
            counters = self._counters(dev, h)
            if counters is not None:
                out.append(counters)
        return out

    def close(self) -> None:
        """Frees the GPM samples and calls ``nvmlShutdown``, once. Never raises."""
        if not self._closed:
            self._closed = True
            for dev in list(self._gpm):
                self._gpm_free(dev)
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

    def _limits(self, dev: int, h: Any, now_ns: int) -> dict:
        """One ``gpu_limits`` record: maximum SM clock (MHz) and the enforced, default and largest
        settable power limits (W, from mW; nvml.h), ``None`` where not offered. Read once."""
        def read(fn_name: str, *args: Any) -> Any:
            fn = getattr(pynvml, fn_name, None)
            return self._call(dev, fn_name, fn, h, *args, notice=False) if fn is not None else None

        def watts(mw: Any) -> float | None:
            return mw / 1000 if isinstance(mw, (int, float)) else None

        constraints = read("nvmlDeviceGetPowerManagementLimitConstraints")
        return {
            "k": "gpu_limits", "t": now_ns, "dev": dev,
            "sm_clock_max_mhz": read("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
            "power_limit_w": watts(read("nvmlDeviceGetEnforcedPowerLimit")),
            "power_limit_default_w": watts(read("nvmlDeviceGetPowerManagementDefaultLimit")),
            "power_limit_max_w": watts(constraints[1]) if constraints else None,
        }

    def _counters(self, dev: int, h: Any) -> dict | None:
        """One ``gpu_counters`` record: cumulative ns of throttling per clocks-event reason
        (:data:`THROTTLE_COUNTER_FIELDS`), from one ``nvmlDeviceGetFieldValues`` call.

        Each value's own ``nvmlReturn`` is checked (the call succeeds when any value was filled,
        nvml.h): a field the device does not offer is not requested again, a transient failure is
        left out of this record only. Silent: without the counters the analysis falls back to the
        ``clocks_event_reasons`` bitmask of ``gpu_state``. ``t`` is the monotonic time right after
        the call; ``nvml_ts_us`` the newest driver timestamp of the values (µs since 1970).
        Returns ``None`` when no counter was read.
        """
        ids = self._fields.get(dev)
        if not ids:
            return None
        values = self._call(dev, "nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, h,
                            ids, notice=False)
        t = self.clock_ns()
        if values is None:
            if (dev, "nvmlDeviceGetFieldValues") in self._disabled:
                self._fields[dev] = []
            return None
        names = {fid: name for name, fid in THROTTLE_COUNTER_FIELDS.items()}
        throttle: dict[str, int] = {}
        newest_ts = 0
        for v in values:
            if v.nvmlReturn == pynvml.NVML_SUCCESS and v.fieldId in names:
                value = getattr(v.value, _VALUE_FIELDS.get(v.valueType, "ullVal"))
                throttle[names[v.fieldId]] = int(value)
                newest_ts = max(newest_ts, int(v.timestamp))
            elif v.nvmlReturn in _FIELD_UNAVAILABLE and v.fieldId in ids:
                ids.remove(v.fieldId)
        if not throttle:
            return None
        return {"k": "gpu_counters", "t": t, "dev": dev, "throttle_ns": throttle,
                "nvml_ts_us": newest_ts or None}

    # -- GPM -------------------------------------------------------------------------------------

    def _gpm_open(self, dev: int, h: Any) -> None:
        """Allocates the two ping-pong samples and takes the first; on failure, no GPM (one notice)."""
        samples: list[Any] = []
        try:
            for _ in range(2):
                samples.append(pynvml.nvmlGpmSampleAlloc())
            pynvml.nvmlGpmSampleGet(h, samples[0])
            t = self.clock_ns()
        except Exception as e:  # noqa: BLE001 -- NVMLError, LibraryMismatch, AttributeError (old pynvml)...
            self._gpm[dev] = _GpmState(samples, 0)
            self._gpm_fail(dev, e)
            return
        self._gpm[dev] = _GpmState(samples, t)

    def _gpm_window(self, dev: int, h: Any) -> dict | None:
        """Ends the device's current GPM window if it is at least :data:`GPM_MIN_WINDOW_S` long.

        Returns the ``gpm`` record: ``t0``/``t1`` (monotonic ns right after the two
        ``nvmlGpmSampleGet`` calls; ``t`` = ``t1``) and one key per :data:`GPM_METRICS` entry.
        Percent metrics become fractions 0–1 (clamped: NVML documents 0.0–100.0); a metric whose
        own ``nvmlReturn`` is an error is ``None`` (one notice per metric). If every metric fails,
        or a call fails, GPM stops on this device (:meth:`_gpm_fail`) and ``None`` is returned.
        """
        st = self._gpm[dev]
        if self.clock_ns() - st.t_prev < GPM_MIN_WINDOW_S * 1e9:
            return None
        prev, cur = st.samples
        try:
            pynvml.nvmlGpmSampleGet(h, cur)
            t1 = self.clock_ns()
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = len(GPM_METRICS)
            req.sample1, req.sample2 = prev, cur
            for i, (metric_id, _) in enumerate(GPM_METRICS.values()):
                req.metrics[i].metricId = metric_id
            pynvml.nvmlGpmMetricsGet(req)
            rec: dict[str, Any] = {"k": "gpm", "t": t1, "dev": dev, "t0": st.t_prev, "t1": t1}
            errors: list[tuple[str, int]] = []
            for i, (key, (_, scale)) in enumerate(GPM_METRICS.items()):
                m = req.metrics[i]
                if m.nvmlReturn != pynvml.NVML_SUCCESS:
                    rec[key] = None
                    errors.append((key, m.nvmlReturn))
                    continue
                value = float(m.value) * scale
                if not math.isfinite(value):
                    rec[key] = None
                elif scale < 1:  # a fraction
                    rec[key] = min(1.0, max(0.0, value))
                else:
                    rec[key] = max(0.0, value)
        except Exception as e:  # noqa: BLE001 -- NVMLError (a GPU lost mid-run), missing symbols, ...
            self._failed += 1
            self._gpm_fail(dev, e)  # the device itself is lost by the next call that fails with _GONE
            return None
        self._ok += 1
        if len(errors) == len(GPM_METRICS):
            self._gpm_fail(dev, pynvml.NVMLError(errors[0][1]))
            return None
        for key, code in errors:
            self._notice(f"gpm_metric:{dev}:{key}",
                         f"GPU {dev}: GPM metric {key} not available ({pynvml.NVMLError(code)})")
        st.samples = [cur, prev]
        st.t_prev = t1
        return rec

    def _gpm_fail(self, dev: int, error: BaseException) -> None:
        """Stops GPM on one device: frees its samples and says so once."""
        self._gpm_free(dev)
        self._notice(f"gpm:{dev}", f"GPU {dev}: GPM not available ({error}); SM activity, tensor-core "
                                   f"and DRAM use are not measured")

    def _gpm_free(self, dev: int) -> None:
        st = self._gpm.pop(dev, None)
        for sample in st.samples if st is not None else ():
            with contextlib.suppress(Exception):  # close() must never raise
                pynvml.nvmlGpmSampleFree(sample)
