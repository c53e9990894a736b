"""Metrics the training program reports itself: :func:`whyidle.log_metric` and Keras ``History``.

Standard library only (runs inside the observed process). Under ``whyidle run`` a metric becomes a
``metric`` record of ``proc-<pid>.jsonl``; without whyidle (no agent in the process) the call does
nothing, so a script can keep it when it runs on its own.
"""

from __future__ import annotations

import math
import numbers
from time import monotonic_ns

from whyidle.instrument import agent as agent_mod


def log_metric(name: str, value, step: int | None = None, n: int | None = None) -> bool:
    """Records a metric of the training program, e.g. the validation accuracy after an epoch.

    Args:
        name: the metric's name (``"val_accuracy"``, ``"val_loss"``); ``whyidle compare`` matches
            metrics across runs by name.
        value: a number; anything ``float()`` accepts (a 0-d tensor or numpy scalar too — note
            that ``float()`` of a CUDA tensor waits for the GPU, so pass a Python number from code
            that already has one).
        step: optional step or epoch index the value belongs to.
        n: optional number of examples the metric was computed over (the validation set's
            size); for an accuracy ``whyidle compare`` then judges a change against its binomial
            standard error instead of a fixed tolerance.
    Returns:
        True when recorded; False when the process is not observed by ``whyidle run`` or the
        value is not a number (said once as a whyidle notice). Never raises.
    """
    agent = agent_mod.current()
    if agent is None or agent.disabled:
        return False
    try:
        v = float(value)
        if not isinstance(name, str) or not name:
            raise ValueError("the name must be a non-empty string")
        if n is not None and (int(n) != n or n < 1):
            raise ValueError(f"n must be a positive count, got {n!r}")
    except Exception as exc:
        agent.notice(f"whyidle.log_metric({name!r}, ...) not recorded: {exc}")
        return False
    agent.record({"k": "metric", "t": monotonic_ns(), "name": name, "value": v if math.isfinite(v) else None,
                  "raw": None if math.isfinite(v) else str(v), "step": step, "n": None if n is None else int(n),
                  "source": "log_metric"})
    agent.start_background()
    return True


def record_epoch_logs(agent, epoch: int, logs) -> None:
    """Records Keras's epoch-end ``logs`` (what ``History`` keeps: ``loss``, ``val_accuracy``, ...).

    Only plain numbers are taken: converting a tensor could wait for the device.
    """
    if not logs:
        return
    t = monotonic_ns()
    for name, value in logs.items():
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            v = float(value)
            agent.record({"k": "metric", "t": t, "name": str(name), "value": v if math.isfinite(v) else None,
                          "raw": None if math.isfinite(v) else str(v), "epoch": epoch, "source": "keras"})
