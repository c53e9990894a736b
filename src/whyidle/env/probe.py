"""Reads the machine for ``whyidle env``: frameworks, NVML, PCI, CPU and memory.

Everything here only *reads*; what it means is decided by :mod:`whyidle.diagnose.rules_env`.

* Frameworks (PyTorch, TensorFlow, JAX) are looked up with ``importlib.util.find_spec`` (nothing is
  imported here) and, when installed, probed each in its own subprocess (``sys.executable -c``)
  with a timeout, all at once: a framework that hangs, crashes, floods the log or (JAX) grabs GPU
  memory cannot harm ``whyidle env`` (DESIGN.md: never import a framework just to check for it).
* NVML goes through :func:`whyidle.sampling.nvml.open_gpu_poller`, the sampler's own plumbing: every
  call is guarded there, so a missing function or permission reads as ``None`` ("not available").
* PCI: ``/sys/bus/pci/devices/*/{vendor,class}`` tells "an NVIDIA GPU is present but the driver
  cannot reach it" apart from "no NVIDIA GPU on this machine".
* CPU and memory: psutil, the affinity mask, and the cgroup (v2, else v1) CPU quota / memory limit
  (:mod:`whyidle.sampling.limits`, which ``whyidle run`` records per process too).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from whyidle.sampling import limits

#: Frameworks probed, module name → display name.
FRAMEWORKS: dict[str, str] = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}

#: Seconds a framework probe may take. Importing TensorFlow takes 4 s on a 2-core VM and first CUDA
#: initialisation can take tens of seconds on a large GPU node (driver persistence mode off); past a
#: minute the framework is stuck, which is itself worth reporting.
PROBE_TIMEOUT_S = 60.0

#: Environment of a probe: JAX must not take 75 % of GPU memory (its default preallocation) and
#: TensorFlow's INFO/WARNING start-up lines are not wanted (stderr is captured, only its tail kept).
PROBE_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_CPP_MIN_LOG_LEVEL": "2"}

#: Last characters of a failed probe's stderr kept as evidence.
STDERR_TAIL_CHARS = 600

#: PCI vendor id of NVIDIA, and the class prefix of display controllers (0x0300 VGA, 0x0302 3D
#: controller, the class data-center GPUs use). NVSwitch (0x0680) and audio functions are excluded.
PCI_VENDOR_NVIDIA = "0x10de"
PCI_CLASS_DISPLAY = "0x03"

_MARK = "@@whyidle-env-probe@@ "

# Common start of every probe: leave the current directory off sys.path (a local torch.py must not
# shadow the installed one; the whyidle process itself does not see it either), and print the
# result as the last line after a marker, whatever the framework printed on stdout before.
_PRELUDE = f"""
import json, os, sys
sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
out = {{}}
def done():
    sys.stdout.write("\\n{_MARK}" + json.dumps(out, default=str) + "\\n")
    sys.stdout.flush()
def err(e):
    return (type(e).__name__ + ": " + str(e)).strip()[:500]
def dists(*names):
    import importlib.metadata as md
    found = {{}}
    for n in names:
        try:
            found[n] = md.version(n)
        except Exception:
            pass
    return found
"""

_TORCH = _PRELUDE + """
try:
    import torch
except BaseException as e:
    out["import_error"] = err(e); done(); sys.exit(0)
out["version"] = torch.__version__
v = getattr(torch, "version", None)
out["cuda_build"] = getattr(v, "cuda", None)
out["hip_build"] = getattr(v, "hip", None)
try:
    out["cudnn_build"] = torch.backends.cudnn.version()
except Exception:
    out["cudnn_build"] = None
try:
    out["arch_list"] = list(torch.cuda.get_arch_list())
except Exception:
    out["arch_list"] = []
try:
    ok = bool(torch.cuda.is_available())
except Exception as e:
    ok = False
    out["cuda_error"] = err(e)
out["sees_gpu"] = ok
out["gpu_count"] = 0
if ok:
    try:
        n = torch.cuda.device_count()
        out["gpu_count"] = n
        out["devices"] = [{"name": torch.cuda.get_device_name(i),
                           "capability": "%d.%d" % torch.cuda.get_device_capability(i)} for i in range(n)]
    except Exception as e:
        out["cuda_error"] = err(e)
elif out["cuda_build"] and "cuda_error" not in out:
    try:
        torch.cuda.init()
    except Exception as e:
        out["cuda_error"] = err(e)
done()
"""

_TENSORFLOW = _PRELUDE + """
out["distributions"] = dists("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly")
try:
    import tensorflow as tf
except BaseException as e:
    out["import_error"] = err(e); done(); sys.exit(0)
out["version"] = tf.__version__
try:
    b = dict(tf.sysconfig.get_build_info())
    out["is_cuda_build"] = bool(b.get("is_cuda_build"))
    out["is_rocm_build"] = bool(b.get("is_rocm_build"))
    out["cuda_build"] = b.get("cuda_version")
    out["cudnn_build"] = b.get("cudnn_version")
    out["compute_capabilities"] = b.get("cuda_compute_capabilities")
except Exception as e:
    out["build_error"] = err(e)
try:
    gpus = tf.config.list_physical_devices("GPU")
    out["gpu_count"] = len(gpus)
    out["sees_gpu"] = bool(gpus)
except Exception as e:
    out["cuda_error"] = err(e)
    out["sees_gpu"] = False
    out["gpu_count"] = 0
done()
"""

_JAX = _PRELUDE + r"""
out["cuda_plugins"] = dists("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt")
try:
    import jax
except BaseException as e:
    out["import_error"] = err(e); done(); sys.exit(0)
out["version"] = jax.__version__
try:
    import jaxlib
    out["jaxlib"] = getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
except Exception:
    out["jaxlib"] = dists("jaxlib").get("jaxlib")
import re
majors = [m.group(1) for m in (re.search(r"cuda(\d+)", n) for n in out["cuda_plugins"]) if m]
if not majors and "+cuda" in str(out.get("jaxlib")):  # old jaxlib wheels: 0.4.x+cuda12.cudnn89
    majors = re.findall(r"\+cuda(\d+)", str(out["jaxlib"]))
out["cuda_build"] = max(majors, key=int) if majors else None
gpus = []
try:
    devs = jax.devices()
    out["backend"] = jax.default_backend()
    gpus = [d for d in devs if d.platform in ("gpu", "cuda")]
except Exception as e:
    out["cuda_error"] = err(e)
if not gpus:
    try:
        gpus = jax.devices("cuda")
    except Exception as e:
        out.setdefault("cuda_error", err(e))
out["gpu_count"] = len(gpus)
out["sees_gpu"] = bool(gpus)
out["jax_platforms"] = os.environ.get("JAX_PLATFORMS")
done()
"""

_SCRIPTS = {"torch": _TORCH, "tensorflow": _TENSORFLOW, "jax": _JAX}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (``importlib.util.find_spec``; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _probe_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(PROBE_ENV)
    env.pop("WHYIDLE_RUN_DIR", None)  # under `whyidle run`, the probe must not be instrumented
    return env


def _kill(proc: subprocess.Popen) -> None:
    """Kills the probe and whatever it started (its own process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        proc.kill()


def _parse(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARK):
            try:
                return json.loads(line[len(_MARK):])
            except ValueError:
                return None
    return None


def probe_frameworks(modules: tuple[str, ...] | list[str] | None = None,
                     timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, dict]:
    """Probes each framework that is installed, each in its own subprocess, all concurrently.

    Args:
        modules: module names among :data:`FRAMEWORKS` (default: all of them).
        timeout_s: seconds each probe may run (wall clock, counted from the common start); a probe
            still running then is killed with its process group.

    Returns:
        module → facts. Always ``installed`` (bool) and ``name``. Installed ones: ``probe``
        (``"ok"``, ``"timeout"``, ``"crashed"``, ``"import_error"``), ``probe_s`` (seconds) and what
        the probe read: ``version``, ``sees_gpu``, ``gpu_count``, ``cuda_build``, ``cudnn_build``
        and per-framework keys (PyTorch ``hip_build``, ``arch_list``; TensorFlow ``is_cuda_build``,
        ``distributions``; JAX ``jaxlib``, ``cuda_plugins``, ``backend``), ``cuda_error`` when
        CUDA initialisation raised, ``error`` (one line) when the probe failed. Never raises.
    """
    modules = list(modules or FRAMEWORKS)
    results: dict[str, dict] = {}
    running: list[tuple[str, subprocess.Popen, float]] = []
    env = _probe_env()
    for mod in modules:
        results[mod] = {"name": FRAMEWORKS.get(mod, mod), "installed": installed(mod)}
        if not results[mod]["installed"]:
            continue
        try:
            proc = subprocess.Popen([sys.executable, "-c", _SCRIPTS[mod]], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                                    errors="replace", start_new_session=True)
        except OSError as e:
            results[mod].update(probe="crashed", error=f"could not start {sys.executable}: {e}")
            continue
        running.append((mod, proc, time.monotonic()))
    deadline = time.monotonic() + timeout_s
    for mod, proc, t0 in running:
        try:
            stdout, stderr = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            results[mod].update(probe="timeout", probe_s=round(time.monotonic() - t0, 2),
                                error=f"probe still running after {timeout_s:g} s (killed)")
            continue
        results[mod]["probe_s"] = round(time.monotonic() - t0, 2)
        facts = _parse(stdout)
        tail = " ".join(stderr.strip().splitlines()[-4:])[-STDERR_TAIL_CHARS:]
        if facts is None:
            how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
            results[mod].update(probe="crashed", error=f"probe died ({how})" + (f": {tail}" if tail else ""))
        elif "import_error" in facts:
            error = f"import failed: {facts.pop('import_error')}"
            results[mod].update(facts, probe="import_error", error=error)
        else:
            results[mod].update(facts, probe="ok")
    return results


# -- NVML ------------------------------------------------------------------------------------------

def _friendly_nvml_reason(reason: str | None) -> str | None:
    """``open_gpu_poller``'s reason, said for a user."""
    if reason and "Shared Library Not Found" in reason:
        return "no NVIDIA driver/NVML on this machine (libnvidia-ml.so.1 not found)"
    if reason and "Driver Not Loaded" in reason:
        return "the NVIDIA driver is not loaded (NVML: Driver Not Loaded)"
    return reason


def probe_nvml() -> dict:
    """What NVML reports, through the sampler's :func:`~whyidle.sampling.nvml.open_gpu_poller`.

    Returns:
        ``{"available": bool, "reason": str|None, "version": driver version str|None,
        "cuda_version": "12.4"|None (the CUDA version the driver supports:
        ``nvmlSystemGetCudaDriverVersion_v2``, else ``nvmlSystemGetCudaDriverVersion``),
        "devices": [{index, name, uuid, memory_total_bytes, compute_capability: "9.0"|None}]}``.
        ``available`` is False with a ``reason`` when NVML cannot be loaded or initialised, or
        reports no accessible device. Values NVML does not offer are ``None``. Never raises.
    """
    try:
        import pynvml

        from whyidle.sampling.nvml import cuda_version_string, open_gpu_poller
    except Exception as e:  # nvidia-ml-py missing from this environment
        return {"available": False, "reason": f"NVML bindings not importable ({e})", "version": None,
                "cuda_version": None, "devices": []}
    poller, reason = open_gpu_poller()
    if poller is None:
        return {"available": False, "reason": _friendly_nvml_reason(reason), "version": None,
                "cuda_version": None, "devices": []}
    try:
        static = poller.start(time.monotonic_ns())[0]
        cuda_v2 = None
        fn = getattr(pynvml, "nvmlSystemGetCudaDriverVersion_v2", None)
        if fn is not None:
            try:
                cuda_v2 = cuda_version_string(fn())
            except Exception:  # FunctionNotFound on old drivers, NotSupported, ...
                cuda_v2 = None
    except Exception as e:
        return {"available": False, "reason": f"NVML failed: {e}", "version": None, "cuda_version": None,
                "devices": []}
    finally:
        poller.close()
    devices = []
    for d in static.get("devices") or []:
        cc = d.get("compute_capability")
        devices.append({"index": d.get("index"), "name": d.get("name"), "uuid": d.get("uuid"),
                        "memory_total_bytes": d.get("memory_total_bytes"),
                        "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None})
    first = (static.get("devices") or [{}])[0]
    return {"available": True, "reason": None, "version": first.get("driver_version"),
            "cuda_version": cuda_v2 or first.get("cuda_driver_version"), "devices": devices}


# -- PCI -------------------------------------------------------------------------------------------

def probe_pci(root: str = "/sys/bus/pci/devices") -> dict:
    """NVIDIA display/3D controllers on the PCI bus, whether or not a driver is loaded.

    Args:
        root: the sysfs PCI device folder (replaceable in tests).

    Returns:
        ``{"readable": bool, "nvidia_gpus": [{slot, device: "0x2335", class: "0x030200",
        driver: "nvidia"|"nouveau"|"vfio-pci"|None}]}``; ``readable`` is False where ``root``
        cannot be listed (not Linux, sysfs not mounted). Never raises.
    """
    try:
        slots = sorted(os.listdir(root))
    except OSError:
        return {"readable": False, "nvidia_gpus": []}
    gpus = []
    for slot in slots:
        base = os.path.join(root, slot)
        vendor = (limits.read_text(os.path.join(base, "vendor")) or "").lower()
        cls = (limits.read_text(os.path.join(base, "class")) or "").lower()
        if vendor != PCI_VENDOR_NVIDIA or not cls.startswith(PCI_CLASS_DISPLAY):
            continue
        try:
            driver = os.path.basename(os.readlink(os.path.join(base, "driver")))
        except OSError:
            driver = None
        gpus.append({"slot": slot, "device": limits.read_text(os.path.join(base, "device")), "class": cls, "driver": driver})
    return {"readable": True, "nvidia_gpus": gpus}


# -- CPU and memory ---------------------------------------------------------------------------------

def probe_cpu() -> dict:
    """CPU cores: ``logical`` and ``physical`` (psutil; ``None`` where unknown), ``affinity`` (cores
    this process may run on, ``os.sched_getaffinity``), ``cgroup_quota`` (CPUs per second allowed by
    the cgroup, ``None`` = no limit) and ``usable`` (the smallest of these, in cores:
    :func:`whyidle.sampling.limits.usable_cores`)."""
    logical = psutil.cpu_count(logical=True) or os.cpu_count()
    physical = psutil.cpu_count(logical=False)
    own = limits.process_limits()
    usable, _why = limits.usable_cores(logical, own["cpu_affinity"], own["cpu_quota"])
    return {"logical": logical, "physical": physical, "affinity": own["cpu_affinity"],
            "cgroup_quota": own["cpu_quota"], "usable": usable}


def probe_memory() -> dict:
    """Host memory in bytes: ``total`` and ``available`` (psutil), ``cgroup_limit`` (``None`` = no
    limit below the machine's)."""
    vm = psutil.virtual_memory()
    limit = limits.process_limits()["mem_limit_bytes"]
    return {"total_bytes": vm.total, "available_bytes": vm.available,
            "cgroup_limit_bytes": limit if limit is not None and limit < vm.total else None}


def cuda_visible_devices() -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as set in this environment (``None`` when unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")
