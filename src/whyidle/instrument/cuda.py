"""CUDA-side instrumentation: a timeline of events on the training stream, and sync detection.

Standard library only; every CUDA object comes from the caller (``torch.cuda.Event`` factories,
the ``torch`` module), so the logic runs under test with fakes driven by a scripted GPU.

**Marks.** :class:`CudaTimeline` records a CUDA event (``record()`` on the current stream, an
asynchronous call) at each host region boundary of a step (data wait, forward, backward,
optimizer, the rest), after every detected host↔device synchronization, and at each stack sample
of the training thread (a *probe*, carrying the sampled source line). Each mark keeps the host
time at which it was recorded. Completed events are read later with ``query()`` and chained
``elapsed_time()`` between consecutive marks — never ``synchronize()`` — which gives for each mark
the GPU time at which the stream reached it. :mod:`whyidle.analysis.gpu_idle` turns the pairs
(host time, GPU time) into the time the GPU queue was empty and why.

**Syncs.** :class:`SyncWatch` turns on PyTorch's sync debug mode (``"warn"``) and intercepts its
warnings before any user handler, so every synchronizing copy or stream sync that PyTorch
flags is counted with the user's source line and never printed. See its docstring for what that
misses and how the rest is covered.
"""

from __future__ import annotations

import collections
import sys
import threading
import warnings
from time import monotonic_ns

from whyidle.instrument import patches

#: Marks recorded but not yet read at most: beyond it (the GPU lags far behind or reading
#: stopped) marks are dropped and the next one is flagged as following a gap, so memory stays
#: bounded and no interval of unknown content is analyzed as if it were observed.
MAX_PENDING_MARKS = 8192

#: Steps over which the mean step time is measured to choose the detail stride: phase marks are
#: recorded on the fully detailed steps only (``whyidle.instrument.torch.FULL_DETAIL_PERIOD_S``; a
#: mark costs a few µs of host time). Probes and sync marks are kept on every step.
STRIDE_WINDOW = 64

#: Mark kinds: a step boundary (``i`` = the step that starts), a phase change, a stack-sample
#: probe, a flagged sync (after it returned), an explicit sync's start and end.
KINDS = ("step", "phase", "probe", "sync", "sync0", "gap")

#: Text of PyTorch's sync debug warning (c10/cuda/CUDAFunctions.cpp ``warn_or_error_on_sync``).
SYNC_WARNING = "called a synchronizing CUDA operation"

#: Flagged syncs counted per step at most; past it the sync debug mode is turned back off (each
#: flagged sync goes through Python's warnings machinery, ~10–30 µs, and a loop that calls
#: ``.item()`` thousands of times per step has already shown what it does).
MAX_SYNCS_PER_STEP = 256


class CudaTimeline:
    """Events on the training stream at host region boundaries, read without synchronizing.

    Args:
        event_factory: callable returning an object with ``record()``, ``query()`` and
            ``elapsed_time(other)`` in milliseconds (``torch.cuda.Event(enable_timing=True)``;
            tests pass a fake).
        clock: host clock in ns (``time.monotonic_ns``; tests pass the fake GPU's clock).
        capturing: callable, True while the current stream captures a CUDA graph
            (``torch.cuda.is_current_stream_capturing``): no event is recorded then, since a
            timing event recorded during capture would invalidate the user's graph.

    ``mark()`` runs in the training thread (also from its stack-sampling signal handler);
    ``poll()`` may run in another thread (the agent's flusher). ``collections.deque`` operations
    are atomic, and a mark interrupted by a probe makes the probe skip, so marks stay in stream
    order.
    """

    def __init__(self, event_factory, clock=monotonic_ns, capturing=lambda: False) -> None:
        self._new = event_factory
        self._clock = clock
        self._capturing = capturing
        self._free: collections.deque = collections.deque()
        self._pending: collections.deque = collections.deque()
        self._busy = False
        self._gap = False
        self._last = None  # last completed event, kept for chaining
        self._last_g = 0.0  # its GPU time, ns since the first completed mark
        self._step_g: tuple[int, float] | None = None  # (step, GPU time) of the last step mark read
        self.dropped = 0

    def mark(self, phase: str, kind: str = "phase", step: int = -1, extra=None) -> None:
        """Records one mark now: ``phase`` is the host phase that follows it, ``extra`` a JSON
        value kept with it (a probe's or sync's source line). Cheap (one event record)."""
        if self._busy:
            return
        self._busy = True
        try:
            if len(self._pending) >= MAX_PENDING_MARKS or self._capturing():
                self._gap = True
                self.dropped += 1
                return
            ev = self._free.popleft() if self._free else self._new()
            t = self._clock()
            ev.record()
            if self._gap:
                self._gap = False
                kind = "gap"
            self._pending.append((t, phase, kind, step, extra, ev))
        finally:
            self._busy = False

    def poll(self) -> list[dict]:
        """Reads the marks whose events completed, in order, stopping at the first that has not.

        Returns ``[]`` or ``[gpu_marks record]`` (columns, see docs/run-format.md) followed by
        ``gpu_step`` records (GPU time between consecutive step marks, ms).
        Errors: propagates the event calls' exceptions (the caller disables the timeline).
        """
        pending = self._pending
        h: list[int] = []
        g: list[int] = []
        phase: list[str] = []
        kind: list[str] = []
        step: list[int] = []
        extra: list = []
        steps: list[dict] = []
        while pending:
            t, ph, kd, st, ex, ev = pending[0]
            if not ev.query():
                break
            pending.popleft()
            if self._last is None:
                gt = 0.0
            else:
                gt = self._last_g + float(self._last.elapsed_time(ev)) * 1e6
                self._free.append(self._last)
            self._last, self._last_g = ev, gt
            if kd == "step":
                prev = self._step_g
                if prev is not None and prev[0] == st - 1:
                    steps.append({"k": "gpu_step", "t": self._clock(), "i": prev[0], "gpu_ms": (gt - prev[1]) / 1e6})
                self._step_g = (st, gt)
            h.append(t)
            g.append(round(gt))
            phase.append(ph)
            kind.append(kd)
            step.append(st)
            if ex is not None:
                extra.append([len(h) - 1, ex])
        if not h:
            return []
        rec = {"k": "gpu_marks", "t": self._clock(), "h": h, "g": g, "phase": phase, "kind": kind,
               "step": step, "extra": extra}
        return [rec] + steps


class SyncWatch:
    """Counts host↔device synchronizations with their source lines, without printing anything.

    Sources, in order of coverage:

    - PyTorch's sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``): PyTorch warns in
      ``memcpy_and_sync`` and ``stream_synchronize`` (c10/cuda/CUDAFunctions.h), i.e. every
      blocking copy between host and device: device→host reads (``.item()``, ``.cpu()``,
      ``.tolist()``, printing a tensor, ``if tensor:``, ``nonzero``, boolean-mask indexing,
      ``torch.equal``) and host→device copies without ``non_blocking=True`` (``.to(device)``,
      ``.cuda()``), plus ``Stream.synchronize()``. The warning reaches Python when the op returns,
      so the mark is recorded right after the sync: the GPU queue is empty there.
      ``warnings._showwarnmsg`` is wrapped so these warnings are consumed before any user
      ``showwarning`` or ``logging.captureWarnings``; an ``"always"`` filter for this one message
      keeps Python's once-per-line registry from hiding repeats.
    - Explicit syncs the debug mode does not flag: ``torch.cuda.synchronize()`` (``cudaDeviceSynchronize``)
      and ``torch.cuda.Event.synchronize()``, wrapped here with a mark before and after (the
      time between is the host's wait).

    Missed (documented, not counted): syncs inside the CUDA caching allocator (``cudaFree`` on
    cache misses, ``torch.cuda.empty_cache()``), ``non_blocking=True`` copies from pageable memory
    (the driver stages them synchronously; the transfer audit measures their host time), NCCL
    collectives, and syncs in C++/CUDA extensions. Their
    cost still appears in the GPU idle time and its source lines (probes), without a count.

    When the user set a sync debug mode themselves, the watch stays off. A user filter turning
    every warning into an error inside ``warnings.catch_warnings()`` would also catch these
    (rare in training loops; the watch is process-wide).

    Args:
        get_mode, set_mode: ``torch.cuda.get_sync_debug_mode`` / ``set_sync_debug_mode``.
        on_sync: ``on_sync(frame, explicit: str | None)``, called in the syncing thread right
            after the sync returned (``explicit`` names a wrapped explicit sync, else None).
        on_sync_start: ``on_sync_start(frame)``, called just before an explicit sync.
    """

    def __init__(self, get_mode, set_mode, on_sync, on_sync_start=None) -> None:
        self._get_mode = get_mode
        self._set_mode = set_mode
        self._on_sync = on_sync
        self._on_start = on_sync_start
        self._orig_show = None
        self._restores: list = []
        self._explicit = threading.local()
        self.active = False
        self.debug_mode = False

    def install(self, torch=None) -> bool:
        """Turns the watch on. Returns False (and changes nothing) when the user already set a
        sync debug mode. ``torch``, when given, gets its explicit sync functions wrapped."""
        if self._get_mode() != 0:
            return False
        warnings.filterwarnings("always", message=SYNC_WARNING)
        self._orig_show = warnings._showwarnmsg
        warnings._showwarnmsg = self._showwarnmsg
        self._set_mode(1)
        self.debug_mode = True
        if torch is not None:
            self._wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
            self._wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
        self.active = True
        return True

    def stop_debug_mode(self) -> None:
        """Turns PyTorch's sync debug mode back off (flagged syncs are no longer counted)."""
        if self.debug_mode:
            self.debug_mode = False
            try:
                if self._get_mode() == 1:
                    self._set_mode(0)
            except Exception:
                pass

    def uninstall(self) -> None:
        """Restores everything :meth:`install` changed (the filter stays: it only concerns a
        warning that no longer occurs)."""
        self.stop_debug_mode()
        if self._orig_show is not None and warnings._showwarnmsg == self._showwarnmsg:
            warnings._showwarnmsg = self._orig_show
        for owner, name, orig in self._restores:
            setattr(owner, name, orig)
        self._restores = []
        self.active = False

    def _showwarnmsg(self, msg) -> None:
        if str(getattr(msg, "message", "")).startswith(SYNC_WARNING):
            if self.active and not getattr(self._explicit, "on", False):
                try:
                    self._on_sync(sys._getframe(1), None)
                except Exception:
                    pass
            return None
        return self._orig_show(msg)

    def _wrap(self, owner, name: str, label: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return
        watch = self

        def wrapper(*args, **kwargs):
            if not watch.active:
                return orig(*args, **kwargs)
            frame = sys._getframe(1)
            try:
                if watch._on_start is not None:
                    watch._on_start(frame)
            except Exception:
                pass
            watch._explicit.on = True
            try:
                return orig(*args, **kwargs)
            finally:
                watch._explicit.on = False
                try:
                    watch._on_sync(frame, label)
                except Exception:
                    pass

        wrapper.__wrapped__ = orig
        wrapper.__name__ = getattr(orig, "__name__", name)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        self._restores.append((owner, name, orig))
        patches.assign(owner, name, wrapper)
