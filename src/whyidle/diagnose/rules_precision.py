"""``emulated_precision``: autocast to a 16-bit type the device has no native matmul units for.

Mixed precision speeds training only where the hardware runs the 16-bit type natively. Elsewhere
autocast makes every matmul and convolution slower than float32:

* **CPU**: bfloat16 needs AVX512-BF16 or AMX (Intel Cooper Lake / Sapphire Rapids and later, AMD
  Zen 4 and later), float16 AVX512-FP16 or AMX-FP16; without them oneDNN is not used and PyTorch
  falls back to a slow path (measured on an AVX2 EPYC, PyTorch 2.13: a bfloat16 matmul took
  5.3–5.8× float32's time at 32×32, 17× at 64×64, 113× at 512×512; a batch-2 transformer trained
  4.9× faster in float32, a small CNN 11.8×).
  The agent times the model's own layer shapes in both types at the first device audit
  (:mod:`whyidle.instrument.shape_probe`; one small matmul, :func:`whyidle.instrument.torch.
  lowp_matmul_slowdown`, where none could be timed), so the slowdown is this CPU's own at this
  model's sizes, and reads the CPU's flags: with native units a slower small product is not
  emulation (AVX512-BF16 EPYC: the 32×32 matmul 6× float32's time, the model at batch 64 1.7×
  faster in bfloat16).
* **CUDA**: bfloat16 before compute capability 8.0 (V100, T4, RTX 20xx): no bfloat16 tensor
  cores (CUDA C++ Programming Guide, "Warp Matrix Functions"; :mod:`whyidle.analysis.capability`),
  so bfloat16 math runs at best at float32 speed while float16 takes the tensor cores from 7.0.

``bound`` is the share of the step the slower type costs and ``est_speedup`` = 1 / (1 − bound).
"""

from __future__ import annotations

from whyidle.analysis.capability import capability_of, supports_bf16
from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import fixes
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.rules import _ms, _pct, _round, bound_of, finding
from whyidle.diagnose.rules_work import DOCS_AMP, _CODE_FP16, _gpu_compute_share
from whyidle.diagnose.types import Finding

DOCS_CPU_AMP = "https://pytorch.org/docs/stable/amp.html#cpu-op-specific-behavior"


#: ``/proc/cpuinfo`` flags of native 16-bit matrix units (the agent's
#: ``whyidle.instrument.shape_probe.LOWP_FLAGS``, which records them): x86 AVX512-BF16 / AMX-BF16,
#: AVX512-FP16 / AMX-FP16; Arm ``bf16``/``svebf16``, ``fphp``/``asimdhp``.
NATIVE_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16", "svebf16"),
                "float16": ("avx512_fp16", "amx_fp16", "fphp", "asimdhp")}

_NATIVE = {"bfloat16": "torch.ops.mkldnn._is_mkldnn_bf16_supported()",
           "float16": "torch.ops.mkldnn._is_mkldnn_fp16_supported()"}


def _float32_code(facts: RunFacts, dtype: str, site: str | None) -> str:
    """The program's mixed-precision switch on only where the CPU runs ``dtype`` natively, in its API."""
    name = fixes.api_name(facts)
    cfg = (facts.api or {}).get("config") or {}
    native = f"native = {_NATIVE[dtype]}   # AVX512/AMX {dtype} units (oneDNN)\n"
    if name == "lightning":
        return native + (f"trainer = Trainer(..., precision=\"{cfg.get('precision') or 'bf16-mixed'}\" if native "
                         "else \"32-true\")")
    if name == "hf_trainer":
        flag = "bf16" if dtype == "bfloat16" else "fp16"
        return native + f"args = TrainingArguments(..., {flag}=native)   # float32 on CPUs without it"
    if name == "accelerate":
        was = cfg.get("mixed_precision") or ("bf16" if dtype == "bfloat16" else "fp16")
        return native + f"accelerator = Accelerator(mixed_precision=\"{was}\" if native else \"no\")"
    where = f"   # {site}" if site else ""
    return (native + f"with torch.autocast(\"cpu\", dtype=torch.{dtype}, enabled=native):{where}\n"
            "    loss = loss_fn(model(x), y)")


def native_units(dtype: str, bench: dict, probe: dict) -> bool | None:
    """Whether this CPU runs ``dtype`` natively: True when it reports one of :data:`NATIVE_FLAGS`
    or oneDNN says so (``cpu_matmul.native``), False when the flags were read (or oneDNN said no)
    and none is there, None when neither is known."""
    flags = probe.get("cpu_flags") if probe.get("cpu_flags") is not None else bench.get("cpu_flags")
    if (flags and any(f in flags for f in NATIVE_FLAGS[dtype])) or bench.get("native") is True:
        return True
    if flags is not None or bench.get("native") is False:
        return False
    return None


def _cpu(facts: RunFacts, devices: dict, shares: dict, step_s: float | None) -> Finding | None:
    params = devices.get("params")
    if isinstance(params, dict) and params and set(params) != {"cpu"}:
        return None  # the model trains elsewhere (CUDA, MPS): CPU autocast is not its math
    dtype = (devices.get("autocast_dtypes") or {}).get("cpu")
    bench = devices.get("cpu_matmul") or {}
    probe = devices.get("shape_probe") or {}
    if dtype not in ("bfloat16", "float16"):
        return None
    lowp_covered = probe.get("lowp_covered")
    if probe.get("dtype") == dtype and probe.get("slowdown") and (
            lowp_covered is None or lowp_covered >= T.PROBE_MIN_COVER or not bench.get("slowdown")):
        slowdown, basis = probe["slowdown"], "model_shapes"
    elif bench.get("dtype") == dtype and bench.get("slowdown"):
        slowdown, basis = bench["slowdown"], "square_matmul"
    else:
        return None
    native = native_units(dtype, bench, probe)
    if basis == "square_matmul" and (native is True or slowdown < T.EMULATED_MIN_SLOWDOWN):
        return None  # a 32×32 product (slow on a CPU with the units, or a little slow) says little of the model
    later = probe.get("slowdown_target") if basis == "model_shapes" else None
    if slowdown <= 1.0 or (later is not None and later <= 1.0 and slowdown < T.EMULATED_MIN_SLOWDOWN):
        # float32 measured no faster at the model's own shapes (or no faster at the bigger batch
        # small_batch advises): float32 would be the slower dtype, never advised
        return None
    compute = shares["forward"] + shares["backward"]
    covered = devices.get("autocast_share")
    under = compute * (1.0 if covered is None else covered)  # backward slows as its forward does
    bound = under * (1.0 - 1.0 / slowdown)
    if bound < T.HOST_SHARE_WARN:
        return None
    cpu = (facts.device or {}).get("name") or "this CPU"
    units = "AVX512-BF16 or AMX" if dtype == "bfloat16" else "AVX512-FP16 or AMX-FP16"
    site = devices.get("autocast_site")
    cover = "" if covered is None else f"{_pct(covered)} of the forward runs"
    if basis == "model_shapes":
        n = len(probe.get("shapes") or [])
        measured = (f"the model's own {n} layer shape{'s' if n != 1 else ''} (probed outside the steps) took "
                    f"{slowdown:.1f}× their float32 time in {dtype}")
    else:
        measured = f"a {bench['n']}×{bench['n']} matmul took {slowdown:.1f}× its float32 time in {dtype}"
    evidence = _round({"dtype": dtype, "matmul_slowdown": slowdown, "matmul_n": bench.get("n"),
                       "native": native, "compute_share": compute, "autocast_share": covered,
                       "device": "cpu", "slowdown_at_target_batch": later})
    evidence["basis"] = basis
    evidence["cpu_flags"] = probe.get("cpu_flags") if probe.get("cpu_flags") is not None else bench.get("cpu_flags")
    evidence["site"] = site
    if native is True or slowdown < T.EMULATED_MIN_SLOWDOWN:
        # native units (or a small slowdown): at small shapes the casts can cost more than the math,
        # and a bigger batch turns it around (issue 32: batch 2 float32 1.06×, batch 64 bfloat16
        # 1.7× faster); whether float32 pays here is for a trial to say, not a critical finding
        summary = ((cover or "Forward and backward run") + f" under CPU autocast to {dtype}"
                   + (f" (from {site})" if site else "")
                   + f"; {cpu} " + ("has native " + dtype + f" units ({units})" if native else
                                    "may lack native " + dtype + " units")
                   + f", yet {measured}: inconclusive at these sizes (the casts cost more than small products). "
                   "`whyidle tune` measures the step with autocast off.")
        text = (f"Keep {dtype} if a bigger batch is the fix (larger products run faster in it on this CPU); "
                "otherwise compare a run with autocast off (`whyidle tune`).")
        return finding("emulated_precision", "info", f"Precision: {dtype} no faster at these sizes", summary,
                       evidence, None, text, None, [DOCS_CPU_AMP], bound=bound)
    est = 1.0 / (1.0 - min(bound, 0.95))
    summary = (f"{cover or 'Forward and backward run'} under CPU autocast to {dtype}"
               + (f" (from {site})" if site else "")
               + f"; with its backward that is {_pct(under)} of each {_ms(step_s)} step, but {cpu} has no native "
               f"{dtype} matmul ({units}): {measured} here, so {dtype} costs about {_pct(bound)} of the step and "
               f"float32 would give about {est:.1f}× (a conservative estimate: larger products slow down more).")
    text = (f"Train in float32 on this CPU: autocast to {dtype} only pays on CPUs with {units} "
            "(Intel Sapphire Rapids and later, AMD Zen 4 and later) and on GPUs; the code keeps it for those.")
    severity = "critical" if bound >= T.HOST_SHARE_CRITICAL else "warning"
    return finding("emulated_precision", severity, f"Emulated precision: {dtype} without native support",
                   summary, evidence, est, text, _float32_code(facts, dtype, site), [DOCS_CPU_AMP], bound=bound)


def _cuda(facts: RunFacts, devices: dict, step_s: float | None) -> Finding | None:
    device = facts.device or {}
    if (devices.get("autocast_dtypes") or {}).get("cuda") != "bfloat16":
        return None
    cap = capability_of(device.get("compute_capability"), device.get("name"))
    if cap is None or supports_bf16(device.get("compute_capability"), device.get("name")):
        return None
    split = _gpu_compute_share(facts)
    if split is None:
        return None
    compute, usable, _ = split
    name = f"the {device.get('name') or 'GPU'} ({cap['arch']}, compute capability {cap['cc']})"
    evidence = _round({"dtype": "bfloat16", "compute_capability": cap["cc"], "compute_share": compute,
                       "speedable_share": usable, "device": "cuda"})
    evidence["tensor_core_dtypes"] = list(cap["tensor_core_dtypes"])
    summary = (f"Forward and backward run under autocast to bfloat16 and take {_pct(compute)} of each "
               f"{_ms(step_s)} step on {name}, which has no bfloat16 tensor cores: bfloat16 math runs at "
               "float32 speed at best")
    if not cap["tensor_cores"]:
        summary += "."
        text = f"Train in float32 on this GPU: {cap['fp16_note']}."
        return finding("emulated_precision", "info", "Emulated precision: bfloat16 without native support",
                       summary, evidence, None, text, None, [DOCS_AMP])
    est = 1.0 / ((1.0 - usable) + usable / cap["amp_speedup"])
    summary += (f"; float16 on its tensor cores would give about {est:.2f}× per step (a conservative "
                "estimate).")
    api = fixes.mixed_precision_code(facts, bf16=False)
    text = (api[0] if api else "Autocast to float16 instead and scale the loss with torch.amp.GradScaler(\"cuda\")"
            " so small gradients do not underflow.") + " Keep bfloat16 for compute capability 8.0 and newer."
    severity = "warning" if est >= T.VERDICT_MIN_SPEEDUP else "info"
    return finding("emulated_precision", severity, "Emulated precision: bfloat16 without native support",
                   summary, evidence, est, text, api[1] if api else _CODE_FP16, [DOCS_AMP], bound=bound_of(est))


def emulated_precision(facts: RunFacts) -> Finding | None:
    """Autocast to bfloat16/float16 on a device without native units for it (see the module).

    Reads ``facts.devices`` (the last device audit: ``autocast_dtypes`` device type → dtype name,
    ``cpu_matmul`` the measured matmul slowdown, ``params`` device → count), ``facts.device``
    (``kind``, ``name``, ``compute_capability``), ``facts.step`` shares and step time.

    CPU: the slowdown is the autocast dtype's time over float32's at the model's own layer shapes
    (``devices.shape_probe``, :mod:`whyidle.instrument.shape_probe`, timed outside the steps), else
    at one 32×32 matmul (``cpu_matmul``). Silent when the dtype measured no slower there (float32
    would be the slower dtype), or below ``EMULATED_MIN_SLOWDOWN`` where it measured no slower at
    the bigger batch ``small_batch`` suggests (``slowdown_target``). The share it costs is
    (forward + backward) × ``autocast_share`` × (1 − 1/slowdown) (the audit's ``autocast_share``:
    the forward's time in module calls under autocast; its backward is taken to slow alike; 1 when
    unknown); nothing below ``HOST_SHARE_WARN``. Where the CPU has native units
    (:func:`native_units`: ``/proc/cpuinfo`` flags, oneDNN's check) or the slowdown is below
    ``EMULATED_MIN_SLOWDOWN``, the result is inconclusive (silent on the 32×32 probe alone; small
    products: the casts dominate; a bigger batch turns it around): an ``info`` finding without an
    estimate that leaves it to ``whyidle tune``. Otherwise (no native units) warning, critical from ``HOST_SHARE_CRITICAL``,
    with est = 1 / (1 − share): the whole forward and backward taken to slow by the measured
    factor (the elementwise work autocast leaves in float32 does not slow at all; larger products
    slow more); measured on an AVX2 EPYC with the 32×32 probe: est. 3.9× against 4.9×
    (``small_batch_bf16.py``) and 5.2× against 11.8×
    (``emulated_bf16.py``). CUDA: bfloat16 under compute capability
    8.0; ``est_speedup`` is Amdahl's law with the capability table's conservative float16
    ``amp_speedup`` (None and info without tensor cores). Silent when any fact is unknown.
    """
    devices = facts.devices or {}
    step = facts.step
    if not step or not devices.get("autocast_dtypes"):
        return None
    step_s = (step.get("step_time_s") or {}).get("mean")
    if (facts.device or {}).get("kind") == "cuda":
        return _cuda(facts, devices, step_s)
    return _cpu(facts, devices, step["shares"], step_s)
