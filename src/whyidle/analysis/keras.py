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

On the torch and JAX backends the steps carry ``data`` and ``comp`` themselves: the time in each
``next()`` of the iterator the trainer takes its batches from (:mod:`whyidle.instrument.keras`),
``method`` ``"fit_input"``. JAX runs each step asynchronously: its steps are first put on the
computation's pace (:func:`completion_paced`).

Without a measurement (the program profiles itself, too few steps, a trace that could not be
read, a Keras whose batches could not be timed) ``data`` is unknown: ``comp = fn`` and
``input_wait.method`` is None, so a report never calls a run "not input-bound" without having
measured it.

Custom-loop steps (``by == "iterator"``) carry ``data`` (time inside the eager ``next()``) and
``comp`` (time inside ``tf.function`` calls) measured directly; when no step called a
``tf.function`` or ``GradientTape.gradient`` the loop only read data and its steps are dropped.
"""

from __future__ import annotations

from whyidle.analysis.facts import InputWait
from whyidle.record.steptable import phase_spans

#: Why eager iteration without any ``tf.function`` call or ``GradientTape.gradient`` is not a
#: training loop (the program only reads or inspects data).
NOT_TRAINING = ("the program iterated a tf.data dataset but called no tf.function and computed no gradient "
                "while doing so: it reads data, it does not train")


def input_wait_ratio(calls: list) -> float | None:
    """The share (fraction) of a TensorFlow profiler window's train-function time spent waiting for
    the input: ``calls`` are ``[duration_ns, get_next_ns]`` per call (``tf_window`` /
    ``trace_window`` records), each wait capped at its call; None when they hold no time."""
    total = sum(c[0] for c in calls)
    return min(1.0, sum(min(c[1], c[0]) for c in calls) / total) if total > 0 else None

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
        "fit_input" | "iterator" | None, "ratio", "calls", "get_next_ms_mean", "fn_ms_mean", "fn_name",
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
    if steps[0].get("data") is not None:  # torch / JAX backends: each batch's fetch was timed
        return completion_paced(steps, records), {"method": "fit_input", "reason": None}
    win = _window(records)
    calls = (win or {}).get("calls") or []
    total = sum(c[0] for c in calls)
    if not win or win.get("error") or total <= 0:
        reason = ("the TensorFlow profiler trace could not be read: " + win["error"]) if win and win.get("error") else (
            "no TensorFlow profiler window ran (see the notes)")
        # steps marked as profiled by a window that was abandoned are ordinary steps
        return [dict(s, data=None, comp=s.get("fn"), profiled=False) for s in steps], {"method": None, "reason": reason}
    ratio = input_wait_ratio(calls)
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


def _overlap(spans: list, phase: str, a: int, b: int) -> int:
    """ns of ``phase`` spans (``phase_spans`` tuples) inside ``[a, b]``."""
    return sum(max(0, min(b, t1) - max(a, t0)) for t0, t1, p in spans if p == phase)


def completion_paced(steps: list, records) -> list:
    """Keras steps on the pace of their computation, where it runs asynchronously (JAX).

    JAX returns from the train function once the step's work is dispatched; the loop goes on to
    the next batch while it computes, and waits only when Keras reads the logs (in its callback
    threads) or at an epoch's end. The ``keras_done`` records give each step's completion ``d``
    (ns; :mod:`whyidle.instrument.keras`). Step ``n`` becomes ``[d(n−1), d(n)]``: one step of the
    computation's pace, whichever side is slower. Its ``comp`` is the computation's busy time
    ``d(n) − max(d(n−1), e(n))`` (``e``: when the train function returned, the work dispatched)
    plus the loop's own train-function time before ``e``; ``data`` is the batch fetches inside
    ``[d(n−1), e(n)]``, when the computation had nothing left to do (a fetch that overlapped the
    previous step's computation cost nothing); the rest of the step is host work. The first step
    starts where it began (the jit compilation is in it). Steps without a completion (the last of
    a run cut short) keep their own times; ``ph`` spans are dropped.

    Args:
        steps: Keras step rows (``by == "keras"``) with ``data``/``comp`` and ``ph``, in order.
        records: the process's records (``keras_done``).
    Returns:
        New step dicts (``t0``, ``t1``, ``data``, ``comp``, ``fn`` in ns), or ``steps`` unchanged
        without completions.
    """
    done: dict[int, int] = {}
    for r in records:
        if r.get("k") == "keras_done":
            for i, t in r.get("done") or []:
                done[i] = t
    if not done:
        return steps
    out, prev = [], None
    for s in steps:
        d = done.get(s["i"])
        if d is None:
            out.append(s)
            prev = None
            continue
        t0 = s["t0"] if prev is None else prev
        t1 = max(d, t0)
        spans = phase_spans(s["t0"], s["t1"], s.get("ph") or [], 1000)
        enq = max((b for _a, b, p in spans if p == "compute"), default=s["t0"])
        idle_end = min(max(enq, t0), t1)
        data = _overlap(spans, "data", t0, idle_end)
        comp = (t1 - idle_end) + _overlap(spans, "compute", t0, idle_end)
        out.append(dict(s, t0=t0, t1=t1, data=data, comp=comp, fn=comp + data, ph=[]))
        prev = t1
    return out
