"""Always-on: the rolling diagnosis of a running job, inside ``whyidle run``'s parent process.

Once a second (:meth:`Rolling.tick`, from the session's wait loop) it reads what the job wrote
since the last look (:class:`whyidle.record.follow.RunFollower`), feeds the Prometheus exporter
(:class:`whyidle.export.prometheus.JobMetrics`, when asked for), and every ``window_s`` seconds
closes a window: the window's records are analyzed and diagnosed like a whole run
(:func:`whyidle.pipeline.window_record`), the ``window`` record is appended to
``RUN_DIR/windows.jsonl``, and judged against the job's own baseline
(:mod:`whyidle.diagnose.departure`). A window that departs gets a deep trace: a request in
``RUN_DIR/control/trace.json`` that the agents in the trainer processes take at their next step
boundaries (:mod:`whyidle.instrument.deep_trace`), at most one at a time and at most every
``trace_every_s``; ``whyidle trace-now`` requests one through ``RUN_DIR/control/request-*.json``.
Each trace the agents write is analyzed with ``whyidle trace`` (:func:`whyidle.pipeline.trace_report`)
into ``RUN_DIR/traces.jsonl``.

Nothing here can stop the command: a problem of whyidle's (a full disk, a trace that cannot be
read) is said once and recording goes on without the part that failed. The trainer never waits
for any of it: requests are files the agents look at once a second.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import itertools
import json
import os
import statistics
import time

from whyidle.record.follow import RunFollower
from whyidle.record.steptable import LITE_COLUMNS
from whyidle.record.writer import JsonlWriter, write_json_atomic

#: Default seconds of one window.
WINDOW_S = 180.0
#: Default steps of a deep trace (Kineto's on-demand default with dynolog is a handful of
#: iterations; 10 steps hold the pattern and keep the trace a few MB).
TRACE_STEPS = 10
#: Default seconds between two automatic deep traces (30 minutes).
TRACE_EVERY_S = 1800.0
#: Seconds a trace request may stay unanswered (a trainer that stopped stepping) before another
#: one may be issued.
REQUEST_TIMEOUT_S = 300.0
#: Windows in a row departing with one verdict after which that regime becomes the baseline.
ADOPT_AFTER = 3
#: Seconds of steps the live figures (samples/s, data wait) are computed over.
LIVE_S = 10.0
#: Seconds of recent steps kept per process: the live figures, a trace's cost, which processes
#: are still training (a step in the last minute).
RECENT_S = 70.0
#: A deep trace's cost is its steps' median time against that of the steps just before it: at most
#: this many, within this many seconds.
COST_STEPS = 50
COST_S = 5.0


@dataclasses.dataclass
class RollingOptions:
    """``whyidle run``'s always-on options (seconds; steps)."""

    window_s: float = WINDOW_S
    trace_steps: int = TRACE_STEPS
    trace_every_s: float = TRACE_EVERY_S
    triggers: bool = True  # automatic deep traces on departure
    metrics_port: str | None = None
    metrics_file: str | None = None


class Rolling:
    """The rolling diagnosis of one run directory being written (see the module's doc).

    Args:
        run_dir: the run directory.
        meta: ``whyidle run``'s ``meta.json`` content (``start_t`` set).
        opts: :class:`RollingOptions`.
        metrics: a started exporter (``steps``, ``live``, ``window``, ``trace``, ``flush``,
            ``close``), or None.
        say: called with one line of text for the user (whyidle's stderr), or None.
    """

    def __init__(self, run_dir: str, meta: dict, opts: RollingOptions, metrics=None, say=None) -> None:
        from whyidle.analysis.baseline import Baseline

        self.run_dir = run_dir
        self.meta = meta
        self.opts = opts
        self.metrics = metrics
        self.say = say or (lambda text: None)
        self.follower = RunFollower(run_dir, meta)
        self.baseline = Baseline()
        self.start_t = meta.get("start_t") or time.monotonic_ns()
        self.t0 = self.start_t
        self.windows: list[dict] = []  # the compact records (a few hundred bytes each)
        self.streak: list[dict] = []  # departed windows in a row
        self.windows_out = JsonlWriter(os.path.join(run_dir, "windows.jsonl"))
        self.traces_out = JsonlWriter(os.path.join(run_dir, "traces.jsonl"))
        self.problem: str | None = None
        self.requests = 0
        self.pending: dict | None = None  # the outstanding request
        self.last_auto: float | None = None  # monotonic s of the last automatic request
        self.answers: dict[str, list[dict]] = {}
        self.ranks: dict[int, int | None] = {}  # pid -> rank
        self.samples_per_step: dict[int, int] = {}
        self.recent: dict[int, collections.deque] = {}  # pid -> (t0, t1, data ns or None)
        self.now = self.start_t  # monotonic ns of the last look

    # -- the loop ---------------------------------------------------------------------------------
    def tick(self, now: int | None = None) -> None:
        """One look (about once a second): new records, metrics, requests, a window when due."""
        if self.problem is not None:
            return
        now = self.now = now or time.monotonic_ns()
        try:
            self.follower.poll()
            self._take_new()
            self._take_requests(now)
            if now - self.t0 >= self.opts.window_s * 1e9:
                self._close_window(now)
            if self.metrics is not None:
                self._live(now)
                self._flush_metrics()
        except Exception as exc:  # noqa: BLE001 - the command must never pay for a problem of ours
            self._fail(exc)

    def _flush_metrics(self) -> None:
        """Writes the metrics file when due; a file that cannot be written any more (a full disk)
        is said once and the job goes on without it (the HTTP endpoint and windows stay)."""
        from whyidle.export.prometheus import MetricsError

        try:
            self.metrics.flush()
        except MetricsError as exc:
            self.say(f"whyidle: {exc}; the metrics file is no longer written")
            self.metrics.textfile = None

    def finish(self, end: int) -> None:
        """At the command's end: the last window (up to ``end``; none for a run shorter than one
        window, whose report is its diagnosis), the traces written meanwhile, the final metrics;
        closes the files."""
        self.now = end
        try:
            self.follower.poll()
            self._take_new()
            # a run shorter than a window: its report is the window's (closed only for the metrics)
            if end > self.t0 and (self.windows or self.metrics is not None):
                self._close_window(end, last=True)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
        for writer in (self.windows_out, self.traces_out):
            try:
                writer.close()
            except OSError:
                pass
        if self.metrics is not None:
            try:
                self.metrics.close()
            except Exception:  # noqa: BLE001
                pass

    def _fail(self, exc: BaseException) -> None:
        if self.problem is None:
            self.problem = f"the rolling diagnosis stopped: {type(exc).__name__}: {str(exc)[:200]}"
            self.say(f"whyidle: {self.problem}")

    # -- records ----------------------------------------------------------------------------------
    def _take_new(self) -> None:
        fed: dict[int, list] = {}
        for pid, rec in self.follower.take_new():
            k = rec.get("k")
            if k == "trace_window":
                self._answered(pid, rec)
                continue
            if pid not in self.ranks:
                self.ranks[pid] = self._rank_of(pid)
            if k == "steps":  # lite rows read in place (a short-step job writes ~1,000 a second)
                got = _lite_times(rec)
            else:
                t0, t1 = rec.get("t0"), rec.get("t1")
                if not isinstance(t0, int) or not isinstance(t1, int):
                    continue
                if isinstance(rec.get("samples"), int) and rec["samples"] > 0:
                    self.samples_per_step[pid] = rec["samples"]
                got = [(t0, t1, rec.get("data"))]
            if not got:
                continue
            recent = self.recent.get(pid)
            if recent is None:
                recent = self.recent[pid] = collections.deque(maxlen=100_000)
            recent.extend(got)
            if self.metrics is not None:
                fed.setdefault(pid, []).extend(got)
        keep = self.now - int(RECENT_S * 1e9)
        for rows in self.recent.values():
            while rows and rows[0][1] < keep:
                rows.popleft()
        if self.metrics is not None:
            for pid, rows in fed.items():
                per = self.samples_per_step.get(pid)
                self.metrics.steps(self.ranks.get(pid), [(b - a) / 1e9 for a, b, _ in rows],
                                   per * len(rows) if per else None, self._unix(rows[-1][1]), _wait_s(rows))

    def _rank_of(self, pid: int) -> int | None:
        for rec in self.follower.procs.get(pid, []):
            if rec.get("k") == "proc" and isinstance(rec.get("dist"), dict):
                rank = rec["dist"].get("RANK")
                try:
                    return int(rank)
                except (TypeError, ValueError):
                    return None
        return None

    def _unix(self, t: int) -> float:
        return time.time() - (time.monotonic_ns() - t) / 1e9

    def _live(self, now: int) -> None:
        cutoff = now - int(LIVE_S * 1e9)
        for pid, kept in self.recent.items():
            rows = list(itertools.takewhile(lambda r: r[1] >= cutoff, reversed(kept)))[::-1]
            if len(rows) < 2:
                continue
            span = (rows[-1][1] - rows[0][1]) / 1e9
            per = self.samples_per_step.get(pid)
            sps = per * (len(rows) - 1) / span if per and span > 0 else None
            timed = [r for r in rows if r[2] is not None]
            busy = sum(b - a for a, b, _ in timed)
            wait = sum(r[2] for r in timed) / busy if busy > 0 else None
            self.metrics.live(self.ranks.get(pid), sps, wait)

    # -- windows ----------------------------------------------------------------------------------
    def _close_window(self, now: int, last: bool = False) -> None:
        from whyidle.diagnose.departure import MIN_WINDOW_STEPS, departures, slow_share
        from whyidle.pipeline import window_record

        t0, self.t0 = self.t0, now
        run = self.follower.window(t0, now)
        try:
            rec = window_record(run, len(self.windows), self.start_t)
        except Exception as exc:  # noqa: BLE001 - one window the analysis cannot take: the next ones go on
            rec = {"k": "window", "i": len(self.windows), "t0": t0, "t1": now, "steps": 0, "verdict": None,
                   "start_s": round((t0 - self.start_t) / 1e9, 3), "end_s": round((now - self.start_t) / 1e9, 3),
                   "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        durations = _durations(run)
        rec["slow_share"] = slow_share(durations, self.baseline)
        stats = self.baseline.step_stats()
        rec["baseline"] = {"p50_s": round(stats[0], 6), "mad_s": round(stats[1], 6), "steps": self.baseline.steps} \
            if stats else None
        rec["departed"] = departures(rec, durations, self.baseline)
        rec["t"] = time.monotonic_ns()
        self.follower.prune(now)
        self._write(self.windows_out, rec)
        self.windows.append(rec)
        if self.metrics is not None and rec.get("steps", 0) >= MIN_WINDOW_STEPS:  # a last second is no verdict
            self.metrics.window(rec)
        if not rec["departed"]:
            if rec["steps"] and not _mostly_startup(rec):
                self.baseline.add(rec, durations)
            self.streak = []
            return
        self.streak.append(rec)
        if len(self.streak) >= ADOPT_AFTER and len({w["verdict"] for w in self.streak}) == 1:
            self.baseline.reset()  # a new regime: judged against itself from now on
            for w in self.streak:
                self.baseline.add(w, [])
            self.baseline.add(rec, durations)
            self.streak = []
        why = f"window {rec['i']} ({rec['start_s']:.0f}–{rec['end_s']:.0f} s): " + "; ".join(rec["departed"])
        if last:
            return
        elapsed = None if self.last_auto is None else time.monotonic() - self.last_auto
        if not self.opts.triggers:
            self.say(f"[whyidle] {why} (no deep trace: --no-triggers)")
        elif self.pending is not None:
            self.say(f"[whyidle] {why} (no deep trace: {self.pending['id']} is being taken)")
        elif elapsed is not None and elapsed < self.opts.trace_every_s:
            self.say(f"[whyidle] {why} (no deep trace: the last was {elapsed / 60:.0f} min ago, --trace-every "
                     f"{self.opts.trace_every_s / 60:g})")
        else:
            self.last_auto = time.monotonic()
            self._request(self.opts.trace_steps, None, why)

    def _write(self, writer: JsonlWriter, rec: dict) -> None:
        if writer.path is None:
            return
        writer.add(rec)
        try:
            writer.flush()
        except OSError as exc:
            name = os.path.basename(writer.path)
            writer.path = None  # never written again
            self.say(f"whyidle: {name} not written ({exc.strerror or exc}); recording goes on without it")

    # -- deep traces ------------------------------------------------------------------------------
    def _trainers(self, rank: int | None = None) -> set[int]:
        """The pids that stepped in the last minute (of ``rank``, when given: a process outside a
        distributed job is rank 0, as the agents count it): the processes a request waits for."""
        recent = self.now - int(60e9)
        return {q for q, rows in self.recent.items() if rows and rows[-1][1] >= recent
                and (rank is None or (self.ranks.get(q) or 0) == rank)}

    def _request(self, steps: int, rank: int | None, reason: str, manual: bool = False) -> None:
        if rank is not None and self.recent and not self._trainers(rank):
            have = sorted({self.ranks.get(q) or 0 for q in self._trainers()})
            self.say(f"[whyidle] deep trace not requested: no process of rank {rank} is training here "
                     f"(ranks: {', '.join(map(str, have)) or 'none yet'})")
            return
        self.requests += 1
        req = {"id": f"t{self.requests}", "steps": int(steps), "ranks": None if rank is None else [int(rank)],
               "pids": None, "reason": reason, "manual": manual, "t": time.monotonic_ns()}
        try:
            os.makedirs(os.path.join(self.run_dir, "control"), mode=0o700, exist_ok=True)
            write_json_atomic(os.path.join(self.run_dir, "control", "trace.json"), req)
        except OSError as exc:
            self.say(f"whyidle: deep trace not requested ({exc.strerror or exc})")
            return
        self.pending = {**req, "since": time.monotonic()}
        who = "" if len(self.ranks) < 2 and rank is None else ", every rank" if rank is None else f", rank {rank}"
        self.say(f"[whyidle] deep trace {req['id']} requested ({steps} steps{who}): {reason}")

    def _take_requests(self, now: int) -> None:
        if self.pending is not None and self.recent and not self._trainers(
                None if self.pending["ranks"] is None else self.pending["ranks"][0]):
            self.say(f"[whyidle] deep trace {self.pending['id']}: no process to take it is training any more")
            self.pending = None
        if self.pending is not None and time.monotonic() - self.pending["since"] > REQUEST_TIMEOUT_S:
            self.say(f"[whyidle] deep trace {self.pending['id']}: no trainer answered in {REQUEST_TIMEOUT_S:.0f} s")
            self.pending = None
        if self.pending is not None:
            return
        for path in sorted(glob.glob(os.path.join(self.run_dir, "control", "request-*.json"))):
            try:
                with open(path, encoding="utf-8") as f:
                    req = json.load(f)
                os.remove(path)
            except (OSError, ValueError):
                continue
            if not isinstance(req, dict):
                continue
            steps = req.get("steps") if isinstance(req.get("steps"), int) and req["steps"] > 0 else self.opts.trace_steps
            rank = req.get("rank") if isinstance(req.get("rank"), int) else None
            self._request(steps, rank, "asked for (whyidle trace-now)", manual=True)
            return

    def _answered(self, pid: int, rec: dict) -> None:
        """A trainer's ``trace_window`` record: analyze its trace into ``traces.jsonl``."""
        out = self._analyzed(pid, rec)
        self._write(self.traces_out, out)
        if self.metrics is not None:
            self.metrics.trace(out)
        if out.get("error"):
            self.say(f"[whyidle] deep trace {out.get('id')} (pid {pid}): {out['error']}")
        else:
            ratio = (out.get("cost") or {}).get("ratio")
            self.say(f"[whyidle] deep trace {out.get('id')}{'' if out.get('rank') is None else ' rank ' + str(out['rank'])}: "
                     + (f"{out['verdict']} ({out['title']})" if out.get("title") else "no finding of its own")
                     + (f"; the traced steps took {ratio:.2f}× the others" if ratio else "")
                     + f" → {out.get('file')}")
        p = self.pending
        if p is not None and rec.get("id") == p["id"]:
            self.answers.setdefault(p["id"], []).append(out)
            waiting = self._trainers(None if p["ranks"] is None else p["ranks"][0])  # those still stepping
            if {a["pid"] for a in self.answers[p["id"]]} >= waiting:
                self.pending = None
                self._job_trace(p, self.answers.pop(p["id"]))

    def _job_trace(self, request: dict, answers: list[dict]) -> None:
        """The ranks' traces of one request read together as one job (``whyidle trace`` of a
        folder: the rank the others wait for, from their collectives): a ``deep_trace`` record
        with ``job`` true, when at least two ranks answered with a trace."""
        from whyidle.pipeline import trace_report

        done = [a for a in answers if a.get("file") and not a.get("error")]
        if len(done) < 2:
            return
        folder = os.path.join(self.run_dir, "traces", request["id"])
        out = {"k": "deep_trace", "t": time.monotonic_ns(), "id": request["id"], "job": True, "pid": None,
               "rank": None, "ranks": sorted(a["rank"] for a in done if a.get("rank") is not None),
               "trigger": "request" if request["manual"] else "departure", "reason": request["reason"],
               "t0": min(a["t0"] for a in done), "t1": max(a["t1"] for a in done), "steps": done[0].get("steps"),
               "start_s": min(a["start_s"] for a in done), "file": os.path.relpath(folder, self.run_dir),
               "error": None}
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            for a in done:  # the folder whyidle trace reads as one job: links, no copies
                target = os.path.join(folder, os.path.basename(a["file"]))
                if not os.path.exists(target):
                    os.link(os.path.join(self.run_dir, a["file"]), target)
            report = trace_report(folder, workers=1)
        except Exception as exc:  # noqa: BLE001 - the per-rank analyses stand
            out["error"] = f"the ranks' traces could not be read as one job: {str(exc)[:200]}"
        else:
            self._verdict_of(report, out)
            culprit = next((f for f in report.get("findings") or [] if f.get("id") == "imbalance"), None)
            out["culprit_rank"] = ((culprit or {}).get("evidence") or {}).get("culprit_rank")
        self._write(self.traces_out, out)
        if not out["error"]:
            self.say(f"[whyidle] deep trace {out['id']} of ranks {out['ranks']} as one job: {out.get('verdict')}"
                     + (f" ({out['title']})" if out.get("title") else "")
                     + (f"; rank {out['culprit_rank']} is the one the others wait for"
                        if out.get("culprit_rank") is not None else ""))

    @staticmethod
    def _verdict_of(report: dict, out: dict) -> None:
        """Puts a trace report's verdict, its finding's title and summary, the GPU idle share, the
        step time and the finding ids into a ``deep_trace`` record."""
        m = report.get("metrics") or {}
        top = next((f for f in report.get("findings") or [] if f.get("id") == report.get("verdict")), None)
        out.update({"verdict": report.get("verdict"), "title": (top or {}).get("title"),
                    "summary": (top or {}).get("summary"), "idle_share": (m.get("gpu") or {}).get("idle_share"),
                    "step_s": (m.get("step_time_s") or {}).get("p50"),
                    "findings": [f.get("id") for f in report.get("findings") or []][:6]})

    def _analyzed(self, pid: int, rec: dict) -> dict:
        from whyidle.pipeline import trace_report

        t0, t1 = rec.get("t0"), rec.get("t1")
        mine = (self.pending or {}).get("id") == rec.get("id")
        out = {"k": "deep_trace", "t": time.monotonic_ns(), "id": rec.get("id"), "pid": pid, "rank": rec.get("rank"),
               "trigger": ("request" if self.pending["manual"] else "departure") if mine else None,
               "world_size": rec.get("world_size"), "reason": (self.pending or {}).get("reason")
               if (self.pending or {}).get("id") == rec.get("id") else rec.get("reason"),
               "t0": t0, "t1": t1, "steps": rec.get("steps"), "file": rec.get("file"),
               "start_s": round((t0 - self.start_t) / 1e9, 3) if isinstance(t0, int) else None,
               "stop_s": rec.get("stop_s"), "export_s": rec.get("export_s"), "error": rec.get("error"),
               "cost": self._cost(pid, t0, t1)}
        if rec.get("method") == "tf_profiler":  # Keras on TensorFlow: the profiler window's own summary
            if not out["error"]:
                out.update(_tf_window_verdict(rec))
        elif out["file"] and not out["error"]:
            try:
                report = trace_report(os.path.join(self.run_dir, out["file"]), workers=1)
            except Exception as exc:  # noqa: BLE001 - a trace we cannot read is said, never fatal
                out["error"] = f"the trace could not be analyzed: {str(exc)[:200]}"
            else:
                self._verdict_of(report, out)
        return out

    def _cost(self, pid: int, t0, t1) -> dict | None:
        """The trace window's cost on the steps it covers: their median step time against the
        median of the :data:`COST_STEPS` steps before it, within :data:`COST_S` seconds of it (the
        same regime: a trace follows a change), in seconds and as a ratio."""
        rows = list(self.recent.get(pid) or ())
        if not isinstance(t0, int) or not isinstance(t1, int) or not rows:
            return None
        traced = [(b - a) / 1e9 for a, b, _ in rows if a >= t0 and b <= t1]
        before = [(b - a) / 1e9 for a, b, _ in rows if t0 - COST_S * 1e9 <= b <= t0][-COST_STEPS:]
        if not traced or len(before) < 5:
            return None
        med_t, med_b = statistics.median(traced), statistics.median(before)
        return {"traced_step_s": round(med_t, 6), "untraced_step_s": round(med_b, 6),
                "ratio": round(med_t / med_b, 3) if med_b > 0 else None}


_LITE_T0, _LITE_T1, _LITE_DATA = (LITE_COLUMNS.index(c) for c in ("t0", "t1", "data"))


def _lite_times(rec: dict) -> list[tuple]:
    """``(t0, t1, data ns or None)`` of each row of a ``steps`` record (the rows
    :func:`whyidle.record.steptable.expand_lite` would give, without building their dicts)."""
    rows = rec.get("rows")
    out = []
    n = len(LITE_COLUMNS)
    for row in rows if isinstance(rows, list) else ():
        if isinstance(row, list) and len(row) == n:
            t0, t1 = row[_LITE_T0], row[_LITE_T1]
            if isinstance(t0, int) and isinstance(t1, int):
                out.append((t0, t1, row[_LITE_DATA]))
    return out


def _tf_window_verdict(rec: dict) -> dict:
    """What a Keras (TensorFlow) deep trace says, from its train-function calls: the share of their
    time spent waiting for the input (``IteratorGetNext`` inside them, as ``tf_window`` records are
    read, :mod:`whyidle.analysis.keras`); input-bound past the ``input_bound`` rule's warning share
    (:data:`whyidle.diagnose.thresholds.DATA_WAIT_WARN`)."""
    from whyidle.analysis.keras import input_wait_ratio
    from whyidle.diagnose.thresholds import DATA_WAIT_WARN

    calls = [c for c in rec.get("calls") or [] if isinstance(c, list) and len(c) >= 2
             and all(isinstance(v, (int, float)) for v in c[:2])]
    share = input_wait_ratio(calls)
    if share is None:
        return {"verdict": None, "error": "the TensorFlow profiler window holds no train-function call"}
    stages = ", ".join(f"{s[0]} {s[2]:.0f} ms" for s in (rec.get("iterators") or [])[:3]
                       if isinstance(s, list) and len(s) >= 3 and isinstance(s[2], (int, float)))
    bound = share >= DATA_WAIT_WARN
    return {"verdict": "input_bound" if bound else "device_bound", "input_wait_share": round(share, 4),
            "title": "Input-bound: the step waits for data" if bound else "The train function rarely waits for input",
            "summary": f"The train function waited for its input {share:.0%} of its time over {len(calls)} calls "
                       "(TensorFlow profiler)" + (f"; busiest tf.data stages: {stages}" if stages else "") + "."}


def _mostly_startup(rec: dict) -> bool:
    """A window whose wall time is mostly the job's start-up (its steps are too few to be the
    job's normal pace, and its samples/s covers only the end of it): kept out of the baseline."""
    g = rec.get("goodput") or {}
    return bool(g.get("wall_s")) and (g.get("lost_s") or {}).get("startup", 0.0) > 0.5 * g["wall_s"]


def _wait_s(rows: list[tuple]) -> float | None:
    """Data wait (seconds) of ``rows`` (``(t0, t1, data ns or None)``): the timed steps' wait scaled
    to all the steps' time, since short steps are timed one in k (docs/run-format.md, detail
    stride); None when none was timed."""
    timed = [(b - a, d) for a, b, d in rows if d is not None]
    busy = sum(t for t, _ in timed)
    if not busy:
        return None
    return sum(d for _, d in timed) / busy * sum(b - a for a, b, _ in rows) / 1e9


def _durations(run) -> list[float]:
    """Step times (seconds) of the window's busiest process, less the steps a deep trace slowed."""
    tables = [t for t in run.steps.values() if len(t)]
    if not tables:
        return []
    table = max(tables, key=len)
    seconds = (table.dense("t1") - table.dense("t0")) / 1e9
    return seconds[[not p for p in table.profiled]].tolist()


def request_trace(run_dir: str, steps: int | None, rank: int | None) -> str:
    """``whyidle trace-now``: asks the ``whyidle run`` observing ``run_dir`` for a deep trace of
    the next ``steps`` steps (None: its ``--trace-steps``) on every rank, or on ``rank``; returns the
    request file's path. The run's whyidle process turns it into a trace request at its next look
    (about a second) once no other trace is being taken.

    Errors: ``ValueError`` (one line) when ``run_dir`` is not a run directory, its run has ended,
    or the whyidle process that observes it is gone; ``OSError`` when the request cannot be written.
    """
    from whyidle.record.writer import write_json_atomic as write

    meta_path = os.path.join(run_dir, "meta.json")
    if not os.path.exists(run_dir):
        raise ValueError(f"{run_dir}: no such run directory")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        raise ValueError(f"{run_dir}: not a run directory (no readable meta.json)") from None
    if not isinstance(meta, dict) or meta.get("format") != "whyidle.run/1":
        raise ValueError(f"{run_dir}: not a whyidle run directory")
    if meta.get("exit_t") is not None or meta.get("end_t") is not None:
        raise ValueError(f"{run_dir}: the run has ended; a deep trace needs a running job")
    if meta.get("scope") == "watch":
        raise ValueError(f"{run_dir}: a whyidle.watch() block has no rolling diagnosis; use whyidle run")
    pid = meta.get("whyidle_pid")
    if not isinstance(pid, int) or not _alive(pid):
        raise ValueError(f"{run_dir}: the whyidle process observing this run (pid {pid}) is gone")
    folder = os.path.join(run_dir, "control")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"request-{time.time_ns()}-{os.getpid()}.json")
    write(path, {"steps": steps, "rank": rank, "t": time.monotonic_ns()})
    return path


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running whyidle process (not a zombie left by a kill, not another
    program that got its number)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and "whyidle" in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
