"""Step time as a function of the batch size, from what the run measured (``small_batch``'s estimate).

A step at batch b costs T(b) = a + c·b: ``a`` per step whatever the batch (the optimizer over every
parameter, Python, the per-operation overhead of forward and backward: dispatch, autograd, kernel
launches), ``c`` per sample (the arithmetic). The samples/s ratio at a target batch B is
(B / T(B)) / (b / T(b)). Three bases, the first that applies (``basis`` in the result):

* ``"batch_sizes"``: the run itself had steps of two batch sizes (a last partial batch each epoch,
  variable batches): a and c fitted through the medians of the two most frequent sizes
  (:func:`fit_batches`). Everything the step does is in it.
* ``"layer_probe"``: the model's own Linear/ConvNd/attention shapes timed at b and at B outside the
  steps (:mod:`whyidle.instrument.shape_probe`, CPU). Forward and backward grow by three times the
  layers' forward growth (a layer's backward is two products of its forward's size: the input's
  and the weight's gradients); of the rest of forward and backward (activations, pooling,
  normalization, casts, autograd's own work) the graph's nodes × ``CPU_S_PER_NODE`` are per-step
  overhead and what exceeds it grows with the batch; data wait per-sample
  (a DataLoader batch is fetched sample by sample), optimizer and other host work as per-step.
  A probe whose layers alone take longer than the step's forward + backward was slowed by a
  busy host: not used. Measured on a 2-core EPYC (issue 32, calm runs, at batch 32): est. 2.3×
  against 2.5× in plain runs (``batch1.py``) and 4.0× against 3.5× (``small_batch_bf16.py``)
  (tests/scenarios/README.md).
* ``"shares"``: the phase shares alone. Per-step: optimizer, other host work, and per-operation
  overhead inside forward and backward (autograd graph nodes × ``DISPATCH_S_PER_NODE``, on a GPU at
  least the measured launch idle); everything else per-sample. A lower bound on CPUs, where an
  operation's overhead is several times ``DISPATCH_S_PER_NODE``.
"""

from __future__ import annotations

import numpy as np

from whyidle.analysis.stepcols import StepCols, unique_counts
from whyidle.record.steptable import NULL_INT

#: Steps each of two batch sizes needs before the run's own T(b) fit is trusted.
FIT_MIN_STEPS = 3
#: The smaller of the two sizes must be at most this fraction of the larger (closer sizes make c noise).
FIT_MAX_SIZE_RATIO = 0.75
#: Forward + backward arithmetic per unit of the layers' forward arithmetic (forward 1, backward 2).
FWD_BWD_FACTOR = 3.0


def fit_batches(rows: list[dict]) -> dict | None:
    """T(b) = a + c·b through the median step times of the two most frequent batch sizes.

    Args:
        rows: analyzed steps (``t0``/``t1`` ns, ``samples`` per step, ``batches`` per step).

    Returns ``{"a_s", "c_s", "sizes": [b1, b2], "steps": [n1, n2]}`` (seconds per step, seconds per
    sample), or None when fewer than two sizes have ``FIT_MIN_STEPS`` steps, the sizes are closer
    than ``FIT_MAX_SIZE_RATIO``, or the fit is not physical (c ≤ 0 or a < 0).
    """
    cols = StepCols(rows)
    if not cols.n:
        return None
    blocks = list(cols.blocks())

    def sized(b: StepCols) -> tuple[np.ndarray, np.ndarray]:
        """A block's steps with a known size: (samples per batch, their indexes in the block)."""
        samples, batches = b.ints("samples"), b.ints("batches")
        has = np.flatnonzero((samples != NULL_INT) & (samples != 0))
        return samples[has] / np.maximum(1, np.where(batches == NULL_INT, 1, batches))[has], has

    # the sizes by their steps, most first (a tie: the size seen first), a block at a time: a day
    # of steps as whole columns took ~150 MB
    values, first, counts = unique_counts((a, sized(b)[0]) for a, b in blocks)
    order = sorted(range(len(values)), key=lambda k: (-counts[k], first[k]))
    sizes = [k for k in order if counts[k] >= FIT_MIN_STEPS][:2]
    if len(sizes) < 2:
        return None
    (k1, b1), (k2, b2) = sorted(((k, float(values[k])) for k in sizes), key=lambda kb: kb[1])
    if b1 > FIT_MAX_SIZE_RATIO * b2:
        return None
    seconds: dict[int, list] = {k1: [], k2: []}
    for _, b in blocks:
        size, has = sized(b)
        dur = b.durations()[has] / 1e9
        for k in (k1, k2):
            seconds[k].append(dur[size == values[k]])
    t1, t2 = (float(np.median(np.concatenate(seconds[k]))) for k in (k1, k2))
    c = (t2 - t1) / (b2 - b1)
    a = t1 - c * b1
    if c <= 0 or a < 0:
        return None
    return {"a_s": a, "c_s": c, "sizes": [b1, b2], "steps": [int(counts[k1]), int(counts[k2])]}


def probe_growth(probe: dict, batch: float, target: int) -> tuple[float, float] | None:
    """The layers' forward seconds at ``batch`` and at ``target`` in the dtype the program runs,
    from a :func:`whyidle.instrument.shape_probe.probe` record: shapes not timed at the target
    (over the probe's size cap) grow linearly (the conservative side), and both sums are scaled to
    all layers by the probe's ``covered`` share of their forward time. None when the probe is of
    another batch or another target."""
    if not probe or probe.get("batch") != batch or probe.get("target") != target or not probe.get("shapes"):
        return None
    low = probe.get("dtype") is not None
    covered = probe.get("covered") or 1.0
    at_b = at_t = 0.0
    for row in probe["shapes"]:
        t_b = row["lowp_s"] if low else row["float32_s"]
        t_t = row["lowp_target_s"] if low else row["float32_target_s"]
        if t_b is None:
            return None
        n = row.get("calls", 1)
        at_b += t_b * n
        at_t += (t_t if t_t is not None else t_b * target / batch) * n
    # layers not probed (the budget, the size cap) grow as the probed ones did
    return at_b / max(covered, 0.05), at_t / max(covered, 0.05)


def step_at(shares: dict, step_s: float, batch: float, target: int, fb_fixed_s: float, probe: dict | None,
            fit: dict | None, run_delay: float = 0.0, node_fixed_s: float = 0.0,
            typical_s: float | None = None) -> dict:
    """The step time at ``target`` samples per step (module docstring: the bases).

    Args:
        shares: the step's phase shares (fractions: ``data_wait``, ``forward``, ``backward``,
            ``optimizer``, ``other_host``; Keras ``compute``).
        step_s: the mean step time at ``batch`` (seconds).
        batch: samples per step now.
        target: samples per step after the fix.
        fb_fixed_s: per-step overhead inside forward and backward for the ``"shares"`` basis (s).
        probe: the device audit's ``shape_probe`` record, or None.
        fit: :func:`fit_batches`'s result, or None.
        node_fixed_s: per-step overhead of the operations outside the layers' products for the
            ``"layer_probe"`` basis (s): autograd graph nodes × ``CPU_S_PER_NODE``; the rest of
            that time grows with the batch.
        typical_s: the median step time (s); the ``"layer_probe"`` basis splits it instead of the
            mean, whose waits for a core on a busy host would read as per-sample work.
        run_delay: the share of the run's wall time the training thread waited for a core (0–1,
            host ``trainer_run_delay_share``): the probe's short calls mostly escape it, the
            steps' time holds it, so the layers' growth and ``node_fixed_s`` are stretched by
            1 / (1 − run_delay) (at most 10×) to be in the steps' terms. Under heavy contention
            (2 intra-op threads waiting for each other on a busy 2-core host) the steps stretch
            more than that and the estimate errs low; ``cpu_contention`` leads there.

    Returns ``{"basis", "step_s", "step_s_at_target", "fixed_s", "per_sample_s", "est"}``:
    seconds, and ``est`` the samples/s ratio (target / T(target)) / (batch / T(batch)), never
    below 1 (a bigger batch never costs more per sample than the same samples in small steps).
    """
    k = target / max(batch, 1e-9)
    if fit is not None:
        now = fit["a_s"] + fit["c_s"] * batch
        later = fit["a_s"] + fit["c_s"] * target
        basis, fixed = "batch_sizes", fit["a_s"]
    else:
        host = (shares.get("optimizer", 0.0) + shares.get("other_host", 0.0)) * step_s
        data = shares.get("data_wait", 0.0) * step_s
        fb = (shares.get("forward", 0.0) + shares.get("backward", 0.0) + shares.get("compute", 0.0)) * step_s
        grown = probe_growth(probe, batch, target) if probe else None
        now = step_s
        fb_typical = fb * (typical_s or step_s) / step_s
        if grown is not None and FWD_BWD_FACTOR * grown[0] > fb_typical:
            grown = None  # the layers' products alone longer than forward + backward: a busy host stretched the probe
        if grown is not None:
            at_b, at_t = grown
            basis = "layer_probe"
            if typical_s:  # the median step: a busy host's long outliers are no per-sample work
                now = typical_s
                host, data, fb = (x * typical_s / step_s for x in (host, data, fb))
            stretch = 1.0 / (1.0 - min(max(run_delay, 0.0), 0.9))
            rest = max(0.0, fb - FWD_BWD_FACTOR * at_b)  # forward/backward outside the layers' products
            rest_fixed = min(rest, node_fixed_s * stretch)  # a waiting thread stretches the overhead alike
            later = (host + data * k + (fb - rest) + FWD_BWD_FACTOR * max(0.0, at_t - at_b) * stretch
                     + rest_fixed + (rest - rest_fixed) * k)
            fixed = host + rest_fixed
        else:
            basis = "shares"
            fb_fixed = min(fb, fb_fixed_s)
            fixed = host + fb_fixed
            later = fixed + (step_s - fixed) * k
    est = max(1.0, k * now / max(later, 1e-12))
    return {"basis": basis, "step_s": now, "step_s_at_target": later, "fixed_s": min(fixed, now),
            "per_sample_s": max(0.0, now - fixed) / max(batch, 1e-9), "est": est}
