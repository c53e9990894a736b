"""The model's own matrix products timed outside the measured steps: in float32 and in the CPU
autocast dtype, at the program's batch and at a bigger one.

Two diagnoses need what the model's layers cost on *this* CPU at *their* shapes, which a fixed
probe cannot give:

* ``emulated_precision``: whether bfloat16/float16 autocast is slower than float32 here. A small
  square matmul is the wrong witness: at 32×32 the cast to bfloat16 dominates, so a CPU with
  AVX512-BF16 (a 2-core EPYC, PyTorch 2.13) timed it 6× float32's time while the program's
  transformer at batch 64 trained 1.7× faster in bfloat16 (issue 32).
* ``small_batch``: how a step's forward and backward grow with the batch. The layers' time at the
  batch and at :data:`TARGET_BATCH` gives the growth of the model's own math, per-call overhead
  included (the per-call part does not grow, the arithmetic does).

While the top-level modules are learnt (:mod:`whyidle.instrument.module_calls`), each
``nn.Linear`` / ``nn.ConvNd`` call's first input shape and forward time are kept
(:func:`layer_of`); at the first device audit :func:`probe` calls ``torch.nn.functional.linear`` /
``convNd`` with the module's own weights on inputs of those shapes (ones, from no RNG: the
program's random stream is untouched; under ``torch.no_grad``: no graph, no state changes; CPU
tensors only: no device synchronization). The audit runs in the first optimizer step, which the
analysis leaves out as warm-up. Standard library only; ``torch`` is passed in.
"""

from __future__ import annotations

from time import perf_counter

#: Batch size the growth is measured at (``small_batch``'s target, thresholds.SMALL_BATCH_TARGET).
TARGET_BATCH = 32
#: Batches of at most this many samples are also probed at :data:`TARGET_BATCH`
#: (``small_batch``'s range, thresholds.SMALL_BATCH_MAX).
SMALL_BATCH_MAX = 8
#: Distinct layer shapes probed: the ones with the most forward time in the first steps.
MAX_SHAPES = 6
#: Timed repetitions per shape and dtype (after one warm-up call); the fastest is kept (a call
#: that waited for a core on a busy host is no measure of the product; the diagnosis stretches the
#: growth by the run's measured run-queue wait instead).
REPS = 5
#: Floating-point operations above which one call is not probed (2e8 ≈ 2–10 ms in float32 on one
#: modern core; a CPU without native bfloat16 runs it up to ~100× slower, so large shapes stay out).
MAX_FLOPS = 2e8
#: The same for the autocast dtype on a CPU without its :data:`LOWP_FLAGS` (emulated: up to ~100×
#: float32's time; the diagnosis falls back to the small square matmul when nothing is timed).
MAX_FLOPS_EMULATED = 1e7
#: Probe time above which the remaining shapes are skipped (seconds).
BUDGET_S = 0.5

_CONV = {"Conv1d": 1, "Conv2d": 2, "Conv3d": 3}

#: ``/proc/cpuinfo`` flags of native 16-bit matrix units, by autocast dtype: x86 AVX512-BF16 /
#: AMX-BF16 (Intel Cooper Lake, Sapphire Rapids and later; AMD Zen 4 and later) and AVX512-FP16 /
#: AMX-FP16 (Sapphire Rapids, Granite Rapids); Arm ``bf16`` / ``svebf16`` (Armv8.6) and ``fphp`` /
#: ``asimdhp`` (half-precision arithmetic, Armv8.2). Linux kernel ``arch/x86/include/asm/cpufeatures.h``
#: and ``Documentation/arch/arm64/elf_hwcaps.rst`` name them.
LOWP_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16", "svebf16"),
              "float16": ("avx512_fp16", "amx_fp16", "fphp", "asimdhp")}


def lowp_cpu_flags(path: str = "/proc/cpuinfo") -> list[str] | None:
    """The :data:`LOWP_FLAGS` this CPU reports (sorted), or None when ``path`` cannot be read (not
    Linux): then whether the CPU has them is unknown."""
    wanted = {f for names in LOWP_FLAGS.values() for f in names}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return sorted(wanted & set(line.split(":", 1)[1].split()))
    except OSError:
        return None
    return []


def layer_of(module, args) -> list[dict]:
    """The shape facts of one ``nn.Linear`` / ``nn.Conv1d/2d/3d`` / ``nn.MultiheadAttention`` call
    (``args``: its positional inputs): none for any other module or an input that is not a CPU
    floating-point tensor; two for an attention module (its input and output projections, which
    it runs through ``F.linear``, not as module calls).

    Each is ``{"kind": "linear"|"conv", "dims": 0|1|2|3, "in": [input shape], "w": weight, "b":
    bias, "stride", "padding", "dilation", "groups"}`` (the module's own tensors, not copies)."""
    name = type(module).__name__
    x = args[0] if isinstance(args, tuple) and args else None
    shape = getattr(x, "shape", None)
    if shape is None or getattr(x, "is_floating_point", lambda: False)() is False:
        return []
    if getattr(x, "device", None) is None or x.device.type != "cpu":
        return []
    if name == "MultiheadAttention":
        w_in, out = getattr(module, "in_proj_weight", None), getattr(module, "out_proj", None)
        if w_in is None or out is None or w_in.device.type != "cpu" or shape[-1] != w_in.shape[-1]:
            return []  # separate q/k/v projections (kdim/vdim): left out
        return [_linear(shape, w_in, getattr(module, "in_proj_bias", None)),
                _linear(shape, out.weight, out.bias)]
    w = getattr(module, "weight", None)
    if w is None or w.device.type != "cpu":
        return []
    dims = _CONV.get(name)
    if dims is None:
        if not any(c.__name__ == "Linear" for c in type(module).__mro__) or not shape or shape[-1] != w.shape[-1]:
            return []
        return [_linear(shape, w, getattr(module, "bias", None))]
    if len(shape) != dims + 2 or isinstance(getattr(module, "padding", 0), str) \
            or getattr(module, "padding_mode", "zeros") != "zeros":
        return []  # unbatched input, padding="same"/"valid" or a non-zero padding mode: left out
    return [{"kind": "conv", "dims": dims, "in": [int(s) for s in shape], "w": w, "b": getattr(module, "bias", None),
             "stride": module.stride, "padding": module.padding, "dilation": module.dilation, "groups": module.groups}]


def _linear(shape, w, b) -> dict:
    return {"kind": "linear", "dims": 0, "in": [int(s) for s in shape], "w": w, "b": b, "stride": 1, "padding": 0,
            "dilation": 1, "groups": 1}


def _bigger(layer: dict, batch: int, target: int) -> list[int] | None:
    """The input shape at ``target`` samples: a convolution's first dimension, a linear layer's
    first dimension of ``batch`` (rows are rows: sequence-first inputs scale alike); None when no
    dimension is the batch."""
    shape = layer["in"]
    dims = range(1) if layer["kind"] == "conv" else range(len(shape) - 1)
    for i in dims:
        if shape[i] == batch:
            return shape[:i] + [shape[i] * target // batch] + shape[i + 1:]
    return None


def flops(layer: dict, shape: list[int]) -> float:
    """Multiply-adds × 2 of one call of ``layer`` on an input of ``shape`` (an upper bound for
    convolutions: the output taken as large as the input, strides ignored)."""
    w = layer["w"].shape
    if layer["kind"] == "linear":
        rows = 1
        for s in shape[:-1]:
            rows *= s
        return 2.0 * rows * w[0] * w[1]
    out = shape[0] * w[0]
    for s in shape[2:]:
        out *= s
    k = 1
    for s in w[1:]:
        k *= s
    return 2.0 * out * k


def _call(torch, layer: dict, shape: list[int]):
    x = torch.ones(shape)
    fn = torch.nn.functional
    if layer["kind"] == "linear":
        return lambda: fn.linear(x, layer["w"], layer["b"])
    conv = getattr(fn, f"conv{layer['dims']}d")
    return lambda: conv(x, layer["w"], layer["b"], layer["stride"], layer["padding"], layer["dilation"],
                        layer["groups"])


def _best(torch, run, dtype: str | None, reps: int) -> float:
    """The fastest of ``reps`` timed calls after one untimed call (oneDNN builds a primitive for
    each new shape and dtype there); a single timed call when the first took over a quarter of
    :data:`BUDGET_S`."""
    with torch.no_grad(), torch.autocast("cpu", dtype=getattr(torch, dtype or "bfloat16"), enabled=dtype is not None):
        t0 = perf_counter()
        run()
        if perf_counter() - t0 > BUDGET_S / 4:
            reps = 1
        times = []
        for _ in range(reps):
            t0 = perf_counter()
            run()
            times.append(perf_counter() - t0)
    return min(times)


def probe(torch, layers: list[tuple[dict, int]], dtype: str | None, batch: int | None,
          target: int = TARGET_BATCH, reps: int = REPS, budget_s: float = BUDGET_S) -> dict | None:
    """Times the model's layer shapes (see the module docstring).

    Args:
        torch: the program's ``torch`` module.
        layers: ``(layer_of(...) result, forward ns in the first steps, calls per step)`` per
            layer; the :data:`MAX_SHAPES` distinct shapes with the most time are probed, each
            counted as often as layers of its shape are called in a step.
        dtype: the CPU autocast dtype (``"bfloat16"`` / ``"float16"``) or None without autocast.
        batch: the program's batch size (samples); the shapes are also probed at ``target`` when
            ``batch`` ≤ :data:`SMALL_BATCH_MAX` and each input's first dimension equals it.
        target: the bigger batch size.
        reps: timed repetitions (the fastest kept).
        budget_s: seconds after which no further shape is started.

    Returns ``{"dtype", "batch", "target", "shapes": [{"kind", "in", "w", "calls", "float32_s", "lowp_s",
    "float32_target_s", "lowp_target_s"}], "float32_s", "lowp_s", "slowdown", "float32_target_s",
    "lowp_target_s", "growth", "covered", "lowp_covered", "slowdown_target", "probe_s", "cpu_flags"}``
    (seconds per call, the fastest of ``reps``; the totals are per step: summed over the shapes timed in that key × their calls;
    ``covered``: the probed shapes' share of the layers' forward time in the first steps (0–1);
    ``lowp_covered``: the same for the shapes also timed in ``dtype``, which ``slowdown`` is over;
    ``slowdown`` = lowp_s / float32_s over the shapes timed in both, None without ``dtype`` or when
    no shape was (an emulated dtype is timed up to :data:`MAX_FLOPS_EMULATED` only); ``cpu_flags``:
    :func:`lowp_cpu_flags`; ``slowdown_target``: the same at ``target`` over the shapes timed
    there in both; ``growth``: the summed time at
    ``target`` over the summed time at ``batch``, in the dtype the program runs (autocast's when
    set), None when not probed at ``target``; a shape over :data:`MAX_FLOPS` at a batch is not
    timed there: None), or None when no shape could be timed. Raises nothing.
    """
    seen: dict[tuple, list] = {}
    for layer, ns, calls in layers:
        key = (layer["kind"], tuple(layer["in"]), tuple(layer["w"].shape), str(layer["stride"]),
               str(layer["padding"]), str(layer["dilation"]), layer["groups"])
        if key in seen:
            seen[key][1] += ns
            seen[key][2] += calls
        else:
            seen[key] = [layer, ns, calls]
    chosen = sorted(seen.values(), key=lambda e: -e[1])[:MAX_SHAPES]
    all_ns = sum(ns for _, ns, _ in seen.values())
    timed_ns = lowp_ns = 0
    grow = batch is not None and 0 < batch <= SMALL_BATCH_MAX and target > batch
    flags = lowp_cpu_flags()
    native = dtype is not None and flags is not None and any(f in flags for f in LOWP_FLAGS[dtype])
    lowp_cap = MAX_FLOPS if native else MAX_FLOPS_EMULATED
    t_start = perf_counter()
    rows = []
    try:
        for layer, ns, calls in chosen:
            if perf_counter() - t_start > budget_s:
                break
            shape = layer["in"]
            if flops(layer, shape) > MAX_FLOPS:
                continue
            row = {"kind": layer["kind"], "in": shape, "w": [int(s) for s in layer["w"].shape], "calls": calls,
                   "float32_s": _best(torch, _call(torch, layer, shape), None, reps),
                   "lowp_s": None, "float32_target_s": None, "lowp_target_s": None}
            if dtype is not None and flops(layer, shape) <= lowp_cap:
                row["lowp_s"] = _best(torch, _call(torch, layer, shape), dtype, reps)
            big = _bigger(layer, batch, target) if grow else None
            if big is not None and flops(layer, big) <= MAX_FLOPS:
                row["float32_target_s"] = _best(torch, _call(torch, layer, big), None, reps)
                # an emulated dtype at the target batch could take 100× float32's time: timed only
                # when it was at most twice as slow at the program's batch
                if row["lowp_s"] is not None and row["lowp_s"] <= 2.0 * row["float32_s"]:
                    row["lowp_target_s"] = _best(torch, _call(torch, layer, big), dtype, reps)
            rows.append(row)
            timed_ns += ns
            lowp_ns += ns if row["lowp_s"] is not None else 0
    except Exception:
        pass  # a shape the functional call refuses: what was timed stays
    if not rows:
        return None
    fp32 = _sum(rows, "float32_s")
    timed = [r for r in rows if r["lowp_s"] is not None]
    lowp = _sum(timed, "lowp_s") if timed else None
    fp32_lowp = _sum(timed, "float32_s")  # float32 over the same shapes
    key_t, key_b = ("lowp_target_s", "lowp_s") if dtype is not None else ("float32_target_s", "float32_s")
    both = [r for r in rows if r[key_t] is not None]
    growth = (_sum(both, key_t) / max(_sum(both, key_b), 1e-12)) if both else None
    return {"dtype": dtype, "batch": batch, "target": target if grow else None, "shapes": rows,
            "float32_s": fp32, "lowp_s": lowp, "slowdown": (lowp / max(fp32_lowp, 1e-12)) if lowp is not None else None,
            "cpu_flags": flags,
            "float32_target_s": _total(rows, "float32_target_s"),
            "lowp_target_s": _total(rows, "lowp_target_s"),
            "growth": growth, "covered": timed_ns / all_ns if all_ns else None,
            "lowp_covered": lowp_ns / all_ns if all_ns else None,
            "slowdown_target": _ratio([r for r in rows if r["lowp_target_s"] is not None]),
            "probe_s": perf_counter() - t_start}


def _sum(rows: list[dict], key: str) -> float:
    """Seconds per step of ``key`` over ``rows``: each shape's time × its calls per step."""
    return sum(r[key] * r.get("calls", 1) for r in rows)


def _total(rows: list[dict], key: str) -> float | None:
    """:func:`_sum` over the rows where ``key`` was timed; None when none was."""
    timed = [r for r in rows if r[key] is not None]
    return _sum(timed, key) if timed else None


def _ratio(rows: list[dict]) -> float | None:
    if not rows:
        return None
    return _sum(rows, "lowp_target_s") / max(_sum(rows, "float32_target_s"), 1e-12)
