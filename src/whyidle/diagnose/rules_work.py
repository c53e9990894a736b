"""Diagnosis rules about how much work the GPU gets and how it does it (pure; no framework imports).

* :func:`no_mixed_precision`: float32 math on a GPU whose tensor cores would run it faster.
* :func:`small_workload`: the GPU always has queued work, yet the work is too small to fill it.
* :func:`module_loop`: a submodule called in a Python loop on slices of the batch (views,
  timesteps, crops, chunks): many small calls where one batched call would do.

Each takes the facts of :func:`whyidle.analysis.run.analyze` and returns a finding of the report
contract (:func:`whyidle.diagnose.rules.finding`) or ``None``; thresholds are in
:mod:`whyidle.diagnose.thresholds`, GPU capabilities in :mod:`whyidle.analysis.capability`.
A missing or ``None`` fact counts as unknown, and an unknown fact keeps a rule silent.
"""

from __future__ import annotations

import re
import statistics

from whyidle.analysis import stacks as stack_analysis
from whyidle.analysis.capability import capability_of
from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes, notebook
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.loader_call import Change
from whyidle.diagnose.rules import _ms, _pct, _round, bound_of, finding, usable_cores
from whyidle.vocab import TRACKERS

DOCS_AMP = "https://pytorch.org/docs/stable/amp.html"
DOCS_AMP_RECIPE = "https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html"
DOCS_TF32 = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"
DOCS_KERAS_MP = "https://keras.io/api/mixed_precision/"
DOCS_MPS = "https://docs.nvidia.com/deploy/mps/index.html"
DOCS_MIG = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html"

_CODE_BF16 = """\
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):   # forward and loss in bfloat16
        loss = loss_fn(model(x), y)
    loss.backward()                                      # outside autocast; no GradScaler needed
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)"""

_CODE_FP16 = """\
scaler = torch.amp.GradScaler("cuda")                   # float16 needs loss scaling
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)"""

_CODE_TF32 = """\
# float32 matmuls left outside autocast: run them on TF32 tensor cores
torch.backends.cuda.matmul.allow_tf32 = True   # or: torch.set_float32_matmul_precision("high")"""


def _fp32_share(param_dtypes: dict) -> float | None:
    """Fraction of parameters (by count) whose dtype is float32; ``None`` without parameters.
    Dtype names may carry a ``torch.`` prefix."""
    total = sum(n for n in param_dtypes.values() if isinstance(n, (int, float)))
    if total <= 0:
        return None
    fp32 = sum(n for k, n in param_dtypes.items()
               if str(k).removeprefix("torch.") in ("float32", "float") and isinstance(n, (int, float)))
    return fp32 / total


def _gpu_compute_share(facts: RunFacts) -> tuple[float, float, float | None] | None:
    """(forward + backward share of step time, the share mixed precision can speed up, GPU
    starved share or None).

    The share that can be sped up is forward + backward, capped by the time the GPU had queued
    work (1 − ``gpu_idle.starved_share``) when that is known: faster kernels do nothing for time
    in which the GPU waits for the host.
    """
    step = facts.step
    shares = (step or {}).get("shares") or {}
    if shares.get("forward") is None or shares.get("backward") is None:
        return None
    compute = shares["forward"] + shares["backward"] + (shares.get("compute") or 0.0)  # Keras: fused step
    starved = (facts.gpu_idle or {}).get("starved_share")
    usable = compute if starved is None else min(compute, max(0.0, 1.0 - starved))
    return compute, usable, starved


def no_mixed_precision(facts: RunFacts) -> dict | None:
    """Float32 math on a GPU whose tensor cores would run it faster (mixed precision is off).

    Reads ``facts.device`` (``kind``, ``name``, ``compute_capability``),
    ``facts.devices`` (the last device audit: ``param_dtypes`` dtype name → parameter count,
    ``autocast`` True/False/None, ``matmul_tf32`` True/False/None, ``params`` device → count),
    ``facts.step["shares"]`` (``forward``, ``backward``), ``facts.step["step_time_s"]``,
    ``facts.gpu_idle["starved_share"]`` (optional), ``facts.gpu["tensor_active_mean"]``
    (optional, evidence only), ``facts.framework``.

    Fires on a CUDA device whose compute capability is known, when ≥
    ``MP_MIN_FP32_PARAM_SHARE`` of the parameters are float32, autocast was off (``False``, not
    unknown) and forward + backward (capped by the GPU's non-starved share) is ≥
    ``MP_MIN_COMPUTE_SHARE`` of the step. Silent when any of these facts is missing, or when
    the parameters are not on the GPU (that is ``wrong_device``).

    * Compute capability ≥ 7.0 (tensor cores): a warning. ``est_speedup`` = Amdahl's law,
      1 / ((1 − c) + c / m), with c the share above and m the capability table's conservative
      ``amp_speedup`` (``amp_speedup_over_tf32`` when TF32 matmuls are already on), so it stays
      below m (at most 2×). The fix is autocast to bfloat16 on ≥ 8.0, float16 with a GradScaler
      on 7.x, and TF32 for the float32 that remains when it is available and off.
    * Compute capability < 7.0 (no tensor cores; also the TU116/TU117 parts of 7.5): an *info*
      finding with ``est_speedup`` None that says mixed precision will not help much there. It
      is a finding rather than an evidence line because the question "would AMP help?" comes up
      exactly on these compute-bound runs, and no other finding would carry the answer; being
      info, it never becomes the verdict.
    """
    device = facts.device or {}
    devices = facts.devices or {}
    if device.get("kind") != "cuda":
        return None
    cap = capability_of(device.get("compute_capability"), device.get("name"))
    dtypes = devices.get("param_dtypes")
    autocast = devices.get("autocast")
    if cap is None or not isinstance(dtypes, dict) or autocast is None or autocast:
        return None
    params = devices.get("params")
    if isinstance(params, dict) and params and "cuda" not in params:
        return None
    fp32 = _fp32_share(dtypes)
    split = _gpu_compute_share(facts)
    if fp32 is None or fp32 < T.MP_MIN_FP32_PARAM_SHARE or split is None:
        return None
    compute, usable, starved = split
    if usable < T.MP_MIN_COMPUTE_SHARE:
        return None
    name = device.get("name") or "GPU"
    cc = cap["cc"]
    step_s = ((facts.step or {}).get("step_time_s") or {}).get("mean")
    tf32 = devices.get("matmul_tf32")
    evidence = _round({
        "compute_capability": cc, "architecture": cap["arch"], "tensor_cores": cap["tensor_cores"],
        "fp32_param_share": fp32, "autocast": autocast, "matmul_tf32": tf32,
        "compute_share": compute, "gpu_starved_share": starved, "speedable_share": usable,
        "tensor_active_mean": (facts.gpu or {}).get("tensor_active_mean"),
    })
    evidence["tensor_core_dtypes"] = list(cap["tensor_core_dtypes"])
    evidence["param_dtypes"] = dtypes
    evidence["note"] = cap["fp16_note"]
    where = f"the {name} ({cap['arch']}, compute capability {cc})"
    if not cap["tensor_cores"]:
        summary = (f"Forward and backward take {_pct(compute)} of each {_ms(step_s)} step in float32 on {where}, "
                   f"which has no tensor cores: mixed precision will not help much here.")
        text = (f"Stay in float32 on this GPU: {cap['fp16_note']}. Faster training needs a GPU with tensor cores "
                "(compute capability 7.0 or newer: V100, T4, RTX 20xx and later), a smaller model or less work "
                "per sample.")
        evidence["math_speedup"] = 1.0
        return finding("no_mixed_precision", "info", "Mixed precision would not help on this GPU", summary,
                       evidence, None, text, None, [DOCS_AMP])

    bf16 = "bf16" in cap["tensor_core_dtypes"]
    has_tf32 = "tf32" in cap["tensor_core_dtypes"]
    factor = cap["amp_speedup_over_tf32"] if (has_tf32 and tf32) else cap["amp_speedup"]
    est = 1.0 / ((1.0 - usable) + usable / factor)
    dtype = "bfloat16" if bf16 else "float16"
    evidence["math_speedup"] = factor
    evidence["recommended_dtype"] = dtype
    summary = (f"Forward and backward take {_pct(compute)} of each {_ms(step_s)} step in float32 with autocast off "
               f"on {where}, where {dtype} on the tensor cores speeds forward and backward about {factor:g}×: "
               f"mixed precision would give about {est:.2f}× per step (a conservative estimate).")
    keras = facts.framework in ("keras", "tensorflow")
    if bf16:
        text = ("Run forward and loss under torch.autocast(\"cuda\", dtype=torch.bfloat16): matmuls and "
                "convolutions use the tensor cores, weights and optimizer stay float32, and bfloat16 has "
                "float32's range, so no loss scaling is needed.")
        code = _CODE_BF16
    else:
        text = ("This GPU's tensor cores take float16, not bfloat16: run forward and loss under "
                "torch.autocast(\"cuda\", dtype=torch.float16) and scale the loss with torch.amp.GradScaler(\"cuda\") "
                "so small gradients do not underflow.")
        code = _CODE_FP16
    docs = [DOCS_AMP, DOCS_AMP_RECIPE]
    if has_tf32 and tf32 is False:
        text += (" TF32 matmuls are off too: torch.backends.cuda.matmul.allow_tf32 = True (or "
                 "torch.set_float32_matmul_precision(\"high\")) puts the float32 matmuls that remain on the "
                 "tensor cores, a one-line change when autocast is not an option.")
        code += "\n\n" + _CODE_TF32
        docs.append(DOCS_TF32)
    api_fix = fixes.mixed_precision_code(facts, bf16)
    if api_fix:  # Lightning, HF Trainer, Accelerate: one setting, the framework runs autocast
        text = api_fix[0] + (" Weights and optimizer state stay float32." if bf16 else "")
        code = api_fix[1]
    if keras:
        policy = "mixed_bfloat16" if bf16 else "mixed_float16"
        text = (f"Set the Keras mixed-precision policy \"{policy}\" before building the model: layers compute in "
                f"{dtype} on the tensor cores and keep float32 weights"
                + ("" if bf16 else "; model.fit scales the loss for float16 by itself")
                + ". Keep the output layer in float32 (dtype=\"float32\") so the softmax and loss stay stable.")
        code = (f"keras.mixed_precision.set_global_policy(\"{policy}\")   # before the model is built\n"
                "...\n"
                "outputs = keras.layers.Dense(num_classes, dtype=\"float32\")(x)   # keep the output layer float32")
        docs = [DOCS_KERAS_MP]
    severity = "warning" if est >= T.VERDICT_MIN_SPEEDUP else "info"
    return finding("no_mixed_precision", severity, "No mixed precision: float32 math on tensor-core GPU",
                   summary, evidence, est, text, code, docs, bound=bound_of(est))


def debug_mode(facts: RunFacts) -> dict | None:
    """A debugging switch left on in training (``debug_mode``, warning): autograd anomaly detection
    (``torch.autograd.set_detect_anomaly(True)`` or inside ``detect_anomaly()``: it records a Python
    traceback for every forward operation and checks every backward output for NaN; PyTorch's
    documentation: "should be enabled only for debugging as the different tests will slow down your
    program execution"), or ``CUDA_LAUNCH_BLOCKING=1`` on a CUDA run (every kernel launch waits for
    the kernel: the host never runs ahead of the GPU). Read at the device audit of the first
    steps. ``bound`` and ``est_speedup`` null: the run has no step without the switch to compare.
    """
    devices = facts.devices or {}
    on = []
    if devices.get("anomaly_detection"):
        on.append(("anomaly detection", "torch.autograd.set_detect_anomaly(False)   # or remove detect_anomaly() "
                   "around the training step"))
    if devices.get("launch_blocking") and "cuda" in (devices.get("params") or {}):
        on.append(("CUDA_LAUNCH_BLOCKING=1", "unset CUDA_LAUNCH_BLOCKING   # in the job's environment"))
    if not on:
        return None
    names = " and ".join(n for n, _ in on)
    summary = (f"{names[0].upper() + names[1:]} {'is' if len(on) == 1 else 'are'} on while training: "
               + ("autograd records a Python traceback for every forward operation and checks every backward output "
                  "for NaN; " if devices.get("anomaly_detection") else "")
               + ("every CUDA kernel launch waits for the kernel to finish; " if len(on) > 1 or
                  not devices.get("anomaly_detection") else "")
               + "the forward and backward shares above include that cost.")
    text = f"Turn {names} off for training runs: {'they are' if len(on) > 1 else 'it is'} for debugging."
    return finding("debug_mode", "warning", "Debug mode left on", summary, {"switches": [n for n, _ in on]}, None,
                   text, "\n".join(c for _, c in on),
                   ["https://pytorch.org/docs/stable/autograd.html#anomaly-detection"])


def small_workload(facts: RunFacts) -> dict | None:
    """The model is simply small for this GPU: it always has queued work but stays under-used.

    Reads ``facts.device`` (``kind``, ``name``, ``compute_capability``),
    ``facts.gpu_idle["starved_share"]``, ``facts.gpu`` (``sm_active_mean``,
    ``sm_occupancy_mean``, ``tensor_active_mean``, ``util_mean``, ``memory_used_max_bytes``,
    ``memory_total_bytes``), ``facts.step`` (``step_time_s.p50``, ``batch_size``).

    Fires on a CUDA device when the GPU was starved (no queued work) for less than
    ``SMALL_WORK_MAX_STARVED`` of the step time, and

    * GPM SM activity is below ``SMALL_WORK_SM_ACTIVE_MAX`` (severity *warning*: more than half
      of the GPU's SM-time is measured idle, a cost worth acting on), or
    * without GPM (``sm_active_mean`` None): peak memory used is below ``SMALL_WORK_MEM_MAX`` of
      capacity and the median step is shorter than ``SMALL_WORK_STEP_MAX_S`` (severity *info*:
      an inference from proxies, not a measurement).

    With GPM present and SM activity at or above the threshold it stays silent, whatever the
    memory says. ``est_speedup`` is None: nothing in the pipeline limits the step, and what a
    bigger batch or a shared GPU gives depends on the model.
    """
    device = facts.device or {}
    if device.get("kind") != "cuda":
        return None
    starved = (facts.gpu_idle or {}).get("starved_share")
    if starved is None or starved >= T.SMALL_WORK_MAX_STARVED:
        return None
    gpu = facts.gpu or {}
    step = facts.step or {}
    sm = gpu.get("sm_active_mean")
    used = gpu.get("memory_used_max_bytes")
    total = gpu.get("memory_total_bytes") or device.get("memory_total_bytes")
    mem_share = used / total if used is not None and total else None
    p50 = (step.get("step_time_s") or {}).get("p50")
    name = device.get("name") or "GPU"
    if sm is not None:
        if sm >= T.SMALL_WORK_SM_ACTIVE_MAX:
            return None
        severity = "warning"
        how = f"its SMs were busy only {_pct(sm)} of the time (GPM SM activity)"
    elif mem_share is not None and p50 is not None and mem_share < T.SMALL_WORK_MEM_MAX \
            and p50 < T.SMALL_WORK_STEP_MAX_S:
        severity = "info"
        how = (f"each step takes only {_ms(p50)} and uses {_pct(mem_share)} of its "
               f"{total / 1e9:.0f} GB memory (no SM-activity counters here, so this is inferred)")
    else:
        return None
    cap = capability_of(device.get("compute_capability"), device.get("name")) or {}
    summary = (f"The {name} always had work queued (starved {_pct(starved)} of the step time) yet {how}: the "
               f"model is small for this GPU, and nothing in the input pipeline or the loop holds it back.")
    share_gpu = "several jobs on this GPU with MPS" + (" or MIG partitions" if cap.get("mig") else "")
    text = (f"Nothing to fix in the pipeline. To get more out of the GPU: raise the batch size (and scale the "
            f"learning rate), run {share_gpu} (e.g. a hyper-parameter sweep), or train on a smaller, cheaper GPU.")
    code = ("nvidia-cuda-mps-control -d     # start the MPS daemon, then launch several training jobs on this GPU\n"
            "echo quit | nvidia-cuda-mps-control   # stop it afterwards")
    evidence = _round({
        "gpu_starved_share": starved, "sm_active_mean": sm, "sm_occupancy_mean": gpu.get("sm_occupancy_mean"),
        "tensor_active_mean": gpu.get("tensor_active_mean"), "util_mean": gpu.get("util_mean"),
        "memory_used_max_bytes": used, "memory_total_bytes": total, "memory_used_share": mem_share,
        "step_time_s_p50": p50, "batch_size": step.get("batch_size"), "mig_capable": cap.get("mig"),
    })
    evidence["basis"] = "sm_active" if sm is not None else "memory_and_step_time"
    docs = [DOCS_MPS] + ([DOCS_MIG] if cap.get("mig") else [])
    return finding("small_workload", severity, "Small workload: the model does not fill this GPU", summary,
                   evidence, None, text, code, docs)


def module_loop(facts: RunFacts) -> dict | None:
    """A module with parameters is called ``T.MODULE_LOOP_MIN_CALLS``+ times per step (a Python loop
    over views, timesteps, crops or chunks: ``module_calls`` of the first steps), each call small
    (forward ≤ ``T.MODULE_LOOP_MAX_CALL_S``), and its calls hold ``T.HOST_SHARE_WARN`` or more of
    the step. Every call pays the per-call cost (Python, dispatch, on a GPU kernel launches) on a
    slice of the batch; folding the loop dimension into the batch pays it once.

    ``bound``: the loop's forward share of the step scaled by (forward + backward) / forward (its
    backward repeats per call too), capped at the forward + backward share. ``est_speedup`` is
    null: what folding gains depends on how small each call is (measured 1.6x on the 2-core CPU
    for 24 views of 8 images, tests/scenarios/README.md). Reported as ``host_bound`` with
    ``evidence.kind = "module_loop"``. A module called once per micro-batch under gradient
    accumulation (calls per step = backward calls per step, the step rows' ``mb``) is not a loop.
    """
    step = facts.step
    loops = facts.module_loops or []
    if not step or not loops:
        return None
    sh = step["shares"]
    fwd, bwd = sh.get("forward") or 0.0, sh.get("backward") or 0.0
    small = [m for m in loops if m["calls_per_step"] >= T.MODULE_LOOP_MIN_CALLS
             and m["forward_s_per_step"] / m["calls_per_step"] <= T.MODULE_LOOP_MAX_CALL_S]
    micro = statistics.median([s["mb"] for s in facts.analyzed_steps or [] if s.get("mb")] or [1])
    if micro >= 2:  # gradient accumulation: one call (and one backward) per micro-batch is no loop
        small = [m for m in small if abs(m["calls_per_step"] - micro) >= 0.5]
    top = small[0] if small else None
    if top is None or fwd <= 0:
        return None
    if not top.get("params"):
        return _loss_loop(facts, [m for m in small if not m.get("params")], fwd, bwd)
    share = min(fwd + bwd, top["share_of_step"] * (fwd + bwd) / fwd)
    if share < T.HOST_SHARE_WARN:
        return None
    k = top["calls_per_step"]
    per_call = top["forward_s_per_step"] / k
    batch = top.get("batch")
    site = top.get("site") or "the loop"
    was = stack_analysis.source_line(site, (facts.meta or {}).get("cwd")) if top.get("site") else None
    summary = (f"`{top['cls']}` is called {k:g} times per step ({_ms(per_call)} of forward each"
               + (f", on {batch} samples" if batch else "") + f") from {site}: a Python loop over slices of the "
               f"batch; its calls hold {_pct(share)} of the step (forward and backward).")
    rows = [("B, V = x.shape[:2]", "x: [batch, views, ...]"),
            (f"out = self.{_attr(was) or 'encoder'}(x.flatten(0, 1))", "one call on B*V samples"),
            ("out = out.unflatten(0, (B, V))", "back to [batch, views, ...]")]
    width = max(len(c) for c, _ in rows) + 3
    code = "\n".join([f"# was: {was}" if was else f"# was: one {top['cls']} call per view / timestep / crop"]
                      + [f"{c.ljust(width)}# {note}" for c, note in rows]
                      + ["# or torch.vmap(module) over the loop dimension; an RNN cell loop: nn.LSTM / nn.GRU"])
    text = (f"Fold the loop dimension into the batch: one `{top['cls']}` call on all {k:g} slices "
            f"({k * batch if batch else '?'} samples) instead of {k:g} calls, then unflatten the result.")
    evidence = _round({"calls_per_step": k, "forward_s_per_call": per_call, "loop_share": share,
                       "forward_share_of_step": top["share_of_step"]})
    evidence.update(kind="module_loop", module=top["cls"], site=top.get("site"), batch=batch,
                    params=top.get("params"), hotspots=[])
    severity = "critical" if share >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("host_bound", severity, "Host-bound: a module called in a Python loop", summary, evidence,
                   None, text, code, ["https://pytorch.org/docs/stable/generated/torch.vmap.html"], bound=share)


#: Arguments of the losses whose call is not ``criterion(input, target)`` (torch.nn's signatures).
LOSS_ARGS = {"MarginRankingLoss": "x1, x2, y", "CosineEmbeddingLoss": "x1, x2, y",
             "TripletMarginLoss": "anchor, positive, negative", "TripletMarginWithDistanceLoss": "anchor, positive, negative",
             "CTCLoss": "log_probs, targets, input_lengths, target_lengths", "GaussianNLLLoss": "input, target, var"}
#: Losses that take ``ignore_index`` (padding targets instead of slicing each sample).
IGNORE_INDEX = ("CrossEntropyLoss", "NLLLoss")


def _loss_code(cls: str, was: str | None) -> str:
    """One call of loss module ``cls`` on the whole batch, with its own arguments."""
    args = LOSS_ARGS.get(cls, "input, target")
    rows = [f"# was: {was}" if was else f"# was: one {cls} call per sample",
            "# one call on the whole batch: each argument built for all samples at once, [N, ...] tensors",
            "# (index with tensors of positions instead of looping: i = torch.arange(N - 1); a, b = emb[i], emb[i + 1])",
            f"loss = criterion({args})"]
    if cls.endswith("Loss"):
        rows += [f"per_sample = nn.{cls}(reduction=\"none\")({args})   # a value per sample, [N]: weights, masks",
                 "loss = (per_sample * weights).mean()"]
    if cls in IGNORE_INDEX:
        rows += ["# variable lengths: pad the targets with -100 (ignore_index) instead of slicing each sample",
                 "loss = criterion(logits.flatten(0, 1), targets.masked_fill(pad_mask, -100).flatten())"]
    return "\n".join(rows)


def _function_of(site: str | None) -> str | None:
    """``"path function"`` of a ``"path:line function"`` site (the hotspots' ``function``)."""
    if not site:
        return None
    path, _line, func = stack_analysis.split_site(site)
    return f"{path} {func}"


def _in_loop(hotspot: dict, site: str | None, training: str | None) -> bool:
    """The other host time of ``hotspot`` belongs to the loss loop called at ``site``: the hotspot
    is the line itself, or the whole function holding the loop when that function is a helper (a
    ``compute_loss``), not the script's body nor the function that calls the model."""
    if not site:
        return False
    if hotspot.get("site") == site:
        return True
    fn = _function_of(site)
    return hotspot.get("function") == fn and fn != training and not fn.endswith(" <module>")


def _loss_loop(facts: RunFacts, loops: list[dict], fwd: float, bwd: float) -> dict | None:
    """:func:`module_loop` for modules without parameters that the program calls itself (a loss
    called per sample or per pair in a Python loop, cases.md C13), busiest first. Per loop: its
    calls' forward share of the step, twice that of the backward (each small call's backward runs
    about as many tiny operations as its forward, and the backward of the slice it was given writes
    a gradient the size of the whole sliced tensor, k of them summed: loss_loop.py, 32 per-sample
    calls on a [32, 64, 50] tensor, measured its backward 1.9 ms longer than the fixed variant's
    for 0.6 ms of calls' forward, 3x; tests/scenarios/README.md) and the step's other
    host time sampled at its line, or in its whole function when that is a helper that does not
    call the model (:func:`_in_loop`: the loop's own Python and tensor ops); ``bound``
    their sum (at most the forward, the backward and the other host time). ``est_speedup``: each
    loop one call instead of k, 1 / (1 − Σ share × (1 − 1/k)) (64 per-sample cross-entropy calls on
    the 2-core CPU: bound 0.81, est 4.9x, measured 5.6x). Conservative where the loop also builds
    tensors per sample (their backward is counted only as far as the calls' own): a pair loss over
    per-pair dot products measured 12.3x per step against an estimate of ~5x."""
    other = (facts.step or {}).get("shares", {}).get("other_host") or 0.0
    training = _function_of((facts.preamble or {}).get("site"))
    fwd_left, bwd_left, rows, used = fwd, bwd, [], set()
    for m in loops:
        site = m.get("site")
        calls = min(fwd_left, m["share_of_step"])
        back = min(bwd_left, 2 * calls)
        fwd_left, bwd_left = fwd_left - calls, bwd_left - back
        mine = [h for h in (facts.hotspots or {}).get("other", []) if id(h) not in used
                and _in_loop(h, site, training) and (h.get("samples") or 0) >= T.MIN_SITE_SAMPLES]
        used.update(id(h) for h in mine)  # two loops in one helper function: its time counts once
        py = sum(h.get("share") or 0.0 for h in mine)
        rows.append((m, calls + back + min(py, other)))
    share = min(fwd + bwd + other, sum(r for _, r in rows))
    if share < T.HOST_SHARE_WARN:
        return None
    top, top_share = rows[0]
    site, k, batch, cls = top.get("site"), top["calls_per_step"], top.get("batch"), top["cls"]
    removed = min(0.95, sum(r * (1 - 1 / m["calls_per_step"]) for m, r in rows))
    was = stack_analysis.source_line(site, (facts.meta or {}).get("cwd")) if site else None
    more = [f"`{m['cls']}` {m['calls_per_step']:g} times at {m.get('site') or '?'}" for m, _ in rows[1:]]
    summary = (f"`{cls}` is called {k:g} times per step" + (f" on {batch} row{'s' if batch != 1 else ''} each" if batch else "")
               + f" from {site or 'the program'}: a Python loop over the batch"
               + (f"; also {', '.join(more)}" if more else "")
               + f". The calls and the loops' own Python hold {_pct(share)} of the step.")
    text = (f"Call `{cls}` once on the whole batch instead of {k:g} times on slices"
            + (f" (nn.{cls}(reduction=\"none\") keeps a value per sample)" if cls.endswith("Loss") else "")
            + (f"; the same for {', '.join(m['cls'] for m, _ in rows[1:])}" if more else "") + ".")
    evidence = _round({"calls_per_step": k, "forward_s_per_call": top["forward_s_per_step"] / k, "loop_share": share,
                       "forward_share_of_step": top["share_of_step"], "top_loop_share": top_share})
    evidence.update(kind="module_loop", module=cls, site=site, batch=batch, params=0, hotspots=[],
                    loops=[{"module": m["cls"], "site": m.get("site"), "calls_per_step": m["calls_per_step"],
                            "share": round(r, 4)} for m, r in rows])
    severity = "critical" if share >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("host_bound", severity, f"Host-bound: {cls} called in a Python loop", summary, evidence,
                   1.0 / (1.0 - removed), text, _loss_code(cls, was),
                   ["https://pytorch.org/docs/stable/nn.html#loss-functions"], bound=share)


def preprocess_in_forward(facts: RunFacts) -> dict | None:
    """The model's forward spends ``T.HOST_SHARE_WARN`` or more of the step before its first layer
    (``facts.preamble``: the top-level module's forward start to its first parameterized submodule,
    timed by the module hooks of the first steps): preprocessing (a tokenizer, an image processor,
    a per-sample resize) run inside ``forward``, serial with the model, while DataLoader workers
    could do it during the previous step (cases.md C36).

    ``bound``: the preamble's share of the steady step time. ``est_speedup``: 1 / (1 − bound), the
    step without it, when the DataLoader has workers or the job may use a core besides the
    training thread to run them (otherwise null: moved work would still be serial). Reported as
    ``host_bound`` with ``evidence.kind = "preprocess_in_forward"``.
    """
    pre = facts.preamble
    if not pre or pre["share_of_step"] < T.HOST_SHARE_WARN:
        return None
    share = pre["share_of_step"]
    loader = facts.loader or {}
    workers = loader.get("num_workers") or 0
    cores = usable_cores(facts.host) if facts.host else 0
    gain = round(1 / (1 - share), 2) if share < 1 and (workers or cores >= 2) else None
    cls = pre.get("cls") or "the model"
    site = pre.get("site")
    lines = ", ".join(h["function"] for h in pre.get("sites") or [])
    summary = (f"`{cls}.forward` runs {_ms(pre['s_per_step'])} per step before its first layer, "
               f"{_pct(share)} of the step: preprocessing inside the model, serial with it"
               + (f"; sampled there: {lines}." if lines else "."))
    text = ("Move the preprocessing out of `forward` into the DataLoader's `collate_fn` (or the dataset's "
            "`__getitem__`), so the workers prepare the next batch while the model trains on this one; "
            "`forward` then takes tensors.")
    if facts.framework == "transformers":
        text += " With the HF Trainer: `Trainer(data_collator=...)` runs it in the dataloader workers."
    code = "\n".join([
        f"# was: {cls}.forward preprocessing raw inputs" + (f" (called from {site})" if site else ""),
        "class Preprocess:                     # the DataLoader workers run it",
        "    def __call__(self, samples):",
        "        return preprocess(samples)     # tokenizer / processor / resize -> batch tensors",
    ] + fixes.in_api(facts, fixes.loader_lines(facts, [Change("collate_fn", "Preprocess()", note="", replace=True)] + [
        c for c in fixes.worker_changes(facts, max(workers, 2)) if c.name in ("num_workers", "persistent_workers")]),
        tail=False))
    # a notebook: spawn workers import Preprocess (and a cell's Dataset) from a module; keep the loader's cell
    text, code = notebook.with_notes(text, code, notebook.worker_notes(facts, max(workers, 2), defines=("Preprocess",)))
    evidence = _round({"preamble_s_per_step": pre["s_per_step"], "preamble_share": share})
    evidence.update(kind="preprocess_in_forward", module=pre.get("cls"), site=site, num_workers=workers,
                    hotspots=pre.get("sites") or [])
    severity = "critical" if share >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("host_bound", severity, "Host-bound: preprocessing inside the model's forward", summary,
                   evidence, gain, text, code,
                   ["https://pytorch.org/docs/stable/data.html#dataloader-collate-fn"], bound=share)


def model_hooks(facts: RunFacts) -> dict | None:
    """Forward, backward or gradient hooks that the program or a tracker put on the model hold
    ``T.HOST_SHARE_WARN`` or more of the step (``facts.hooks``, timed per call by
    :mod:`whyidle.instrument.hooks`): ``wandb.watch`` with a small ``log_freq`` reading every weight
    and gradient into histograms (cases.md C26), or a hand-written hook doing the same. Their time
    is inside the forward and backward shares, where it would read as device work.

    ``bound``: the hooks' share of the step. ``est_speedup``: the step with the hooks' work done
    every ``T.LOG_EVERY`` calls instead of every call, 1 / (1 − bound × (1 − 1/LOG_EVERY)).
    Reported as ``host_bound`` with ``evidence.kind = "model_hooks"``.
    """
    hooks = facts.hooks
    if not hooks or hooks["share_of_step"] < T.HOST_SHARE_WARN:
        return None
    share = hooks["share_of_step"]
    rows = hooks.get("hooks") or []
    top = rows[0] if rows else {}
    tracker = top.get("owner") in TRACKERS
    gain = round(1 / (1 - share * (1 - 1 / T.LOG_EVERY)), 2)
    phases = " and ".join(f"{_pct(v)} in {k}" for k, v in sorted(hooks.get("by_phase", {}).items(), key=lambda kv: -kv[1])
                          if v >= 0.01)
    named = ", ".join(f"`{r['function']}` ({r['defined']}, {r['calls']} calls)" for r in rows[:3])
    where = top.get("registered")
    summary = (f"Hooks on the model take {_ms(hooks['s_per_step'])} per step, {_pct(share)} of the step"
               + (f" ({phases})" if phases else "") + f": {named or 'hooks registered by the program'}"
               + (f", registered at {where}" if where else "") + ". That time reads as forward/backward, not as the model.")
    if tracker and top.get("owner") == "wandb":
        text = ("Log histograms less often: `wandb.watch(model, log_freq=...)` reads every weight and gradient each "
                "time it logs; use the default 1000 (or `log=\"gradients\"`), or drop `watch` and log scalars.")
        code = 'wandb.watch(model, log="gradients", log_freq=1000)   # was a small log_freq'
    else:
        who = f"the {top.get('owner')} hooks" if tracker else "the hooks"
        text = (f"Let {who} do their work every {T.LOG_EVERY} steps instead of every call: read weights and gradients into "
                "histograms (or anything that copies whole tensors to the host) only on logging steps, or remove the "
                "hooks (the handle's `.remove()`) between logging steps.")
        fn = (top.get("function") or "hook").split(".")[-1]
        code = (f"def {fn}(...):                 # {top.get('defined') or 'the hook'}\n"
                f"    if step % {T.LOG_EVERY}:          # the training step counter: log on every {T.LOG_EVERY}th step\n"
                "        return\n"
                "    ...                             # the histogram / logging work")
    evidence = _round({"hooks_s_per_step": hooks["s_per_step"], "hooks_share": share})
    evidence.update(kind="model_hooks", owner=top.get("owner"), registered=where, by_phase=_round(hooks.get("by_phase") or {}),
                    hooks=rows[:5])
    severity = "critical" if share >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("host_bound", severity, "Host-bound: hooks on the model", summary, evidence, gain, text, code,
                   ["https://docs.wandb.ai/ref/python/watch/",
                    "https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_forward_hook"],
                   bound=share)


def _attr(line: str | None) -> str | None:
    """``encoder`` from a source line calling ``self.encoder(...)``, else None."""
    m = re.search(r"self\.(\w+)\(", line or "")
    return m.group(1) if m else None
