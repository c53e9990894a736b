"""One ``whyidle tune`` trial: the unchanged command, observed as by ``whyidle run``, with the
trial's settings applied inside it, stopped gently once its steady steps are measured well enough.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time

from whyidle.instrument.overrides import ENV, SCRATCH_ENV
from whyidle.record.tail import StepTail

#: A trial is measured when it has this many steps after its warm-up ...
MIN_STEPS = 30
#: ... covering at least this many seconds (a loader's queue refills, periodic logging and the
#: like repeat over seconds, not steps) ...
MIN_STEADY_S = 3.0
#: ... and the 95 % interval of its mean step time is within ± this fraction of it (batch means:
#: :func:`rel_halfwidth`); after ``max_s`` it stops anyway and the interval says how sure it is.
#: ±5 %: the noise floor below which a single-run comparison claims nothing
#: (:data:`whyidle.analysis.compare.SINGLE_RUN_NOISE`); on a shared 2-core machine ±3 % took
#: more than 20 s of 3 ms steps (batch means spread 8–10 %).
TARGET_HALFWIDTH = 0.05
#: Steps left out at the start of a trial (at least 3; 10 % of those seen): start-up, the first
#: batches of new workers, allocator and autotuner warm-up. The report's own warm-up detection
#: (:func:`whyidle.analysis.steps.select_steps`) decides what the statistics are over.
WARMUP_FRACTION = 0.10
#: Batches the steady steps are cut into for the batch-means interval; Student's t for 7 degrees
#: of freedom at 97.5 % (two-sided 95 %).
BATCHES, T_975_7 = 8, 2.365
#: The trial is stopped when the machine's available memory falls under this fraction of its
#: total: the batch-size ladder's CPU memory ceiling (a larger size would swap or be killed).
MEMORY_FLOOR = 0.10
#: Output patterns of a run out of device or host memory (PyTorch, TensorFlow, Python).
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED|MemoryError|out of memory", re.I)


def rel_halfwidth(times: list[float]) -> float:
    """Half-width of the 95 % interval of the mean of ``times`` (step times, s) relative to the
    mean, from :data:`BATCHES` batch means (consecutive steps are correlated; batch means are
    nearly independent: Law & Kelton, "Simulation Modeling and Analysis", ch. 9). ``inf`` for fewer
    than 2 × :data:`BATCHES` steps."""
    n = len(times) // BATCHES
    if n < 2:
        return math.inf
    means = [sum(times[i * n:(i + 1) * n]) / n for i in range(BATCHES)]
    mean = sum(means) / BATCHES
    var = sum((m - mean) ** 2 for m in means) / (BATCHES - 1)
    return T_975_7 * math.sqrt(var / BATCHES) / mean if mean > 0 else math.inf


class StopRule:
    """Says when a trial has been measured enough (``RunOptions.until`` of
    :func:`whyidle.run.session.observe`).

    Args:
        max_s: seconds of steps (from the first one seen) after which the trial stops whatever it
            measured; ``2 × max_s`` from its start when no step comes.
        min_steps, min_steady_s, halfwidth: :data:`MIN_STEPS`, :data:`MIN_STEADY_S`,
            :data:`TARGET_HALFWIDTH`.
        memory: ``() -> (available, total)`` bytes (default: psutil's), for :data:`MEMORY_FLOOR`.
    """

    def __init__(self, max_s: float, min_steps: int = MIN_STEPS, min_steady_s: float = MIN_STEADY_S,
                 halfwidth: float = TARGET_HALFWIDTH, memory=None) -> None:
        self.max_s, self.min_steps, self.min_steady_s, self.halfwidth = max_s, min_steps, min_steady_s, halfwidth
        self.memory = memory or _memory
        self.t0 = time.monotonic()
        self.tail: StepTail | None = None
        self.first_step: float | None = None  # monotonic s when the first step was seen
        self.stopped_at: float | None = None  # monotonic s when it said stop

    def __call__(self, run_dir: str) -> str | None:
        if self.tail is None:
            self.tail = StepTail(run_dir)
        self.tail.poll()
        now = time.monotonic()
        if self.first_step is None and self.tail.total:
            self.first_step = now
        why = self._why(now)
        if why:
            self.stopped_at = now
        return why

    def _why(self, now: float) -> str | None:
        avail, total = self.memory()
        if total and avail < MEMORY_FLOOR * total:
            return f"memory: {avail / total:.0%} of the machine's memory left"
        steps = self.steady()
        if steps:
            span = (steps[-1]["t1"] - steps[0]["t0"]) / 1e9
            times = [(s["t1"] - s["t0"]) / 1e9 for s in steps]
            if len(steps) >= self.min_steps and span >= self.min_steady_s and rel_halfwidth(times) <= self.halfwidth:
                return f"measured: {len(steps)} steady steps, mean step time within ±{self.halfwidth:.0%}"
        # the limit is on measuring time: start-up (imports, building the data) comes first; a
        # program that never reaches a step is stopped at twice the limit
        if now - (self.first_step or self.t0) >= self.max_s * (1 if self.first_step else 2):
            return f"time: {self.max_s:.0f} s of steps, its share of the budget"
        return None

    def steps_seen(self) -> int:
        """Steps of the busiest process so far."""
        return max(self.tail.total.values()) if self.tail and self.tail.total else 0

    def steady(self) -> list[dict]:
        """The busiest process's steps after the warm-up (:data:`WARMUP_FRACTION`, at least 3)."""
        if not self.tail or not self.tail.total:
            return []
        path = max(self.tail.total, key=self.tail.total.get)
        steps = list(self.tail.recent[path])
        skip = max(3, int(WARMUP_FRACTION * self.tail.total[path])) - (self.tail.total[path] - len(steps))
        return steps[max(0, skip):]


def _memory() -> tuple[int, int]:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total
    except Exception:
        return 0, 0


@dataclasses.dataclass
class TrialRun:
    """What one trial run left: ``run_dir``, ``report`` (``whyidle.report/1``; None when none was
    built), ``status`` (``"ok"``, ``"failed"``, ``"oom"``, ``"memory"``, ``"no_steps"``,
    ``"interrupted"``: the user pressed Ctrl-C), ``stopped`` (why whyidle stopped it, or None when it
    ended by itself), ``seconds`` (wall time, report included), ``detail`` (a failure's last output
    line)."""

    run_dir: str
    report: dict | None
    status: str
    stopped: str | None
    seconds: float
    detail: str | None = None


def run_trial(cmd: list[str], settings: dict, run_dir: str, max_s: float, stop: StopRule | None = None) -> TrialRun:
    """Runs ``cmd`` once with ``settings`` applied (:data:`whyidle.instrument.overrides.ENV`) in
    ``run_dir``; its output goes to ``RUN_DIR/output.log``, its checkpoints to ``RUN_DIR/outputs``
    (:data:`whyidle.instrument.overrides.SCRATCH_ENV`).

    Args:
        cmd: the command, as given to ``whyidle tune``.
        settings: knob → value (``{}``: the baseline).
        run_dir: the trial's run directory (created).
        max_s: seconds after which the trial is stopped; ``0`` runs the command to its end (the
            ``--validate`` runs).
        stop: the stop rule (default :class:`StopRule` of ``max_s``).
    Errors: :class:`whyidle.run.launcher.LaunchError` when the command cannot start.
    """
    from whyidle.run.session import RunOptions, observe

    t0 = time.monotonic()
    until = None if max_s <= 0 else (stop or StopRule(max_s))
    env = {ENV: json.dumps(settings) if settings else "", SCRATCH_ENV: os.path.abspath(os.path.join(run_dir, "outputs"))}
    opts = RunOptions(out=run_dir, quiet=True, html=False, env=env, output=os.path.join(run_dir, "output.log"),
                      until=until)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    report, status, _ = observe(cmd, opts)
    stopped = ((report or {}).get("run") or {}).get("stopped") if report else None
    stopped = stopped or _meta(run_dir).get("stopped")
    seconds = time.monotonic() - t0
    steps = ((report or {}).get("metrics") or {}).get("steps") or 0
    detail = None
    if status.interrupted:  # whyidle itself got SIGINT: the user's Ctrl-C (its own stop signals only the command)
        state = "interrupted"
    elif stopped and stopped.startswith("memory"):
        state = "memory"
    elif not stopped and (status.exit_code or status.signal):
        text = _tail(os.path.join(run_dir, "output.log"))
        state = "oom" if OOM.search(text) or status.signal == 9 else "failed"
        lines = [line for line in text.splitlines() if line.strip()]
        detail = lines[-1][:200] if lines else f"exit {status.exit_code if status.signal is None else -status.signal}"
    elif report is None or steps < 5:
        state = "no_steps"
    else:
        state = "ok"
    return TrialRun(run_dir, report, state, stopped, seconds, detail)


def _meta(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _tail(path: str, size: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
