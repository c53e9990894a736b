"""Statistical stack sampling of the training thread (stdlib only; runs inside the trainer).

A daemon thread wakes ``hz`` times per second, reads the training thread's current Python frame
(``sys._current_frames()``), and counts ``(phase, user_site, leaf_site)``: the step phase the
instrumentation reports at that moment, the innermost frame in the user's own code and the
innermost frame overall. Counts are aggregated in memory (bounded by ``max_sites`` distinct keys
per flush) and drained into one ``stacks`` record per flush.

Each sample is also weighted by the wall time since the previous one. The sampler needs the GIL:
while the training thread runs pure Python it gets it only at a switch (5 ms or more later),
while C++ work that releases the GIL (autograd, convolutions) lets it in at once. Counting
samples would over-weight GIL-releasing code several-fold; the elapsed-time weight gives a
GIL-holding stretch the time it really took, attributed to the frame it ended in.

Cost: one sample walks one frame chain (~5–20 µs) and makes the training thread hand over the GIL
once, so 100 Hz costs well under 1 % of a CPU-bound step (measured in ``benchmarks/overhead.py``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import site
import sys
import sysconfig
import threading
import time

#: User-code frames kept per sample (innermost first): the innermost names the line, the
#: enclosing ones let a report say which of the user's functions holds the time inclusively.
USER_FRAMES = 4

#: Longest wall time one sample may stand for (a suspended process should not dump seconds
#: onto one line).
MAX_SAMPLE_WEIGHT_S = 0.25

#: Distinct (phase, user_site, leaf_site) keys kept between two flushes; more are counted under
#: one overflow key so memory stays bounded whatever the program does.
MAX_SITES_PER_FLUSH = 4096

_WHYIDLE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_WHYIDLE_DEMO = os.path.join(_WHYIDLE_DIR, "demo")


def _library_roots() -> list[str]:
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(os.path.realpath(paths[key]))
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except Exception:
        pass
    if getattr(site, "ENABLE_USER_SITE", False) and site.USER_SITE:
        roots.add(os.path.realpath(site.USER_SITE))
    return sorted(roots, key=len, reverse=True)


class FrameClassifier:
    """Tells user code from library code and formats ``"file:line function"`` sites.

    User code is any file outside the standard library, ``site-packages``/``dist-packages`` and
    whyidle itself (except ``whyidle/demo``, the demo's training script, shown as
    ``whyidle/demo/...``). User paths are shown relative to the working directory when inside it;
    library paths relative to their install root (``torch/nn/modules/conv.py``).
    """

    def __init__(self) -> None:
        self._roots = _library_roots()
        self._cwd = os.getcwd()
        self._cache: dict[str, tuple[int, str]] = {}  # filename -> (kind, label); kind 0 user 1 lib 2 ours

    def classify(self, filename: str) -> tuple[int, str]:
        hit = self._cache.get(filename)
        if hit is not None:
            return hit
        if filename.startswith("<"):
            result = (1, filename)
        else:
            real = os.path.realpath(filename)
            if real.startswith(_WHYIDLE_DEMO + os.sep):  # the demo's trainer is user code
                result = (0, os.path.relpath(real, os.path.dirname(_WHYIDLE_DIR)))
            elif real.startswith(_WHYIDLE_DIR + os.sep):
                result = (2, real)
            elif "site-packages" in real or "dist-packages" in real:
                tail = real.split("-packages" + os.sep, 1)[-1]
                result = (1, tail)
            else:
                result = None
                for root in self._roots:
                    if real.startswith(root + os.sep):
                        result = (1, os.path.relpath(real, root))
                        break
                if result is None:
                    rel = os.path.relpath(real, self._cwd)
                    result = (0, real if rel.startswith("..") else rel)
        self._cache[filename] = result
        return result

    def site_pair(self, frame) -> tuple[str | None, str | None]:
        """``(innermost user site, innermost site)`` of a frame chain, whyidle's own frames and
        ``warnings.py`` skipped; ``None`` where there is none."""
        leaf = None
        while frame is not None:
            code = frame.f_code
            kind, label = self.classify(code.co_filename)
            if kind != 2 and not label.endswith("warnings.py"):
                site = f"{label}:{frame.f_lineno or code.co_firstlineno} {code.co_name}"
                if leaf is None:
                    leaf = site
                if kind == 0:
                    return site, leaf
            frame = frame.f_back
        return None, leaf


class _Sigevent(ctypes.Structure):
    # struct sigevent on Linux (64 bytes): sigev_value, sigev_signo, sigev_notify, then a union
    # whose first int is the target thread id for SIGEV_THREAD_ID.
    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int), ("sigev_notify", ctypes.c_int),
                ("sigev_tid", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_SIGEV_THREAD_ID = 4
_CLOCK_MONOTONIC = 1


class ThreadTimer:
    """A POSIX per-thread timer (Linux ``timer_create`` with ``SIGEV_THREAD_ID``) that sends a
    real-time signal to one thread every ``period_s`` of wall time.

    Only that thread is interrupted; the process-wide ``ITIMER_*`` timers and ``alarm()`` stay
    free for the user's code. The signal handler is installed with ``SA_RESTART``
    (``signal.siginterrupt(sig, False)``), and the signal is one no one else handles.

    Errors: ``OSError`` / ``ValueError`` / ``AttributeError`` when unsupported (not Linux, not
    the main thread, no free real-time signal); callers fall back to a sampling thread.
    """

    def __init__(self, native_tid: int, period_s: float, handler) -> None:
        if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
            raise OSError("per-thread timer signals need Linux and the main thread")
        libc = None
        for name in (None, "librt.so.1"):
            candidate = ctypes.CDLL(name, use_errno=True)
            if hasattr(candidate, "timer_create"):
                libc = candidate
                break
        if libc is None:
            raise OSError("timer_create not found")
        self._libc = libc
        self.signum = next(sig for sig in range(signal.SIGRTMIN + 4, signal.SIGRTMAX - 3)
                           if signal.getsignal(sig) in (signal.SIG_DFL, None))
        signal.signal(self.signum, handler)
        signal.siginterrupt(self.signum, False)
        event = _Sigevent(sigev_signo=self.signum, sigev_notify=_SIGEV_THREAD_ID, sigev_tid=native_tid)
        self._timer = ctypes.c_void_p()
        if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(self._timer)) != 0:
            signal.signal(self.signum, signal.SIG_IGN)
            raise OSError(ctypes.get_errno(), "timer_create failed")
        sec, frac = divmod(period_s, 1.0)
        spec = _Timespec(int(sec), int(frac * 1e9))
        if libc.timer_settime(self._timer, 0, ctypes.byref(_Itimerspec(spec, spec)), None) != 0:
            self.close()
            raise OSError(ctypes.get_errno(), "timer_settime failed")

    def close(self) -> None:
        """Deletes the timer, then ignores its signal (a signal still in flight must not reach the
        default action, which would end the process)."""
        if self._timer is not None:
            self._libc.timer_delete(self._timer)
            self._timer = None
            if threading.current_thread() is threading.main_thread():  # else the handler stays, inert
                signal.signal(self.signum, signal.SIG_IGN)


class StackSampler:
    """Samples one thread's stack ``hz`` times per second of wall time.

    Two tick sources, the first that works: a per-thread timer signal (:class:`ThreadTimer`),
    whose handler runs in the training thread itself at the next bytecode and reads its frame
    without any GIL hand-off; else a daemon thread reading ``sys._current_frames()``. The thread
    fallback is biased: it needs the GIL, and a training thread that keeps releasing and
    re-taking it briefly (``torch.tensor`` on every sample) starves it until a long release, so
    its samples cluster at those points. ``mode`` says which source ran.

    Args:
        thread_id: ``threading.get_ident()`` of the training thread.
        hz: samples per second (> 0).
        phase_of: callable returning the current phase name (read without locking).
        max_sites: see :data:`MAX_SITES_PER_FLUSH`.
        native_id: the training thread's kernel thread id (``threading.get_native_id()``), needed
            for the timer signal; None forces the thread fallback.
        on_sample: ``on_sample(user_site, leaf_site, weight_s, phase)`` called after each sample
            (in the sampled thread in signal mode; the GPU timeline records a probe there).
    """

    def __init__(self, thread_id: int, hz: float, phase_of, max_sites: int = MAX_SITES_PER_FLUSH,
                 native_id: int | None = None, on_sample=None) -> None:
        self.thread_id = thread_id
        self.native_id = native_id
        self.hz = hz
        self.phase_of = phase_of
        self.max_sites = max_sites
        self.on_sample = on_sample
        self.classifier = FrameClassifier()
        self.mode = None
        self._counts: dict[tuple, list] = {}  # key -> [count, weight_s]
        self._n = 0
        self._last = None
        self._timer: ThreadTimer | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="whyidle-stacks", daemon=True)

    def start(self) -> None:
        """Starts sampling: the timer signal when possible, else the sampling thread."""
        if self.native_id is not None and self.thread_id == threading.main_thread().ident:
            try:
                self._timer = ThreadTimer(self.native_id, 1.0 / self.hz, self._on_signal)
                self._timer_signum = self._timer.signum
                self.mode = "signal"
                return
            except (OSError, ValueError, AttributeError, StopIteration):
                self._timer = None
        self.mode = "thread"
        self._thread.start()

    def stop(self) -> None:
        """Stops sampling; joins the thread (called at exit, before interpreter finalization)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _weight(self) -> float:
        now = time.monotonic()
        weight = 1.0 / self.hz if self._last is None else min(now - self._last, MAX_SAMPLE_WEIGHT_S)
        self._last = now
        return weight

    def _on_signal(self, signum, frame) -> None:
        if frame is not None and not self._stop.is_set():
            self.sample(frame, self.phase_of(), self._weight())

    def _run(self) -> None:
        period = 1.0 / self.hz
        deadline = time.monotonic()
        while not self._stop.is_set():
            deadline += period
            delay = deadline - time.monotonic()
            if delay > 0:
                if self._stop.wait(delay):
                    break
            else:  # late (GIL held long): skip missed ticks rather than burst
                deadline = time.monotonic()
            frame = sys._current_frames().get(self.thread_id)
            weight = self._weight()
            if frame is not None:
                self.sample(frame, self.phase_of(), weight)

    def sample(self, frame, phase: str, weight_s: float | None = None) -> None:
        """Counts one sample of ``frame``'s stack under ``phase``, standing for ``weight_s``
        seconds (default one period). Also used by tests."""
        classify = self.classifier.classify
        leaf = None
        users: list[str] = []
        while frame is not None and len(users) < USER_FRAMES:
            code = frame.f_code
            kind, label = classify(code.co_filename)
            if kind != 2:
                site = f"{label}:{frame.f_lineno or code.co_firstlineno} {code.co_name}"
                if leaf is None:
                    leaf = site
                if kind == 0:
                    users.append(site)
            frame = frame.f_back
        if weight_s is None:
            weight_s = 1.0 / self.hz
        key = (phase, tuple(users), leaf)
        counts = self._counts
        entry = counts.get(key)
        if entry is None:
            if len(counts) >= self.max_sites:
                key = (phase, (), "(overflow)")
            entry = counts.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += weight_s
        self._n += 1
        if self.on_sample is not None:
            try:
                self.on_sample(users[0] if users else None, leaf, weight_s, phase)
            except Exception:  # never raise into the sampled thread; probes stop
                self.on_sample = None

    def drain(self) -> list[dict]:
        """Returns ``[stacks record]`` with the counts since the last drain (or ``[]``); each site
        is ``[phase, user_site, leaf_site, count, ms, callers]``: ``ms`` the wall time the samples
        stand for, ``callers`` the enclosing user frames (innermost first, up to
        ``USER_FRAMES - 1``)."""
        if not self._n:
            return []
        counts, self._counts = self._counts, {}
        n, self._n = self._n, 0
        sites = [[phase, users[0] if users else None, leaf, c, round(w * 1000, 3), list(users[1:])]
                 for (phase, users, leaf), (c, w) in counts.items()]
        return [{"k": "stacks", "t": time.monotonic_ns(), "hz": self.hz, "n": n, "mode": self.mode, "sites": sites}]
