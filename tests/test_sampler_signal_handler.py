"""The stack sampler's SIGURG timer against programs that touch signal handlers (issue 12).

A library that resets the handler (Lightning restores every handler it saved at ``fit`` start)
must cost samples, never the process; the flusher thread notices, the main thread re-installs at
the next step boundary and the lost ticks are counted; a program's own SIGURG handler makes the
sampler step aside for good, with one notice.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from whyidle.instrument import stacks as stacks_mod
from whyidle.instrument.stacks import StackSampler
from whyidle.run import launcher

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="per-thread timer signals are Linux-only")

SIGURG = signal.SIGURG
KERNEL_VIEW = os.uname().machine in stacks_mod._SIGACTION_CHECKED


def _busy(seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(1000))


def _drain_in_thread(sampler):
    """What the agent's flusher does every 0.5 s, from another thread."""
    out = []
    t = threading.Thread(target=lambda: out.extend(sampler.drain()))
    t.start()
    t.join()
    return out


@pytest.fixture
def sampler():
    assert signal.getsignal(SIGURG) == signal.SIG_DFL
    notes: list[str] = []
    s = StackSampler(threading.get_ident(), 100, lambda: "other", native_id=threading.get_native_id(),
                     notify=notes.append)
    s.notes = notes
    yield s
    s.stop()
    if signal.getsignal(SIGURG) != signal.SIG_DFL:
        signal.signal(SIGURG, signal.SIG_DFL)


def _sa_restart() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)
    assert libc.sigaction(SIGURG, None, buf) == 0
    return bool(ctypes.c_int.from_buffer(buf, ctypes.sizeof(ctypes.c_void_p) + 128).value
                & stacks_mod._SA_RESTART)


@pytest.mark.parametrize("reset_to", [signal.SIG_DFL, signal.SIG_IGN])
def test_reset_handler_is_flagged_by_the_flusher_and_reinstalled_in_the_main_thread(sampler, reset_to):
    sampler.start()
    assert sampler.mode == "signal" and signal.getsignal(SIGURG) is sampler._handler
    _busy(0.2)
    (first,) = _drain_in_thread(sampler)
    assert first["n"] >= 5 and first["lost"] == 0
    signal.signal(SIGURG, reset_to)  # what Lightning's teardown does to a handler it did not see
    _busy(0.3)  # no samples: the ticks are ignored, the process lives
    out = _drain_in_thread(sampler)  # the flag is raised; nothing counted as lost yet
    assert all(r["n"] <= 1 and r["lost"] == 0 for r in out)  # (one tick may have been in flight)
    assert sampler._pending == stacks_mod._REINSTALL
    assert signal.getsignal(SIGURG) == reset_to  # the flusher never sets a handler
    sampler.maybe_reinstall()  # the next step boundary, in the main thread
    assert sampler._pending == stacks_mod._NOTHING
    assert signal.getsignal(SIGURG) is sampler._handler
    if KERNEL_VIEW:
        assert _sa_restart()
    _busy(0.3)
    (after,) = _drain_in_thread(sampler)
    assert after["mode"] == "signal" and after["n"] >= 10
    assert 20 <= after["lost"] <= 60 and 0.2 <= after["lost_s"] <= 0.6
    # the gap is not attributed to the first sample after the re-install
    assert sum(site[4] for site in after["sites"]) / 1000 <= 0.4
    assert sampler.notes == []
    sampler.stop()
    assert signal.getsignal(SIGURG) == signal.SIG_DFL


@pytest.mark.skipif(not KERNEL_VIEW, reason="the kernel's view of the handler is read on x86_64/aarch64 only")
def test_handler_set_again_by_signal_signal_gets_sa_restart_back_without_lost_ticks(sampler):
    sampler.start()
    assert _sa_restart()
    signal.signal(SIGURG, signal.getsignal(SIGURG))  # a library restoring what it saved: drops SA_RESTART
    assert not _sa_restart()
    _drain_in_thread(sampler)
    assert sampler._pending == stacks_mod._RESTART_FLAG
    sampler.maybe_reinstall()
    assert _sa_restart() and signal.getsignal(SIGURG) is sampler._handler
    _busy(0.1)
    (r,) = _drain_in_thread(sampler)
    assert r["lost"] <= 5  # only the gap since the last sample, nothing like a reset's


@pytest.mark.skipif(not KERNEL_VIEW, reason="the kernel's view of the handler is read on x86_64/aarch64 only")
def test_handler_reset_from_c_behind_pythons_back_is_reinstalled(sampler):
    sampler.start()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal(SIGURG, ctypes.c_void_p(0))  # SIG_DFL set by a C library: Python's table still says ours
    assert signal.getsignal(SIGURG) is sampler._handler
    _busy(0.1)
    _drain_in_thread(sampler)
    assert sampler._pending == stacks_mod._REINSTALL
    sampler.maybe_reinstall()
    _busy(0.2)
    (r,) = _drain_in_thread(sampler)
    assert r["n"] >= 5 and r["lost"] >= 5


def test_maybe_reinstall_outside_the_main_thread_waits_for_it(sampler):
    sampler.start()
    signal.signal(SIGURG, signal.SIG_DFL)
    _drain_in_thread(sampler)
    errors = []

    def other():
        try:
            sampler.maybe_reinstall()
        except BaseException as exc:  # pragma: no cover - the assertion below says it
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == [] and sampler._pending == stacks_mod._REINSTALL
    assert signal.getsignal(SIGURG) == signal.SIG_DFL
    sampler.maybe_reinstall()
    assert signal.getsignal(SIGURG) is sampler._handler


def test_programs_own_handler_at_start_means_thread_mode_and_one_notice(sampler):
    calls = []

    def mine(signum, frame):
        calls.append(signum)

    signal.signal(SIGURG, mine)
    try:
        sampler.start()
        assert sampler.mode == "thread" and sampler._timer is None
        _busy(1.0)  # the thread needs the GIL and a core: on a loaded box it may wait a while
        got = _drain_in_thread(sampler)
        assert got, (sampler._thread.is_alive(), sampler._stop.is_set(), sampler._n, sampler.mode)
        (r,) = got
        assert r["mode"] == "thread" and r["n"] >= 2  # a thread needs the GIL: few on a loaded box
        sampler.maybe_reinstall()
        sampler.stop()
        assert signal.getsignal(SIGURG) is mine
        assert calls == []  # no timer ever sent it a tick
        assert len(sampler.notes) == 1 and "SIGURG" in sampler.notes[0]
    finally:
        signal.signal(SIGURG, signal.SIG_DFL)


def test_programs_own_handler_later_makes_the_sampler_step_aside(sampler):
    calls = []

    def mine(signum, frame):
        calls.append(signum)

    sampler.start()
    _busy(0.2)
    try:
        signal.signal(SIGURG, mine)
        (r,) = _drain_in_thread(sampler)  # the samples taken so far, still from the timer
        assert r["mode"] == "signal"
        assert sampler.mode == "thread" and sampler._timer is None  # stepped aside
        assert sampler._thread.is_alive()
        n_calls = len(calls)
        _busy(0.3)
        assert len(calls) <= n_calls + 1  # the timer is gone (one tick may have been in flight)
        for _ in range(3):
            sampler.maybe_reinstall()
            _drain_in_thread(sampler)
        assert signal.getsignal(SIGURG) is mine
        sampler.stop()
        assert signal.getsignal(SIGURG) is mine  # stop never touches the program's handler
    finally:
        signal.signal(SIGURG, signal.SIG_DFL)
    assert len(sampler.notes) == 1 and "handles SIGURG itself" in sampler.notes[0]


def test_thread_mode_keeps_sampling_after_stepping_aside(sampler):
    sampler.start()
    signal.signal(SIGURG, lambda s, f: None)
    try:
        _drain_in_thread(sampler)
        assert sampler.mode == "thread"
        _busy(1.0)  # the thread needs the GIL and a core: on a loaded box it may wait a while
        got = _drain_in_thread(sampler)
        assert got, (sampler._thread.is_alive(), sampler._stop.is_set(), sampler._n, sampler.mode)
        (r,) = got
        assert r["mode"] == "thread" and r["n"] >= 2
    finally:
        sampler.stop()
        signal.signal(SIGURG, signal.SIG_DFL)


def test_signal_handler_never_raises_into_the_training_thread():
    def broken_phase():
        raise RuntimeError("phase_of failed")

    s = StackSampler(threading.get_ident(), 100, broken_phase, native_id=threading.get_native_id())
    s.start()
    try:
        assert s.mode == "signal"
        _busy(0.2)  # ticks arrive; the handler swallows the error
        s._handler(SIGURG, sys._getframe())
    finally:
        s.stop()


def test_reset_never_reinstalled_counts_lost_ticks_at_stop(sampler):
    sampler.start()
    _busy(0.1)
    _drain_in_thread(sampler)
    signal.signal(SIGURG, signal.SIG_DFL)
    _busy(0.3)
    sampler.stop()  # at exit, before the final flush
    (r,) = sampler.drain()
    assert r["n"] <= 1 and 20 <= r["lost"] <= 60  # (one tick may have been in flight)
    assert signal.getsignal(SIGURG) == signal.SIG_DFL


# -- launcher: any signal number, never a traceback --------------------------------------------------

def test_signal_name_is_total():
    assert launcher.signal_name(signal.SIGINT) == "SIGINT"
    assert launcher.signal_name(signal.SIGRTMIN + 4) == "SIGRTMIN+4"
    assert launcher.signal_name(999) == "signal 999"


@pytest.mark.parametrize("signum, code", [
    (int(signal.SIGRTMIN) + 5, None),  # re-raised: the shell sees 128+N
    (int(signal.SIGTERM), None),
    (int(signal.SIGABRT), 128 + int(signal.SIGABRT)),  # core-dumping: exit 128+N, no core of ours
    (int(signal.SIGURG), 128 + int(signal.SIGURG)),  # its default action ignores it: exit 128+N
])
def test_whyidle_exit_maps_every_signal(signum, code):
    prog = ("from whyidle.run.launcher import ChildExit\n"
            f"ChildExit(None, {signum}, False).whyidle_exit()\n")
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == (-signum if code is None else code)
    shell = subprocess.run(["sh", "-c", f'"{sys.executable}" -c \'{prog}\'; echo $?'], capture_output=True,
                           text=True, timeout=60)
    assert shell.stdout.strip() == str(128 + signum)


def test_forwarding_handler_never_raises():
    child = launcher.Child([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ))
    try:
        child._on_signal(int(signal.SIGRTMIN) + 5, None)  # not a signal.Signals member
        assert child.wait(30)
        assert child.exit_status().signal == int(signal.SIGRTMIN) + 5
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
        child.restore_signals()


def test_quick_reset_and_restore_between_two_checks_restarts_the_timer(sampler):
    """A tick that finds the handler reset stops a periodic timer for good (Linux), even when the
    handler is set back before the flusher looks: the sampler re-arms it."""
    sampler.start()
    _busy(0.1)
    _drain_in_thread(sampler)
    signal.signal(SIGURG, signal.SIG_DFL)
    _busy(0.05)  # a tick finds it ignored
    signal.signal(SIGURG, sampler._handler)  # restored, unseen by the flusher
    signal.siginterrupt(SIGURG, False)  # even with SA_RESTART back, only a stall check can tell
    _busy(stacks_mod.STALL_S + 0.2)  # (Linux >= 6.13 stopped the timer; older kernels kept it)
    _drain_in_thread(sampler)  # the flusher: ours, but no sample for over STALL_S: re-arm
    _busy(0.3)
    (r,) = _drain_in_thread(sampler)
    assert r["n"] >= 10 and r["mode"] == "signal"


@pytest.mark.skipif(not KERNEL_VIEW, reason="the kernel's view of the handler is read on x86_64/aarch64 only")
def test_handler_set_from_c_before_start_means_step_aside(sampler):
    """Python's handler table is read once at start-up; a C library (a Go runtime) that installs
    a SIGURG handler later shows only in the kernel's view, and must be left alone."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int)
    c_handler = handler_type(lambda signum: None)
    old = libc.signal(SIGURG, ctypes.cast(c_handler, ctypes.c_void_p))
    try:
        assert signal.getsignal(SIGURG) == signal.SIG_DFL  # Python does not know
        sampler.start()
        assert sampler.mode == "thread" and sampler._timer is None
        assert len(sampler.notes) == 1
        sampler.stop()
        buf = ctypes.create_string_buffer(256)
        libc.sigaction(SIGURG, None, buf)
        assert ctypes.c_void_p.from_buffer(buf, 0).value == ctypes.cast(c_handler, ctypes.c_void_p).value
    finally:
        libc.signal(SIGURG, old)


def test_a_timer_disarmed_on_purpose_stays_disarmed(sampler):
    """benchmarks/hook_cost.py pauses the sampler with timer_settime(0): no stall re-arm then."""
    sampler.start()
    timer = sampler._timer
    zero = stacks_mod._Itimerspec()
    assert timer._libc.timer_settime(timer._timer, 0, ctypes.byref(zero), None) == 0
    assert not timer.armed()
    _busy(stacks_mod.STALL_S + 0.2)
    _drain_in_thread(sampler)
    _busy(0.2)
    assert _drain_in_thread(sampler) == [] and not timer.armed()


def test_a_second_whyidle_sampler_falls_back_to_a_thread_silently(sampler):
    """PyTorch's and Keras's instrumentation may both sample one process: the second one is not
    "the program's own handler" (no notice) and leaves the first one's timer alone."""
    sampler.start()
    second = StackSampler(threading.get_ident(), 100, lambda: "other", native_id=threading.get_native_id(),
                          notify=sampler.notes.append)
    second.start()
    try:
        assert second.mode == "thread" and sampler.mode == "signal"
        assert sampler.notes == []
        _busy(0.2)
        (r,) = _drain_in_thread(sampler)
        assert r["n"] >= 5 and sampler.mode == "signal"
    finally:
        second.stop()
    assert signal.getsignal(SIGURG) is sampler._handler
