"""Steady-state step timing for the framework scenarios (Lightning, HF Trainer, Accelerate).

The plain PyTorch scenarios time their own ``for`` loop with ``common.StepMeter``. The framework
scenarios cannot: the loop belongs to the framework. So they time it the way a user would, from
the framework's own hooks:

- Lightning: a ``Callback`` whose ``on_train_batch_start`` / ``on_train_batch_end`` call
  :meth:`SteadyMeter.batch_start` / :meth:`SteadyMeter.batch_end` (with automatic optimization,
  one batch = one optimizer step);
- HF ``Trainer``: a ``TrainerCallback`` whose ``on_step_begin`` / ``on_step_end`` do the same
  (the Trainer fetches the batch before ``on_step_begin``);
- Accelerate / plain loops: ``batch_start`` right after each batch arrives and ``batch_end`` after
  ``optimizer.step()`` (per optimizer step, not per micro-batch). With gradient accumulation,
  ``micro_done()`` after each micro-batch that does not end a step, so that the next
  ``batch_start`` adds only the wait for that batch.

A step's time is the time between two consecutive ``batch_end`` calls (so it includes fetching
the batch and all framework / callback work); the data wait is ``batch_start`` minus the previous
``batch_end`` (summed over the micro-batches of a step; for Lightning and the HF Trainer it also
holds the framework's own code between the two hooks). The first ``warmup`` steps (worker
start-up, first-call allocations, lazy initialisation in the framework, compilation) are left out
of ``samples_per_s``, ``step_time_p50_s`` and ``data_wait_share``; ``wall_s`` is the whole
training loop (from ``start()`` to the last step, start-up included).

RESULT keys: ``steps``, ``wall_s``, ``samples_per_s`` (steady), ``step_time_p50_s`` (steady),
``data_wait_share`` (steady), ``samples``, ``warmup_steps``, ``steady_steps``, ``steady_wall_s``,
``main_cpu_share`` (process CPU / wall over the steady window), plus what the script adds.
"""

from __future__ import annotations

import json
import statistics
import time


class SteadyMeter:
    def __init__(self, warmup: int = 5):
        self.warmup = warmup
        self.t_start = None
        self.last = None
        self.mark = None  # end of the last step or micro-step: the next wait starts here
        self.ends: list[float] = []  # perf_counter at each batch_end
        self.cpu_ends: list[float] = []  # process_time at each batch_end
        self.step_times: list[float] = []
        self.data_times: list[float] = []
        self.samples: list[int] = []
        self._pending_wait = 0.0

    def start(self) -> None:
        """Call when the training loop starts (before the first batch is fetched)."""
        self.t_start = self.last = self.mark = time.perf_counter()

    def batch_start(self) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.start()
        self._pending_wait += now - self.mark

    def micro_done(self) -> None:
        """End of a micro-batch that did not end an optimizer step (gradient accumulation)."""
        self.mark = time.perf_counter()

    def batch_end(self, n_samples: int) -> None:
        now = time.perf_counter()
        if self.last is None:
            self.start()
        self.step_times.append(now - self.last)
        self.data_times.append(self._pending_wait)
        self._pending_wait = 0.0
        self.samples.append(int(n_samples))
        self.ends.append(now)
        self.cpu_ends.append(time.process_time())
        self.last = self.mark = now

    @property
    def steps(self) -> int:
        return len(self.step_times)

    def result(self, **extra) -> dict:
        n = self.steps
        w = min(self.warmup, max(n - 2, 0))  # keep at least 2 steady steps when the run is short
        wall = (self.ends[-1] - self.t_start) if n else 0.0
        out = {"steps": n, "wall_s": round(wall, 4)}
        if n > w and n > 0:
            t0 = self.ends[w - 1] if w > 0 else self.t_start
            steady_wall = self.ends[-1] - t0
            steady_samples = sum(self.samples[w:])
            steady_steps = self.step_times[w:]
            out["samples_per_s"] = round(steady_samples / steady_wall, 2) if steady_wall > 0 else 0.0
            out["step_time_p50_s"] = round(statistics.median(steady_steps), 5)
            out["data_wait_share"] = round(sum(self.data_times[w:]) / steady_wall, 4) if steady_wall > 0 else 0.0
            if w > 0:
                cpu = self.cpu_ends[-1] - self.cpu_ends[w - 1]
                out["main_cpu_share"] = round(cpu / steady_wall, 4) if steady_wall > 0 else 0.0
            out["steady_steps"] = len(steady_steps)
            out["steady_wall_s"] = round(steady_wall, 4)
        else:
            out.update(samples_per_s=0.0, step_time_p50_s=0.0, data_wait_share=0.0, steady_steps=0)
        out["samples"] = sum(self.samples)
        out["warmup_steps"] = w
        out.update(extra)
        return out

    def print_result(self, **extra) -> dict:
        res = self.result(**extra)
        print("RESULT " + json.dumps(res), flush=True)
        return res
