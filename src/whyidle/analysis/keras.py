"""Keras / TensorFlow steps → input wait and compute (pure; no framework imports).

A Keras step (``by == "keras"``) holds ``fn``: ns inside the compiled train function, which
fetches the next batch (``IteratorGetNext``) and runs forward, backward and optimizer fused. The
split comes from whyidle's TensorFlow profiler window (``tf_window`` record, see
:mod:`whyidle.instrument.tfprof`):

- ``ratio`` = Σ get-next time / Σ train-function time over the window's calls (fraction, 0–1).
- Steps inside the window whose calls line up one to one with the window's get their own
  measured get-next time; every other step gets ``data = fn × ratio`` (the window's ratio
  applied to the step's own measured train-function time).
- ``comp = fn − data``; the rest of the step (callbacks, logging, the Keras loop) stays host time.

Without a window (another Keras backend, the program profiles itself, too few steps, a trace
that could not be read) ``data`` is unknown: ``comp = fn`` and ``input_wait.method`` is None,
so a report never calls a run "not input-bound" without having measured it.

Custom-loop steps (``by == "iterator"``) carry ``data`` (time inside the eager ``next()``) and
``comp`` (time inside ``tf.function`` calls) measured directly; when no step called a
``tf.function`` or ``GradientTape.gradient`` the loop only read data and its steps are dropped.
"""

from __future__ import annotations

from whyidle.analysis.facts import InputWait

#: Why eager iteration without any ``tf.function`` call or ``GradientTape.gradient`` is not a
#: training loop (the program only reads or inspects data).
NOT_TRAINING = ("the program iterated a tf.data dataset but called no tf.function and computed no gradient "
                "while doing so: it reads data, it does not train")


def _window(records) -> dict | None:
    return next((r for r in records if r.get("k") == "tf_window"), None)


def input_wait(steps: list, records) -> tuple[list, InputWait | None]:
    """Fills ``data`` and ``comp`` (ns) into Keras steps.

    Args:
        steps: the process's step rows (dicts or :class:`~whyidle.record.steptable.StepView`),
            as chosen by :func:`whyidle.analysis.steps.steps_of`.
        records: the process's records (for ``tf_window``).
    Returns:
        ``(steps, info)``: new step dicts and ``info`` = ``{"method": "tf_profiler" |
        "iterator" | None, "ratio", "calls", "get_next_ms_mean", "fn_ms_mean", "fn_name",
        "iterators", "file", "reason", "gpu_busy"}`` (``gpu_busy``: ``[plane, fraction]`` of the
        profiled calls' span in which each GPU ran kernels or copies) (``ratio`` a fraction of train-function time; ms per
        call), or ``(steps, None)`` when the steps are not Keras or custom-loop steps.
    """
    if not steps:
        return steps, None
    by = steps[0].get("by")
    if by == "iterator":
        if not any(s.get("comp") or s.get("grad") for s in steps):
            return [], {"method": None, "reason": NOT_TRAINING}
        return steps, {"method": "iterator", "reason": None}
    if by != "keras":
        return steps, None
    win = _window(records)
    calls = (win or {}).get("calls") or []
    total = sum(c[0] for c in calls)
    if not win or win.get("error") or total <= 0:
        reason = ("the TensorFlow profiler trace could not be read: " + win["error"]) if win and win.get("error") else (
            "no TensorFlow profiler window ran (see the notes)")
        # steps marked as profiled by a window that was abandoned are ordinary steps
        return [dict(s, data=None, comp=s.get("fn"), profiled=False) for s in steps], {"method": None, "reason": reason}
    ratio = min(1.0, sum(min(c[1], c[0]) for c in calls) / total)
    profiled = [s for s in steps if s.get("profiled")]
    own = {}
    if len(profiled) == len(calls):
        own = {s["i"]: min(c[1], c[0]) / c[0] if c[0] else ratio for s, c in zip(profiled, calls)}
    out = []
    for s in steps:
        fn = s.get("fn") or 0
        data = int(fn * own.get(s["i"], ratio))
        out.append(dict(s, data=data, comp=fn - data))
    info = {
        "method": "tf_profiler", "ratio": ratio, "calls": len(calls),
        "get_next_ms_mean": sum(c[1] for c in calls) / len(calls) / 1e6,
        "fn_ms_mean": total / len(calls) / 1e6, "fn_name": win.get("fn_name"),
        "iterators": win.get("iterators") or [], "file": win.get("file"), "reason": None,
        "gpu_busy": win.get("gpu_busy") or [],
    }
    return out, info
