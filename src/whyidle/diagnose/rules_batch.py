"""``small_batch``: per-step fixed cost dominates because the batches are tiny.

One question: how much faster per sample would a bigger batch run on this machine? The step-time
model is :mod:`whyidle.diagnose.batch_model`; the finding's vocabulary and helpers are
:mod:`whyidle.diagnose.rules`'.
"""

from __future__ import annotations

import math

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import batch_model, fixes
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import DOCS_TUNING, _ms, _pct, _round, finding, gpu_idle_share


def small_batch(facts: RunFacts) -> dict | None:
    """Per-step fixed cost dominates because batches are tiny (≤ ``SMALL_BATCH_MAX`` samples).

    Model: step time = fixed + per-sample × batch (:mod:`whyidle.diagnose.batch_model`), from the
    run's own steps of two batch sizes when it had them, else from the model's layers timed at both
    batch sizes (CPU, ``devices.shape_probe``), else from the phase shares: optimizer and other
    host time, plus the per-operation overhead inside forward and backward (autograd graph nodes ×
    ``DISPATCH_S_PER_NODE``; on a GPU at least the measured launch idle) fixed; forward, backward
    and data wait beyond that per-sample. ``evidence.basis`` names the basis; ``bound`` is the
    fixed share; ``est_speedup`` the samples/s ratio at the target batch size.

    On a CUDA device whose peak memory use and capacity are known (``facts.gpu``
    ``memory_used_max_bytes`` / ``memory_total_bytes``, capacity else from ``facts.device``),
    the target is bounded by the memory headroom: batch × min(``SMALL_BATCH_TARGET`` / batch,
    ``SMALL_BATCH_MEM_FILL`` × total / used), rounded down to a power of two (conservative:
    weights, optimizer state and the CUDA context do not grow with the batch). When that is no
    bigger than today's batch, the memory is full and ``SMALL_BATCH_TARGET`` stays the example.
    """
    step = facts.step
    if not step or step.get("batch_size") is None:
        return None
    batch = step["batch_size"]
    if batch > T.SMALL_BATCH_MAX:
        return None
    sh = step["shares"]
    mean = step["step_time_s"]["mean"]
    # per-operation overhead inside forward and backward does not grow with the batch either: the
    # measured autograd graph size × the cost of one operation (on a GPU: the measured launch idle)
    nodes = facts.graph_nodes or 0
    per_op = min(sh["forward"] + sh["backward"], nodes * T.DISPATCH_S_PER_NODE * (step.get("batches_per_step") or 1)
                 / max(mean, 1e-9))
    launch = gpu_idle_share(facts, "launch")
    if launch is not None:
        per_op = min(sh["forward"] + sh["backward"], max(per_op, launch))
    keras = facts.framework in ("keras", "tensorflow")
    shares = sh
    if keras:  # the optimizer runs inside the compiled step, whose call has a fixed cost of its own
        fixed_k = min(1.0, sh["other_host"] + T.KERAS_STEP_FIXED_S / max(mean, 1e-9))
        shares = {"other_host": fixed_k, "forward": 1.0 - fixed_k}
    target = T.SMALL_BATCH_TARGET
    gpu = facts.gpu or {}
    used = gpu.get("memory_used_max_bytes")
    total = gpu.get("memory_total_bytes") or (facts.device or {}).get("memory_total_bytes")
    room = None  # GPU memory headroom: None off CUDA or when used/total is unknown
    if (facts.device or {}).get("kind") == "cuda" and used and total:
        scale = min(T.SMALL_BATCH_TARGET / max(batch, 1), T.SMALL_BATCH_MEM_FILL * total / used)
        fits = 2 ** math.floor(math.log2(max(1.0, max(batch, 1) * scale)))
        room = {"memory_used_bytes": used, "memory_total_bytes": total, "memory_used_share": used / total,
                "suggested_batch_size": fits if fits > batch else None}
        if fits > batch:
            target = fits
    fit = batch_model.fit_batches(facts.analyzed_steps or [])
    if fit is not None and batch not in fit["sizes"]:
        fit = None
    probe = None if keras else (facts.devices or {}).get("shape_probe")
    model = batch_model.step_at(shares, mean, batch, target, 0.0 if keras else per_op * mean, probe, fit,
                                (facts.host or {}).get("trainer_run_delay_share") or 0.0,
                                nodes * T.CPU_S_PER_NODE * (step.get("batches_per_step") or 1),
                                step["step_time_s"].get("p50"))
    est = model["est"]
    fixed = min(1.0, model["fixed_s"] / max(model["step_s"], 1e-12))
    basis = {"batch_sizes": f"this run's steps of {fit['sizes'][0]:g} and {fit['sizes'][1]:g} samples"
             if fit else "",
             "layer_probe": "the model's own layers timed at both batch sizes outside the steps",
             "shares": "the step's phase shares (per-operation overhead at its lower bound)"}[model["basis"]]
    memory = ""
    if room is not None:
        memory = (f"; the GPU used {used / 1e9:.1f} of {total / 1e9:.1f} GB"
                  + (f", room for batches of {target}" if room["suggested_batch_size"] else ", little room to grow"))
    summary = (f"Batches of {batch:g} sample{'s' if batch != 1 else ''}: each {_ms(step['step_time_s']['mean'])} step "
               f"carries {_pct(fixed)} fixed per-step work (optimizer, Python) and per-operation overhead that a "
               f"bigger batch would share; batches of {target} would give about {est:.1f}× the samples/s "
               f"(from {basis}){memory}.")
    text = (f"Raise batch_size (e.g. to {target}) and scale the learning rate with it (linear scaling "
            "with warm-up). Gradient accumulation keeps a large effective batch but does not amortize per-step cost.")
    if room is not None and not room["suggested_batch_size"]:
        text += (" GPU memory is nearly full: free some first (mixed precision halves activation memory; "
                 "activation checkpointing trades compute for memory).")
    evidence = _round({"batch_size": batch, "fixed_share": fixed, "per_op_share": per_op,
                       "step_time_s_mean": step["step_time_s"]["mean"],
                       "samples_per_s": step.get("samples_per_s"), "target_batch_size": target,
                       "step_time_s_at_target": model["step_s_at_target"], "fixed_s": model["fixed_s"],
                       "per_sample_s": model["per_sample_s"]})
    evidence["basis"] = model["basis"]
    if room is not None:
        evidence.update(_round(room))
    severity = "warning" if est >= 1.3 else "info"
    code = fixes.batch_code(facts, target, batch)
    if keras:
        code = fixes.keras_batch_code(facts, target, batch)
    return finding("small_batch", severity, "Small batch: per-step overhead dominates", summary, evidence, est, text,
                   code, [DOCS_TUNING], bound=fixed)
