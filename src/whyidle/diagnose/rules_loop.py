"""``no_training``: the program runs a model but never trains it (inference or evaluation only).

A process whose steps are marked by DataLoader batches or by calls of its model, with no
``backward()`` and no optimizer step anywhere (:mod:`whyidle.analysis.loop`), is an inference or
evaluation job: the report says so, with what was measured (model calls per second, the data
wait), instead of asking for "the training script". The other rules still apply to its loop (an
inference loop can be input-bound as well); this finding only names the kind of job.
"""

from __future__ import annotations

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose.rules import finding
from whyidle.diagnose.types import Finding


def no_training(facts: RunFacts) -> Finding | None:
    """The ``no_training`` info finding when the analyzed loop does not train, else None.

    Evidence: ``marker`` (``loader``: a step per DataLoader batch, ``forward``: per call of the
    model), ``steps``, ``forward_calls_per_step`` and ``forward_calls_per_s`` (outermost module
    calls), ``samples_per_s`` (None when no batch size was read), ``data_wait_share`` (0–1 of the
    step time).
    """
    loop, step = facts.loop, facts.step
    if not loop or loop["trains"] or not step:
        return None
    calls = loop.get("forward_calls_per_step")
    rate = calls * step["steps_per_s"] if calls is not None else None
    wait = step["shares"].get("data_wait", 0.0)
    if loop["marker"] == "loader":
        seen = (f"ran {rate:,.1f} model calls per second ({calls:g} per DataLoader batch)" if rate is not None
                else f"took {step['steps_per_s']:,.1f} DataLoader batches per second")
    else:
        seen = f"called its model {step['steps_per_s']:,.1f} times per second (a step per call)"
    samples = step.get("samples_per_s")
    summary = (f"No training here: no backward() and no optimizer step in {step['steps']} steps. The loop {seen}"
               + (f", {samples:,.0f} samples/s" if samples else "")
               + (f", and waited for data {wait:.0%} of the time" if loop["marker"] == "loader" else "")
               + ". The other findings are about this inference/evaluation loop.")
    evidence = {"marker": loop["marker"], "steps": step["steps"], "forward_calls_per_step": calls,
                "forward_calls_per_s": round(rate, 3) if rate is not None else None,
                "samples_per_s": round(samples, 3) if samples else None, "data_wait_share": round(wait, 4)}
    return finding("no_training", "info", "No training here: inference or evaluation only", summary, evidence, None,
                   "Nothing to change for training: this program only runs its model. If it should train, check that "
                   "loss.backward() and the optimizer step are reached (an early return, a flag, a config that "
                   "selects evaluation).")
