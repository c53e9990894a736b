"""``whyidle tune``: the baseline, the trials the diagnosis names, within a time budget.

    baseline → candidates (plan.candidates) → batch-size ladder → halving (repeats of the better
    half and of the baseline) → combination → winner → [--validate: full runs of baseline and
    winner] → whyidle.tune/1 (tune.json, tune.html, the terminal)

Each trial is a run directory under the tune directory (``00-baseline``, ``01-...``), made by the
code path of ``whyidle run`` (:func:`whyidle.tune.trial.run_trial`). Ctrl-C stops the trial that
runs and prints the results so far.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
import time

from whyidle.sampling import limits
from whyidle.tune import plan
from whyidle.tune.plan import Candidate, Outcome
from whyidle.tune.trial import MIN_STEADY_S, StopRule, TrialRun, run_trial

#: Default total budget of a tune, seconds.
DEFAULT_BUDGET_S = 300.0
#: A trial's time limit is the budget ÷ this, within [:data:`MIN_TRIAL_S`, :data:`MAX_TRIAL_S`]:
#: room for the baseline, a handful of candidates and their repeats.
TRIAL_SHARE = 8
MIN_TRIAL_S, MAX_TRIAL_S = 15.0, 90.0
#: Seconds kept back per trial beyond the baseline's fixed cost: the stop rule looks once a second
#: and the last report is built after the budget's end otherwise (a 120 s tune took 122 s).
STOP_MARGIN_S = 3.0


@dataclasses.dataclass
class TuneOptions:
    """Options of ``whyidle tune`` (seconds)."""

    budget_s: float = DEFAULT_BUDGET_S
    trial_s: float | None = None  # per-trial limit (default: from the budget)
    out: str | None = None
    name: str | None = None
    tries: dict | None = None  # knob -> values asked for with --try
    validate: bool = False
    json_path: str | None = None
    html_path: str | None = None


class Tuner:
    """Runs the trials of one tune and keeps their outcomes (see the module docstring).

    Args:
        cmd: the command, unchanged.
        opts: :class:`TuneOptions`.
        root: the tune directory (created by the caller).
        progress: :class:`whyidle.report.tune_terminal.Progress` (or any object with ``start``,
            ``tick``, ``done`` and ``say``).
    """

    def __init__(self, cmd: list[str], opts: TuneOptions, root: str, progress) -> None:
        self.cmd, self.opts, self.root, self.progress = cmd, opts, root, progress
        self.t0 = time.monotonic()
        self.trial_s = opts.trial_s or min(MAX_TRIAL_S, max(MIN_TRIAL_S, opts.budget_s / TRIAL_SHARE))
        self.fixed_s = 0.0  # a trial's cost outside its measured steps (start-up, stop, report), from the baseline
        self.base_runs: list[TrialRun] = []
        self.outcomes: list[Outcome] = []
        self.runs: dict[str, TrialRun] = {}  # run_dir -> its TrialRun
        self.summaries: dict[str, dict] = {}
        self.interrupted = False
        self.count = 0
        self.planned = 1

    # --- budget -------------------------------------------------------------------------------

    def remaining(self) -> float:
        return self.opts.budget_s - (time.monotonic() - self.t0)

    def _limit(self) -> float | None:
        """The time limit of the next trial, or None when the budget cannot fit one."""
        room = self.remaining() - self.fixed_s - STOP_MARGIN_S
        if room < MIN_STEADY_S + 2:
            return None
        return min(self.trial_s, room)

    # --- running ------------------------------------------------------------------------------

    def _run(self, settings: dict, slug: str) -> TrialRun | None:
        limit = self._limit() if self.base_runs else min(self.trial_s, self.opts.budget_s)
        if limit is None or self.interrupted:
            return None
        self.count += 1
        run_dir = os.path.join(self.root, f"{self.count - 1:02d}-{slug}")
        rule = StopRule(limit)
        ticker = _Ticker(rule, self.progress)
        self.progress.start(self.count, max(self.planned, self.count), plan.label(settings), self.opts.budget_s,
                            time.monotonic() - self.t0)
        trial = run_trial(self.cmd, settings, run_dir, limit, stop=ticker)
        self.runs[run_dir] = trial
        if trial.status == "interrupted":
            self.interrupted = True
        if not self.base_runs:  # start-up before the first step, stopping and the report after it
            end = rule.t0 + trial.seconds
            stop = rule.stopped_at if rule.stopped_at is not None else end - 0.3 * trial.seconds
            self.fixed_s = ((rule.first_step or rule.t0) - rule.t0) + max(0.0, end - stop)
        return trial

    def baseline(self) -> TrialRun | None:
        """Runs the command as it is; returns its run (None when Ctrl-C or the budget stopped it)."""
        trial = self._run({}, "baseline")
        if trial is not None:
            self.base_runs.append(trial)
            self.progress.done(trial, None)
        return trial

    def trial(self, cand: Candidate) -> Outcome:
        """Runs one candidate (or records it as skipped when the budget is spent) and measures it
        against the baseline."""
        trial = self._run(cand.settings, _slug(cand.settings))
        if trial is None:
            out = Outcome(cand, "interrupted" if self.interrupted else "skipped")
        else:
            out = Outcome(cand, trial.status, runs=[trial.run_dir])
            self.measure(out)
            self.progress.done(trial, out)
        self.outcomes.append(out)
        return out

    def repeat(self, out: Outcome) -> None:
        """A second run of a trial (the halving stage); measured again over both runs."""
        trial = self._run(out.candidate.settings, _slug(out.candidate.settings) + "-r2")
        if trial is None:
            return
        if trial.status == "ok":
            out.runs.append(trial.run_dir)
            self.measure(out)
        self.progress.done(trial, out)

    def repeat_baseline(self) -> bool:
        """A second run of the baseline (the halving stage); every trial is measured again
        against both. False when it could not run or failed."""
        trial = self._run({}, "baseline-r2")
        if trial is None:
            return False
        self.progress.done(trial, None)
        if trial.status != "ok":
            return False
        self.base_runs.append(trial)
        for o in self.outcomes:
            self.measure(o)
        return True

    # --- measuring ----------------------------------------------------------------------------

    def summary(self, run_dir: str) -> dict | None:
        if run_dir not in self.summaries:
            from whyidle.pipeline import summarize_run

            try:
                self.summaries[run_dir] = summarize_run(run_dir)
            except Exception:  # noqa: BLE001 - a run that cannot be analyzed is a failed trial
                self.summaries[run_dir] = None
        return self.summaries[run_dir]

    def comparison(self, runs: list[str]) -> dict | None:
        """``whyidle.compare/1`` of the baseline's runs and ``runs`` (None when either has none usable)."""
        from whyidle.report.compare import CompareError, compare_variants

        base = [s for s in (self.summary(t.run_dir) for t in self.base_runs if t.status == "ok") if s]
        other = [s for s in (self.summary(r) for r in runs) if s]
        if not base or not other:
            return None
        try:
            return compare_variants([base, other], [])
        except CompareError:
            return None

    def measure(self, out: Outcome) -> None:
        """Sets ``out``'s ratio, interval and claim against the baseline (its runs pooled)."""
        if out.status != "ok":
            return
        comp = self.comparison(out.runs)
        if comp is None:
            out.status = "no_steps"
            return
        sp = comp["comparisons"][0]["speedup"]
        out.ratio, out.ci, out.claim = sp["ratio"], sp["ci"], sp["claim"] if sp["ci"] else "none"
        out.batch_size = comp["runs"][1]["batch_size"]


class _Ticker:
    """The stop rule, also updating the progress display at each of its calls (once a second)."""

    def __init__(self, rule: StopRule, progress) -> None:
        self.rule, self.progress = rule, progress

    def __call__(self, run_dir: str) -> str | None:
        why = self.rule(run_dir)
        self.progress.tick(self.rule.steps_seen(), len(self.rule.steady()))
        return why


def _slug(settings: dict) -> str:
    text = "-".join(f"{k}={v}" for k, v in settings.items()) or "as-written"
    return re.sub(r"[^A-Za-z0-9=._-]", "-", text)[:80]


def tune_dir(cmd: list[str], opts: TuneOptions) -> str:
    """Creates the tune directory (``--out``, else ``whyidle-runs/<UTC time>-tune-<name>``).
    Errors: :class:`whyidle.run.launcher.LaunchError` (exit 2) when it cannot be made or holds a tune."""
    from whyidle.run.launcher import LaunchError
    from whyidle.cmdline import default_name
    from whyidle.run.session import DEFAULT_RUNS_DIR, RUN_DIR_MODE, safe_name

    name = safe_name(opts.name or default_name(cmd))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = opts.out or os.path.join(DEFAULT_RUNS_DIR, f"{stamp}-tune-{name}")
    try:
        os.makedirs(path, mode=RUN_DIR_MODE, exist_ok=True)
    except OSError as exc:
        raise LaunchError(f"tune directory not writable: {path} ({exc.strerror or exc})", 2) from None
    if os.path.exists(os.path.join(path, "tune.json")) or os.path.exists(os.path.join(path, "00-baseline")):
        raise LaunchError(f"tune directory already holds a tune: {path}", 2)
    return path


def run_tune(cmd: list[str], opts: TuneOptions, progress) -> dict:
    """Runs a whole tune and returns ``whyidle.tune/1`` (:func:`whyidle.tune.result.build`),
    written to ``<tune dir>/tune.json`` (and ``tune.html``).

    Errors: :class:`whyidle.run.launcher.LaunchError` when the command cannot start or the tune
    directory cannot be made.
    """
    from whyidle.run import launcher
    from whyidle.tune import guard, result

    launcher.resolve_command(cmd)
    root = tune_dir(cmd, opts)
    before = guard.snapshot(os.getcwd(), skip=(root,))
    tuner = Tuner(cmd, opts, root, progress)
    changed: dict[str, dict] = {}  # trial label -> {"created": [...], "modified": [...]}: first seen there

    def check(label: str) -> None:
        created, modified = guard.changed(before, guard.snapshot(os.getcwd(), skip=(root,)))
        seen = {p for c in changed.values() for ps in c.values() for p in ps}
        created, modified = [p for p in created if p not in seen], [p for p in modified if p not in seen]
        if created or modified:
            changed[label] = {"created": created, "modified": modified}
        if modified:
            progress.say(f"{len(modified)} file(s) that existed before changed during {label}: {', '.join(modified[:3])}"
                         + (" ..." if len(modified) > 3 else ""))

    base = None
    try:
        base = _search(tuner, opts, check)
    except KeyboardInterrupt:  # Ctrl-C between two trials (during one, the trial's run takes it)
        tuner.interrupted = True
        progress.done(None, None)
        base = tuner.base_runs[0] if tuner.base_runs else None
    validation = None
    win = plan.winner(tuner.outcomes)
    if opts.validate and win is not None and not tuner.interrupted:
        validation = _validate(tuner, win, progress)
    res = result.build(tuner, base, win, validation, changed, cmd)
    result.write(res, root, opts.json_path, opts.html_path)
    return res


def _search(tuner: Tuner, opts: TuneOptions, check) -> TrialRun | None:
    """The stages of the search (module docstring); returns the baseline run."""
    base = tuner.baseline()
    check("the baseline")
    cands: list[Candidate] = []
    start = None
    if base is not None and base.status == "ok" and base.report:
        cands = plan.candidates(base.report, plan.job_cores(base.report, limits.own_usable_cores()), opts.tries)
        start = plan.ladder_start(base.report, opts.tries)
        tuner.planned = 1 + len(cands) + (3 if start else 0) + 3
        for cand in cands:
            if tuner.interrupted:
                break
            tuner.trial(cand)
            check(plan.label(cand.settings))
        ladder: list[Outcome] = []
        while start and not tuner.interrupted:
            size = plan.next_batch(start, ladder)
            if size is None:
                break
            predicted = _ladder_prediction(base.report, size)
            out = tuner.trial(Candidate({"batch_size": size}, "batch_ladder", predicted, "doubling the batch",
                                        "small_batch" if predicted else None))
            check(plan.label(out.candidate.settings))
            ladder.append(out)
            if out.status == "skipped":
                break
        best = plan.promising(tuner.outcomes)
        if best and not tuner.interrupted and tuner.repeat_baseline():
            for out in best:
                tuner.repeat(out)
        combo = plan.combination(tuner.outcomes)
        if combo and not tuner.interrupted:
            tuner.trial(combo)
            check(plan.label(combo.settings))
    return base


def _ladder_prediction(report: dict, size: int) -> float | None:
    """The ``small_batch`` finding's estimate, for the ladder trial at its target batch size."""
    f = next((f for f in report.get("findings") or [] if f["id"] == "small_batch"), None)
    if f and f["evidence"].get("target_batch_size") == size:
        return f.get("est_speedup")
    return None


def _validate(tuner: Tuner, win: Outcome, progress) -> dict:
    """``--validate``: the baseline and the winner each run to the command's end (outside the
    budget), compared with ``whyidle compare`` (throughput and the logged validation metrics)."""
    runs = {}
    for key, settings in (("baseline", {}), ("winner", win.candidate.settings)):
        tuner.count += 1
        run_dir = os.path.join(tuner.root, f"{tuner.count - 1:02d}-validate-{key}")
        progress.start(tuner.count, tuner.count, f"validate: {plan.label(settings)} (full run)", None, None)
        trial = run_trial(tuner.cmd, settings, run_dir, 0)
        progress.done(trial, None)
        runs[key] = trial
        if trial.status != "ok":
            return {"status": trial.status, "runs": {k: t.run_dir for k, t in runs.items()}, "comparison": None}
    from whyidle.pipeline import compare

    try:
        comp = compare([runs["baseline"].run_dir, runs["winner"].run_dir])
    except Exception as exc:  # noqa: BLE001 - the tune's results stand without it
        return {"status": f"not compared: {exc}", "runs": {k: t.run_dir for k, t in runs.items()}, "comparison": None}
    return {"status": "ok", "runs": {k: t.run_dir for k, t in runs.items()}, "comparison": comp}

