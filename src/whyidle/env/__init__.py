"""``whyidle env``: what a user checks first on a machine.

Which frameworks are installed and whether each sees the GPU, the driver and the CUDA version it
supports against each framework's build, what the GPU can do (compute capability, tensor cores,
bf16, what mixed precision would give), CPU cores and memory this process may use, and with a data
path, whether the data sits on a network or FUSE file system. Data flows probe → diagnose → render:
:mod:`whyidle.env.probe` and :mod:`whyidle.env.fs` read, :mod:`whyidle.diagnose.rules_env` judges,
:mod:`whyidle.report.env_report` prints. The JSON object is described in ``docs/report.md``
("Environment check").
"""

from __future__ import annotations

import threading

from whyidle import __version__
from whyidle.analysis import capability
from whyidle.diagnose import rules_env
from whyidle.env import fs, probe
from whyidle.env.fs import DataPathError

SCHEMA = "whyidle.env/1"

__all__ = ["SCHEMA", "DataPathError", "check", "exit_code", "gpu_entry"]


def gpu_entry(dev: dict) -> dict:
    """An NVML device (:func:`whyidle.env.probe.probe_nvml`) with what its compute capability means
    (:mod:`whyidle.analysis.capability`): ``arch``, ``tensor_cores``, ``tensor_core_dtypes``, ``bf16``,
    ``mig_capable`` and ``mixed_precision`` = ``{dtype ("bfloat16"/"float16"/None),
    speedup_vs_fp32, speedup_vs_tf32 (step-math ratios, conservative), note}``; those keys are
    ``None`` when the capability is unknown or newer than the table."""
    cc, name = dev.get("compute_capability"), dev.get("name")
    row = capability.capability_of(cc, name)
    out = dict(dev)
    if row is None:
        out.update(arch=None, tensor_cores=None, tensor_core_dtypes=None, bf16=None, mig_capable=None,
                   mixed_precision=None)
        return out
    out.update(arch=row["arch"], tensor_cores=row["tensor_cores"], tensor_core_dtypes=list(row["tensor_core_dtypes"]),
               bf16=capability.supports_bf16(cc, name), mig_capable=row["mig"],
               mixed_precision={"dtype": capability.amp_dtype(cc, name), "speedup_vs_fp32": row["amp_speedup"],
                                "speedup_vs_tf32": row["amp_speedup_over_tf32"], "note": row["fp16_note"]})
    return out


def check(data_path: str | None = None, *, frameworks: dict | None = None,
          probe_timeout_s: float = probe.PROBE_TIMEOUT_S) -> dict:
    """Examines this machine and returns the ``whyidle.env/1`` object.

    Args:
        data_path: a dataset folder or file whose file system to examine (``--data``), or ``None``.
        frameworks: framework facts already probed (as :func:`whyidle.env.probe.probe_frameworks`
            returns them), e.g. in tests; ``None`` probes PyTorch, TensorFlow and JAX in
            subprocesses.
        probe_timeout_s: seconds each framework probe may run.

    Returns:
        ``{schema, tool_version, frameworks, gpus, driver, cpu, memory, data, findings,
        unchecked}`` (docs/report.md, "Environment check"). Takes about as long as the slowest
        framework import (seconds), plus up to :data:`whyidle.env.fs.MAX_SCAN_S` for the data scan.

    Raises:
        DataPathError: ``data_path`` does not exist or is not readable (checked before anything
            else runs).
    """
    if data_path is not None:
        fs.resolve(data_path)  # fail fast, before the probes start
    probed: dict = {}
    worker = None
    if frameworks is None:
        worker = threading.Thread(target=lambda: probed.update(probe.probe_frameworks(timeout_s=probe_timeout_s)),
                                  name="whyidle-env-probes", daemon=True)
        worker.start()
    nvml = probe.probe_nvml()
    pci = probe.probe_pci()
    cvd = probe.cuda_visible_devices()
    gpus = [gpu_entry(d) for d in nvml["devices"]]
    env = {
        "schema": SCHEMA,
        "tool_version": __version__,
        "frameworks": frameworks,
        "gpus": gpus,
        "driver": {"nvml": nvml["available"], "reason": nvml["reason"], "version": nvml["version"],
                   "cuda_version": nvml["cuda_version"], "cuda_visible_devices": cvd,
                   "visible_gpus": rules_env.visible_gpu_count(cvd, gpus) if gpus else None,
                   "pci_readable": pci["readable"], "pci_gpus": pci["nvidia_gpus"]},
        "cpu": probe.probe_cpu(),
        "memory": probe.probe_memory(),
        "data": fs.describe(data_path) if data_path is not None else None,
    }
    if worker is not None:
        worker.join()
        env["frameworks"] = probed
    env["findings"] = rules_env.diagnose(env)
    env["unchecked"] = rules_env.unchecked(env)
    return env


def exit_code(env: dict) -> int:
    """``whyidle env``'s exit code: 1 when a finding is a warning or critical, else 0."""
    return 1 if any(f.get("severity") in ("warning", "critical") for f in env.get("findings") or []) else 0
