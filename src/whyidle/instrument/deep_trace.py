"""On-demand deep traces: a ``torch.profiler`` window of a few training steps, opened when the
``whyidle run`` process asks for one (issue 34).

The parent writes a request into ``RUN_DIR/control/trace.json`` (atomically: temp file +
``os.replace``)::

    {"id": "t1", "steps": 10, "ranks": null | [int, ...], "pids": null | [int, ...], "reason": "text", "t": ns}

At step boundaries of the training thread (:meth:`DeepTrace.boundary`, called from
``TorchInstrument.end_step`` only when the clock it already read passes ``TorchInstrument.trace_due``)
the file is looked at with one ``os.stat`` at most every :data:`POLL_S` seconds, and read only when
its ``(mtime_ns, size, inode)`` changed (:class:`whyidle.instrument.trace_requests.Requests`). A
request with an ``id`` this process has not served, written after the process started, and
addressed to it (``ranks`` null or holding its rank: the default process group's once
initialized, else the launcher's ``RANK``, else 0; ``pids`` null or holding its pid) opens the
window at that boundary:

- ``torch.profiler.profile`` (CPU activity, plus CUDA when CUDA is initialized in this process),
  ``record_shapes=False``, ``with_stack=False``, and a schedule that records every step (so the
  trace holds one ``ProfilerStep#N`` span per training step: ``start()`` at the boundary,
  ``step()`` at each following one, ``stop()`` at the boundary that ends the last of ``steps``
  steps (default :data:`DEFAULT_STEPS`, at most :data:`MAX_STEPS`);
- then ``export_chrome_trace`` to ``RUN_DIR/traces/<id>-rank<R>-<pid>.pt.trace.json`` (no rank
  part outside a distributed job), written under a temporary name and renamed when complete;
- one ``trace_window`` record (docs/run-format.md), also when the window fails or is given up.

The stop and the export run on the training thread, at the boundary that ends the window's last
step, before its end time is read: their cost is inside the window's ``[t0, t1]`` and the steps
after it are not slowed. A background export thread would not spare the training thread: Kineto's
``save`` holds the GIL for most of its run (measured with torch 2.13 on a 77 MB trace: the other
thread ran at ~4 % of its speed for the export's 0.45 s), so it would only move the cost into
the next steps, at unknown points.

The program's own profiling wins: a request that finds a profiler of the program's running (or
prepared, a schedule's warm-up) is not served (an ``error`` record says whyidle stepped aside),
and a profiler the program starts while whyidle's window is open stops whyidle's window first, on
the training thread, discarding it (from another thread: whyidle's window is given up at the
training thread's next boundary after the program's profiler ended, since a profiler can only be
stopped on the thread that started it). The wrappers of ``torch.autograd.profiler.profile``'s
``_prepare_trace`` / ``_start_trace`` / ``__exit__`` (every ``torch.profiler.profile`` and
``torch.autograd.profiler.profile`` goes through them) go in through
:func:`whyidle.instrument.patches.assign`, so :func:`whyidle.instrument.patches.restore` takes
them out. Nothing else of the program's is touched; every error is caught and ends in a record
or one notice.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import weakref
from time import monotonic_ns

from whyidle.instrument import patches
from whyidle.instrument.trace_requests import (CONTROL_FILE, DEFAULT_STEPS, MAX_STEPS, POLL_NS, POLL_S,  # noqa: F401
                                               TRACES_DIR, Requests, launcher_place, reason_of, trace_name)
#: Mode of the trace files (as whyidle's own files: readable by their owner only).
FILE_MODE = 0o600

STEPPED_ASIDE = "the program's own profiler is running: whyidle stepped aside"
DISCARDED = "the program started its own profiler: whyidle's window was stopped and discarded"

_NEVER = 1 << 62  # a trace_due that is never reached: deep traces off in this process


def _record_every_step(step: int):
    """The window's profiler schedule: record from the first step to ``stop()`` (a schedule is what
    makes ``torch.profiler`` add the ``ProfilerStep#N`` spans)."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


class DeepTrace:
    """The deep-trace state of one process (the training thread's step boundaries drive it).

    Args:
        agent: the process's :class:`whyidle.instrument.agent.Agent` (run directory, records).
        torch: the imported ``torch`` module.
        inst: the :class:`whyidle.instrument.torch.TorchInstrument`; its ``trace_due`` (monotonic
            ns) is when its ``end_step`` next calls :meth:`boundary`.
    """

    def __init__(self, agent, torch, inst) -> None:
        self.agent = agent
        self.torch = torch
        self.inst = inst
        self.requests = Requests(agent.run_dir, agent.t_start, self._place)
        self.user: weakref.WeakSet = weakref.WeakSet()  # the program's profilers prepared and not ended
        self.prof = None  # whyidle's torch.profiler.profile while a window is open
        self.req: dict = {}
        self.steps = DEFAULT_STEPS
        self.done = 0  # steps of the window completed
        self.t0 = 0
        self.first_step = 0
        self.rank: int | None = None
        self.world: int | None = None
        self.tid: int | None = None  # the thread that started the window
        self.give_up: str | None = None  # the window is to be discarded at the next boundary (why)
        self.guard = None  # handle of the optimizer hook that ends a window once recording stopped

    # -- the training thread's step boundary -------------------------------------------------
    def boundary(self, now: int) -> int:
        """A step boundary of the training thread at monotonic ``now`` (ns), once ``now`` passed
        ``inst.trace_due``: looks for a request (no window open) or advances the open window.
        Returns the time to use as the boundary: ``now``, or the clock after the window's stop and
        export (their cost ends the window's last step). Never raises."""
        try:
            if self.prof is not None:
                return self._advance(now)
            self.inst.trace_due = now + POLL_NS
            req = self.requests.look()
            if req is not None:
                self._open(req, now)
            return now
        except Exception as exc:  # never in the program's way: deep traces end in this process
            self.inst.trace_due = _NEVER
            self._drop_window()
            self.agent.notice(f"deep traces disabled after an error: {exc!r}")
            return monotonic_ns()

    def _place(self) -> tuple[int | None, int | None]:
        """``(rank, world_size)``: the default process group's once initialized, else the
        launcher's ``RANK`` / ``WORLD_SIZE``; ``(None, None)`` outside a distributed job."""
        try:
            dist = self.torch.distributed
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except Exception:
            pass
        return launcher_place()

    def _open(self, req: dict, now: int) -> None:
        """Opens the window at boundary ``now``: the step that starts there is its first."""
        self.req = req
        self.steps = self.requests.serve(req)
        self.rank, self.world = self._place()
        self.t0, self.first_step, self.done = now, self.inst.step + 1, 0
        self.give_up = None
        if self.program_profiling():
            self._write(now, None, STEPPED_ASIDE, 0.0, 0.0)
            return
        torch = self.torch
        try:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                activities.append(ProfilerActivity.CUDA)
            self.prof = profile(activities=activities, record_shapes=False, with_stack=False,
                                schedule=_record_every_step)
            self.tid = threading.get_ident()
            self.prof.start()
            dist = torch.distributed
            if self.rank is not None and not (dist.is_available() and dist.is_initialized()):
                # torch adds distributedInfo only once the process group exists: the launcher's rank
                self.prof.add_metadata_json("distributedInfo", json.dumps(
                    {"rank": self.rank, "world_size": self.world}))
        except Exception as exc:
            self._drop_window()
            self._write(now, None, f"the profiler did not start: {exc!r}", 0.0, 0.0)
            return
        self.inst.trace_due = 0  # every boundary of the window comes here
        # the step hooks pass everything through once recording stops (the agent halted, the
        # instrumentation failed): this one, ungated, ends a window they would leave open for good
        with contextlib.suppress(Exception):
            self.guard = torch.optim.optimizer.register_optimizer_step_post_hook(self._guard)

    def _guard(self, optimizer, args, kwargs) -> None:
        if self.prof is not None and (self.agent.disabled or self.inst.off) and threading.get_ident() == self.tid:
            with contextlib.suppress(Exception):
                self._discard("recording stopped during the window: the window was discarded")

    def _advance(self, now: int) -> int:
        """A boundary inside the open window: the step that ends here was traced."""
        if self.give_up is not None:  # the program's profiler started on another thread
            if any(True for _ in self.user):
                return now  # stopping ours now would end the program's session: after it
            self._discard(self.give_up)
            return now
        self.done += 1
        if self.done < self.steps:
            self.prof.step()
            return now
        return self._close()

    def _take(self):
        """Ends the window's state (the profiler is the caller's to stop); returns the profiler."""
        prof, self.prof = self.prof, None
        self.give_up = None
        guard, self.guard = self.guard, None
        if guard is not None:
            with contextlib.suppress(Exception):
                guard.remove()
        return prof

    def _close(self, error: str | None = None) -> int:
        """Stops the window, exports its trace and writes the record; returns the clock after."""
        prof = self._take()
        self.inst.trace_due = 0  # the next boundary resumes the looks
        t = monotonic_ns()
        try:
            prof.stop()
        except Exception as exc:
            end = monotonic_ns()
            self._write(end, None, f"the profiler failed to stop: {exc!r}", (end - t) / 1e9, 0.0)
            return end
        t_stop = monotonic_ns()
        rel = None
        try:
            rel = self._export(prof)
        except Exception as exc:
            error = f"the trace was not written: {exc}" if isinstance(exc, OSError) else \
                f"the trace was not written: {exc!r}"
        end = monotonic_ns()
        self._write(end, rel, error, (t_stop - t) / 1e9, (end - t_stop) / 1e9)
        return end

    def _export(self, prof) -> str:
        """Writes the window's Chrome trace under ``RUN_DIR/traces``; returns its path relative to
        the run directory. Errors: ``OSError`` (a full or unwritable disk: nothing is left behind),
        or the profiler's own."""
        folder = os.path.join(self.agent.run_dir, TRACES_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        name = trace_name(self.req["id"], self.rank, os.getpid())
        final = os.path.join(folder, name + ".pt.trace.json")
        tmp = os.path.join(folder, f".{name}.partial")  # no *.json: a folder's reader never sees it
        try:
            prof.export_chrome_trace(tmp)
            _check_complete(tmp)
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return os.path.relpath(final, self.agent.run_dir)

    def _write(self, t: int, rel: str | None, error: str | None, stop_s: float, export_s: float) -> None:
        self.agent.record({
            "k": "trace_window", "t": t, "id": self.req.get("id"), "t0": self.t0, "t1": t,
            "steps": self.done, "first_step": self.first_step, "file": rel, "rank": self.rank,
            "world_size": self.world, "reason": reason_of(self.req), "stop_s": round(stop_s, 6), "export_s": round(export_s, 6), "error": error,
        })

    def _discard(self, why: str) -> None:
        """Stops the open window (on the thread that started it) and drops its trace."""
        prof = self._take()
        self.inst.trace_due = 0
        t = monotonic_ns()
        with contextlib.suppress(Exception):
            prof.stop()
        end = monotonic_ns()
        self._write(end, None, why, (end - t) / 1e9, 0.0)

    def _drop_window(self) -> None:
        prof = self._take()
        if prof is not None and threading.get_ident() == self.tid:
            with contextlib.suppress(Exception):
                prof.stop()

    # -- the program's own profiling ----------------------------------------------------------
    def program_profiling(self) -> bool:
        """Whether a profiler of the program's is running (the autograd profiler's flags) or
        prepared (a ``torch.profiler`` schedule's warm-up)."""
        try:
            if self.torch.autograd.profiler._is_profiler_enabled or self.torch._C._autograd._profiler_enabled():
                return True
        except Exception:
            pass
        return any(True for _ in self.user)

    def program_starts(self, profiler) -> None:
        """The program's ``profiler`` (a ``torch.autograd.profiler.profile``) is being prepared or
        started: whyidle's open window makes way (see the module docstring)."""
        self.user.add(profiler)
        if self.prof is None or self.give_up is not None:
            return
        if threading.get_ident() == self.tid:
            self._discard(DISCARDED)
        else:
            self.give_up = DISCARDED

    def at_exit(self) -> None:
        """The program ends with the window open: on the thread that opened it, what was traced is
        stopped and exported (the record says the program ended first); else it is given up."""
        if self.prof is None:
            return
        if threading.get_ident() != self.tid:  # cannot be stopped from here: the process ends anyway
            self._take()
            self._write(monotonic_ns(), None, "the program ended during the window", 0.0, 0.0)
        elif self.give_up is not None:
            self._discard(self.give_up)
        else:
            self._close(f"the program ended after {self.done} of {self.steps} steps")

    def is_ours(self, profiler) -> bool:
        return self.prof is not None and getattr(self.prof, "profiler", None) is profiler


def _check_complete(path: str) -> None:
    """Raises ``OSError`` when the export at ``path`` is missing, empty or cut short (Kineto's
    writer reports no write error: a full disk leaves a truncated file). A complete Chrome trace
    ends with ``}``."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64))
        tail = f.read().rstrip()
    if not size or not tail.endswith(b"}"):
        raise OSError(f"the profiler's export to {path} is {'empty' if not size else 'cut short'} (disk full?)")


def install(agent, torch, inst) -> DeepTrace:
    """Sets up deep traces for one process: the :class:`DeepTrace` (``inst.deep``; the first step
    boundary looks at the control file) and the wrappers that see the program's own profilers.
    Errors: those of ``setattr`` on torch's profiler class (the caller turns them into a notice)."""
    deep = DeepTrace(agent, torch, inst)
    inst.deep = deep
    inst.trace_due = 0
    agent.on_exit.append(deep.at_exit)
    cls = torch.autograd.profiler.profile
    orig_prepare, orig_start, orig_exit = cls._prepare_trace, cls._start_trace, cls.__exit__

    def seen(profiler) -> None:
        if not deep.is_ours(profiler):
            try:
                deep.program_starts(profiler)
            except Exception as exc:
                agent.notice(f"deep traces: the program's profiler start not handled: {exc!r}")

    @functools.wraps(orig_prepare)
    def _prepare_trace(self, *args, **kwargs):
        __tracebackhide__ = True
        seen(self)
        return orig_prepare(self, *args, **kwargs)

    @functools.wraps(orig_start)
    def _start_trace(self, *args, **kwargs):
        __tracebackhide__ = True
        seen(self)
        return orig_start(self, *args, **kwargs)

    @functools.wraps(orig_exit)
    def __exit__(self, *args, **kwargs):
        __tracebackhide__ = True
        try:
            return orig_exit(self, *args, **kwargs)
        finally:
            deep.user.discard(self)

    patches.assign(cls, "_prepare_trace", _prepare_trace)
    patches.assign(cls, "_start_trace", _start_trace)
    patches.assign(cls, "__exit__", __exit__)
    return deep
