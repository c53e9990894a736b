"""Which settings ``whyidle tune`` tries, in which order, and which one wins (pure).

The search follows the diagnosis, not a grid:

1. **Candidates** (:func:`candidates`): each warning or critical finding whose fix is a setting
   whyidle can apply without code change (:data:`whyidle.instrument.overrides.KNOBS`; the whole
   job's frequencies, ``persistent_workers`` for epoch restarts, autocast off, worker counts within
   the cores: :mod:`whyidle.tune.job_settings`) gives the fix as printed (its ``est_speedup`` is the prediction the trial checks) and, for a count such as
   ``num_workers``, its neighbours; settings the user asks for (``--try``) are added as given.
2. **Batch size** (:func:`next_batch`): doubled from the program's own while throughput rises by
   more than :data:`LADDER_MIN_GAIN`, until a trial fails (out of memory) or :data:`MAX_BATCH_FACTOR`.
3. **Successive halving** (:func:`promising`): the better half of the trials that beat the
   baseline are run again, and so is the baseline, so their comparison holds run-to-run
   variation (Jamieson & Talwalkar 2016, "Non-stochastic best arm identification and
   hyperparameter optimization": spend more runs on the arms still in the race).
4. **Combination** (:func:`combination`): the best setting of each kind that measured faster,
   together, in one more trial.
5. **Winner** (:func:`winner`): the fastest trial whose interval says *faster* than the baseline
   (:func:`whyidle.analysis.compare.speedup` ``claim``); none, and the program's own settings stay.

An ``input_bound`` finding also gets the input pipeline's **ceiling** (origin :data:`CEILING`): a
trial with the DataLoader's first batches replayed (``replay``), the step time with an ideal
loader, which every input fix is held against; it is never the winner.
"""

from __future__ import annotations

import dataclasses
import math

from whyidle.tune import job_settings

#: Kind of each setting: one trial per kind goes into the combination.
#: ``input_bound`` causes (docs/report.md) whose printed fix is not a worker count: packing the
#: batch's tensors, even shards, the training process's own receiving, ``in_order=False``.
NOT_WORKERS = ("many_tensors", "uneven_shards", "main_process_receive", "head_of_line")
FAMILY = {"num_workers": "loader", "persistent_workers": "loader", "prefetch_factor": "loader", "pin_memory": "pin",
          "batch_size": "batch", "threads": "threads", "autocast": "precision", "tf32": "tf32",
          "cudnn_benchmark": "cudnn", "tfdata_parallel_map": "tfdata", "tfdata_prefetch": "tfdata",
          "compile_dynamic": "compile", "val_check_interval": "evaluation", "check_val_every_n_epoch": "evaluation",
          "limit_val_batches": "evaluation", "eval_steps": "evaluation", "validation_freq": "evaluation",
          "every_n_train_steps": "checkpoint", "save_steps": "checkpoint", "log_every_n_steps": "logging",
          "logging_steps": "logging", "replay": "ceiling"}
#: A doubled batch size must raise samples/s by more than this over the best smaller one for the
#: ladder to go on: below it the gain is within the ±2–9 % run-to-run spread of identical runs on a
#: shared machine (docs/report.md, "Comparing runs") and larger batches only cost memory and
#: convergence.
LADDER_MIN_GAIN = 0.03
#: The ladder stops at the program's batch size × this (6 doublings).
MAX_BATCH_FACTOR = 64
#: Candidate trials from one finding at most (the fix and its neighbours).
MAX_PER_FINDING = 3
#: Trials given a second run in the halving stage at most.
MAX_REPEATS = 3
#: Prefetch depth the loader fix uses (as :data:`whyidle.diagnose.fixes.PREFETCH`).
PREFETCH = 4
#: Findings below this severity do not make trials: an info finding is not what holds the step.
SEVERE = ("warning", "critical")
#: Origin of the input pipeline's ceiling trial (the ``replay`` setting): a measurement, never a
#: fix, so it is never the winner, repeated or combined.
CEILING = "ceiling"
#: Batches the ceiling trial keeps and replays (:mod:`whyidle.instrument.replay`): enough that a
#: model does not see one batch twice in a row, few enough to fit beside the model.
REPLAY_BATCHES = 16


@dataclasses.dataclass
class Candidate:
    """One setting to try: ``settings`` (knob → value), ``origin`` (the finding id it fixes,
    ``"batch_ladder"``, ``"user"`` or ``"combination"``), ``predicted`` (the ``est_speedup`` of
    finding ``finding`` when the settings are its printed fix, else None), ``why`` (one phrase)."""

    settings: dict
    origin: str
    predicted: float | None = None
    why: str = ""
    finding: str | None = None

    def __post_init__(self) -> None:
        if self.predicted is not None and self.finding is None:
            self.finding = self.origin

    @property
    def family(self) -> str:
        """The kind of change (:data:`FAMILY` of its first setting; ``"mixed"`` for several kinds)."""
        kinds = {FAMILY.get(k, k) for k in self.settings}
        if "loader" in kinds:  # the loader fix sets the trainer's threads and pinning with the workers
            kinds -= {"threads", "pin"}
        return kinds.pop() if len(kinds) == 1 else "mixed"


@dataclasses.dataclass
class Outcome:
    """A trial as the search sees it: its candidate, ``status`` (``"ok"``, ``"failed"``, ``"oom"``,
    ``"memory"``, ``"no_steps"``, ``"interrupted"``, ``"skipped"``), ``ratio`` (samples/s or
    steps/s over the baseline's), ``ci`` ([low, high] or None), ``claim`` (``"faster"``,
    ``"slower"``, ``"none"``), ``runs`` (run directories), ``batch_size`` (samples per step)."""

    candidate: Candidate
    status: str
    ratio: float | None = None
    ci: list | None = None
    claim: str = "none"
    runs: list = dataclasses.field(default_factory=list)
    batch_size: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.ratio is not None


def label(settings: dict) -> str:
    """``"num_workers=2, persistent_workers=True"``; ``"as written"`` for no settings."""
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "as written"


def _finding(report: dict, fid: str) -> dict | None:
    return next((f for f in report.get("findings") or [] if f["id"] == fid and f["severity"] in SEVERE), None)


def job_cores(report: dict | None, here: float) -> int:
    """The cores worker and thread counts are kept to: the baseline run's usable cores
    (``metrics.host.cores_usable``: the machine's, less what the job's affinity mask or cgroup CPU
    quota leaves it), else ``here`` (what the tuning process itself may use), at least 1."""
    host = ((report or {}).get("metrics") or {}).get("host") or {}
    return max(1, int((host.get("cores_usable") or here) + 1e-9))


def candidates(report: dict, cores: int, tries: dict[str, list] | None = None) -> list[Candidate]:
    """The settings to try first, from the baseline's report (``whyidle.report/1``).

    Args:
        report: the baseline run's report.
        cores: the cores the job may use (:func:`job_cores`; worker and thread counts are kept to them).
        tries: settings the user asked for (``--try num_workers=2,4``): knob → values.
    Returns: candidates in the order to run them (the verdict finding's first, then ``tries``, then
        the other findings' in the order found), without duplicates. The batch-size ladder is
        not among them (:func:`ladder_start`, :func:`next_batch`).
    """
    out: list[Candidate] = []
    loader = report.get("loader") or {}
    framework = report.get("framework")
    on_cuda = (report.get("device") or {}).get("kind") == "cuda"
    inp = _finding(report, "input_bound")
    if inp and framework == "torch" and loader and inp["evidence"].get("cause") not in NOT_WORKERS:
        ev = inp["evidence"]
        now = loader.get("num_workers") or 0
        best = int(ev.get("suggested_num_workers") or max(1, min(2, cores)))
        fix = {"num_workers": best, "persistent_workers": True, "prefetch_factor": PREFETCH}
        if ev.get("suggested_threads"):
            fix["threads"] = int(ev["suggested_threads"])
        if on_cuda and not loader.get("pin_memory"):
            fix["pin_memory"] = True
        if best != now:
            # the estimate of the printed worker option (the first option may be another kind of fix)
            option = next((o for o in (inp.get("fix") or {}).get("options") or []
                           if "num_workers" in (o.get("code") or "")), None)
            predicted = option.get("est_speedup") if option else inp.get("est_speedup")
            out.append(Candidate(fix, "input_bound", predicted, "the input_bound worker fix as printed"))
        most = ev.get("max_workers_by_memory") or math.inf  # more would not fit the cgroup memory limit
        for w in sorted({1, 2, max(1, cores // 2), cores} - {now, best}, key=lambda w: abs(w - best)):
            if 0 < w <= min(max(cores, 2), most) and len([c for c in out if c.origin == "input_bound"]) < MAX_PER_FINDING:
                out.append(Candidate({"num_workers": w, "persistent_workers": True}, "input_bound",
                                     why="a neighbouring worker count"))
    if inp and framework == "torch" and loader:  # what any input fix is held against: right after the printed fix
        out.insert(min(len(out), 1), Candidate({"replay": REPLAY_BATCHES}, CEILING, None, "the input pipeline's ceiling: the DataLoader's "
                             f"first {REPLAY_BATCHES} batches replayed, the loader out of the step", "input_bound"))
    # a tf.data pipeline given to fit (its description is recorded when fit starts; fit_input only
    # when fit returns, which a trial stopped early never reaches)
    tfdata = inp and (inp["evidence"].get("fit_input") == "tf.data" or (report.get("keras") or {}).get("pipeline"))
    if inp and framework in ("keras", "tensorflow") and tfdata:
        out.append(Candidate({"tfdata_parallel_map": True, "tfdata_prefetch": True}, "input_bound",
                             inp.get("est_speedup"), "the input_bound fix as printed"))
        out.append(Candidate({"tfdata_prefetch": True}, "input_bound", why="prefetch alone"))
    pin = _finding(report, "pageable_transfers")
    if pin and loader and not loader.get("pin_memory"):
        out.append(Candidate({"pin_memory": True}, "pageable_transfers", pin.get("est_speedup"), "pinned batches"))
    amp = _finding(report, "no_mixed_precision")
    if amp and framework == "torch":
        dtype = "bf16" if amp["evidence"].get("recommended_dtype") == "bfloat16" else "fp16"
        out.append(Candidate({"autocast": dtype}, "no_mixed_precision", amp.get("est_speedup"), "autocast"))
        if amp["evidence"].get("tf32") is False or dtype == "bf16":
            out.append(Candidate({"tf32": True}, "no_mixed_precision", why="TF32 matmuls, no autocast"))
    busy = _finding(report, "cpu_contention")
    if busy and framework == "torch" and busy["evidence"].get("cause") in ("oversubscription", "own_threads", "cpu_quota"):
        ev = busy["evidence"]
        now = ev.get("intra_op_threads") or cores
        # oversubscribed: cores ÷ processes each (the printed fix); own threads: one core left to them;
        # throttled by a CPU quota: the threads the quota covers
        per = {"oversubscription": max(1, cores // max(1, ev.get("processes") or 1)), "own_threads": cores - 1,
               "cpu_quota": cores}[ev["cause"]]
        if 0 < per < now:
            out.append(Candidate({"threads": per}, "cpu_contention",
                                 busy.get("est_speedup") if ev["cause"] == "oversubscription" else None, "fewer threads"))
    recompiled = _finding(report, "recompiles") or _finding(report, "recompile_limit")
    if recompiled and framework == "torch":  # symbolic sizes: one compilation for every length
        option = next((o for o in (recompiled.get("fix") or {}).get("options") or []
                       if "dynamic=True" in (o.get("code") or "")), None)
        out.append(Candidate({"compile_dynamic": True}, recompiled["id"], option.get("est_speedup") if option else None,
                             "torch.compile(dynamic=True)"))
    # the whole job's settings (evaluation, checkpoint and logging frequency, workers kept between
    # epochs), autocast off, worker counts within the cores: whyidle.tune.job_settings
    severe = [f for f in report.get("findings") or [] if f["severity"] in SEVERE]
    for t in job_settings.trials(report, severe, cores):
        out.append(Candidate(t.settings, t.finding, t.predicted, t.why))
    for name, values in (tries or {}).items():
        for v in values:
            out.append(Candidate({name: v}, "user", why="asked for (--try)"))
    seen, unique = [], []
    for c in out:
        if c.settings not in seen:
            seen.append(c.settings)
            unique.append(c)
    # the verdict's own fix first, then what the user asked for, then the rest as found: a short
    # budget must not run out on side findings before the trial that matters most
    verdict = report.get("verdict")
    return sorted(unique, key=lambda c: 0 if (c.finding or c.origin) == verdict else (1 if c.origin == "user" else 2))


def ladder_start(report: dict, tries: dict[str, list] | None = None) -> int | None:
    """The program's batch size when the batch ladder should run (a ``small_batch`` finding of any
    severity — an info one estimates a small gain, which the ladder measures —, not overridden by
    the user's own ``--try batch_size=...``), else None."""
    small = next((f for f in report.get("findings") or [] if f["id"] == "small_batch"), None)
    if "batch_size" in (tries or {}) or small is None:  # at any severity: the ladder measures what it estimates
        return None
    size = (report.get("loader") or {}).get("batch_size") or (report.get("metrics") or {}).get("batch_size")
    return int(size) if size else None


def next_batch(start: int, ladder: list[Outcome]) -> int | None:
    """The next batch size of the ladder, or None when it is done.

    Args:
        start: the program's batch size.
        ladder: the ladder's trials so far, in order (each ``candidate.settings["batch_size"]``).
    The ladder doubles while each size is faster than the best smaller one by more than
    :data:`LADDER_MIN_GAIN` (the program's own size counts 1.0), and stops at a failed trial.
    """
    if not ladder:
        return start * 2
    last = ladder[-1]
    size = last.candidate.settings["batch_size"]
    if not last.ok or size * 2 > start * MAX_BATCH_FACTOR:
        return None
    before = max([1.0] + [o.ratio for o in ladder[:-1] if o.ok])
    return size * 2 if last.ratio > before * (1 + LADDER_MIN_GAIN) else None


def promising(outcomes: list[Outcome]) -> list[Outcome]:
    """The trials worth a second run: the better half (rounded up, at most :data:`MAX_REPEATS`) of
    those that ran once and may be faster than the baseline (the upper end of their interval above
    1 + :data:`whyidle.analysis.compare.SINGLE_RUN_NOISE`: a second run narrows an inconclusive
    one), best first."""
    from whyidle.analysis.compare import SINGLE_RUN_NOISE

    up = sorted([o for o in outcomes if o.ok and len(o.runs) == 1 and o.candidate.origin != CEILING
                 and (o.ci or [0, o.ratio])[1] > 1 + SINGLE_RUN_NOISE],
                key=lambda o: -o.ratio)
    return up[:min(MAX_REPEATS, math.ceil(len(up) / 2))]


def combination(outcomes: list[Outcome]) -> Candidate | None:
    """The best faster trial of each kind of setting, merged (the faster one's value where two
    set the same knob); None unless two kinds or more measured faster, or when it was tried."""
    best: dict[str, Outcome] = {}
    for o in outcomes:
        if o.ok and o.claim == "faster" and o.candidate.origin not in ("combination", CEILING):
            fam = o.candidate.family
            if fam not in best or o.ratio > best[fam].ratio:
                best[fam] = o
    if len(best) < 2:
        return None
    settings: dict = {}
    for o in sorted(best.values(), key=lambda o: o.ratio):  # the fastest last: its values win
        settings.update(o.candidate.settings)
    if any(o.candidate.settings == settings for o in outcomes):
        return None
    return Candidate(settings, "combination", why="the best of each kind together")


def winner(outcomes: list[Outcome]) -> Outcome | None:
    """The fastest trial measured faster than the baseline (its interval clears the noise floor),
    or None: then no trial may be recommended over the program's own settings."""
    faster = [o for o in outcomes if o.ok and o.claim == "faster" and o.candidate.origin != CEILING]
    return max(faster, key=lambda o: o.ratio) if faster else None
