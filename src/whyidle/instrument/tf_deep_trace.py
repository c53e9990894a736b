"""On-demand deep traces of Keras on the TensorFlow backend (issue 34): a TensorFlow profiler
window of N train-function calls, opened when the ``whyidle run`` process asks for one in
``RUN_DIR/control/trace.json`` (the request, its polling and addressing:
:mod:`whyidle.instrument.trace_requests`, shared with the PyTorch window of
:mod:`whyidle.instrument.deep_trace`).

:meth:`KerasDeepTrace.boundary` runs at the training batch begins of ``fit`` (the train-function
call boundary, where :meth:`whyidle.instrument.keras.KerasInstrument.on_batch_begin` starts a
``keras`` step) only once the clock it already read passes :attr:`KerasDeepTrace.due`: one
comparison per batch, one ``os.stat`` at most once a second. A request addressed to this
process:

- waits while whyidle's own start-of-fit profiler window (:class:`whyidle.instrument.tfprof.ProfilerWindow`)
  has not run or is open, then is served at the first batch begin after it;
- is not served when a profiler of the program's runs or is due (a session started with
  ``tf.profiler.experimental.start`` / ``tf.summary.trace_on(profiler=True)``, or a ``TensorBoard``
  callback of this ``fit`` whose ``profile_batch`` range has not ended): a ``trace_window``
  record with :data:`STEPPED_ASIDE`;
- else starts the TensorFlow profiler (TensorFlow's default options) into
  ``RUN_DIR/traces/<id>-<pid>/`` (``<id>-rank<R>-<pid>`` under a launcher that sets ``RANK``; a
  TensorBoard log dir: ``plugins/profile/<run>/<host>.xplane.pb``) at that batch begin and stops
  it, saving, at the batch begin after the request's N train-function calls (default 10, at most
  200); the start and the stop-and-save run on the training thread between two steps (in no
  step, as the start-of-fit window's do). The flusher thread then reads the trace with
  :func:`whyidle.instrument.tfprof.summarize_xspace` and writes one ``trace_window`` record with
  ``method: "tf_profiler"``, each traced call's ``[duration_ns, get_next_ns]`` and the tf.data
  stages (docs/run-format.md).

The program's own profiler wins: its start while whyidle's window is open
(:meth:`KerasDeepTrace.program_starts`, from the wrapper of ``profiler_v2.start`` in
:mod:`whyidle.instrument.keras`) stops whyidle's window first, discarding it (TensorFlow's
profiler session is process-wide: it can be stopped from the starting thread). A ``fit`` that
ends inside the window closes it and keeps what was traced (the record's ``error`` says so).
On the JAX and torch backends a request gets one record with :data:`NEEDS_TF` (there is no
TensorFlow profiler to open). Every error ends in a record or one notice, never in the program.
"""

from __future__ import annotations

import os
import threading
from time import monotonic_ns

from whyidle.instrument import tfprof
from whyidle.instrument.trace_requests import POLL_NS, TRACES_DIR, Requests, launcher_place, reason_of, trace_name

STEPPED_ASIDE = "the program's own profiler is running: whyidle stepped aside"
DISCARDED = "the program started its own profiler: whyidle's window was stopped and discarded"
NEEDS_TF = "deep traces of Keras need the TensorFlow backend (this run: {backend})"
#: Mode of the trace files and folders (as whyidle's own files: their owner's only).
FILE_MODE, DIR_MODE = 0o600, 0o700

_NEVER = 1 << 62  # a due time never reached: deep traces off in this process


class KerasDeepTrace:
    """The Keras/TensorFlow deep-trace state of one process (see the module docstring).

    Args:
        agent: the process's :class:`whyidle.instrument.agent.Agent` (run directory, records,
            collectors: the saved window is read on the flusher thread).
        inst: the :class:`whyidle.instrument.keras.KerasInstrument` (``backend``, ``window``: the
            start-of-fit profiler window, ``tb_profilers``: this fit's profiling ``TensorBoard``
            callbacks, ``last_end``: the end of the last ``keras`` step, monotonic ns).
    """

    def __init__(self, agent, inst) -> None:
        self.agent = agent
        self.inst = inst
        self.requests = Requests(agent.run_dir, agent.t_start, launcher_place)
        self.due = 0  # monotonic ns from which a batch begin calls boundary()
        self.lock = threading.RLock()  # the program's profiler may start on another thread
        self.state = "idle"  # idle → pending (a request waits for the start-of-fit window) → open → idle
        self.req: dict = {}
        self.steps = 0
        self.rank: int | None = None
        self.world: int | None = None
        self.t0 = 0
        self.first_call = 0
        self.first_step = 0
        self.logdir = ""
        self.saved: list[dict] = []  # windows stopped and saved, for the flusher thread to read
        agent.collectors.append(self.drain)
        agent.on_exit.append(self.at_exit)

    # -- the training thread's batch begins ------------------------------------------------------
    def boundary(self, calls: int, step: int, now: int) -> int:
        """A training batch begin at monotonic ``now`` (ns), once ``now`` passed :attr:`due`;
        ``calls``: the train-function calls done so far, ``step``: the index of the step that starts
        here. Looks for a request, opens a waiting one, or ends the open window after its calls.
        Returns the time the step starting here starts: ``now``, or the clock after the profiler's
        start or stop-and-save. Never raises."""
        with self.lock:
            try:
                if self.state == "open":
                    if calls - self.first_call < self.steps:
                        return now
                    return self._close(self._last_end(now), calls, None)
                if self.state == "idle":
                    self.due = now + POLL_NS
                    req = self.requests.look()
                    if req is None:
                        return now
                    self.req, self.steps = req, self.requests.serve(req)
                    self.rank, self.world = launcher_place()
                    if self.inst.backend != "tensorflow":
                        self.first_step = step
                        self._record(now, now, 0, NEEDS_TF.format(backend=self.inst.backend or "unknown"),
                                     method=None)
                        return now
                    self.state = "pending"
                return self._open(calls, step, now)
            except Exception as exc:  # never in the program's way: deep traces end in this process
                self.due = _NEVER
                self.drop(f"deep traces disabled after an error: {exc!r}")
                self.agent.notice(f"deep traces disabled after an error: {exc!r}")
                return monotonic_ns()

    def _open(self, calls: int, step: int, now: int) -> int:
        """Opens the pending request's window at this batch begin, unless the start-of-fit window
        has still to run (then the next batch begin asks again) or the program profiles."""
        own = self.inst.window
        if own is not None and own.state in ("waiting", "active"):
            self.due = 0
            return now
        self.state = "idle"
        self.due = 0  # the next batch begin looks again
        self.first_step = step
        if self.program_profiling():
            self._record(now, now, 0, STEPPED_ASIDE)
            return now
        folder = os.path.join(self.agent.run_dir, TRACES_DIR)
        self.logdir = os.path.join(folder, trace_name(self.req["id"], self.rank, os.getpid()))
        try:
            os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
            os.makedirs(self.logdir, mode=DIR_MODE, exist_ok=True)
            tfprof.start_profiler(self.logdir)
        except Exception as exc:
            end = monotonic_ns()
            self._record(end, end, 0, f"the profiler did not start: {exc!r}")
            return end
        self.state = "open"
        self.first_call, self.first_step = calls, step
        self.t0 = monotonic_ns()
        return self.t0

    def _close(self, t1: int, calls: int, error: str | None) -> int:
        """Stops the open window, saving its trace (TensorFlow writes the ``.xplane.pb`` in its
        stop); the flusher thread reads it (:meth:`drain`). Returns the clock after."""
        self.state = "idle"
        self.due = 0
        done = calls - self.first_call
        t = monotonic_ns()
        try:
            tfprof._profiler().stop(save=True)
        except Exception as exc:
            end = monotonic_ns()
            self._record(self.t0, t1, done, f"the profiler failed to stop or save: {exc!r}", t=end,
                         stop_s=(end - t) / 1e9)
            return end
        end = monotonic_ns()
        self.saved.append({"t": end, "t1": t1, "steps": done, "stop_s": (end - t) / 1e9, "error": error,
                           "req": self.req, "t0": self.t0, "first_step": self.first_step, "rank": self.rank,
                           "world": self.world, "logdir": self.logdir})
        return end

    def _last_end(self, now: int) -> int:
        """The end of the last traced step: the last ``keras`` step's end (an epoch's last step
        ends at the epoch's end, before its validation), else ``now``."""
        last = getattr(self.inst, "last_end", 0) or 0
        return last if self.t0 <= last <= now else now

    # -- the program's own profiling -------------------------------------------------------------
    def program_profiling(self) -> bool:
        """Whether a profiler of the program's runs (a TensorFlow profiler session while whyidle's
        window is not open) or is due (a ``TensorBoard`` callback of this fit before the end of its
        ``profile_batch`` range)."""
        if self.state != "open" and tfprof.session_running():
            return True
        for cb in getattr(self.inst, "tb_profilers", None) or []:
            try:
                if cb._global_train_batch < cb._stop_batch:
                    return True
            except Exception:
                return True  # a TensorBoard callback that profiles, of another make: leave it be
        return False

    def program_starts(self) -> None:
        """The program starts its own profiler (any thread): whyidle's open window is stopped
        without saving, first, so that the program's start succeeds and its trace is its own."""
        with self.lock:
            if self.state != "open":
                return
            self.state = "idle"
            self.due = 0
            self._discard(DISCARDED)

    def _discard(self, why: str) -> None:
        """Stops the open profiler session without saving and records the window with ``why``
        (under the lock)."""
        t = monotonic_ns()
        try:
            tfprof._profiler().stop(save=False)
        except Exception:
            pass
        end = monotonic_ns()
        self._record(self.t0, self._last_end(end), self.inst.calls - self.first_call, why, t=end,
                     stop_s=(end - t) / 1e9)

    # -- fit ends, failures, exit ----------------------------------------------------------------
    def fit_ended(self, now: int) -> None:
        """``fit`` ended (its last step ended at ``now``): an open window is closed and kept, the
        record saying how many of its calls ran; a waiting request waits for the next ``fit``."""
        with self.lock:
            if self.state == "open":
                done = self.inst.calls - self.first_call
                self._close(self._last_end(now), self.inst.calls, None if done >= self.steps else
                            f"fit ended after {done} of {self.steps} train-function calls")

    def drop(self, why: str) -> None:
        """Ends what is open or waiting without a trace (the Keras instrumentation turned off);
        no request is looked for again."""
        with self.lock:
            self.due = _NEVER
            state, self.state = self.state, "idle"
            if state == "open":
                self._discard(why)
            elif state == "pending":
                now = monotonic_ns()
                self._record(now, now, 0, why)

    def at_exit(self) -> None:
        """The program ends with a window open (what was traced is saved and read) or a request
        waiting (a record says it was not served)."""
        with self.lock:
            now = monotonic_ns()
            if self.state == "open":
                done = self.inst.calls - self.first_call
                self._close(self._last_end(now), self.inst.calls,
                            f"the program ended after {done} of {self.steps} train-function calls")
            elif self.state == "pending":
                self.state = "idle"
                self._record(now, now, 0, "the program ended before the window could open")

    # -- records ---------------------------------------------------------------------------------
    def _record(self, t0: int, t1: int, steps: int, error: str, *, t: int | None = None, stop_s: float = 0.0,
                method: str | None = "tf_profiler") -> None:
        """A ``trace_window`` record without a trace to read (the window did not run or was
        discarded): ``[t0, t1]`` the traced steps' span (monotonic ns; one instant when none ran),
        ``t`` when it was written (default ``t1``)."""
        self.agent.record(_window_record(
            t=t1 if t is None else t, req=self.req, t0=t0, t1=t1, steps=steps, first_step=self.first_step,
            rel=None, rank=self.rank, world=self.world, stop_s=stop_s, error=error, method=method))

    def drain(self) -> list[dict]:
        """Collector (flusher thread): reads each saved window's trace into its record."""
        out = []
        while self.saved:
            out.append(self._read(self.saved.pop(0)))
        return out

    def _read(self, w: dict) -> dict:
        t = monotonic_ns()
        error, rel, summary = w["error"], None, {}
        files = tfprof.xplane_files(w["logdir"])
        if not files:
            error = error or "no .xplane.pb file was written"
        else:
            rel = os.path.relpath(files[-1], self.agent.run_dir)
            for root, dirs, names in os.walk(w["logdir"]):
                for name in dirs:
                    _chmod(os.path.join(root, name), DIR_MODE)
                for name in names:
                    _chmod(os.path.join(root, name), FILE_MODE)
            try:
                summary = tfprof.summarize_xspace(files[-1])
            except Exception as exc:
                error = error or f"the trace could not be read: {exc!r}"
        rec = _window_record(t=w["t"], req=w["req"], t0=w["t0"], t1=w["t1"], steps=w["steps"],
                             first_step=w["first_step"], rel=rel, rank=w["rank"], world=w["world"],
                             stop_s=w["stop_s"], error=error, method="tf_profiler")
        rec.update(summary)
        rec["calls"], rec["iterators"] = summary.get("calls") or [], summary.get("iterators") or []
        rec["logdir"] = os.path.relpath(w["logdir"], self.agent.run_dir)
        rec["parse_s"] = round((monotonic_ns() - t) / 1e9, 4)
        return rec


def _window_record(*, t, req, t0, t1, steps, first_step, rel, rank, world, stop_s, error, method) -> dict:
    """One ``trace_window`` record (docs/run-format.md); ``export_s`` is 0: TensorFlow's stop
    writes the trace, its time is in ``stop_s``."""
    return {"k": "trace_window", "t": t, "id": req.get("id"), "t0": t0, "t1": t1, "steps": steps,
            "first_step": first_step, "file": rel, "rank": rank, "world_size": world, "reason": reason_of(req),
            "stop_s": round(stop_s, 6), "export_s": 0.0, "error": error, "method": method, "calls": [],
            "iterators": []}


def _chmod(path: str, mode: int) -> None:
    try:
        os.chmod(path, mode)
    except OSError:
        pass
