"""``whyidle.watch()``: observe one part of a running Python program, then report on it.

    with whyidle.watch(name="exp3") as w:
        trainer.fit(model)
    w.report      # the whyidle.report/1 dict; w.run_dir: its run directory

The same measurements, findings and report as ``whyidle run``, for the process the block runs in
(a notebook kernel, a script, a test harness): the agent (:mod:`whyidle.instrument.agent`) is
started at the block's entry and stopped at its exit, which takes every hook of whyidle's out of
the process again (:mod:`whyidle.instrument.patches`); the host and GPU samplers run in a helper
process (:mod:`whyidle.sampling.helper`) that watches this process's tree from outside. The
``%%whyidle`` cell magic (:mod:`whyidle.run.magic`) is a thin layer over it.

The doctor never harms the patient: a problem of whyidle's (a run directory that cannot be made,
a helper that does not start) is said in one line and the block runs unobserved; an exception of
the block (``KeyboardInterrupt`` included) propagates unchanged, after the report of what ran.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import functools
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

import whyidle
from whyidle.redact import redact_argv
from whyidle.run import session

#: Seconds to wait for the sampler helper's first tick before observing without it.
HELPER_START_S = 15.0
#: Seconds the helper gets to write its last tick and exit before it is killed.
HELPER_STOP_S = 5.0
#: Seconds between two refreshes of the live status (as ``whyidle run``'s).
LIVE_PERIOD_S = 1.0


class Watch:
    """Observes the code run between :meth:`start` and :meth:`stop` (or inside ``with``, or in
    a function it decorates: each call is one run).

    Args:
        name: the run's name (default: the script's, or ``watch``).
        out: the run directory (default ``./whyidle-runs/<UTC time>-<name>/``); must not hold a run.
        stack_hz: stack samples of the training thread per second (Hz, 0 = off).
        interval_s: host sampling period in seconds.
        html: write ``report.html``.
        json_path: also write the report as JSON there.
        quiet: no live status and no report on ``stream``.
        stream: where the live status and the report go (default ``sys.stderr``).
        live: ``live(text)`` is called about once a second with the status line instead of
            drawing it on ``stream`` (the cell magic updates its output with it).
        command: the run's ``command`` in ``meta.json`` (default: this process's argv).
    Attributes:
        report: the ``whyidle.report/1`` dict once stopped (None before, or when it could not be
            built: :attr:`problem` says why).
        run_dir: the run directory (None when none could be made).
        problem: None, or one line saying why the block ran unobserved or has no report.
    """

    def __init__(self, name: str | None = None, out: str | None = None, stack_hz: float = 100.0,
                 interval_s: float = 0.25, html: bool = True, json_path: str | None = None, quiet: bool = False,
                 stream=None, live: Callable[[str], None] | None = None, command: list[str] | None = None) -> None:
        self.opts = session.RunOptions(out=out, name=name, json_path=json_path, interval_s=interval_s,
                                       stack_hz=stack_hz, quiet=quiet, html=html)
        self.stream = stream
        self.live = live
        self.command = command
        self.report: dict | None = None
        self.run_dir: str | None = None
        self.problem: str | None = None
        self._agent = None
        self._helper: subprocess.Popen | None = None
        self._meta: dict | None = None
        self._live_stop = threading.Event()
        self._live_thread: threading.Thread | None = None
        self._cell = None  # the cell's output (whyidle.run.cell_output.CellOutput) in a Jupyter kernel
        self._t0 = 0.0

    # -- context manager and decorator -------------------------------------------------------------

    def __enter__(self) -> "Watch":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop(exc)
        return False  # the block's exception goes on unchanged

    def __call__(self, fn):
        """Decorates ``fn``: every call runs under a new watch with these options (with ``out``
        given, the second call's run directory is ``out-2``, and so on); :attr:`report`,
        :attr:`run_dir` and :attr:`problem` are the last call's."""
        calls = [0]

        @functools.wraps(fn)
        def watched(*args, **kwargs):
            calls[0] += 1
            out = self.opts.out if not self.opts.out or calls[0] == 1 else f"{self.opts.out}-{calls[0]}"
            w = Watch(self.opts.name or getattr(fn, "__name__", None), out, self.opts.stack_hz,
                      self.opts.interval_s, self.opts.html, self.opts.json_path, self.opts.quiet, self.stream,
                      self.live, self.command)
            try:
                with w:
                    return fn(*args, **kwargs)
            finally:
                self.report, self.run_dir, self.problem = w.report, w.run_dir, w.problem

        return watched

    # -- start ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts observing this process. Never raises: a problem is said in one line
        (:attr:`problem`) and the program runs unobserved."""
        from whyidle.instrument import agent
        from whyidle.run import cell_output

        if self.live is None and self.stream is None and not self.opts.quiet and cell_output.in_kernel():
            self._cell = cell_output.CellOutput()  # the report in the cell's output, not on stderr
            self.live = self._cell.live
        if agent.current() is not None:
            self._say(f"this process is observed already (run directory {agent.current().run_dir}): "
                      "its own report covers this part")
            return
        kernel = os.path.basename(sys.argv[0] if sys.argv else "").startswith("ipykernel")
        cmd = self.command or (["whyidle.watch()"] if kernel else
                               redact_argv([os.path.basename(sys.executable), *(sys.argv or [])]) or ["python"])
        if not self.opts.name and kernel:
            self.opts.name = "notebook"
        try:
            if self.opts.json_path and self.opts.json_path != "-":
                session.check_writable_file(self.opts.json_path)
            self.run_dir = session.prepare_run_dir(cmd, self.opts)
        except session.LaunchError as exc:
            self._say(str(exc))
            return
        self._meta = {
            "format": "whyidle.run/1", "tool_version": whyidle.__version__, "scope": "watch",
            "name": session.safe_name(self.opts.name or session.default_name(cmd)), "command": cmd,
            "run_dir": self.run_dir, "cwd": os.getcwd(), "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count(),
            "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "anchors": [session.clock_anchor()], "interval_s": self.opts.interval_s, "stack_hz": self.opts.stack_hz,
            "root_pid": os.getpid(), "python": sys.version.split()[0], "html": self.opts.html,
        }
        self._helper = self._start_helper()
        if self._helper is not None:
            self._meta["whyidle_pid"] = self._helper.pid
        self._t0 = time.monotonic()
        self._meta["start_t"] = time.monotonic_ns()
        problem = session.write_meta(self.run_dir, self._meta)
        if problem:
            self._say(f"run directory not writable: {self.run_dir} ({problem})")
            self._stop_helper()
            self.run_dir = None
            return
        try:
            self._agent = agent.start(self.run_dir, self.opts.stack_hz)
        except Exception as exc:
            self._say(f"cannot observe this process: {exc}")
            self._stop_helper()
            return
        if not self.opts.quiet or self.live is not None:
            # in the caller's context: a notebook kernel routes the thread's display updates to the cell
            ctx = contextvars.copy_context()
            self._live_thread = threading.Thread(target=ctx.run, args=(self._live_loop,), name="whyidle-live",
                                                 daemon=True)
            self._live_thread.start()

    def _start_helper(self) -> subprocess.Popen | None:
        """The sampler helper, once its first tick is written; None (said once) when it cannot start."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("WHYIDLE_")}
        here = os.path.dirname(os.path.dirname(os.path.abspath(whyidle.__file__)))
        if os.path.basename(here) not in ("site-packages", "dist-packages"):  # a source tree on sys.path
            env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            helper = subprocess.Popen(
                [sys.executable, "-m", "whyidle.sampling.helper", os.path.abspath(self.run_dir), str(os.getpid()),
                 str(self.opts.interval_s)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True, close_fds=True)
        except OSError as exc:
            self._say(f"host and GPU sampling off: cannot start the sampler ({exc.strerror or exc})")
            return None
        ready: list[bytes] = []
        reader = threading.Thread(target=lambda: ready.append(helper.stdout.readline()), daemon=True)
        reader.start()
        reader.join(HELPER_START_S)
        if not ready or ready[0].strip() != b"ready":
            why = b""
            with contextlib.suppress(Exception):
                helper.kill()
                why = helper.communicate(timeout=2)[1]
            self._say("host and GPU sampling off: the sampler did not start"
                      + (f" ({why.decode(errors='replace').strip().splitlines()[-1]})" if why.strip() else ""))
            return None
        return helper

    # -- live status --------------------------------------------------------------------------------

    def _live_loop(self) -> None:
        from whyidle.record.tail import SamplerTail, StepTail
        from whyidle.report.live import LiveStatus

        stream = self.stream or sys.stderr
        tty = self.live is None and _isatty(stream)
        status = LiveStatus(StepTail(self.run_dir), SamplerTail(self.run_dir), stream, tty=tty)
        try:
            while not self._live_stop.wait(LIVE_PERIOD_S):
                if self.live is not None:
                    with contextlib.suppress(Exception):
                        self.live(status.text())
                else:
                    status.tick()
        finally:
            status.close()

    # -- stop -----------------------------------------------------------------------------------------

    def stop(self, exc: BaseException | None = None) -> dict | None:
        """Stops observing (every hook of whyidle's out of the process), builds the report and,
        unless quiet, prints it. ``exc``: the exception that ended the block, if any (named in the
        report's notes). Returns :attr:`report`. Idempotent; never raises."""
        if self._agent is None:
            self._stop_helper()
            return self.report
        agent, self._agent = self._agent, None
        agent.stop()
        self._live_stop.set()
        if self._live_thread is not None:
            self._live_thread.join(timeout=2 * LIVE_PERIOD_S)
        self._meta["exit_t"] = time.monotonic_ns()
        self._stop_helper()
        meta = self._meta
        meta.update({
            "ended_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "end_t": time.monotonic_ns(), "wall_s": round(time.monotonic() - self._t0, 3),
            "exit_code": 0 if exc is None else None, "signal": None,
            "interrupted": isinstance(exc, KeyboardInterrupt),
        })
        if exc is not None:
            meta["raised"] = (type(exc).__name__ + (f": {exc}" if str(exc) else "")).splitlines()[0][:200]
        meta["anchors"].append(session.clock_anchor())
        stale = session.write_meta(self.run_dir, meta)
        from whyidle.pipeline import report_run

        json_path = self.opts.json_path if self.opts.json_path != "-" else None
        try:
            try:
                self.report = report_run(self.run_dir, json_path, meta=meta if stale else None)
            except OSError as err:  # the json_path only: the report is still shown, with a note
                if json_path is None:
                    raise
                self.report = report_run(self.run_dir, None, meta=meta if stale else None,
                                         notes=[f"The JSON report could not be written to {json_path} "
                                                f"({err.strerror or err})."])
        except Exception as err:
            self._say(f"could not build the report ({err}); the recorded data is in {self.run_dir}")
            return None
        if self._cell is not None:
            with contextlib.suppress(Exception):
                page = os.path.join(self.run_dir, "report.html") if self.opts.html else None
                self._cell.show(self.report, page, None)
        elif not self.opts.quiet:
            from whyidle.report import terminal

            with contextlib.suppress(Exception):
                terminal.render(self.report, file=self.stream or sys.stderr)
        if self.opts.json_path == "-":
            from whyidle.jsonsafe import json_text

            sys.stdout.write(json_text(self.report) + "\n")
        return self.report

    def _stop_helper(self) -> None:
        helper, self._helper = self._helper, None
        if helper is None:
            return
        try:
            helper.communicate(b"stop\n", timeout=HELPER_STOP_S)
        except Exception:
            with contextlib.suppress(Exception):
                helper.kill()
                helper.wait(timeout=1)

    def _say(self, msg: str) -> None:
        """``msg`` as one ``[whyidle]`` line: in the cell's output in a kernel, else on the stream."""
        self.problem = msg
        with contextlib.suppress(Exception):
            if self._cell is not None:
                self._cell.live(f"[whyidle] {msg}")
            else:
                (self.stream or sys.stderr).write(f"[whyidle] {msg}\n")


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except Exception:
        return False
