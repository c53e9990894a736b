"""Command line: thin wrappers that parse arguments and call the layers below.

Exit codes: ``run`` exits like the command it ran (same code, or the same signal); 2 for usage
errors and unreadable input; 127 command not found; 126 not executable.
"""

from __future__ import annotations

import json
import os
import re
import sys

import click

import whyidle

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _fail(message: str, code: int) -> None:
    click.echo(f"whyidle: {message}", err=True)
    sys.exit(code)


def _renderer_import(json_path: str | None):
    """What :func:`_show` will import, as a callable (run while a trace is read in other processes)."""
    if json_path == "-":
        return None

    import importlib

    return lambda: importlib.import_module("whyidle.report.terminal")


def _show(rep: dict, json_path: str | None) -> None:
    """Prints the report: as JSON on stdout for ``--json -``, else for a human."""
    if json_path == "-":
        from whyidle.jsonsafe import json_text

        click.echo(json_text(rep))
    else:
        from whyidle.report import terminal

        terminal.render(rep)


@click.group(context_settings=CONTEXT)
@click.version_option(whyidle.__version__, prog_name="whyidle")
def main() -> None:
    """Why is my GPU idle? Run a training command unchanged, name its bottleneck, get the fix."""


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--out", "out", metavar="DIR", help="Run directory (default: ./whyidle-runs/<UTC time>-<name>/).")
@click.option("--name", help="Run name used in the default run directory.")
@click.option("--json", "json_path", metavar="FILE",
              help="Also write the report (whyidle.report/1) to FILE ('-' = stdout, after the command ends).")
@click.option("--interval", type=click.FloatRange(0.05, 60.0), default=0.25, show_default=True,
              help="Seconds between host samples.")
@click.option("--stack-hz", type=click.FloatRange(0.0, 500.0), default=100.0, show_default=True,
              help="Stack samples per second of the training thread (0 = off).")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing; still write the run directory and --json.")
@click.option("--no-html", is_flag=True,
              help="Do not write RUN_DIR/report.html (~5 MB: plotly.js is embedded), e.g. for sweeps.")
@click.option("--diff", "diff_path", metavar="FILE",
              help="Also write the first fix, when it is a setting, as a unified diff of the script to FILE "
                   "(git apply FILE / patch -p1 < FILE, from this directory).")
@click.option("--window", "window_s", type=click.FloatRange(2.0, 86400.0), default=180.0, show_default=True,
              help="Seconds of one window of the rolling diagnosis (verdict and shares over time; RUN_DIR/windows.jsonl).")
@click.option("--trace-steps", type=click.IntRange(1, 200), default=10, show_default=True,
              help="Steps of a deep (Kineto) trace taken when a window departs from the job's baseline, or by trace-now.")
@click.option("--trace-every", "trace_every", type=click.FloatRange(0.0, 100000.0), default=30.0, show_default=True,
              help="Minutes at least between two automatic deep traces.")
@click.option("--no-triggers", is_flag=True, help="Take no automatic deep trace (whyidle trace-now still can).")
@click.option("--metrics-port", metavar="[HOST:]PORT",
              help="Expose Prometheus metrics of the job on this port (whyidle's process, never the trainer).")
@click.option("--metrics-file", metavar="FILE",
              help="Write the Prometheus metrics to FILE (node_exporter's textfile collector, *.prom) as the job runs.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(out, name, json_path, interval, stack_hz, quiet, no_html, diff_path, window_s, trace_steps, trace_every,
        no_triggers, metrics_port, metrics_file, command) -> None:
    """Run COMMAND unchanged and diagnose why the device waits.

    \b
    Example:  whyidle run -- python train.py --epochs 1
    """
    from whyidle.run.launcher import LaunchError
    from whyidle.run.session import RunOptions, observe

    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        click.echo(click.get_current_context().get_usage(), err=True)
        _fail("no command given (usage: whyidle run [OPTIONS] -- COMMAND ...)", 2)
    from whyidle.run.rolling import RollingOptions

    rolling = RollingOptions(window_s=window_s, trace_steps=trace_steps, trace_every_s=trace_every * 60.0,
                             triggers=not no_triggers, metrics_port=metrics_port, metrics_file=metrics_file)
    opts = RunOptions(out=out, name=name, json_path=json_path, interval_s=interval, stack_hz=stack_hz, quiet=quiet,
                      html=not no_html, rolling=rolling)
    try:
        if diff_path not in (None, "-"):
            from whyidle.run.session import check_writable_file

            check_writable_file(diff_path, "--diff")
        report, status, _run_dir = observe(cmd, opts)
    except LaunchError as exc:
        _fail(str(exc), exc.exit_code)
    if diff_path and report:
        from whyidle.tune.result import first_fix_patch

        _write_diff(diff_path, first_fix_patch(report, cmd), quiet)
    status.whyidle_exit()


def _write_diff(path: str, patch: dict, quiet: bool = False) -> None:
    """Writes ``patch["diff"]`` to ``path`` ('-': stdout) and says so on stderr; when there is none,
    says why (one line) and writes nothing."""
    if not patch.get("diff"):
        click.echo(f"whyidle: no diff written: {patch.get('error') or 'the setting is already in the script'}", err=True)
        return
    if path == "-":
        click.echo(patch["diff"], nl=False)
    else:
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(patch["diff"])
        except OSError as exc:
            _fail(f"--diff {path}: cannot write ({exc.strerror or exc})", 2)
    if not quiet:
        left = "; ".join(f"{k} not written ({v})" for k, v in (patch.get("unplaced") or {}).items())
        click.echo(f"whyidle: {', '.join(patch['placed'])} written into {patch['file']} as a diff"
                   + ("" if path == "-" else f" in {path} (apply: git apply {path}, or patch -p1 < {path})")
                   + (f"; {left}" if left else ""), err=True)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _tries(values: tuple[str, ...]) -> dict:
    """``--try NAME=V1,V2`` options → knob → typed values; one-line usage error otherwise."""
    from whyidle.instrument.overrides import KNOBS, parse

    out: dict = {}
    for item in values:
        name, _, text = item.partition("=")
        name = name.strip()
        kind = KNOBS.get(name)
        if kind is None or not text:
            _fail(f"--try {item}: expected NAME=V1[,V2...] with NAME one of {', '.join(KNOBS)}", 2)
        for raw in text.split(","):
            raw = raw.strip()
            value = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}.get(raw.lower()) \
                if kind is bool else raw if kind is str else int(raw) if raw.lstrip("-").isdigit() \
                else _float(raw) if isinstance(kind, tuple) else None
            if value is None or parse(json.dumps({name: value}))[1]:
                _fail(f"--try {item}: {raw!r} is not a valid value for {name}", 2)
            out.setdefault(name, []).append(value)
    return out


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--budget", type=click.FloatRange(20, 86400), default=300, show_default=True, metavar="SECONDS",
              help="Total time for the baseline and all trials (the --validate runs come on top).")
@click.option("--trial-seconds", type=click.FloatRange(5, 3600), default=None, metavar="SECONDS",
              help="Longest one trial may run (default: budget ÷ 8, between 15 and 90 s).")
@click.option("--try", "tries", multiple=True, metavar="NAME=V1,V2",
              help="Also try these values of a setting, e.g. --try num_workers=2,4 --try batch_size=64 "
                   "(num_workers, pin_memory, persistent_workers, prefetch_factor, batch_size, threads, autocast "
                   "(bf16, fp16, off), tf32, cudnn_benchmark, tfdata_parallel_map, tfdata_prefetch; Lightning "
                   "val_check_interval, check_val_every_n_epoch, limit_val_batches, log_every_n_steps, "
                   "every_n_train_steps; HF eval_steps, save_steps, logging_steps; Keras validation_freq).")
@click.option("--validate", is_flag=True,
              help="Then run the baseline and the winner to the end each and compare their logged validation metrics.")
@click.option("--out", "out", metavar="DIR", help="Tune directory (default: ./whyidle-runs/<UTC time>-tune-<name>/).")
@click.option("--name", help="Name used in the default tune directory.")
@click.option("--json", "json_path", metavar="FILE", help="Also write the result (whyidle.tune/1) to FILE ('-' = stdout).")
@click.option("--html", "html_path", metavar="FILE", help="Also write the result as an HTML page to FILE.")
@click.option("--diff", "diff_path", metavar="FILE",
              help="Also write the winner's change as a unified diff of the script to FILE "
                   "(git apply FILE / patch -p1 < FILE, from this directory).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def tune(budget, trial_seconds, tries, validate, out, name, json_path, html_path, diff_path, command) -> None:
    """Measure the fixes: run COMMAND as it is, then with the settings its diagnosis names (DataLoader
    workers and batch size, threads, autocast, tf.data parallelism...) applied without code change;
    rank them and print the change to make.

    \b
    Each trial re-runs the command and stops it (as Ctrl-C would) once its steady steps are measured.
    A program that writes checkpoints or results writes them in every trial: whyidle names the files
    trials changed. Exit code: 0 done (with or without a faster setting), 1 the command as written
    could not be measured, 2 usage errors, 130 interrupted (the results so far are printed).

    \b
    Example:  whyidle tune --budget 300 -- python train.py --epochs 1
    """
    from whyidle.report.tune_terminal import Progress, render
    from whyidle.run.launcher import LaunchError
    from whyidle.run.session import check_writable_file
    from whyidle.tune.session import TuneOptions, run_tune

    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        _fail("no command given (usage: whyidle tune [OPTIONS] -- COMMAND ...)", 2)
    opts = TuneOptions(budget_s=budget, trial_s=trial_seconds, out=out, name=name, tries=_tries(tries),
                       validate=validate, json_path=json_path, html_path=html_path)
    try:
        for option, path in (("--json", json_path), ("--html", html_path), ("--diff", diff_path)):
            if path not in (None, "-"):
                check_writable_file(path, option)
        res = run_tune(cmd, opts, Progress())
    except LaunchError as exc:
        _fail(str(exc), exc.exit_code)
    if json_path == "-":
        from whyidle.jsonsafe import json_text

        click.echo(json_text(res))
    else:
        render(res)
    if diff_path:
        win = res["winner"]
        _write_diff(diff_path, win["patch"] if win else {"error": "no trial was measured faster than the program as written"})
    sys.exit(130 if res["interrupted"] else 1 if res["baseline"]["status"] != "ok" else 0)


@main.command(context_settings=CONTEXT)
@click.argument("run_dir", metavar="RUN_DIR...", nargs=-1, required=True)
@click.option("--json", "json_path", metavar="FILE", help="Write the report (whyidle.report/1) to FILE ('-' = stdout).")
@click.option("--html", "html_path", metavar="FILE", help="Write the report as one self-contained HTML page to FILE.")
def report(run_dir, json_path, html_path) -> None:
    """Re-render a saved run directory without re-running anything. Several directories: the
    node runs of one multi-node torchrun job, reported as one job."""
    from whyidle.pipeline import report_run
    from whyidle.record.reader import RunDirError
    from whyidle.run.launcher import LaunchError
    from whyidle.run.session import check_writable_file

    try:
        for option, path in (("--json", json_path), ("--html", html_path)):
            if path not in (None, "-"):
                check_writable_file(path, option)
        rep = report_run(list(run_dir), json_path if json_path not in (None, "-") else None, html_path)
    except (RunDirError, LaunchError) as exc:
        _fail(str(exc), 2)
    except OSError as exc:
        where = re.sub(r"\.tmp\d+$", "", str(exc.filename or json_path or html_path))  # not the temporary file
        _fail(f"cannot write {where}: {exc.strerror or exc}", 2)
    except Exception as exc:  # noqa: BLE001 - the last resort: a record the readers let through
        _fail(f"{', '.join(run_dir)}: cannot analyze ({type(exc).__name__}: {str(exc)[:200]}); the run directory "
              "is left as it was", 2)
    _show(rep, json_path)
    if html_path and json_path != "-":
        click.echo(f"HTML report (--html): {html_path}")


@main.command("trace-now", context_settings=CONTEXT)
@click.argument("run_dir", metavar="RUN_DIR")
@click.option("--steps", type=click.IntRange(1, 200), default=None,
              help="Steps to trace (default: the run's --trace-steps).")
@click.option("--rank", type=click.IntRange(min=0), default=None, help="Only this rank (default: every rank).")
def trace_now(run_dir, steps, rank) -> None:
    """Take a deep (Kineto) trace of a running `whyidle run` job now, from another shell.

    \b
    The trainers start it at their next step boundaries; the trace and its analysis land in
    RUN_DIR/traces/ and RUN_DIR/traces.jsonl, and in the final report.
    """
    from whyidle.run.rolling import request_trace

    try:
        request_trace(run_dir, steps, rank)
    except ValueError as exc:
        _fail(str(exc), 2)
    except OSError as exc:
        _fail(f"{run_dir}: cannot write the request ({exc.strerror or exc})", 2)
    click.echo(f"whyidle: deep trace requested; it is taken at the next step boundaries (a second or two), "
               f"analyzed into {os.path.join(run_dir, 'traces.jsonl')} and shown in the report", err=True)


@main.command(context_settings=CONTEXT)
@click.argument("path", metavar="PATH")
@click.option("--json", "json_path", metavar="FILE", help="Write the report (whyidle.report/1) to FILE ('-' = stdout).")
@click.option("--rank", type=int, default=None, help="Only this rank's trace (from distributedInfo).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes reading a folder's rank files, or the byte ranges of one large uncompressed trace "
                   "(default: one per core, fewer when memory is short; 1: this process alone).")
def trace(path, json_path, rank, workers) -> None:
    """Diagnose an existing PyTorch profiler (Kineto) trace: a .json/.json.gz file or a folder of ranks."""
    import contextlib

    # No linear algebra here: numpy's OpenBLAS would start a thread per core when imported
    # (~40 ms of CPU, measured on 2 cores), which the byte-range readers would wait behind.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from whyidle.pipeline import trace_report
    from whyidle.record.kineto import TraceError
    from whyidle.record.writer import write_json_atomic

    status = contextlib.nullcontext()
    if sys.stderr.isatty():  # a folder of many ranks takes a while
        from rich.console import Console

        status = Console(stderr=True).status("reading and analyzing the trace(s)…")
    from whyidle.gcpause import gc_paused

    try:
        with status, gc_paused():  # the analysis builds no cycles; collections would walk every import
            rep = trace_report(path, rank, workers, while_reading=_renderer_import(json_path))
    except TraceError as exc:
        _fail(str(exc), 2)
    if json_path not in (None, "-"):
        try:
            write_json_atomic(json_path, rep)
        except OSError as exc:
            _fail(f"cannot write {json_path}: {exc.strerror or exc}", 2)
    _show(rep, json_path)
    import atexit
    import gc

    # At exit, whatever is left is freed with the process: frozen, it is spared the interpreter's
    # final full collection (~15 ms of CPU). Only at exit: a program calling this keeps its collector.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


@main.command(context_settings=CONTEXT)
@click.option("--data", "data_path", metavar="PATH",
              help="Dataset folder or file: is it on a network or FUSE file system, made of small files?")
@click.option("--json", "as_json", is_flag=True, help="Print the result (whyidle.env/1) as one JSON object on stdout.")
def env(data_path, as_json) -> None:
    """Check this machine: can each framework see the GPU, driver vs CUDA builds, what the GPU can do.

    Exit code: 0 all good, 1 a warning or critical finding, 2 usage errors (e.g. a missing --data path).
    """
    import contextlib
    import json

    from whyidle.env import DataPathError, check, exit_code

    status = contextlib.nullcontext()
    if not as_json and sys.stderr.isatty():
        from rich.console import Console

        status = Console(stderr=True).status("probing PyTorch, TensorFlow, JAX and the GPU…")
    try:
        with status:
            result = check(data_path)
    except DataPathError as exc:
        _fail(str(exc), 2)
    if as_json:
        click.echo(json.dumps(result, indent=1, default=str))
    else:
        from whyidle.report import env_report

        env_report.render(result)
    sys.exit(exit_code(result))


@main.command(context_settings=CONTEXT)
@click.option("--out", "out", metavar="DIR", default="whyidle-runs", show_default=True,
              help="Where the demo's two run directories go.")
@click.option("--data", "data_dir", metavar="DIR", help="Image folder cache (default: ~/.cache/whyidle/demo-images).")
@click.option("--steps", type=click.IntRange(10, 100000), default=60, show_default=True, help="Steps per run.")
def demo(out, data_dir, steps) -> None:
    """Diagnose a beginner's image pipeline on real photos, apply the fix, show before/after."""
    from whyidle.demo import run_demo

    sys.exit(run_demo(out_dir=out, data_dir=data_dir, steps=steps))


@main.command(context_settings=CONTEXT)
@click.argument("run_dirs", nargs=-1, metavar="RUN_A[,RUN_A2...] RUN_B[,RUN_B2...] [...]")
@click.option("--json", "json_path", metavar="FILE", help="Write the comparison (whyidle.compare/1) to FILE ('-' = stdout).")
def compare(run_dirs, json_path) -> None:
    """Compare saved runs (A = the baseline): throughput with bootstrap intervals, data wait, GPU, metrics.

    Runs joined by commas are repeats of one variant: their interval includes run-to-run variation.

    \b
    Example:  whyidle compare whyidle-runs/...-before whyidle-runs/...-after
              whyidle compare before1,before2,before3 after1,after2,after3
    """
    from whyidle.pipeline import compare as compare_runs
    from whyidle.record.writer import write_json_atomic
    from whyidle.report.compare import CompareError
    from whyidle.report.compare_terminal import render

    if len(run_dirs) < 2:
        _fail("compare needs at least two run directories (usage: whyidle compare RUN_A RUN_B [RUN ...])", 2)
    try:
        result = compare_runs(list(run_dirs))
    except CompareError as exc:
        _fail(str(exc), 2)
    if json_path == "-":
        from whyidle.jsonsafe import json_text

        click.echo(json_text(result))
    else:
        if json_path:
            try:
                write_json_atomic(json_path, result)
            except OSError as exc:
                _fail(f"cannot write {json_path}: {exc.strerror or exc}", 2)
        render(result)
    if not result["comparable"]:
        _fail("no run could be compared with the baseline " + result["baseline"], 2)
