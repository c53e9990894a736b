"""The composition root: load → analyze → diagnose → build the report → render and write.

``whyidle run`` (:mod:`whyidle.run.session`), ``report``, ``trace``, ``compare`` and ``demo`` all
go through here (``tune``'s trials too: each is an observed run, compared as ``compare`` does); no
other module wires the stages together. The stages themselves are pure:
:mod:`whyidle.record` reads a run directory, :mod:`whyidle.analysis` turns records into facts,
:mod:`whyidle.diagnose` turns facts into a verdict and findings, :mod:`whyidle.report` turns facts
and findings into the report and its renderings (it never reads records), and
:mod:`whyidle.export` converts a saved run for other tools.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from whyidle.gcpause import gc_paused

if TYPE_CHECKING:  # annotations only: `whyidle trace` does not load the run-side modules
    from whyidle.analysis.facts import RunFacts
    from whyidle.record.reader import RunData


@dataclasses.dataclass
class Analyzed:
    """One run directory taken through analysis and diagnosis.

    Fields: ``run`` (the records, :func:`whyidle.record.reader.load_run`); ``facts``
    (:func:`whyidle.analysis.run.analyze`); ``verdict`` (finding id, or ``"device_bound"`` /
    ``"no_steps"``); ``findings`` (list of finding dicts, docs/report.md).
    """

    run: RunData
    facts: RunFacts
    verdict: str
    findings: list[dict]


def analyze_run(run_dir: str | list[str], meta: dict | None = None) -> Analyzed:
    """Loads, analyzes and diagnoses one saved run directory, or the node runs of one
    multi-node job as one job (a list of several: :mod:`whyidle.record.merge`; the machine
    samples and ``meta`` are those of the node whose rank the report describes).

    ``meta``: one directory's final ``meta.json`` content as ``whyidle run`` holds it, used instead
    of the file when the file could not be rewritten at the end (a full or read-only run directory;
    the notes say so).

    Errors: :class:`whyidle.record.reader.RunDirError` for a missing, older-format or corrupt
    directory, or directories that are not one job's nodes.
    """
    with gc_paused():
        return _analyze_run([run_dir] if isinstance(run_dir, str) else list(run_dir), meta)


def _analyze_run(dirs: list[str], meta: dict | None) -> Analyzed:
    from whyidle.analysis.ranks import SUMMARY_VERSION
    from whyidle.analysis.run import analyze, job_lead
    from whyidle.diagnose import diagnose
    from whyidle.record import merge
    from whyidle.record.reader import load_run

    if len(dirs) == 1:
        run = load_run(dirs[0])
        if meta is not None:
            run.meta = dict(meta)
            run.problems.append("meta.json could not be rewritten at the end of the run (it lacks the exit "
                                "status); this report used whyidle's own copy.")
    else:  # every rank's summary (or records, without one), then the described node and rank in full
        runs = [merge.load_node(d, SUMMARY_VERSION) for d in dirs]
        merged, owner = merge.merge_runs(runs)
        lead = job_lead(merged)
        i = owner.get(lead, 0) if lead is not None else 0
        own = merge.node_pid(lead, owner) if lead is not None and lead in merged.summaries else None
        runs[i] = merge.load_node(dirs[i], SUMMARY_VERSION, described=own, samples=True)
        merged, owner = merge.merge_runs(runs)
        run = merge.with_node_of(merged, runs, owner, lead)
    facts = analyze(run)
    verdict, findings = diagnose(facts)
    return Analyzed(run, facts, verdict, findings)


def report_run(run_dir: str | list[str], json_path: str | None = None, html_path: str | None = None,
               meta: dict | None = None, notes: list[str] | None = None) -> dict:
    """The ``whyidle.report/1`` dict of a run directory; writes ``report.json``, ``report.html``
    (unless the run was made with ``--no-html``) and ``timeline.json`` into it, and the report to
    ``json_path`` / ``html_path`` when given. The page is rendered once for both HTML paths.
    Several directories (one multi-node job's node runs, :func:`analyze_run`) give the job's
    report, written only to ``json_path`` / ``html_path``: each node's directory keeps its own.

    A view of the run directory that cannot be written (read-only or full directory, a rendering
    error), ``report.json`` included, is named in the report's ``notes``; the report never depends
    on it. ``meta``: see :func:`analyze_run`; ``notes``: sentences the caller adds to the report's
    ``notes`` (``whyidle run``: why its recording stopped early).
    Errors: :class:`whyidle.record.reader.RunDirError` for a missing or corrupt directory;
    ``OSError`` when ``json_path`` or ``html_path`` cannot be written.
    """
    from whyidle.record.writer import write_json_atomic
    from whyidle.report.build import build_report

    dirs = [run_dir] if isinstance(run_dir, str) else list(run_dir)
    a = analyze_run(dirs, meta)
    report = build_report(a.facts, a.verdict, a.findings, a.run.problems)
    report["notes"] += notes or []
    report["run"]["run_dir"] = a.run.path
    own = dirs[0] if len(dirs) == 1 else None
    if own is None:
        report["run"]["run_dirs"] = dirs
        report["notes"].append(f"One job from {len(dirs)} node runs ({', '.join(dirs)}): every node's ranks; the "
                               f"machine samples and time accounting are those of {a.run.path}, the node of the rank "
                               "described.")
    own_html = os.path.join(own, "report.html") if own and a.run.meta.get("html", True) else None
    if own_html or html_path:
        try:
            parts = render_html_parts(a, report)
        except Exception as exc:  # a view must never cost the report
            if html_path:
                raise
            _note(report, "report.html", exc)
        else:
            if own_html and _write_view(report, "report.html", lambda: write_parts(own_html, parts)):
                report["run"]["html"] = own_html
            if html_path:
                write_parts(html_path, parts)
            del parts
    if own:
        timeline = os.path.join(own, "timeline.json")
        written: dict = {}
        if _write_view(report, "timeline.json", lambda: written.update(write_timeline(a, timeline))):
            report["run"]["timeline"] = timeline
            size_law = written["otherData"].get("size_law")  # a long run: which steps are summarized
            if size_law:
                report["notes"].append(size_law)
        try:
            write_json_atomic(os.path.join(own, "report.json"), report)
        except OSError as exc:  # a read-only saved run can still be rendered; --json, stdout still get it
            _note(report, "report.json", exc)
        if "end_t" in a.run.meta:  # an ended run: what a merge of node runs reads of its ranks
            try:
                write_rank_summaries(a.run)
            except OSError:
                pass  # a read-only or full directory: a merge reads these ranks in full
            except Exception as exc:  # noqa: BLE001 - never costs the report
                _note(report, "ranks.json", exc)
    if json_path:
        write_json_atomic(json_path, report)
    return report


def write_rank_summaries(run: RunData) -> int:
    """Writes the rank summaries of one ended node run (``ranks.json``, ``ranks.npy``:
    :mod:`whyidle.record.rank_summary`) into its directory (:func:`summarize_ranks`); returns how
    many (0: nothing written, not a distributed job).

    Errors: ``OSError`` when the directory cannot be written or a rank's file is gone.
    """
    from whyidle.analysis.ranks import SUMMARY_VERSION
    from whyidle.record import rank_summary

    made = summarize_ranks(run)
    if made:
        rank_summary.write(run.path, made, SUMMARY_VERSION)
    return len(made)


def summarize_ranks(run: RunData) -> list:
    """The :class:`~whyidle.record.rank_summary.RankSummary` of each ``torch.distributed`` rank of
    ``run`` (:func:`whyidle.analysis.run.rank_summaries`), each stamped with its
    ``proc-<pid>.jsonl``'s size and mtime now (the run has ended: the files no longer change) and
    holding the reader's notes on that file.

    Errors: ``OSError`` when a rank's file is gone.
    """
    from whyidle.analysis.run import rank_summaries
    from whyidle.record import rank_summary

    out = []
    for pid, s in rank_summaries(run).items():
        size, mtime_ns = rank_summary.source_stamp(rank_summary.proc_file(run.path, pid))
        name = f"proc-{pid}.jsonl:"
        out.append(rank_summary.RankSummary(
            pid=pid, size=size, mtime_ns=mtime_ns, records=s["records"],
            problems=[p for p in run.problems if p.startswith(name)], figures=s["figures"], other=s["other"],
            steps=s["steps"], trains=s["trains"], wait_steps=s["waits"].steps, wait_ns=s["waits"].ns))
    return out


def window_record(run: RunData, i: int, start_t: int | None) -> dict:
    """The rolling diagnosis of one window: ``run`` holds the window's records
    (:func:`whyidle.record.window.slice_run`, its ``meta["window"]`` = ``[t0, t1]`` monotonic ns),
    analyzed and diagnosed as a whole run, reduced to a ``window`` record
    (:func:`whyidle.report.windows.window_record`; docs/run-format.md). ``start_t``: the command's
    start (monotonic ns), for the record's seconds.
    """
    from whyidle.analysis.run import analyze
    from whyidle.diagnose import diagnose
    from whyidle.report.build import build_report
    from whyidle.report.windows import window_record as reduce

    t0, t1 = run.meta["window"]
    facts = analyze(run)
    verdict, findings = diagnose(facts)
    return reduce(build_report(facts, verdict, findings, []), i, t0, t1, start_t)


def render_html_parts(a: Analyzed, report: dict) -> tuple[bytes, ...]:
    """The HTML page of a report as UTF-8 parts (:func:`whyidle.report.html.render_parts`)."""
    from whyidle.analysis.series import run_series
    from whyidle.report.html import render_parts

    return render_parts(report, run_series(a.run, a.facts))


def write_parts(path: str, parts: tuple[bytes, ...]) -> None:
    """Writes the parts of a page to ``path`` atomically (temporary file + ``os.replace``).

    Errors: ``OSError`` when the directory is not writable.
    """
    from whyidle.record.writer import atomic_file

    with atomic_file(path) as f:
        for part in parts:
            f.write(part)


def write_timeline(a: Analyzed, path: str) -> dict:
    """Writes the run's Perfetto timeline (:func:`whyidle.export.perfetto.write_timeline`)."""
    from whyidle.export.perfetto import write_timeline as write

    return write(path, a.facts, a.run)


def _note(report: dict, name: str, exc: BaseException) -> None:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else repr(exc)
    report.setdefault("notes", []).append(f"{name} not written: {why}")


def _write_view(report: dict, name: str, write) -> bool:
    try:
        write()
        return True
    except Exception as exc:  # a view must never cost the report
        _note(report, name, exc)
        return False


def trace_report(path: str, rank: int | None = None, workers: int | None = None, while_reading=None) -> dict:
    """The ``whyidle.report/1`` dict of a profiler trace (a Kineto ``.json``/``.json.gz`` file or
    a folder of rank traces, read in parallel processes with bounded memory:
    :mod:`whyidle.analysis.trace_job`); ``rank`` keeps only that rank's trace; ``workers``
    overrides the number of reading processes; ``while_reading``: a callable run while the helper
    processes of one file's parallel read work (the caller's imports). A folder of traces that are not one job's ranks
    (:func:`whyidle.record.kineto.separate_runs`) is reported by its newest run's ranks
    (:func:`whyidle.analysis.trace_job.newest_run`), else by its newest file, with a note.
    Rank files that cannot be read are left out with a note naming each.

    Errors: :class:`whyidle.record.kineto.TraceError` for an unreadable or non-Kineto trace (every
    file of a folder unreadable; the first one's reason), or no trace of ``rank``.
    """
    from whyidle.record.kineto import TraceError, TraceReading, separate_runs, trace_files

    files = trace_files(path)
    # one file: its parallel read starts now, so that the imports below overlap the helpers' reading
    reading = TraceReading(files[0], workers=workers) if len(files) == 1 else None
    from whyidle.analysis.trace_job import job_metrics, newest_run, read_ranks
    from whyidle.diagnose.trace_rules import diagnose_trace
    from whyidle.report.trace_report import build_trace_report

    if while_reading is not None:
        while_reading()
    summaries = read_ranks(files, workers, reading)
    failed = [s for s in summaries if s.error]
    summaries = [s for s in summaries if not s.error]
    if not summaries:
        raise TraceError(failed[0].error)
    notes = [f"skipped (unreadable): {s.error}" for s in failed]
    if failed:
        notes.append(f"{len(failed)} of {len(failed) + len(summaries)} trace files could not be read: the job is "
                     "judged on the others, and a skipped rank may be the one they wait for.")
    notes += [f"{s.path}: left out {s.skipped} event{'s' if s.skipped > 1 else ''} or damaged piece"
              f"{'s' if s.skipped > 1 else ''} of text (not an event object, or a ts, dur or cat that is not a number "
              "in range or text)" for s in summaries if s.skipped]
    notes += [f"{s.path}: the events end early, at {s.cut}: the report covers the events before it"
              + ("" if s.metrics.get("has_gpu") else " (none of them ran on a GPU: profilers write the device's "
                 "events after the host's, so the cut may have taken them all)") for s in summaries if s.cut]
    if separate_runs(summaries):  # not one job's ranks: the newest run's ranks, else its newest trace
        last = newest_run(summaries)
        if last:
            notes.append(f"{len(summaries)} trace files of several runs here (grouped by when their first ProfilerStep "
                         f"began): this report is the newest run's {len(last)} rank(s); pass a file to read another.")
            summaries = last
        else:
            newest = max(summaries, key=lambda s: (os.path.getmtime(s.path), s.path))
            notes.append(f"{len(summaries)} trace files of separate runs here (ranks missing or repeated): this report "
                         f"is the newest, {os.path.basename(newest.path)}; pass a file to read another.")
            summaries = [newest]
    if rank is not None:
        chosen = [s for s in summaries if s.rank == rank]
        if not chosen:
            have = sorted({s.rank for s in summaries if s.rank is not None})
            raise TraceError(f"{path}: no trace of rank {rank} (ranks here: {have or 'none recorded'})")
        if len(summaries) > 1:
            notes.append(f"Rank {rank}'s trace alone, of {len(summaries)} ranks here: the ranks' collectives are not "
                         "compared (leave out --rank for the job).")
        summaries = chosen
    summaries.sort(key=lambda s: (s.rank is None, s.rank if s.rank is not None else 0, s.path))
    job = job_metrics(summaries)
    verdict, findings = diagnose_trace(job, next((s.loader for s in summaries if s.loader), None))
    return build_trace_report(path, summaries, job, verdict, findings, notes)


def summarize_run(path: str) -> dict:
    """One run directory analyzed as ``whyidle report`` would, reduced to what a comparison needs
    (:func:`whyidle.report.compare.run_summary`).

    Errors: :class:`whyidle.record.reader.RunDirError` (missing, older format, corrupt);
    ``ValueError`` when the run has no analyzable steps.
    """
    from whyidle.analysis.gpu import util_series
    from whyidle.report.compare import GPU_TREND_PARTS, run_summary
    from whyidle.cmdline import default_name

    a = analyze_run(path)
    if not a.facts.analyzed_steps:
        total = (a.facts.steps_info or {}).get("total", 0)
        raise ValueError(f"{path}: no training steps to compare ({total} step(s) recorded)"
                         if total else f"{path}: no training steps were recorded")
    command = a.run.meta.get("command") or []
    trend = [round(v, 1) for _, v in util_series(a.run.gpu, tuple(a.facts.step["window"]), max_points=GPU_TREND_PARTS)]
    return run_summary(path, a.facts, a.verdict, a.findings, a.run.problems,
                       name=a.run.meta.get("name") or os.path.basename(os.path.normpath(path)),
                       command=command, script=default_name(list(command)) if command else None, gpu_trend=trend)


def compare(args: list[str]) -> dict:
    """Compares saved runs (``whyidle.compare/1``, :func:`whyidle.report.compare.compare_variants`).

    Args:
        args: one entry per variant: a run directory, or several separated by commas (repeated
            runs of one configuration). A run that cannot be read is left out and named in
            ``problems``.
    Errors: :class:`whyidle.report.compare.CompareError` when fewer than two variants are usable.
    """
    from whyidle.record.reader import RunDirError
    from whyidle.report.compare import MAX_VARIANTS, compare_variants

    problems: list[str] = []
    groups: list[list[dict]] = []
    for arg in args[:MAX_VARIANTS]:
        runs = []
        for path in [p for p in arg.split(",") if p]:
            try:
                runs.append(summarize_run(path))
            except (RunDirError, ValueError) as exc:
                problems.append(f"{exc}; left out")
            except Exception as exc:  # noqa: BLE001 - one odd run must not cost the comparison
                problems.append(f"{path}: cannot analyze ({type(exc).__name__}: {str(exc)[:200]}); left out")
        if runs:
            groups.append(runs)
    return compare_variants(groups, problems)
