"""``emulated_precision``: autocast to a 16-bit type the device has no native matmul units for.

Mixed precision speeds training only where the hardware runs the 16-bit type natively. Elsewhere
autocast makes every matmul and convolution slower than float32:

* **CPU**: bfloat16 needs AVX512-BF16 or AMX (Intel Cooper Lake / Sapphire Rapids and later, AMD
  Zen 4 and later), float16 AVX512-FP16 or AMX-FP16; without them oneDNN is not used and PyTorch
  falls back to a slow path (measured on an AVX2 EPYC, PyTorch 2.13: a bfloat16 matmul took
  5.3–5.8× float32's time at 32×32, 17× at 64×64, 113× at 512×512; a batch-2 transformer trained
  4.9× faster in float32, a small CNN 11.8×).
  The agent times one small matmul in both types at the first device audit
  (:func:`whyidle.instrument.torch.lowp_matmul_slowdown`), so the slowdown is this CPU's own.
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


def _cpu(facts: RunFacts, devices: dict, shares: dict, step_s: float | None) -> Finding | None:
    params = devices.get("params")
    if isinstance(params, dict) and params and set(params) != {"cpu"}:
        return None  # the model trains elsewhere (CUDA, MPS): CPU autocast is not its math
    dtype = (devices.get("autocast_dtypes") or {}).get("cpu")
    bench = devices.get("cpu_matmul") or {}
    slowdown = bench.get("slowdown")
    if dtype not in ("bfloat16", "float16") or bench.get("dtype") != dtype or not slowdown:
        return None
    if slowdown < T.EMULATED_MIN_SLOWDOWN or bench.get("native") is True:
        # oneDNN reports native units: its convolutions and large matmuls use them even where the
        # small probe is slow (an EPYC with AVX512-BF16: the 32×32 matmul 6× float32's time, yet the
        # scenario's bfloat16 CNN 1.7× faster than in float32, 2026-12-04): no claim to make
        return None
    compute = shares["forward"] + shares["backward"]
    covered = devices.get("autocast_share")
    under = compute * (1.0 if covered is None else covered)  # backward slows as its forward does
    bound = under * (1.0 - 1.0 / slowdown)
    if bound < T.HOST_SHARE_WARN:
        return None
    est = 1.0 / (1.0 - min(bound, 0.95))
    cpu = (facts.device or {}).get("name") or "this CPU"
    units = "AVX512-BF16 or AMX" if dtype == "bfloat16" else "AVX512-FP16 or AMX-FP16"
    site = devices.get("autocast_site")
    cover = "" if covered is None else f"{_pct(covered)} of the forward runs"
    summary = (f"{cover or 'Forward and backward run'} under CPU autocast to {dtype}"
               + (f" (from {site})" if site else "")
               + f"; with its backward that is {_pct(under)} of each {_ms(step_s)} step, but {cpu} has no native "
               f"{dtype} matmul ({units}): a {bench['n']}×{bench['n']} matmul took {slowdown:.1f}× its float32 time "
               f"here, so {dtype} costs about {_pct(bound)} of the step and float32 would give about {est:.1f}× "
               "(a conservative estimate: larger matmuls slow down more).")
    text = (f"Train in float32 on this CPU: autocast to {dtype} only pays on CPUs with {units} "
            "(Intel Sapphire Rapids and later, AMD Zen 4 and later) and on GPUs; the code keeps it for those.")
    evidence = _round({"dtype": dtype, "matmul_slowdown": slowdown, "matmul_n": bench.get("n"),
                       "native": bench.get("native"), "compute_share": compute, "autocast_share": covered,
                       "device": "cpu"})
    evidence["site"] = site
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

    CPU: silent where oneDNN reports native units (``cpu_matmul.native``: the small probe can be slow
    there while the model's convolutions are fast); else fires when the measured slowdown is ≥
    ``EMULATED_MIN_SLOWDOWN`` and the share it costs,
    (forward + backward) × ``autocast_share`` × (1 − 1/slowdown), is ≥ ``HOST_SHARE_WARN`` (the
    audit's ``autocast_share``: the forward's time in module calls under autocast; its backward is
    taken to slow alike; 1 when unknown); critical from
    ``HOST_SHARE_CRITICAL``. The estimate assumes the whole forward and backward slows by the
    matmul's factor: a 32×32 matmul's slowdown is a lower bound of larger ones (matmuls and
    convolutions), while the elementwise work autocast leaves in float32 does not slow at all;
    measured here: est. 3.9× against 4.9× (scenario ``small_batch_bf16.py``) and 5.2× against 11.8×
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
