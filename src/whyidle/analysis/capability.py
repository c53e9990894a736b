"""What a CUDA GPU can do for training, by compute capability (pure; no framework imports).

One table, :data:`CAPABILITIES`, keyed by compute capability ``(major, minor)`` from 3.5
(Kepler) to 12.x (Blackwell GeForce / workstation). Each row holds:

* ``arch``: architecture name (Kepler, Maxwell, Pascal, Volta, Turing, Ampere, Ada, Hopper,
  Blackwell); ``examples``: representative GPUs.
* ``tensor_cores``: whether the SMs have tensor cores (none before 7.0);
  ``tensor_core_dtypes``: the floating-point input types the tensor cores take, among
  ``fp16`` (from 7.0), ``bf16`` and ``tf32`` (from 8.0), ``fp8`` (from 8.9) and ``fp4``
  (Blackwell, 10.0 and later). Integer types (int8/int4) are left out: they do not train.
* ``amp_speedup``: a *conservative* factor by which mixed precision (autocast to bfloat16 or
  float16) speeds the GPU math of forward and backward compared with plain float32 on CUDA
  cores; ``amp_speedup_over_tf32``: the same when float32 matmuls already run as TF32 on tensor
  cores (8.0 and later; ``None`` before). 1.0 where there are no tensor cores. These are well
  below the peak-throughput ratios (8–16×) because real steps also hold memory-bound
  elementwise work, normalizations and reductions, and because PyTorch already runs cuDNN
  convolutions in TF32 by default on 8.0+ (``torch.backends.cudnn.allow_tf32`` is True).
  NVIDIA's mixed-precision training guide reports end-to-end gains of about 1.5–3× on
  compute-bound networks; we take 2× where the tensor-core peak is ≥ 4× the fp32 rate and the
  fp16/bf16 peak is 2× TF32, and 1.5× where the fp32-accumulate tensor peak is only 2× the fp32
  rate (GeForce parts: NVIDIA halves the fp32-accumulate tensor rate there).
* ``fp16_note``: one sentence on what fp16 gives over fp32 on this chip.
* ``mig``: whether the data-center parts of this capability support Multi-Instance GPU.

Sources (where each fact comes from):

* Compute capability → architecture and GPUs: NVIDIA "CUDA GPUs - Compute Capability" list
  (developer.nvidia.com/cuda-gpus) and the CUDA C++ Programming Guide, "Compute Capabilities"
  (per-capability sections and the "Features and Technical Specifications" table).
* fp16 arithmetic rates on CUDA cores before tensor cores: CUDA C++ Programming Guide,
  "Arithmetic Instructions" throughput table (results per clock per SM, 16-bit vs 32-bit
  floating-point add/multiply/multiply-add): 5.3: 256 vs 128; 6.0: 128 vs 64; 6.1: 2 vs 128;
  6.2: 256 vs 128; 3.x/5.0/5.2: no 16-bit arithmetic.
* Tensor-core input types per capability: CUDA C++ Programming Guide "Warp Matrix Functions"
  (wmma types: half from 7.0; __nv_bfloat16 and tf32 from 8.0) and the PTX ISA ``mma`` /
  ``wgmma`` / ``tcgen05.mma`` type tables (e4m3/e5m2 from sm_89; fp4/fp6 from sm_100 and
  sm_120); NVIDIA Transformer Engine support matrix (BF16 ≥ 8.0, FP8 ≥ 8.9, NVFP4 on 10.0 and
  12.0).
* Peak throughputs quoted in the notes (dense, TFLOPS): NVIDIA Tesla V100 whitepaper
  (fp32 15.7, fp16 tensor 125), T4 datasheet (fp32 8.1, fp16 tensor 65), A100 whitepaper /
  datasheet (fp32 19.5, TF32 156, bf16/fp16 312), GA102 (Ampere GeForce) whitepaper appendix
  (RTX 3090: fp32 35.6, TF32 35.6, fp16 tensor with fp32 accumulate 71), A10 datasheet (fp32
  31.2, TF32 62.5, bf16 125), Ada Lovelace whitepaper appendix (RTX 4090: fp32 82.6, fp16 tensor
  with fp32 accumulate 165.2), L4 datasheet (fp32 30.3, bf16 121), H100 whitepaper / datasheet
  (SXM: fp32 67, TF32 ≈ 495, bf16 ≈ 990), Blackwell architecture technical brief (bf16 2× TF32;
  FP4 tensor cores). PyTorch blog "What Every User Should Know About Mixed Precision Training in
  PyTorch" (2022): peak float16 matmul is 16× float32 on A100.
* MIG: NVIDIA Multi-Instance GPU user guide, "Supported GPUs" (A100, A30, H100, H200, B200,
  B300; also RTX PRO 6000 Blackwell, a 12.0 part whose GeForce siblings lack MIG).
"""

from __future__ import annotations

import re

_NO_TC = ()
_FP16 = ("fp16",)
_AMPERE = ("fp16", "bf16", "tf32")
_ADA = ("fp16", "bf16", "tf32", "fp8")
_BLACKWELL = ("fp16", "bf16", "tf32", "fp8", "fp4")

_NOTE_NO_FP16 = ("no 16-bit arithmetic units (fp16 is a storage format only) and no tensor cores: mixed "
                 "precision saves memory traffic, not math time")
_NOTE_FP16X2 = ("fp16 runs at 2× the fp32 rate on CUDA cores (paired half2 instructions) but there are no "
                "tensor cores: mixed precision helps little, mostly through halved memory traffic")


def _row(arch: str, examples: str, dtypes: tuple, amp: float, amp_tf32: float | None, note: str,
         mig: bool = False) -> dict:
    return {"arch": arch, "examples": examples, "tensor_cores": bool(dtypes), "tensor_core_dtypes": dtypes,
            "amp_speedup": amp, "amp_speedup_over_tf32": amp_tf32, "fp16_note": note, "mig": mig}


#: Compute capability → what the GPU can do for training (see the module docstring for fields
#: and sources).
CAPABILITIES: dict[tuple[int, int], dict] = {
    (3, 5): _row("Kepler", "Tesla K20/K40, GeForce GTX 780/Titan", _NO_TC, 1.0, None, _NOTE_NO_FP16),
    (3, 7): _row("Kepler", "Tesla K80", _NO_TC, 1.0, None, _NOTE_NO_FP16),
    (5, 0): _row("Maxwell", "GeForce GTX 750/750 Ti", _NO_TC, 1.0, None, _NOTE_NO_FP16),
    (5, 2): _row("Maxwell", "GeForce GTX 970/980/Titan X, Tesla M40/M60", _NO_TC, 1.0, None, _NOTE_NO_FP16),
    (5, 3): _row("Maxwell", "Jetson TX1/Nano", _NO_TC, 1.0, None, _NOTE_FP16X2),
    (6, 0): _row("Pascal", "Tesla P100", _NO_TC, 1.0, None, _NOTE_FP16X2),
    (6, 1): _row("Pascal", "GeForce GTX 1050–1080 Ti/Titan Xp, Tesla P4/P40", _NO_TC, 1.0, None,
                 "fp16 arithmetic runs at 1/64 of the fp32 rate and there are no tensor cores: mixed precision "
                 "will not help here (libraries compute fp16 in fp32 on this chip)"),
    (6, 2): _row("Pascal", "Jetson TX2", _NO_TC, 1.0, None, _NOTE_FP16X2),
    (7, 0): _row("Volta", "Tesla V100, Titan V", _FP16, 2.0, None,
                 "1st-generation tensor cores run fp16 matmuls and convolutions (fp32 accumulate) at 8× the fp32 "
                 "peak (V100: 125 vs 15.7 TFLOPS); no bf16, so use float16 with a GradScaler"),
    (7, 2): _row("Volta", "Jetson AGX Xavier", _FP16, 2.0, None,
                 "1st-generation tensor cores (fp16 only): use float16 with a GradScaler"),
    (7, 5): _row("Turing", "Tesla T4, GeForce RTX 20xx, Quadro RTX", _FP16, 2.0, None,
                 "2nd-generation tensor cores run fp16 at 8× the fp32 peak (T4: 65 vs 8.1 TFLOPS); no bf16, so "
                 "use float16 with a GradScaler (GTX 16xx and other TU117/TU116 parts have no tensor cores)"),
    (8, 0): _row("Ampere", "A100, A30", _AMPERE, 2.0, 1.5,
                 "3rd-generation tensor cores: bf16/fp16 at 16× the fp32 peak and 2× TF32 (A100: 312 vs 19.5 "
                 "and 156 TFLOPS); prefer bfloat16 (no GradScaler needed)", mig=True),
    (8, 6): _row("Ampere", "GeForce RTX 30xx, RTX A2000–A6000, A10, A40", _AMPERE, 1.5, 1.5,
                 "3rd-generation tensor cores; GeForce RTX 30: fp16/bf16 with fp32 accumulate at 2× the fp32 "
                 "rate and TF32 no faster than fp32 (3090: 71 vs 35.6 TFLOPS); A10: bf16 at 4× fp32"),
    (8, 7): _row("Ampere", "Jetson AGX Orin", _AMPERE, 1.5, 1.5, "3rd-generation tensor cores (bf16, tf32)"),
    (8, 9): _row("Ada", "L4, L40/L40S, GeForce RTX 40xx, RTX 6000 Ada", _ADA, 1.5, 1.5,
                 "4th-generation tensor cores, adding fp8; GeForce RTX 40: fp16/bf16 with fp32 accumulate at "
                 "2× the fp32 rate (4090: 165 vs 83 TFLOPS); L4: bf16 at 4× fp32 (121 vs 30)"),
    (9, 0): _row("Hopper", "H100, H200, GH200", _ADA, 2.0, 1.5,
                 "4th-generation tensor cores: bf16 at about 15× the fp32 peak and 2× TF32 (H100 SXM: ≈990 vs "
                 "67 and ≈495 TFLOPS); fp8 doubles bf16 again through Transformer Engine", mig=True),
    (10, 0): _row("Blackwell", "B200, GB200", _BLACKWELL, 2.0, 1.5,
                  "5th-generation tensor cores, adding fp4/fp6; bf16 at 2× TF32", mig=True),
    (10, 1): _row("Blackwell", "Jetson Thor (CUDA 12.x numbering)", _BLACKWELL, 1.5, 1.5,
                  "5th-generation tensor cores (fp4, fp8, bf16)"),
    (10, 3): _row("Blackwell", "B300, GB300", _BLACKWELL, 2.0, 1.5,
                  "5th-generation tensor cores, adding fp4/fp6; bf16 at 2× TF32", mig=True),
    (11, 0): _row("Blackwell", "Jetson Thor (CUDA 13 numbering)", _BLACKWELL, 1.5, 1.5,
                  "5th-generation tensor cores (fp4, fp8, bf16)"),
    (12, 0): _row("Blackwell", "GeForce RTX 50xx, RTX PRO 6000 Blackwell", _BLACKWELL, 1.5, 1.5,
                  "5th-generation tensor cores (fp4, fp8, bf16); GeForce parts accumulate fp32 at half the "
                  "tensor rate"),
    (12, 1): _row("Blackwell", "DGX Spark (GB10)", _BLACKWELL, 1.5, 1.5, "5th-generation tensor cores (fp4, fp8, bf16)"),
}

#: Turing parts of compute capability 7.5 built without tensor cores (TU116/TU117: GeForce GTX
#: 16xx, MX450/MX550, T400–T2000 workstation and laptop cards; NVIDIA Turing whitepaper and the
#: GTX 1660 / T1000 product pages). Matched against the NVML device name.
NO_TENSOR_CORE_NAMES = re.compile(r"\bGTX\s*16\d\d|\bMX\s*[45]50\b|\bT(?:400|500|550|600|1000|1200|2000)\b",
                                  re.IGNORECASE)


def parse_cc(cc: str | tuple | list | None) -> tuple[int, int] | None:
    """``"8.6"``, ``"8.6.0"``, ``(8, 6)`` or ``[8, 6]`` → ``(8, 6)``; ``None`` or anything else → ``None``."""
    if cc is None:
        return None
    try:
        if isinstance(cc, str):
            parts = cc.strip().split(".")
            return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1] else 0
        if isinstance(cc, (tuple, list)) and len(cc) >= 2:
            return int(cc[0]), int(cc[1])
    except (ValueError, TypeError):
        return None
    return None


def capability_of(cc: str | tuple | list | None, name: str | None = None) -> dict | None:
    """The :data:`CAPABILITIES` row of a compute capability, as a new dict.

    Args:
        cc: ``"8.6"`` or ``(8, 6)`` (NVML's ``nvmlDeviceGetCudaComputeCapability``; the report's
            ``device.compute_capability``).
        name: the device name, optional; a 7.5 part named in :data:`NO_TENSOR_CORE_NAMES` gets
            its tensor-core fields cleared.

    Returns:
        The row plus ``cc`` (``"major.minor"`` as asked), ``table_cc`` (the row used) and
        ``exact`` (False when an unknown minor fell back to the lowest known minor of that major,
        which has the fewest tensor-core types; its speedup factors are then the smallest of that
        major's rows and ``mig`` is False). ``None`` for ``None``, an unparsable value, or a major not in
        the table (older than Kepler or newer than this table).
    """
    key = parse_cc(cc)
    if key is None:
        return None
    row_key = key if key in CAPABILITIES else min((k for k in CAPABILITIES if k[0] == key[0]), default=None)
    if row_key is None:
        return None
    row = dict(CAPABILITIES[row_key])
    row.update(cc=f"{key[0]}.{key[1]}", table_cc=f"{row_key[0]}.{row_key[1]}", exact=row_key == key)
    if row_key != key:  # an unknown minor: claim only what every known minor of this major has
        siblings = [r for k, r in CAPABILITIES.items() if k[0] == key[0]]
        row["amp_speedup"] = min(r["amp_speedup"] for r in siblings)
        tf32 = [r["amp_speedup_over_tf32"] for r in siblings if r["amp_speedup_over_tf32"] is not None]
        row["amp_speedup_over_tf32"] = min(tf32) if row["amp_speedup_over_tf32"] is not None and tf32 else None
        row["mig"] = False
    if name and row_key == (7, 5) and NO_TENSOR_CORE_NAMES.search(name):
        row.update(tensor_cores=False, tensor_core_dtypes=(), amp_speedup=1.0,
                   fp16_note=("this Turing part (TU116/TU117) has no tensor cores; its fp16 units run at 2× the "
                              "fp32 rate, so mixed precision helps little"))
    return row


def has_tensor_cores(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when the GPU has tensor cores (compute capability ≥ 7.0, minus the TU116/TU117 parts)."""
    row = capability_of(cc, name)
    return bool(row and row["tensor_cores"])


def _has(cc, dtype: str, name: str | None = None) -> bool:
    row = capability_of(cc, name)
    return bool(row and dtype in row["tensor_core_dtypes"])


def supports_fp16(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when tensor cores take fp16 inputs (compute capability ≥ 7.0)."""
    return _has(cc, "fp16", name)


def supports_bf16(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when tensor cores take bfloat16 inputs (compute capability ≥ 8.0)."""
    return _has(cc, "bf16", name)


def supports_tf32(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when float32 matmuls can run as TF32 on tensor cores (compute capability ≥ 8.0)."""
    return _has(cc, "tf32", name)


def supports_fp8(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when tensor cores take fp8 (e4m3/e5m2) inputs (compute capability ≥ 8.9)."""
    return _has(cc, "fp8", name)


def supports_fp4(cc: str | tuple | list | None, name: str | None = None) -> bool:
    """True when tensor cores take fp4 inputs (Blackwell: compute capability ≥ 10.0)."""
    return _has(cc, "fp4", name)


def amp_dtype(cc: str | tuple | list | None, name: str | None = None) -> str | None:
    """The autocast dtype to recommend: ``"bfloat16"`` from 8.0 (float32's range, no loss
    scaling), ``"float16"`` on 7.x (needs a GradScaler), ``None`` without tensor cores."""
    if supports_bf16(cc, name):
        return "bfloat16"
    if supports_fp16(cc, name):
        return "float16"
    return None
