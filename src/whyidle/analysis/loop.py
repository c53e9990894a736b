"""What kind of loop a process runs: does it train, what marks its steps, which optimizers step in
each, and how many micro-batches of gradient accumulation an optimizer step holds.

Definitions (issue 30):

- A process *trains* when its steps are marked by an optimizer, a ``backward()`` (a loop without
  ``torch.optim``), Keras ``fit`` or a custom TF loop, or when its batch-marked steps run backward
  calls; otherwise it runs inference or evaluation only (``loader``- or ``forward``-marked steps
  without a backward call).
- *Parts* of a step: every optimizer that steps in it (a GAN's discriminator and generator, an
  actor-critic's actor and critic), from the instrument's ``optimizers`` record: its steps and
  the backward calls made since the previous optimizer step, per step of the primary optimizer.
- *Micro-batches* (gradient accumulation): several batches, or without a DataLoader several
  backward calls, per step of one optimizer. A step in which several optimizers step is never
  accumulation (a DCGAN's three backward passes per iteration are two optimizers' parts).

Pure; takes step rows (dicts or ``StepView``) and records.
"""

from __future__ import annotations

from whyidle.analysis.facts import LoopFacts, Part
from whyidle.analysis.steps import field_percentile

#: Steps of an optimizer per step of the primary one from which it is a part of every step (a
#: WGAN's generator steps once per 5 critic steps: 0.2); rarer ones (an optimizer rebuilt once,
#: a warm-up stage) are not parts of the loop.
MIN_PART_RATE = 0.1

#: Step markers of a training loop (docs/run-format.md, the ``step`` record's ``by``).
TRAINING_MARKERS = frozenset({"optimizer", "backward", "keras", "iterator"})


def trains(rows) -> bool:
    """True when the step rows are a training loop (see the module docstring)."""
    return any(r.get("by") in TRAINING_MARKERS or (r.get("mb") or 0) > 0 for r in rows)


def parts(rec: dict | None) -> list[Part]:
    """The optimizers stepping in each step, from the last ``optimizers`` record: ``name`` (the
    class of the model it trains, else its own), ``cls`` (the optimizer's class), ``params``,
    ``steps_per_step`` and ``backward_per_step`` (per step of the primary optimizer); the primary
    first, then by rate. Empty without the record or primary steps."""
    rows = (rec or {}).get("parts") or []
    primary = next((p for p in rows if p.get("id") == rec.get("primary")), None)
    base = (primary or {}).get("steps") or 0
    if not base:
        return []
    out = [Part(name=p.get("name") or p.get("class") or "optimizer", cls=p.get("class") or "", params=p.get("params") or 0,
                steps_per_step=(p.get("steps") or 0) / base, backward_per_step=(p.get("backward") or 0) / base)
           for p in rows]
    out = [p for p in out if p["steps_per_step"] >= MIN_PART_RATE]
    first = primary.get("name") or primary.get("class")
    return sorted(out, key=lambda p: (p["name"] != first, -p["steps_per_step"]))


def loop_facts(rows, rec: dict | None) -> LoopFacts | None:
    """The loop of one process from its step rows (one marker, :func:`whyidle.analysis.steps.steps_of`)
    and its last ``optimizers`` record; None without rows. ``micro_batches_per_step``: 1 when
    several optimizers step per step; else the median DataLoader batches per step where the steps
    take batches, else the median outermost backward calls per step; None when neither is recorded.
    ``forward_calls_per_step``: median outermost module calls (the step records' ``fc``)."""
    if not rows:
        return None
    loop_parts = parts(rec)
    backward_per_step, batches, calls = (field_percentile(rows, key, 50) for key in ("mb", "batches", "fc"))
    if len(loop_parts) >= 2:
        micro = 1.0
    elif batches is not None and batches >= 1:
        micro = batches
    else:
        micro = backward_per_step
    return LoopFacts(marker=rows[0].get("by"), trains=trains(rows), parts=loop_parts,
                     backward_per_step=backward_per_step, micro_batches_per_step=micro,
                     forward_calls_per_step=calls)
