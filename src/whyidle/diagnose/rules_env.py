"""Rules for ``whyidle env``: facts about the machine → findings (pure; no framework imports).

Facts are the object :func:`whyidle.env.check` builds (``frameworks``, ``gpus``, ``driver``,
``data``; see ``docs/report.md``, "Environment check"). Findings follow
:func:`whyidle.diagnose.rules.finding`:

* ``gpu_not_visible`` (critical; warning when another installed framework does see the GPU) —
  ``evidence.cause``: ``driver_not_loaded`` (an NVIDIA GPU on the PCI bus, NVML cannot reach it),
  ``cuda_visible_devices`` (the variable hides every GPU), ``cpu_build`` / ``rocm_build`` (the
  framework has no CUDA support), ``build_newer_than_driver`` (built for a newer CUDA than the
  driver supports), ``cuda_init_failed`` (a matching CUDA build that still cannot initialise), and
  for PyTorch ``arch_not_in_build`` (no kernels for the GPU's compute capability).
* ``input_pipeline_config`` (warning) — a small-file dataset on a network (``network_filesystem``)
  or FUSE (``fuse_filesystem``) file system.

The wording of the PyTorch and TensorFlow CPU-build findings is the run rules' own
(:func:`whyidle.diagnose.rules.gpu_not_visible`, :func:`whyidle.diagnose.rules_keras.gpu_not_visible`);
this module replaces only their install command with one matched to the driver
(:func:`pip_command`).
"""

from __future__ import annotations

import re

from whyidle.analysis.facts import RunFacts
from whyidle.diagnose import rules, rules_keras
from whyidle.diagnose.rules import finding

DOCS_TORCH_INSTALL = "https://pytorch.org/get-started/locally/"
DOCS_JAX_INSTALL = "https://docs.jax.dev/en/latest/installation.html"
DOCS_CUDA_VISIBLE = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables"
DOCS_DRIVER = "https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/"
DOCS_CONTAINER_TOOLKIT = "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
DOCS_WEBDATASET = "https://github.com/webdataset/webdataset"
DOCS_TFRECORD = "https://www.tensorflow.org/tutorials/load_data/tfrecord"

#: PyTorch CUDA wheel variants on download.pytorch.org/whl: (CUDA major, minor, index tag, first
#: PyTorch release without that variant or ``None`` while current). From PyTorch's release
#: compatibility matrix (RELEASE.md) and pytorch.org/get-started/previous-versions: cu118 in
#: 2.0–2.7, cu121 in 2.1–2.5, cu124 in 2.4–2.6, cu126 from 2.6, cu128 from 2.7, cu130 from 2.9.
#: A wheel runs on a driver whose CUDA version is at least the wheel's.
TORCH_CUDA_WHEELS: tuple[tuple[int, int, str, str | None], ...] = (
    (11, 8, "cu118", "2.8"), (12, 1, "cu121", "2.6"), (12, 4, "cu124", "2.7"),
    (12, 6, "cu126", None), (12, 8, "cu128", None), (13, 0, "cu130", None),
)

#: CUDA versions TensorFlow's Linux GPU wheels are built with (``tensorflow[and-cuda]`` installs the
#: matching CUDA/cuDNN libraries, from 2.14): (CUDA major, minor, first TensorFlow release built with a
#: newer CUDA or ``None`` while current). From tensorflow.org/install/source "Tested build
#: configurations": 2.14 CUDA 11.8; 2.15 CUDA 12.2; 2.16–2.17 CUDA 12.3; 2.18 and later CUDA 12.5. A
#: newer build can fail on an older driver even under CUDA's minor-version compatibility: its PTX
#: (e.g. ``compute_90`` for Hopper) cannot be compiled by a driver older than the toolkit.
TF_CUDA_BUILDS: tuple[tuple[int, int, str | None], ...] = (
    (11, 8, "2.15"), (12, 2, "2.16"), (12, 3, "2.18"), (12, 5, None),
)

#: Oldest driver CUDA major JAX's CUDA wheels (``jax[cuda12]``) run on.
JAX_MIN_DRIVER_CUDA_MAJOR = 12

_LABEL = {"torch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX"}
_UPDATE_DRIVER = ("# update the NVIDIA driver (Ubuntu: sudo ubuntu-drivers install), reboot, then check the\n"
                  "# CUDA version it supports (top right of):\nnvidia-smi")


def version_tuple(v: str | int | None) -> tuple[int, ...] | None:
    """``"12.5.1"`` → ``(12, 5, 1)``, ``"12"`` → ``(12,)``; ``None`` or no leading number → ``None``."""
    if v is None:
        return None
    nums = re.findall(r"\d+", str(v).split("+")[0])
    return tuple(int(n) for n in nums) if nums else None


def cuda_newer(build: str | None, driver: str | None) -> bool:
    """Whether a framework's CUDA build (``"12.8"``, or a major only: ``"12"``) is newer than the CUDA
    version the driver supports, comparing major.minor (major only when one side has no minor)."""
    b, d = version_tuple(build), version_tuple(driver)
    if not b or not d:
        return False
    n = min(len(b), len(d), 2)
    return b[:n] > d[:n]


def torch_wheel(driver_cuda: str | None) -> tuple[str, str | None] | None:
    """The newest PyTorch CUDA wheel tag the driver supports, with the first PyTorch release that no
    longer ships it (``None`` while current): ``"12.4"`` → ``("cu124", "2.7")``. ``None`` when the
    driver's CUDA is older than every tag in :data:`TORCH_CUDA_WHEELS` or unknown."""
    d = version_tuple(driver_cuda)
    if not d:
        return None
    fits = [w for w in TORCH_CUDA_WHEELS if (w[0], w[1]) <= (d + (0,))[:2]]
    return (fits[-1][2], fits[-1][3]) if fits else None


def pip_command(framework: str, driver_cuda: str | None, distributions: dict | None = None) -> str | None:
    """The command that installs ``framework``'s CUDA build for a driver supporting ``driver_cuda``.

    Args:
        framework: ``"torch"``, ``"tensorflow"`` or ``"jax"``.
        driver_cuda: the CUDA version the driver supports (``"12.4"``; NVML
            ``nvmlSystemGetCudaDriverVersion``), ``None`` when unknown.
        distributions: for TensorFlow, the installed distributions (``{"tensorflow-cpu": "2.21.0"}``):
            other TensorFlow packages share the ``tensorflow`` folder and are removed first.

    Returns:
        A shell command, or ``None`` when no current CUDA build of the framework runs on this
        driver (the fix is then a driver update).
    """
    d = version_tuple(driver_cuda)
    if framework == "torch":
        if d is None:
            return ("pip uninstall -y torch && pip install torch --index-url https://download.pytorch.org/whl/cu126"
                    "   # cuXYZ: at most the driver's CUDA version (nvidia-smi)")
        wheel = torch_wheel(driver_cuda)
        if wheel is None:
            return None
        tag, gone_in = wheel
        spec = f'"torch<{gone_in}"' if gone_in else "torch"
        return f"pip uninstall -y torch && pip install {spec} --index-url https://download.pytorch.org/whl/{tag}"
    if framework == "tensorflow":
        spec = "tensorflow[and-cuda]"
        if d is not None:
            fits = [b for b in TF_CUDA_BUILDS if (b[0], b[1]) <= (d + (0,))[:2]]
            if not fits:
                return None
            if fits[-1][2]:
                spec += f"<{fits[-1][2]}"
        others = sorted(n for n in (distributions or {}) if n != "tensorflow")
        if others:
            return f"pip uninstall -y {' '.join(sorted(distributions or {}))} && pip install \"{spec}\""
        return f"pip install \"{spec}\"   # ships the CUDA and cuDNN libraries TensorFlow expects"
    if framework == "jax":
        if d is not None and d[0] < JAX_MIN_DRIVER_CUDA_MAJOR:
            return None
        return f'pip install -U "jax[cuda{13 if d is not None and d[0] >= 13 else 12}]"'
    return None


def visible_gpu_count(cvd: str | None, gpus: list[dict]) -> int:
    """How many of NVML's GPUs CUDA programs see under ``CUDA_VISIBLE_DEVICES``.

    CUDA's rules (CUDA C++ Programming Guide, "CUDA Environment Variables"): a comma-separated list
    of indexes or (prefixes of) ``GPU-`` UUIDs; the list ends at the first entry that is invalid
    (``-1``, an index out of range, an unknown UUID), so only entries before it count; an empty
    value hides every GPU. NVML itself ignores the variable. ``MIG-`` entries are counted as visible
    (their UUIDs are not read here).

    Args:
        cvd: the variable's value (``None`` = unset: every GPU).
        gpus: NVML's devices (``index``, ``uuid``).
    """
    if cvd is None:
        return len(gpus)
    seen: set = set()
    for tok in (t.strip() for t in cvd.split(",")):
        if re.fullmatch(r"-?\d+", tok):
            i = int(tok)
            if not 0 <= i < len(gpus):
                break
            seen.add(i)
        elif tok.startswith("GPU-"):
            match = [g for g in gpus if (g.get("uuid") or "").startswith(tok)]
            if len(match) != 1:
                break
            seen.add(match[0].get("index"))
        elif tok.startswith("MIG-"):
            seen.add(tok)
        else:
            break
    return len(seen)


def _plural(n: int) -> str:
    return f"{n} NVIDIA GPU{'s are' if n > 1 else ' is'}"


def driver_not_loaded(facts: dict) -> dict | None:
    """An NVIDIA display/3D controller is on the PCI bus but NVML reaches no GPU."""
    drv = facts.get("driver") or {}
    pci = drv.get("pci_gpus") or []
    if drv.get("nvml") or not pci:
        return None
    bound = sorted({p.get("driver") for p in pci if p.get("driver")})
    other = [b for b in bound if b != "nvidia"]
    if other:
        why = f"the device is bound to the {', '.join(other)} driver, not NVIDIA's"
    elif "nvidia" in bound:
        why = "the nvidia kernel driver holds the device but its user-space library cannot reach it"
    else:
        why = "no driver is bound to the device"
    summary = (f"{_plural(len(pci))} on the PCI bus ({', '.join(p['slot'] for p in pci[:4])}) but NVML cannot reach "
               f"any ({drv.get('reason') or 'NVML failed'}; {why}), so no framework can use the GPU.")
    code = ("nvidia-smi                # must list the GPU\n"
            "sudo modprobe nvidia      # driver installed but not loaded\n"
            "# not installed (Ubuntu): sudo ubuntu-drivers install && sudo reboot\n"
            "# in a container: start it with the NVIDIA Container Toolkit, e.g. docker run --gpus all ...")
    return finding("gpu_not_visible", "critical", "GPU not visible: the NVIDIA driver is not loaded", summary,
                   {"cause": "driver_not_loaded", "pci_gpus": pci, "nvml_reason": drv.get("reason"),
                    "bound_drivers": bound}, None,
                   "Install or load NVIDIA's driver and check that nvidia-smi lists the GPU; inside a container, "
                   "pass the GPU in with the NVIDIA Container Toolkit.", code, [DOCS_DRIVER, DOCS_CONTAINER_TOOLKIT])


def cuda_visible_devices(facts: dict) -> dict | None:
    """NVML sees GPUs but ``CUDA_VISIBLE_DEVICES`` hides every one of them from CUDA programs."""
    drv = facts.get("driver") or {}
    gpus = facts.get("gpus") or []
    cvd = drv.get("cuda_visible_devices")
    if not gpus or cvd is None or visible_gpu_count(cvd, gpus) > 0:
        return None
    summary = (f"{_plural(len(gpus))} present but CUDA_VISIBLE_DEVICES={cvd!r} hides "
               f"{'it' if len(gpus) == 1 else 'all of them'} (valid: "
               f"{', '.join(str(g.get('index')) for g in gpus)}; the list ends at the first invalid entry), so "
               "PyTorch, TensorFlow and JAX see no GPU.")
    valid = ",".join(str(g.get("index")) for g in gpus)
    return finding("gpu_not_visible", "critical", "GPU not visible: CUDA_VISIBLE_DEVICES hides every GPU", summary,
                   {"cause": "cuda_visible_devices", "cuda_visible_devices": cvd, "gpus": len(gpus)}, None,
                   "Unset CUDA_VISIBLE_DEVICES, or set it to GPU indexes that exist (find where your shell, job "
                   "script or scheduler sets it).",
                   f"unset CUDA_VISIBLE_DEVICES\n# or: export CUDA_VISIBLE_DEVICES={valid}", [DOCS_CUDA_VISIBLE])


def _cause(mod: str, fw: dict, driver_cuda: str | None) -> str:
    if mod == "torch":
        if not fw.get("cuda_build"):
            return "rocm_build" if fw.get("hip_build") else "cpu_build"
    elif mod == "tensorflow":
        if not fw.get("is_cuda_build"):
            return "rocm_build" if fw.get("is_rocm_build") else "cpu_build"
    elif mod == "jax" and not fw.get("cuda_build"):
        return "cpu_build"
    if cuda_newer(fw.get("cuda_build"), driver_cuda):
        return "build_newer_than_driver"
    return "cuda_init_failed"


def framework_not_visible(mod: str, facts: dict) -> dict | None:
    """NVML sees a GPU, ``CUDA_VISIBLE_DEVICES`` leaves one visible, and an installed framework
    (``mod``: ``torch``, ``tensorflow``, ``jax``) still sees none; the cause and the install
    command for the driver's CUDA version."""
    fw = (facts.get("frameworks") or {}).get(mod) or {}
    gpus = facts.get("gpus") or []
    drv = facts.get("driver") or {}
    if not fw.get("installed") or fw.get("probe") != "ok" or fw.get("sees_gpu") is not False or not gpus:
        return None
    if visible_gpu_count(drv.get("cuda_visible_devices"), gpus) == 0:
        return None  # cuda_visible_devices() says it
    n, dcuda, label, version = len(gpus), drv.get("cuda_version"), _LABEL[mod], fw.get("version")
    others = [m for m, f in (facts.get("frameworks") or {}).items() if m != mod and f.get("sees_gpu")]
    severity = "warning" if others else "critical"
    cause = _cause(mod, fw, dcuda)
    code = pip_command(mod, dcuda, fw.get("distributions"))
    static = {"devices": [{"cuda_driver_version": dcuda}] * n}
    docs = {"torch": [DOCS_TORCH_INSTALL], "tensorflow": [rules_keras.DOCS_TF_GPU], "jax": [DOCS_JAX_INSTALL]}[mod]
    built = (f"CUDA {fw.get('cuda_build')}" + (f" / cuDNN {fw['cudnn_build']}" if fw.get("cudnn_build") else "")
             if fw.get("cuda_build") else None)
    if mod == "torch" and cause == "cpu_build":
        base = rules.gpu_not_visible(RunFacts(proc={"framework": "torch", "framework_version": version, "cuda_build": None},
                                              gpu_static=static))
        summary, text = base["summary"], base["fix"]["text"]
    elif mod == "tensorflow" and cause in ("cpu_build", "cuda_init_failed"):
        base = rules_keras.gpu_not_visible(RunFacts(gpu_static=static, tf_devices={
            "physical_gpus": 0, "is_cuda_build": fw.get("is_cuda_build"), "cuda_build": fw.get("cuda_build"),
            "cudnn_build": fw.get("cudnn_build"), "tf_version": version}))
        summary, text = base["summary"], base["fix"]["text"]
    elif cause in ("cpu_build", "rocm_build"):
        kind = "ROCm (AMD) build" if cause == "rocm_build" else "CPU-only build"
        if mod == "jax":
            kind += " (no jax-cuda plugin installed)"
        summary = (f"{_plural(n)} present (driver supports CUDA {dcuda}) but this {label} {version} is a {kind}, "
                   "so nothing can run on the GPU.")
        text = f"Install a CUDA build of {label} that the driver supports (CUDA version ≤ the driver's)."
    elif cause == "build_newer_than_driver":
        summary = (f"{_plural(n)} present but {label} {version} was built for {built}, newer than the CUDA "
                   f"{dcuda} the driver ({drv.get('version')}) supports, so {label} cannot use the GPU.")
        text = (f"Install the {label} build for the driver's CUDA version (≤ {dcuda}), or update the NVIDIA driver "
                "to one that supports the build's CUDA version.")
    else:
        error = fw.get("cuda_error")
        summary = (f"{_plural(n)} present (driver supports CUDA {dcuda}) and {label} {version} is built for "
                   f"{built}, but it sees no GPU" + (f": {error}" if error else "") + ".")
        text = (f"Reinstall {label}'s CUDA build for the driver's CUDA version (its CUDA libraries are missing or "
                "do not match), then check again with whyidle env.")
    if code is None:
        text = (f"Update the NVIDIA driver: it supports CUDA {dcuda}, older than every CUDA build of {label} "
                "published as pip wheels.")
        code = _UPDATE_DRIVER
    if mod == "torch" and code != _UPDATE_DRIVER:
        text += " Install torchvision/torchaudio from the same index."
    evidence = {"cause": cause, "framework": mod, "version": version, "cuda_build": fw.get("cuda_build"),
                "cudnn_build": fw.get("cudnn_build"), "cuda_driver_version": dcuda,
                "driver_version": drv.get("version"), "gpus": n, "cuda_error": fw.get("cuda_error"),
                "frameworks_seeing_gpu": others}
    if fw.get("distributions"):
        evidence["distributions"] = fw["distributions"]
    return finding("gpu_not_visible", severity, f"GPU not visible to {label}", summary, evidence, None, text, code,
                   docs)


def arch_supported(cc: str, arch_list: list[str]) -> bool:
    """Whether a build compiled for ``arch_list`` (``torch.cuda.get_arch_list()``: ``sm_80``,
    ``sm_90a``, ``compute_90``) can run on compute capability ``cc`` (``"8.6"``): a cubin ``sm_XY``
    runs on the same major with minor ≥ Y (``sm_90a``-style arch-specific ones only on exactly X.Y),
    PTX ``compute_XY`` is compiled by the driver for any capability ≥ X.Y (CUDA C++ Programming Guide,
    "Binary Compatibility" and "PTX Compatibility")."""
    dev = version_tuple(cc)
    if not dev or len(dev) < 2:
        return True
    for arch in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+?)(\d)([a-z]?)", arch)
        if not m:
            continue
        major, minor, suffix = int(m.group(2)), int(m.group(3)), m.group(4)
        if suffix:
            if (major, minor) == dev[:2]:
                return True
        elif m.group(1) == "compute":
            if (major, minor) <= dev[:2]:
                return True
        elif major == dev[0] and minor <= dev[1]:
            return True
    return False


def torch_arch_missing(facts: dict) -> dict | None:
    """PyTorch sees the GPU but was compiled for none of its compute capability (kernels fail with
    "no kernel image is available for execution on the device")."""
    fw = (facts.get("frameworks") or {}).get("torch") or {}
    archs = fw.get("arch_list") or []
    if not fw.get("sees_gpu") or not archs:
        return None
    devices = fw.get("devices") or [{"name": g.get("name"), "capability": g.get("compute_capability")}
                                    for g in facts.get("gpus") or []]
    bad = [d for d in devices if d.get("capability") and not arch_supported(d["capability"], archs)]
    if not bad:
        return None
    drv = facts.get("driver") or {}
    code = pip_command("torch", drv.get("cuda_version"))
    cc = bad[0]["capability"]
    summary = (f"PyTorch {fw.get('version')} (CUDA {fw.get('cuda_build')}) has no kernels for compute capability {cc} "
               f"({bad[0].get('name')}; it was built for {', '.join(archs)}), so CUDA operations fail with \"no kernel "
               "image is available for execution on the device\".")
    text = ("Install a PyTorch build compiled for this GPU: a newer PyTorch with a newer CUDA (GPUs newer than the "
            "build need its CUDA version or later).")
    if code is None:
        text, code = "Update the NVIDIA driver, then install a PyTorch CUDA build that covers this GPU.", _UPDATE_DRIVER
    return finding("gpu_not_visible", "critical", f"GPU not usable by PyTorch: no kernels for compute capability {cc}",
                   summary, {"cause": "arch_not_in_build", "framework": "torch", "version": fw.get("version"),
                             "arch_list": archs, "compute_capability": cc, "cuda_build": fw.get("cuda_build"),
                             "cuda_driver_version": drv.get("cuda_version")}, None, text, code, [DOCS_TORCH_INSTALL])


def size_text(n: float | None) -> str:
    """Bytes for a person: ``1.5 GiB``, ``12.0 KiB``, ``300 B``; ``n/a`` for None."""
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def data_filesystem(facts: dict) -> dict | None:
    """A small-file dataset on a network, parallel or FUSE file system (``--data``)."""
    data = facts.get("data") or {}
    kind = data.get("kind")
    if kind not in ("network", "parallel", "fuse") or not data.get("small_files"):
        return None
    cause = "fuse_filesystem" if kind == "fuse" else "network_filesystem"
    what = {"network": "a network file system", "parallel": "a parallel file system (metadata server per open)",
            "fuse": "a FUSE file system"}[kind]
    count = f"{data['files']:,}{'+' if data.get('truncated') else ''}"
    summary = (f"The data at {data.get('path')} is on {what} ({data.get('fstype')} from {data.get('source')}, mounted "
               f"at {data.get('mount_point')}) and is made of small files ({count} files, mean "
               f"{size_text(data.get('mean_file_bytes'))}): every file costs a round trip before its first byte, which "
               "can keep the GPU waiting for data.")
    name = (data.get("realpath") or "data").rstrip("/").rsplit("/", 1)[-1] or "data"
    code = (f"# copy once per node to local NVMe / node-local scratch, and read from there\n"
            f"rsync -a {data.get('realpath')}/ /local_scratch/{name}/\n"
            "# or pack the files into ~100 MB–1 GB shards read sequentially (pip install webdataset):\n"
            "import webdataset as wds\n"
            "with wds.ShardWriter(\"shards/train-%06d.tar\", maxsize=500_000_000) as sink:\n"
            "    for i, (path, label) in enumerate(samples):\n"
            "        sink.write({\"__key__\": f\"{i:08d}\", \"jpg\": open(path, \"rb\").read(), \"cls\": label})")
    evidence = {"cause": cause, "fstype": data.get("fstype"), "fs_kind": kind, "source": data.get("source"),
                "mount_point": data.get("mount_point"), "files": data.get("files"),
                "files_truncated": data.get("truncated"), "mean_file_bytes": data.get("mean_file_bytes")}
    return finding("input_pipeline_config", "warning", "Small files on a network or FUSE file system", summary,
                   evidence, None,
                   "Copy the dataset to local NVMe or node-local scratch before training, or pack it into large "
                   "shards (WebDataset .tar, TFRecord) that are read sequentially.", code,
                   [DOCS_WEBDATASET, DOCS_TFRECORD])


_SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}


def diagnose(facts: dict) -> list[dict]:
    """Every env rule over ``facts``; findings most severe first (rule order within a severity)."""
    found = [driver_not_loaded(facts), cuda_visible_devices(facts)]
    found += [framework_not_visible(mod, facts) for mod in _LABEL]
    found += [torch_arch_missing(facts), data_filesystem(facts)]
    return sorted((f for f in found if f), key=lambda f: _SEVERITY_RANK.get(f["severity"], 3))


def unchecked(facts: dict) -> list[dict]:
    """What ``whyidle env`` could not check, and why: ``[{what, why}]``."""
    out = []
    for mod, fw in (facts.get("frameworks") or {}).items():
        label = _LABEL.get(mod, mod)
        if not fw.get("installed"):
            out.append({"what": label, "why": "not installed"})
        elif fw.get("probe") != "ok":
            out.append({"what": label, "why": fw.get("error") or "probe failed"})
    drv = facts.get("driver") or {}
    if not drv.get("nvml"):
        why = drv.get("reason") or "NVML not available"
        if not drv.get("pci_gpus") and drv.get("pci_readable"):
            why += "; no NVIDIA device on the PCI bus"
        # the GPU's absence is a result; what stays unknown is the driver and what it supports
        out.append({"what": "GPU driver, its CUDA version and the GPU's properties", "why": why})
    elif drv.get("cuda_version") is None:
        out.append({"what": "driver CUDA version", "why": "NVML does not report it (framework builds not compared)"})
    if not drv.get("pci_readable"):
        out.append({"what": "PCI bus", "why": "/sys/bus/pci/devices not readable"})
    if facts.get("data") is None:
        out.append({"what": "data", "why": "no --data PATH given (the file system holding the dataset)"})
    return out
