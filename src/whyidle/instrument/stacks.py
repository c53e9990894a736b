"""Statistical stack sampling of the training thread (stdlib only; runs inside the trainer).

``hz`` times per second a tick — a per-thread timer signal whose handler runs in the training
thread itself, or where that is not possible a daemon thread reading ``sys._current_frames()`` —
reads the training thread's current Python frame and counts ``(phase, user_site, leaf_site)``: the step phase the
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

The timer signal is ``SIGURG``: the doctor must never harm the patient, and a timer signal is
only safe if a library that resets its handler cannot turn it into a kill switch. Libraries do
reset handlers: PyTorch Lightning saves every handler when ``fit`` starts and restores them all
when it ends, so a handler installed in between goes back to ``SIG_DFL``. The default action of
a real-time signal (whyidle's choice before) is to terminate, so the next tick killed the
program; the default action of ``SIGURG`` is to ignore it, so a reset costs samples, never the
process. The choice is the Go runtime's for its asynchronous preemption signal, for the same
reasons (``sigPreempt`` in ``src/runtime/signal_unix.go``; proposal golang/go#24543): debuggers
pass it through, libc does not use it, out-of-band socket data is practically unused, and a
spurious one is harmless.

The handler is watched from the agent's flusher thread (every flush, ~0.5 s; reading the
disposition works from any thread, setting it only from the main thread):

* reset to ``SIG_DFL``/``SIG_IGN`` (from Python or from C): the flusher raises a flag and the
  main thread re-installs the handler at the next step boundary
  (:meth:`StackSampler.maybe_reinstall`, one attribute test when nothing is pending); the ticks
  lost meanwhile are counted (``lost``, ``lost_s`` in the ``stacks`` record) and the gap is not
  attributed to the frame of the next sample;
* our handler set again by ``signal.signal`` (a library restoring what it saved): that drops
  ``SA_RESTART``, which the main thread re-asserts the same way. Either way the timer is re-armed:
  Linux stops a periodic timer whose tick found its signal ignored, and installing a handler
  again does not restart it (:meth:`ThreadTimer.rearm`);
* replaced by the program's own handler (at start or later; a Python one, or a C one such as a
  Go runtime's, seen in the kernel's ``sigaction``): the sampler steps aside for good — it
  deletes its timer, never touches the program's handler, samples from a thread instead and
  says so once. Ticks sent before the flusher looked (at most one flush period) reach that
  handler; a program that handles ``SIGURG`` must take spurious ones anyway (it carries no
  information about which socket has urgent data).
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

#: Seconds without a sample after which the flusher re-arms the timer (see ThreadTimer.rearm).
STALL_S = 1.0

_WHYIDLE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_WHYIDLE_DEMO = os.path.join(_WHYIDLE_DIR, "demo")


#: Code objects whose line table was read for instructions without a line number (bounded).
_NO_LINE: dict = {}
MAX_CODE_TABLES = 4096


def _lineless_table(code) -> dict[int, int]:
    """``{byte offset: line}`` for the instructions of ``code`` that carry no line number: a jump
    back to a loop's head gets the head's line (the ``for`` / ``while`` line), any other the line of
    the instruction before it."""
    import dis

    instructions = list(dis.get_instructions(code))
    line_at = {ins.offset: ins.positions.lineno for ins in instructions if ins.positions.lineno is not None}
    table: dict[int, int] = {}
    last = code.co_firstlineno
    for ins in instructions:
        if ins.positions.lineno is not None:
            last = ins.positions.lineno
        elif ins.opname.startswith("JUMP_BACKWARD") and isinstance(ins.argval, int):
            table[ins.offset] = line_at.get(ins.argval, last)
        else:
            table[ins.offset] = last
    return table


def line_of(frame) -> int:
    """The line ``frame`` is at. CPython 3.11+ reports ``f_lineno`` None at instructions without a
    line number, among them the ``JUMP_BACKWARD`` that closes every loop, which is where the eval
    loop runs pending signal handlers: a timer signal landing in a Python loop almost always sees
    it. Those instructions are looked up in :func:`_lineless_table` (read once per code object)."""
    line = frame.f_lineno
    if line is not None:
        return line
    code = frame.f_code
    table = _NO_LINE.get(code)
    if table is None:
        try:
            table = _lineless_table(code)
        except Exception:
            table = {}
        if len(_NO_LINE) < MAX_CODE_TABLES:
            _NO_LINE[code] = table
    return table.get(frame.f_lasti, code.co_firstlineno)


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
                site = f"{label}:{line_of(frame)} {code.co_name}"
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

#: The timer signal: default action "ignore", so a library that resets its handler costs samples,
#: never the process (module docstring). None where the platform has no SIGURG.
TIMER_SIGNAL = getattr(signal, "SIGURG", None)

#: ``SA_RESTART`` and where ``sa_flags`` sits in libc's ``struct sigaction`` (after the handler
#: pointer and a 128-byte ``sigset_t``: glibc and musl on these machines). Elsewhere the kernel's
#: view of the handler is not read and only Python's is checked.
_SA_RESTART = 0x10000000
_SIGACTION_CHECKED = ("x86_64", "aarch64")

#: What :meth:`ThreadTimer.state` finds.
OURS, RESET, NO_RESTART, FOREIGN = "ours", "reset", "no_restart", "foreign"

_NOTHING, _RESTART_FLAG, _REINSTALL = 0, 1, 2  # StackSampler._pending


class ForeignHandler(Exception):
    """The program (or a library) handles the timer signal itself; the sampler must not."""


class ThreadTimer:
    """A POSIX per-thread timer (Linux ``timer_create`` with ``SIGEV_THREAD_ID``) that sends
    :data:`TIMER_SIGNAL` (``SIGURG``) to one thread every ``period_s`` seconds of wall time.

    Only that thread is interrupted; the process-wide ``ITIMER_*`` timers and ``alarm()`` stay
    free for the user's code. The handler is installed with ``SA_RESTART``
    (``signal.siginterrupt(sig, False)``) so an interrupted system call resumes.

    Args:
        native_tid: kernel thread id of the thread to interrupt (``threading.get_native_id()``).
        period_s: seconds between two signals (> 0).
        handler: the Python signal handler ``handler(signum, frame)``.
    Errors:
        ForeignHandler: ``SIGURG`` already has a handler that is not ``SIG_DFL``/``SIG_IGN``
            (set from Python, or from C: ``signal.getsignal`` returns None).
        OSError / ValueError / AttributeError: unsupported (not Linux, not the main thread, no
            ``timer_create``); callers fall back to a sampling thread.
    """

    def __init__(self, native_tid: int, period_s: float, handler) -> None:
        if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
            raise OSError("per-thread timer signals need Linux and the main thread")
        if TIMER_SIGNAL is None:
            raise OSError("no SIGURG on this platform")
        libc = None
        for name in (None, "librt.so.1"):
            candidate = ctypes.CDLL(name, use_errno=True)
            if hasattr(candidate, "timer_create"):
                libc = candidate
                break
        if libc is None:
            raise OSError("timer_create not found")
        self._libc = libc
        self._close_lock = threading.Lock()  # close() may come from the flusher and at exit at once
        self._timer = None
        self.signum = TIMER_SIGNAL
        previous = signal.getsignal(self.signum)
        if getattr(previous, "__func__", None) is StackSampler._on_signal:
            # another of whyidle's samplers (PyTorch's and Keras's instrumentation in one process)
            raise OSError("the timer signal is taken by another whyidle stack sampler")
        if previous not in (signal.SIG_DFL, signal.SIG_IGN):
            raise ForeignHandler(f"signal {self.signum} already has a handler: {previous!r}")
        self._previous = previous
        self._handler = handler
        self._action = None  # a struct sigaction buffer when the kernel's view can be read
        self._c_handler = None  # the address Python installs for every Python-level handler
        if os.uname().machine in _SIGACTION_CHECKED and hasattr(libc, "sigaction"):
            self._action = ctypes.create_string_buffer(256)
            try:
                addr, _flags = self._kernel_action()
            except OSError:
                self._action = None
            else:
                # Python's table is read once at start-up: a C library loaded since (a Go
                # runtime, which preempts with SIGURG) shows only in the kernel's view.
                if addr not in (None, 0, 1):
                    raise ForeignHandler(f"signal {self.signum} has a handler set from C")
        signal.signal(self.signum, handler)
        signal.siginterrupt(self.signum, False)
        if self._action is not None:
            try:
                addr, flags = self._kernel_action()
                if addr in (None, 0, 1) or not flags & _SA_RESTART:
                    self._action = None  # not the layout we expect: trust Python's view only
                else:
                    self._c_handler = addr
            except Exception:
                self._action = None
        event = _Sigevent(sigev_signo=self.signum, sigev_notify=_SIGEV_THREAD_ID, sigev_tid=native_tid)
        timer = ctypes.c_void_p()
        if libc.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
            errno = ctypes.get_errno()
            signal.signal(self.signum, previous)
            raise OSError(errno, "timer_create failed")
        self._timer = timer
        sec, frac = divmod(period_s, 1.0)
        spec = _Timespec(int(sec), int(frac * 1e9))
        self._spec = _Itimerspec(spec, spec)
        self._cur = _Itimerspec()  # timer_gettime's answer (armed())
        self.armed_at = time.monotonic()
        if libc.timer_settime(self._timer, 0, ctypes.byref(self._spec), None) != 0:
            errno = ctypes.get_errno()
            self.close()
            raise OSError(errno, "timer_settime failed")

    def _kernel_action(self) -> tuple[int | None, int]:
        """``(sa_handler address, sa_flags)`` of the signal as the kernel has it (any thread)."""
        buf = self._action
        if self._libc.sigaction(self.signum, None, buf) != 0:
            raise OSError(ctypes.get_errno(), "sigaction failed")
        addr = ctypes.c_void_p.from_buffer(buf, 0).value
        flags = ctypes.c_int.from_buffer(buf, ctypes.sizeof(ctypes.c_void_p) + 128).value
        return addr, flags

    def state(self) -> str:
        """Where the signal's handler stands; safe from any thread (one ``sigaction`` read).

        Returns :data:`OURS`; :data:`RESET` (``SIG_DFL``/``SIG_IGN``, in Python's table or the
        kernel's); :data:`NO_RESTART` (ours, but set again by ``signal.signal``, which drops
        ``SA_RESTART``); :data:`FOREIGN` (another Python handler, or a C handler installed
        behind Python's back).
        """
        current = signal.getsignal(self.signum)
        if current is not self._handler:
            return RESET if current in (signal.SIG_DFL, signal.SIG_IGN) else FOREIGN
        if self._action is None:
            return OURS
        try:
            addr, flags = self._kernel_action()
        except Exception:
            return OURS
        if addr != self._c_handler:
            return RESET if addr in (None, 0, 1) else FOREIGN
        return OURS if flags & _SA_RESTART else NO_RESTART

    def reinstall(self) -> None:
        """Sets our handler again, with ``SA_RESTART``. Main thread only.

        Errors: ``ValueError`` outside the main thread; ``OSError`` from ``sigaction``.
        """
        signal.signal(self.signum, self._handler)
        signal.siginterrupt(self.signum, False)

    def rearm(self) -> None:
        """Starts the timer's period again (any thread; nothing when deleted).

        Needed after a reset: Linux stops delivering a periodic timer's signal once a tick finds
        it ignored (or discards it pending when the handler is set to ignore), and installing a
        handler again does not restart it when the disposition was ``SIG_DFL`` (only ``SIG_IGN``
        is tracked). Errors: ``OSError`` when ``timer_settime`` fails.
        """
        with self._close_lock:
            if self._timer is None:
                return
            self.armed_at = time.monotonic()
            if self._libc.timer_settime(self._timer, 0, ctypes.byref(self._spec), None) != 0:
                raise OSError(ctypes.get_errno(), "timer_settime failed")

    def armed(self) -> bool:
        """True while the timer runs as far as the kernel says (any thread): False once deleted or
        disarmed on purpose (``timer_settime`` with zero, as ``benchmarks/hook_cost.py`` does).
        A timer stopped by an ignored tick still counts as armed. Errors: ``OSError``."""
        with self._close_lock:
            if self._timer is None:
                return False
            cur = self._cur
            if self._libc.timer_gettime(self._timer, ctypes.byref(cur)) != 0:
                raise OSError(ctypes.get_errno(), "timer_gettime failed")
            return bool(cur.it_value.tv_sec or cur.it_value.tv_nsec)

    def delete(self) -> None:
        """Deletes the timer (idempotent, any thread); the handler is left as it is."""
        with self._close_lock:
            timer, self._timer = self._timer, None
            if timer is not None:
                self._libc.timer_delete(timer)

    def close(self) -> None:
        """Deletes the timer, then puts back the disposition found at start (``SIG_DFL``, or
        ``SIG_IGN`` if it was ignored), only if the handler is still ours and only from the main
        thread (elsewhere the handler stays, inert). A tick still in flight is harmless: the
        default action of ``SIGURG`` is to ignore it."""
        self.delete()
        try:
            if (threading.current_thread() is threading.main_thread()
                    and signal.getsignal(self.signum) is self._handler):
                signal.signal(self.signum, self._previous)
        except (OSError, ValueError):
            pass


class PhaseMap:
    """The step phase of a stack, from its frames, for samples of steps whose phase hooks are out.

    On short steps the PyTorch instrumentation keeps its phase hooks in only one step in k (the
    detail stride); the others report phase ``"lite"``. Their samples get the phase the hooks
    would have given, read from the stack: the innermost frame of a known entry point decides
    (``codes``: the original ``DataLoader`` iterator ``__next__``/``__iter__`` → ``data``,
    ``Module._call_impl`` → ``forward``, or ``eval`` when grad is off, ``torch.autograd.backward`` →
    ``backward``, the optimizer's step wrapper → ``optimizer``); code outside ``torch`` between an
    optimizer step and the sampled frame is a closure (Lightning's ``training_step``), which the
    hooks count as host work (``other``); no entry point on the stack: ``other``.

    Args:
        codes: code object → phase name.
        grad_enabled: ``torch.is_grad_enabled`` (read in the sampled thread), None: never ``eval``.
    """

    def __init__(self, codes: dict, grad_enabled=None) -> None:
        self.codes = codes
        self.grad_enabled = grad_enabled

    def phase_of(self, frame, classify) -> str:
        """The phase of the stack ending in ``frame``; ``classify`` is
        :meth:`FrameClassifier.classify`. Never raises into the sampled thread (``other`` then)."""
        try:
            closure = False
            while frame is not None:
                code = frame.f_code
                phase = self.codes.get(code)
                if phase is not None:
                    if phase == "optimizer" and closure:
                        return "other"
                    if phase == "forward" and self.grad_enabled is not None and not self.grad_enabled():
                        return "eval"
                    return phase
                if not closure:
                    kind, label = classify(code.co_filename)
                    closure = kind != 2 and not label.startswith("torch/")
                frame = frame.f_back
        except Exception:
            pass
        return "other"


class StackSampler:
    """Samples one thread's stack ``hz`` times per second of wall time.

    Two tick sources, the first that works: a per-thread ``SIGURG`` timer (:class:`ThreadTimer`),
    whose handler runs in the training thread itself at the next bytecode and reads its frame
    without any GIL hand-off; else a daemon thread reading ``sys._current_frames()``. The thread
    fallback is biased: it needs the GIL, and a training thread that keeps releasing and
    re-taking it briefly (``torch.tensor`` on every sample) starves it until a long release, so
    its samples cluster at those points. ``mode`` says which source ran.

    In signal mode, :meth:`drain` (the flusher thread) also checks the handler (module
    docstring): a reset one is re-installed by :meth:`maybe_reinstall`, which the
    instrumentation calls in the training thread at each step boundary; a program's own handler
    makes the sampler switch to the thread for good, with one notice.

    Args:
        thread_id: ``threading.get_ident()`` of the training thread.
        hz: samples per second (> 0).
        phase_of: callable returning the current phase name (read without locking).
        max_sites: see :data:`MAX_SITES_PER_FLUSH`.
        native_id: the training thread's kernel thread id (``threading.get_native_id()``), needed
            for the timer signal; None forces the thread fallback.
        on_sample: ``on_sample(user_site, leaf_site, weight_s, phase)`` called after each sample
            (in the sampled thread in signal mode; the GPU timeline records a probe there).
        notify: ``notify(message)`` says something to the user once (``Agent.notice``); None:
            the process's agent (:func:`whyidle.instrument.agent.current`), if any.
        phases: a :class:`PhaseMap` telling the phase from the stack when ``phase_of`` says
            ``"lite"`` (a step whose phase hooks are out, see ``whyidle.instrument.torch``).
        until: thread mode only: ``until()`` is checked before each tick and ends the sampling
            when true (a process found to be a helper, :mod:`whyidle.instrument.startup`).
        import_phase: when set, a sample whose frames below the innermost user frame include
            ``importlib`` (a library module being imported) is counted under this phase instead.
        user_frames: user-code frames kept per sample (:data:`USER_FRAMES`).
    """

    def __init__(self, thread_id: int, hz: float, phase_of, max_sites: int = MAX_SITES_PER_FLUSH,
                 native_id: int | None = None, on_sample=None, notify=None, phases: "PhaseMap | None" = None,
                 until=None, import_phase: str | None = None, user_frames: int = USER_FRAMES) -> None:
        self.thread_id = thread_id
        self.native_id = native_id
        self.hz = hz
        self.phase_of = phase_of
        self.phases = phases
        self.max_sites = max_sites
        self.on_sample = on_sample
        self.notify = notify
        self.until = until
        self.import_phase = import_phase
        self.user_frames = user_frames
        self.classifier = FrameClassifier()
        self.mode = None
        self._counts: dict[tuple, list] = {}  # key -> [count, weight_s]
        self._n = 0
        self._last = None
        self._timer: ThreadTimer | None = None
        self._timer_signum = TIMER_SIGNAL
        self._handler = self._on_signal  # one bound method: the handler's identity is checked
        self._pending = _NOTHING  # set by the flusher (drain), acted on in the main thread
        self._main_ident = threading.main_thread().ident
        self._lost = 0  # timer ticks lost to a reset handler since the last drain
        self._lost_s = 0.0
        self._stepped_aside = False
        self._started: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="whyidle-stacks", daemon=True)

    def start(self) -> None:
        """Starts sampling: the timer signal when possible, else the sampling thread."""
        self._started = time.monotonic()
        if self.native_id is not None and self.thread_id == threading.main_thread().ident:
            try:
                self._timer = ThreadTimer(self.native_id, 1.0 / self.hz, self._handler)
                self._timer_signum = self._timer.signum
                self.mode = "signal"
                return
            except ForeignHandler:
                self._timer = None
                self._stepped_aside = True
                self._say(_STEP_ASIDE_MSG)
            except (OSError, ValueError, AttributeError):
                self._timer = None
        self.mode = "thread"
        self._thread.start()

    def maybe_reinstall(self) -> None:
        """Re-installs a reset timer-signal handler; call it from the training (main) thread at
        each step boundary. One attribute test when nothing is pending; never raises."""
        if self._pending:
            self._reinstall()

    def _reinstall(self) -> None:
        if threading.get_ident() != self._main_ident:
            return  # only the main thread may set a handler; the flag waits for it
        try:
            timer = self._timer
            if timer is not None and not self._stop.is_set():
                state = timer.state()
                if state == FOREIGN:
                    self._step_aside()
                elif state != OURS or self._pending == _REINSTALL:
                    # counted first: a tick may run the handler as soon as it is back
                    self._count_lost()
                    if state != OURS:
                        timer.reinstall()
                    # a tick that found the handler reset stopped the timer (ThreadTimer.rearm);
                    # a handler set again may have been reset in between unseen
                    timer.rearm()
            self._pending = _NOTHING
        except Exception as exc:  # cannot re-install: sample from a thread rather than not at all
            self._pending = _NOTHING
            self._step_aside(f"whyidle's stack sampler could not re-install its SIGURG handler ({exc!r}); "
                             "it samples from a thread now")

    def _count_lost(self) -> None:
        """Counts the ticks missed since the last sample (the one in flight aside) and restarts
        the weighting clock, so the gap is not attributed to the next sample's frame."""
        now = time.monotonic()
        last = self._last if self._last is not None else self._started
        if last is not None:
            lost = int((now - last) * self.hz) - 1
            if lost > 0:
                self._lost += lost
                self._lost_s += lost / self.hz
        self._last = now

    def _check(self) -> None:
        """The flusher's look at the handler (any thread): raises the flag for the main thread,
        or steps aside when the program handles the signal itself."""
        timer = self._timer
        if timer is None or self._pending or self._stop.is_set():
            return
        state = timer.state()
        if state == RESET:
            self._pending = _REINSTALL
        elif state == NO_RESTART:
            self._pending = _RESTART_FLAG
        elif state == FOREIGN:
            self._step_aside()
        else:
            last = self._last
            if time.monotonic() - max(last or 0.0, timer.armed_at) > STALL_S and timer.armed():
                # Ours, yet no tick for a while: a reset and restore between two checks may have
                # stopped the timer (or the thread is inside one long C call; re-arming then only
                # shifts the ticks' phase). A timer disarmed on purpose stays disarmed.
                timer.rearm()

    def _step_aside(self, msg: str | None = None) -> None:
        """Deletes the timer (the program's handler is never touched) and samples from a thread."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.delete()
        self._pending = _NOTHING
        self._last = None
        if not self._stepped_aside:
            self._stepped_aside = True
            self._say(msg or _STEP_ASIDE_MSG)
        if self.mode == "signal" and not self._stop.is_set():
            self.mode = "thread"
            try:
                self._thread.start()
            except RuntimeError:
                pass

    def _say(self, msg: str) -> None:
        try:
            notify = self.notify
            if notify is None:
                from whyidle.instrument.agent import current

                agent = current()
                notify = agent.notice if agent is not None else None
            if notify is not None:
                notify(msg)
        except Exception:
            pass

    def stop(self) -> None:
        """Stops sampling; joins the thread (called at exit, before interpreter finalization)."""
        self._stop.set()
        timer, self._timer = self._timer, None
        if timer is not None:
            try:
                if self._pending == _REINSTALL or timer.state() == RESET:
                    self._count_lost()  # reset and never re-installed: those ticks are lost too
            except Exception:
                pass
            self._pending = _NOTHING
            timer.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _weight(self) -> float:
        now = time.monotonic()
        weight = 1.0 / self.hz if self._last is None else min(now - self._last, MAX_SAMPLE_WEIGHT_S)
        self._last = now
        return weight

    def _on_signal(self, signum, frame) -> None:
        try:  # never raise into the training thread
            if frame is not None and not self._stop.is_set():
                self.sample(frame, self.phase_of(), self._weight())
        except Exception:
            pass

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
            try:
                if self.until is not None and self.until():
                    break
                frame = sys._current_frames().get(self.thread_id)
                weight = self._weight()
                if frame is not None:
                    self.sample(frame, self.phase_of(), weight)
            except Exception:  # one bad sample must not end the sampling thread
                pass

    def sample(self, frame, phase: str, weight_s: float | None = None) -> None:
        """Counts one sample of ``frame``'s stack under ``phase``, standing for ``weight_s``
        seconds (default one period). Also used by tests."""
        classify = self.classifier.classify
        if phase.endswith("lite") and self.phases is not None:  # "lite", or "<region>:lite"
            inner = self.phases.phase_of(frame, classify)
            phase = inner if phase == "lite" else phase[:-4] + inner
        leaf = None
        users: list[str] = []
        importing = self.import_phase is not None
        depth = self.user_frames
        while frame is not None and len(users) < depth:
            code = frame.f_code
            kind, label = classify(code.co_filename)
            if importing and not users and (label.startswith("<frozen importlib") or label.startswith("importlib/_boot")):
                phase = self.import_phase
                importing = False
            # only the innermost frame and the user's frames become sites: a framework's stack
            # (Lightning: ~35 library frames above training_step) is walked, not formatted
            if kind == 0 or (kind == 1 and leaf is None):
                site = f"{label}:{line_of(frame)} {code.co_name}"
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
        ``user_frames - 1``). ``lost``/``lost_s``: timer ticks (and seconds) missed because a
        library reset the handler. Runs in the flusher thread, which then checks the handler
        (:meth:`_check`); never raises."""
        out = []
        if self._n or self._lost:
            counts, self._counts = self._counts, {}
            n, self._n = self._n, 0
            lost, self._lost = self._lost, 0
            lost_s, self._lost_s = self._lost_s, 0.0
            sites = [[phase, users[0] if users else None, leaf, c, round(w * 1000, 3), list(users[1:])]
                     for (phase, users, leaf), (c, w) in counts.items()]
            out.append({"k": "stacks", "t": time.monotonic_ns(), "hz": self.hz, "n": n, "mode": self.mode,
                        "lost": lost, "lost_s": round(lost_s, 3), "sites": sites})
        try:
            self._check()
        except Exception:
            pass
        return out


_STEP_ASIDE_MSG = ("the program handles SIGURG itself: whyidle's stack sampler stopped its SIGURG timer, leaves "
                   "that handler alone and samples from a thread now (biased towards points where the training "
                   "thread releases the GIL)")
