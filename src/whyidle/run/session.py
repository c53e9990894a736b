"""One observed run, start to finish: run directory, samplers, the command, the report.

    prepare → start samplers → start command → live status until it ends → stop samplers →
    finalize meta.json → the pipeline (whyidle.pipeline.report_run: analyze → diagnose →
    report.json, report.html, timeline.json, --json) → render

Used by ``whyidle run`` and ``whyidle demo`` (the same code path).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import sys
import time
from typing import Callable

import whyidle
from whyidle.cmdline import default_name
from whyidle.jsonsafe import json_text
from whyidle.record.writer import FILE_MODE, write_json_atomic
from whyidle.redact import redact_argv
from whyidle.run import launcher
from whyidle.run.launcher import ChildExit, LaunchError
from whyidle.run.rolling import Rolling, RollingOptions

DEFAULT_RUNS_DIR = "whyidle-runs"
#: Mode of a run directory whyidle creates (before the umask): its owner's only, as its files
#: (:data:`whyidle.record.writer.FILE_MODE`) describe the user's program, paths and machine.
RUN_DIR_MODE = 0o700


@dataclasses.dataclass
class RunOptions:
    """Options of ``whyidle run`` (units: seconds, Hz)."""

    out: str | None = None
    name: str | None = None
    json_path: str | None = None
    interval_s: float = 0.25
    stack_hz: float = 100.0
    quiet: bool = False
    show_report: bool = True  # False: live status only, the caller renders the report
    html: bool = True  # write RUN_DIR/report.html (meta.json "html")
    env: dict | None = None  # extra environment for the command (whyidle tune: its trial's settings)
    output: str | None = None  # file for the command's stdout and stderr (default: whyidle's own)
    #: Called about once a second while the command runs with the run directory; a text (why)
    #: stops the command gently (:meth:`whyidle.run.launcher.Child.stop`), recorded in meta.json
    #: ``stopped``. whyidle tune stops a trial once it has measured enough steps.
    until: "Callable[[str], str | None] | None" = None
    #: Always-on (:mod:`whyidle.run.rolling`): windows of verdicts, deep traces, metrics; None: off
    #: (tune's trials, the demo, watch blocks).
    rolling: "RollingOptions | None" = None


def safe_name(name: str) -> str:
    """``name`` as a file-name part: letters, digits, ``-_.``, at most 60 characters."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:60] or "run"


def prepare_run_dir(cmd: list[str], opts: RunOptions) -> str:
    """Creates the run directory and checks it is writable.

    A directory it creates gets mode :data:`RUN_DIR_MODE` (less the umask); folders above it that
    it creates (``./whyidle-runs``) get the usual mode, and an existing directory (``--out`` an
    existing folder) keeps its own: whyidle changes no folder it did not make.

    Errors: LaunchError (exit 2) when it cannot be created or written, or already holds a run.
    """
    name = safe_name(opts.name or default_name(cmd))
    if opts.out:
        path = opts.out
    else:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        path = os.path.join(DEFAULT_RUNS_DIR, f"{stamp}-{name}")
        n = 1
        while os.path.exists(path):
            n += 1
            path = os.path.join(DEFAULT_RUNS_DIR, f"{stamp}-{name}-{n}")
    try:
        os.makedirs(path, mode=RUN_DIR_MODE, exist_ok=True)
        if os.path.exists(os.path.join(path, "meta.json")):
            raise LaunchError(f"run directory already holds a run: {path}", 2)
        probe = os.path.join(path, ".write-test")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE))
        os.remove(probe)
    except OSError as exc:
        raise LaunchError(f"run directory not writable: {path} ({exc.strerror or exc})", 2) from None
    return path


def check_writable_file(path: str, option: str = "--json") -> None:
    """Checks before any work that ``path`` (the value of ``option``) can be written.

    Errors: LaunchError (exit 2) naming the option and the problem.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise LaunchError(f"{option} {path}: is a directory", 2)
    if not os.path.isdir(folder):
        raise LaunchError(f"{option} {path}: no such directory {folder}", 2)
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise LaunchError(f"{option} {path}: not writable", 2)


def clock_anchor() -> dict:
    """One ``meta.json`` clock anchor: the monotonic and the wall clock now, in ns."""
    return {"monotonic_ns": time.monotonic_ns(), "time_ns": time.time_ns()}


def observe(cmd: list[str], opts: RunOptions, stream=None) -> tuple[dict, ChildExit, str]:
    """Runs ``cmd`` under observation and returns ``(report, child_exit, run_dir)``.

    ``stream`` receives the live status and the final report (default: stderr).
    Errors: LaunchError (127 command not found, 126 not executable, 2 run directory problems).
    """
    from whyidle.sampling.helper import start_sampler

    stream = stream or sys.stderr
    if not cmd:
        raise LaunchError("no command given", 2)
    launcher.resolve_command(cmd)
    if opts.json_path and opts.json_path != "-":
        check_writable_file(opts.json_path)
    name = safe_name(opts.name or default_name(cmd))
    metrics = _start_metrics(opts.rolling, name)
    try:
        run_dir = prepare_run_dir(cmd, opts)
        boot = launcher.prepare_bootstrap(run_dir)
    except OSError as exc:  # e.g. a full disk: the write probe of prepare_run_dir writes no data
        if metrics is not None:
            metrics.close()
        raise LaunchError(f"run directory not writable: {run_dir} ({exc.strerror or exc})", 2) from None
    except LaunchError:
        if metrics is not None:
            metrics.close()
        raise
    meta = {
        "format": "whyidle.run/1", "tool_version": whyidle.__version__, "name": name, "command": redact_argv(cmd),
        "run_dir": run_dir, "cwd": os.getcwd(), "hostname": socket.gethostname(), "cpu_count": os.cpu_count(),
        "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "anchors": [clock_anchor()], "interval_s": opts.interval_s, "stack_hz": opts.stack_hz,
        "whyidle_pid": os.getpid(), "python": sys.version.split()[0], "html": opts.html,
    }
    problem = write_meta(run_dir, meta)
    if problem:
        if metrics is not None:
            metrics.close()
        raise LaunchError(f"run directory not writable: {run_dir} ({problem})", 2)

    launcher.become_subreaper()
    sampler = start_sampler(run_dir, os.getpid(), opts.interval_s)

    env = launcher.child_env(run_dir, boot, opts.stack_hz, base={**os.environ, **(opts.env or {})})
    t_start = time.monotonic()
    meta["start_t"] = time.monotonic_ns()
    try:
        output = open(opts.output, "ab", buffering=0) if opts.output else None  # noqa: SIM115 - closed below
        try:
            child = launcher.Child(cmd, env, output)
        finally:
            if output is not None:
                output.close()  # the child holds its own copy
    except OSError as exc:
        sampler.stop()
        if metrics is not None:
            metrics.close()
        raise LaunchError(f"cannot execute {cmd[0]}: {exc.strerror or exc}", 126) from None
    meta["root_pid"] = child.pid
    write_meta(run_dir, meta)  # from now on nothing whyidle cannot write may stop the command
    rolling = None
    if opts.rolling is not None:
        say = None if opts.quiet else _sayer(stream)
        rolling = Rolling(run_dir, meta, opts.rolling, metrics, say=say)
        if say and metrics is not None:
            say(_metrics_line(metrics, opts.rolling))

    live = None
    if not opts.quiet:
        from whyidle.record.tail import StepTail
        from whyidle.report.live import LiveStatus

        live = LiveStatus(StepTail(run_dir), sampler, stream, tty=stream.isatty())
    told = False
    try:
        while not child.wait(1.0):
            launcher.reap_orphans(child.pid)
            if live:
                live.tick()
            if rolling is not None:
                rolling.tick()
            told = _tell_problem(sampler, stream, told)
            if opts.until is not None and "stopped" not in meta:
                why = opts.until(run_dir)
                if why:
                    meta["stopped"] = why
                    child.stop()
            child.escalate()
    finally:
        if live:
            live.close()
    meta["exit_t"] = time.monotonic_ns()
    status = child.exit_status()
    if rolling is not None:
        rolling.finish(meta["exit_t"])
    try:
        return _finish(run_dir, meta, status, sampler, child, opts, stream, t_start, told)
    finally:
        child.restore_signals()


def _start_metrics(rolling: RollingOptions | None, name: str):
    """The Prometheus exporter asked for (``--metrics-port``/``--metrics-file``), started before
    the command so a port in use fails fast; None when not asked for.

    Errors: LaunchError (exit 2) naming the problem (port in use, file not writable)."""
    if rolling is None or not (rolling.metrics_port or rolling.metrics_file):
        return None
    from whyidle.export.prometheus import JobMetrics, MetricsError

    try:
        return JobMetrics(run=name, host=socket.gethostname(), port=rolling.metrics_port,
                          textfile=rolling.metrics_file)
    except MetricsError as exc:
        raise LaunchError(str(exc), 2) from None


def _metrics_line(metrics, rolling: RollingOptions) -> str:
    """The one line saying where the job's Prometheus metrics are (``--metrics-port``/``-file``)."""
    parts = []
    if metrics.address:
        host, port = metrics.address
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else f"[{host}]" if ":" in host else host
        parts.append(f"http://{shown}:{port}/metrics")
    if rolling.metrics_file:
        parts.append(rolling.metrics_file + ("" if rolling.metrics_file.endswith(".prom") else
                                             " (node_exporter's textfile collector reads only *.prom files)"))
    return "[whyidle] Prometheus metrics: " + " and ".join(parts)


def _sayer(stream):
    def say(text: str) -> None:
        try:
            stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass
    return say


def write_meta(run_dir: str, meta: dict) -> str | None:
    """Writes ``RUN_DIR/meta.json`` atomically; returns None, or why it could not (an errno text)."""
    try:
        write_json_atomic(os.path.join(run_dir, "meta.json"), meta)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _tell_problem(sampler, stream, told: bool) -> bool:
    """Says the sampler's :attr:`~whyidle.sampling.loop.SamplerLoop.problem` (a run directory that
    cannot be written) in one line, once; returns whether it was said."""
    if told or sampler.problem is None:
        return told
    try:
        stream.write(f"whyidle: {sampler.problem}\n")
        stream.flush()
    except (OSError, ValueError):
        pass
    return True


def _finish(run_dir, meta, status, sampler, child, opts, stream, t_start, told=False):
    """After the command ended: stop sampling, finalize meta.json, build and show the report.

    A run directory that cannot be written any more costs neither the exit status nor a
    traceback: the report is built from what was recorded, with whyidle's own copy of meta.json,
    and the views it cannot write are named in its notes."""
    sampler.stop()
    launcher.reap_orphans(child.pid)
    _tell_problem(sampler, stream, told)

    meta.update({
        "ended_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "end_t": time.monotonic_ns(), "wall_s": round(time.monotonic() - t_start, 3),
        "exit_code": status.exit_code, "signal": status.signal, "interrupted": status.interrupted,
    })
    meta["anchors"].append(clock_anchor())
    stale = write_meta(run_dir, meta)

    try:
        from whyidle.pipeline import report_run

        report = report_run(run_dir, opts.json_path if opts.json_path != "-" else None,
                            meta=meta if stale else None,
                            notes=[f"whyidle's sampler: {sampler.problem}."] if sampler.problem else None)
    except Exception as exc:  # never lose the command's exit status to a reporting problem
        if not os.path.isdir(run_dir):
            stream.write(f"whyidle: no report: the run directory {run_dir} was removed during the run\n")
        else:
            stream.write(f"whyidle: could not build the report ({exc}); the recorded data is in {run_dir}\n")
        return None, status, run_dir
    if not opts.quiet and opts.show_report:
        from whyidle.report import terminal

        terminal.render(report, file=stream)
    if opts.json_path == "-":  # after the command: its stdout is done by now
        sys.stdout.write(json_text(report) + "\n")
        sys.stdout.flush()
    return report, status, run_dir
