"""``whyidle env``: probes (fake sysfs, fake NVML driver, real framework subprocesses), the pure
rules over facts dicts, the file-system check, the renderer and the CLI."""

from __future__ import annotations

import io
import json
import os
import sys

import pynvml
import pytest
from click.testing import CliRunner

import whyidle.env as env_mod
from whyidle.cli import main
from whyidle.diagnose import rules_env
from whyidle.env import DataPathError, check, exit_code, fs, gpu_entry, probe
from whyidle.report import env_report

try:
    from fake_nvml import FakeDevice, FakeNvml
except ImportError:  # tests/ became a package
    from tests.fake_nvml import FakeDevice, FakeNvml


# -- facts builders --------------------------------------------------------------------------------

def _torch(**kw) -> dict:
    fw = {"name": "PyTorch", "installed": True, "probe": "ok", "version": "2.5.1+cu124", "cuda_build": "12.4",
          "hip_build": None, "cudnn_build": 90100, "arch_list": ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80",
                                                                 "sm_86", "sm_90"],
          "sees_gpu": True, "gpu_count": 1}
    fw.update(kw)
    return fw


def _tf(**kw) -> dict:
    fw = {"name": "TensorFlow", "installed": True, "probe": "ok", "version": "2.16.1", "is_cuda_build": True,
          "cuda_build": "12.3", "cudnn_build": "8", "sees_gpu": True, "gpu_count": 1,
          "distributions": {"tensorflow": "2.16.1"}}
    fw.update(kw)
    return fw


def _jax(**kw) -> dict:
    fw = {"name": "JAX", "installed": True, "probe": "ok", "version": "0.4.30", "jaxlib": "0.4.30",
          "cuda_plugins": {"jax-cuda12-plugin": "0.4.30"}, "cuda_build": "12", "sees_gpu": True, "gpu_count": 1}
    fw.update(kw)
    return fw


def _absent(name: str) -> dict:
    return {"name": name, "installed": False}


def _facts(torch=None, tensorflow=None, jax=None, gpus=1, cuda="12.4", cvd=None, nvml=True, pci=None,
           data=None) -> dict:
    devices = [gpu_entry({"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}aaa-bbbb",
                          "memory_total_bytes": 150_754_820_096, "compute_capability": "9.0"})
               for i in range(gpus if nvml else 0)]
    return {
        "frameworks": {"torch": torch or _absent("PyTorch"), "tensorflow": tensorflow or _absent("TensorFlow"),
                       "jax": jax or _absent("JAX")},
        "gpus": devices,
        "driver": {"nvml": nvml, "reason": None if nvml else "the NVIDIA driver is not loaded (NVML: Driver Not Loaded)",
                   "version": "550.54.15" if nvml else None, "cuda_version": cuda if nvml else None,
                   "cuda_visible_devices": cvd, "pci_readable": True, "pci_gpus": pci or []},
        "cpu": {"logical": 8, "physical": 4, "affinity": 8, "cgroup_quota": None, "usable": 8},
        "memory": {"total_bytes": 64 << 30, "available_bytes": 60 << 30, "cgroup_limit_bytes": None},
        "data": data,
    }


def _only(findings: list[dict]) -> dict:
    assert len(findings) == 1, [f["summary"] for f in findings]
    return findings[0]


# -- shared helper: which install command matches the driver -------------------------------------

@pytest.mark.parametrize("driver, spec, tag", [
    ("12.4", '"torch<2.7"', "cu124"),  # cu124 wheels stopped with PyTorch 2.6: pinned
    ("12.2", '"torch<2.6"', "cu121"),
    ("12.0", '"torch<2.8"', "cu118"),
    ("12.6", "torch", "cu126"),
    ("12.9", "torch", "cu128"),
    ("13.1", "torch", "cu130"),
    ("11.4", None, None),
])
def test_torch_pip_command_never_newer_than_driver(driver, spec, tag):
    expected = (f"pip uninstall -y torch && pip install {spec} --index-url https://download.pytorch.org/whl/{tag}"
                if tag else None)
    assert rules_env.pip_command("torch", driver) == expected


def test_tf_and_jax_pip_commands():
    assert rules_env.pip_command("tensorflow", "12.8", {"tensorflow": "2.16.1"}).startswith(
        'pip install "tensorflow[and-cuda]"   #')
    assert rules_env.pip_command("tensorflow", "12.8", {"tensorflow-cpu": "2.16.1"}) == (
        'pip uninstall -y tensorflow-cpu && pip install "tensorflow[and-cuda]"')
    # both distributions share the tensorflow/ folder: remove both, then install the CUDA one
    assert rules_env.pip_command("tensorflow", "12.5", {"tensorflow": "2.21.0", "tensorflow-cpu": "2.21.0"}) == (
        'pip uninstall -y tensorflow tensorflow-cpu && pip install "tensorflow[and-cuda]"')
    # never a build newer than the driver: TensorFlow 2.18+ is built with CUDA 12.5
    assert rules_env.pip_command("tensorflow", "12.4").startswith('pip install "tensorflow[and-cuda]<2.18"')
    assert rules_env.pip_command("tensorflow", "12.2").startswith('pip install "tensorflow[and-cuda]<2.16"')
    assert rules_env.pip_command("tensorflow", "11.8").startswith('pip install "tensorflow[and-cuda]<2.15"')
    assert rules_env.pip_command("tensorflow", "11.4") is None
    assert rules_env.pip_command("tensorflow", None).startswith('pip install "tensorflow[and-cuda]"')
    assert rules_env.pip_command("jax", "12.4") == 'pip install -U "jax[cuda12]"'
    assert rules_env.pip_command("jax", "13.0") == 'pip install -U "jax[cuda13]"'
    assert rules_env.pip_command("jax", "11.8") is None


def test_cuda_newer_compares_major_minor():
    assert rules_env.cuda_newer("12.8", "12.4")
    assert not rules_env.cuda_newer("12.4.1", "12.4")
    assert not rules_env.cuda_newer("11.8", "12.0")
    assert rules_env.cuda_newer("13", "12.9")  # JAX: a CUDA major only
    assert not rules_env.cuda_newer("12", "12.0")
    assert not rules_env.cuda_newer(None, "12.4")


@pytest.mark.parametrize("cvd, visible", [
    (None, 2), ("", 0), ("-1", 0), ("0", 1), ("1,0", 2), ("3", 0), ("1,5", 1), ("5,0", 0), ("0,0", 1),
    ("GPU-1aaa", 1), ("GPU-ffff", 0), ("MIG-1234", 1), ("nonsense", 0), (" 1 , 0 ", 2),
])
def test_visible_gpu_count_follows_cuda_rules(cvd, visible):
    gpus = [{"index": 0, "uuid": "GPU-0aaa-bbbb"}, {"index": 1, "uuid": "GPU-1aaa-bbbb"}]
    assert rules_env.visible_gpu_count(cvd, gpus) == visible


# -- gpu_not_visible rules ---------------------------------------------------------------------------

def test_all_good_no_findings():
    facts = _facts(torch=_torch(), tensorflow=_tf(), jax=_jax())
    assert rules_env.diagnose(facts) == []
    assert exit_code({"findings": []}) == 0


def test_torch_cpu_build_uses_the_run_rule_wording_and_a_driver_matched_command():
    facts = _facts(torch=_torch(version="2.13.0+cpu", cuda_build=None, cudnn_build=None, arch_list=[], sees_gpu=False,
                                gpu_count=0), cuda="12.2")
    f = _only(rules_env.diagnose(facts))
    assert f["id"] == "gpu_not_visible" and f["severity"] == "critical"
    assert f["evidence"]["cause"] == "cpu_build" and f["evidence"]["framework"] == "torch"
    assert f["title"] == "GPU not visible to PyTorch"
    assert "this PyTorch 2.13.0+cpu is a CPU-only build" in f["summary"]
    assert "driver supports CUDA 12.2" in f["summary"]
    assert f["fix"]["code"] == ('pip uninstall -y torch && pip install "torch<2.6" '
                                "--index-url https://download.pytorch.org/whl/cu121")
    assert f["est_speedup"] is None
    assert set(f) == {"id", "severity", "title", "summary", "evidence", "bound", "est_speedup_if_removed", "est_speedup",
                      "fix"}
    assert set(f["fix"]) == {"text", "code", "docs", "options"}
    assert exit_code({"findings": [f]}) == 1


def test_torch_build_newer_than_driver():
    facts = _facts(torch=_torch(version="2.7.0+cu128", cuda_build="12.8", sees_gpu=False, gpu_count=0,
                                cuda_error="RuntimeError: The NVIDIA driver on your system is too old (found version 12040)"),
                   cuda="12.4")
    f = _only(rules_env.diagnose(facts))
    assert f["evidence"]["cause"] == "build_newer_than_driver"
    assert "built for CUDA 12.8" in f["summary"] and "CUDA 12.4 the driver (550.54.15)" in f["summary"]
    assert "/whl/cu124" in f["fix"]["code"]


def test_torch_matching_build_that_cannot_initialise():
    facts = _facts(torch=_torch(sees_gpu=False, gpu_count=0, cuda_error="RuntimeError: CUDA unknown error"))
    f = _only(rules_env.diagnose(facts))
    assert f["evidence"]["cause"] == "cuda_init_failed"
    assert "CUDA unknown error" in f["summary"]


def test_driver_too_old_for_any_build_says_update_the_driver():
    facts = _facts(torch=_torch(version="2.5.1+cu121", cuda_build="12.1", sees_gpu=False, gpu_count=0), cuda="11.4")
    f = _only(rules_env.diagnose(facts))
    assert f["evidence"]["cause"] == "build_newer_than_driver"
    assert f["fix"]["text"].startswith("Update the NVIDIA driver")
    assert "nvidia-smi" in f["fix"]["code"]


def test_tensorflow_cpu_build_reuses_keras_rule_wording():
    facts = _facts(tensorflow=_tf(is_cuda_build=False, cuda_build=None, cudnn_build=None, sees_gpu=False, gpu_count=0,
                                  distributions={"tensorflow-cpu": "2.16.1"}))
    f = _only(rules_env.diagnose(facts))
    assert f["title"] == "GPU not visible to TensorFlow" and f["evidence"]["cause"] == "cpu_build"
    assert "TensorFlow sees none: this TensorFlow 2.16.1 is a CPU-only build" in f["summary"]
    assert f["fix"]["code"] == 'pip uninstall -y tensorflow-cpu && pip install "tensorflow[and-cuda]<2.18"'


def test_tensorflow_cuda_build_without_libraries():
    facts = _facts(tensorflow=_tf(sees_gpu=False, gpu_count=0))
    f = _only(rules_env.diagnose(facts))
    assert f["evidence"]["cause"] == "cuda_init_failed"
    assert "was built for CUDA 12.3 / cuDNN 8, the driver supports CUDA 12.4" in f["summary"]
    assert f["fix"]["code"].startswith('pip install "tensorflow[and-cuda]<2.18"')  # driver CUDA 12.4


def test_jax_without_cuda_plugin_and_plugin_newer_than_driver():
    f = _only(rules_env.diagnose(_facts(jax=_jax(cuda_plugins={}, cuda_build=None, sees_gpu=False, gpu_count=0))))
    assert f["evidence"]["cause"] == "cpu_build" and f["title"] == "GPU not visible to JAX"
    assert f["fix"]["code"] == 'pip install -U "jax[cuda12]"'
    f = _only(rules_env.diagnose(_facts(jax=_jax(cuda_plugins={"jax-cuda13-plugin": "0.7.2"}, cuda_build="13",
                                                 sees_gpu=False, gpu_count=0))))
    assert f["evidence"]["cause"] == "build_newer_than_driver"
    assert f["fix"]["code"] == 'pip install -U "jax[cuda12]"'


def test_warning_not_critical_when_another_framework_sees_the_gpu():
    facts = _facts(torch=_torch(), tensorflow=_tf(is_cuda_build=False, cuda_build=None, sees_gpu=False, gpu_count=0))
    f = _only(rules_env.diagnose(facts))
    assert f["severity"] == "warning" and f["evidence"]["frameworks_seeing_gpu"] == ["torch"]


def test_no_gpu_no_finding_even_for_cpu_builds():
    facts = _facts(torch=_torch(cuda_build=None, sees_gpu=False), nvml=False)
    facts["driver"]["reason"] = "no NVIDIA driver/NVML on this machine (libnvidia-ml.so.1 not found)"
    assert rules_env.diagnose(facts) == []
    why = {u["what"]: u["why"] for u in rules_env.unchecked(facts)}
    assert why["GPU driver, its CUDA version and the GPU's properties"] == ("no NVIDIA driver/NVML on this machine (libnvidia-ml.so.1 not found); "
                          "no NVIDIA device on the PCI bus")
    assert why["TensorFlow"] == "not installed" and why["JAX"] == "not installed"


@pytest.mark.parametrize("cvd", ["", "-1", "2"])
def test_cuda_visible_devices_hiding_every_gpu(cvd):
    facts = _facts(torch=_torch(sees_gpu=False, gpu_count=0), tensorflow=_tf(sees_gpu=False, gpu_count=0),
                   gpus=2, cvd=cvd)
    f = _only(rules_env.diagnose(facts))  # one finding, not one per framework
    assert f["evidence"]["cause"] == "cuda_visible_devices" and f["severity"] == "critical"
    assert f"CUDA_VISIBLE_DEVICES={cvd!r}" in f["summary"]
    assert f["fix"]["code"].startswith("unset CUDA_VISIBLE_DEVICES") and "=0,1" in f["fix"]["code"]


def test_cuda_visible_devices_leaving_one_gpu_is_fine():
    assert rules_env.diagnose(_facts(torch=_torch(), gpus=2, cvd="1")) == []


def test_driver_not_loaded_when_pci_shows_an_nvidia_gpu():
    pci = [{"slot": "0000:17:00.0", "device": "0x2335", "class": "0x030200", "driver": "nouveau"}]
    facts = _facts(torch=_torch(sees_gpu=False, gpu_count=0), nvml=False, pci=pci)
    f = _only(rules_env.diagnose(facts))
    assert f["id"] == "gpu_not_visible" and f["evidence"]["cause"] == "driver_not_loaded"
    assert "0000:17:00.0" in f["summary"] and "nouveau" in f["summary"]
    assert "nvidia-smi" in f["fix"]["code"] and "--gpus all" in f["fix"]["code"]
    facts["driver"]["pci_gpus"][0]["driver"] = None
    assert "no driver is bound" in _only(rules_env.diagnose(facts))["summary"]


@pytest.mark.parametrize("cc, archs, ok", [
    ("8.6", ["sm_80"], True), ("8.0", ["sm_86"], False), ("12.0", ["sm_50", "sm_80", "sm_90"], False),
    ("12.0", ["sm_90", "compute_90"], True), ("9.0", ["sm_90a"], True), ("10.0", ["sm_90a"], False),
    ("10.0", ["sm_100"], True), ("7.5", ["sm_70"], True), ("7.0", ["sm_75", "compute_75"], False),
])
def test_arch_supported(cc, archs, ok):
    assert rules_env.arch_supported(cc, archs) is ok


def test_torch_without_kernels_for_a_new_gpu():
    torch = _torch(version="2.5.1+cu124", devices=[{"name": "NVIDIA GeForce RTX 5090", "capability": "12.0"}])
    f = _only(rules_env.diagnose(_facts(torch=torch, cuda="12.8")))
    assert f["evidence"]["cause"] == "arch_not_in_build" and f["severity"] == "critical"
    assert "no kernels for compute capability 12.0" in f["summary"]
    assert "/whl/cu128" in f["fix"]["code"]


def test_probe_failure_is_unchecked_not_a_finding():
    facts = _facts(torch={"name": "PyTorch", "installed": True, "probe": "timeout",
                          "error": "probe still running after 60 s (killed)"})
    assert rules_env.diagnose(facts) == []
    assert {"what": "PyTorch", "why": "probe still running after 60 s (killed)"} in rules_env.unchecked(facts)


# -- capability facts ----------------------------------------------------------------------------------

def test_gpu_entry_uses_the_capability_table():
    h200 = gpu_entry({"name": "NVIDIA H200", "compute_capability": "9.0"})
    assert h200["arch"] == "Hopper" and h200["tensor_cores"] and h200["bf16"]
    assert h200["mixed_precision"]["dtype"] == "bfloat16" and h200["mixed_precision"]["speedup_vs_fp32"] == 2.0
    t4 = gpu_entry({"name": "Tesla T4", "compute_capability": "7.5"})
    assert t4["bf16"] is False and t4["mixed_precision"]["dtype"] == "float16"
    gtx = gpu_entry({"name": "NVIDIA GeForce GTX 1660", "compute_capability": "7.5"})
    assert gtx["tensor_cores"] is False and gtx["mixed_precision"]["dtype"] is None
    unknown = gpu_entry({"name": "?", "compute_capability": None})
    assert unknown["arch"] is None and unknown["mixed_precision"] is None


# -- NVML through the fake driver -----------------------------------------------------------------------

def test_probe_nvml_reads_driver_cuda_and_devices(monkeypatch):
    FakeNvml([FakeDevice(name="NVIDIA H200"), FakeDevice(name="Tesla T4", compute_capability=(7, 5),
                                                         memory_total=16 << 30, gpm_supported=False)],
             driver_version="550.54.15", cuda_driver_version=12040).install(monkeypatch)
    nv = probe.probe_nvml()
    assert nv["available"] and nv["version"] == "550.54.15" and nv["cuda_version"] == "12.4"
    assert [d["name"] for d in nv["devices"]] == ["NVIDIA H200", "Tesla T4"]
    assert nv["devices"][1]["compute_capability"] == "7.5" and nv["devices"][1]["memory_total_bytes"] == 16 << 30


def test_probe_nvml_without_driver(monkeypatch):
    FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED).install(monkeypatch)
    nv = probe.probe_nvml()
    assert not nv["available"] and nv["devices"] == []
    assert nv["reason"] == "the NVIDIA driver is not loaded (NVML: Driver Not Loaded)"


def test_probe_nvml_library_missing(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", no_library)
    nv = probe.probe_nvml()
    assert nv["reason"] == "no NVIDIA driver/NVML on this machine (libnvidia-ml.so.1 not found)"


def test_check_with_fake_gpu_and_cpu_only_torch(monkeypatch):
    """The GPU path end to end: fake driver (CUDA 12.2), injected framework facts, JSON shape."""
    FakeNvml([FakeDevice(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))],
             cuda_driver_version=12020).install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fws = {"torch": _torch(version="2.13.0+cpu", cuda_build=None, cudnn_build=None, arch_list=[], sees_gpu=False,
                           gpu_count=0), "tensorflow": _absent("TensorFlow"), "jax": _absent("JAX")}
    env = check(frameworks=fws)
    assert set(env) == {"schema", "tool_version", "frameworks", "gpus", "driver", "cpu", "memory", "data",
                        "findings", "unchecked"}
    assert env["schema"] == "whyidle.env/1"
    gpu = env["gpus"][0]
    assert gpu["arch"] == "Ampere" and gpu["bf16"] and gpu["compute_capability"] == "8.0"
    assert env["driver"]["cuda_version"] == "12.2" and env["driver"]["visible_gpus"] == 1
    f = _only(env["findings"])
    assert f["evidence"]["cause"] == "cpu_build" and "/whl/cu121" in f["fix"]["code"]
    assert exit_code(env) == 1
    json.dumps(env)  # serializable as is
    out = io.StringIO()
    env_report.render(env, file=out, width=120)
    text = out.getvalue()
    for part in ("Frameworks", "NVIDIA A100-SXM4-80GB", "compute capability 8.0 (Ampere)", "bf16: yes",
                 "mixed precision (bfloat16 autocast): ≈2×", "driver 550.54.15 · supports CUDA 12.2",
                 "[critical] GPU not visible to PyTorch", "Fix:", "whl/cu121", "Could not check", "JAX: not installed"):
        assert part in text, part


# -- PCI and cgroups (fake sysfs) ------------------------------------------------------------------------

def _pci_device(root, slot, vendor, cls, driver=None):
    d = root / slot
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "class").write_text(cls + "\n")
    (d / "device").write_text("0x2335\n")
    if driver:
        target = root.parent / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(target, d / "driver")


def test_probe_pci_finds_nvidia_display_controllers_only(tmp_path):
    root = tmp_path / "devices"
    _pci_device(root, "0000:17:00.0", "0x10de", "0x030200", "nvidia")   # 3D controller (data center)
    _pci_device(root, "0000:65:00.0", "0x10de", "0x030000")             # VGA, no driver bound
    _pci_device(root, "0000:65:00.1", "0x10de", "0x040300")             # the card's HDMI audio
    _pci_device(root, "0000:a0:00.0", "0x10de", "0x068000")             # NVSwitch bridge
    _pci_device(root, "0000:00:02.0", "0x8086", "0x030000", "i915")     # Intel graphics
    pci = probe.probe_pci(str(root))
    assert pci["readable"]
    assert [(g["slot"], g["driver"]) for g in pci["nvidia_gpus"]] == [("0000:17:00.0", "nvidia"), ("0000:65:00.0", None)]
    assert probe.probe_pci(str(tmp_path / "missing")) == {"readable": False, "nvidia_gpus": []}


def test_probe_cpu_and_memory_on_this_machine():
    cpu = probe.probe_cpu()
    assert cpu["logical"] >= 1 and 0 < cpu["usable"] <= cpu["logical"]
    mem = probe.probe_memory()
    assert mem["total_bytes"] > 0 and 0 <= mem["available_bytes"] <= mem["total_bytes"]


# -- data file system --------------------------------------------------------------------------------

@pytest.mark.parametrize("fstype, kind", [
    ("nfs4", "network"), ("nfs", "network"), ("cifs", "network"), ("smb3", "network"), ("9p", "network"),
    ("ceph", "network"), ("lustre", "parallel"), ("gpfs", "parallel"), ("beegfs", "parallel"),
    ("glusterfs", "parallel"), ("fuse.sshfs", "fuse"), ("fuse.s3fs", "fuse"), ("fuse.gcsfuse", "fuse"),
    ("fuse.rclone", "fuse"), ("fuse", "fuse"), ("fuseblk", "fuse"), ("overlay", "local"), ("tmpfs", "local"),
    ("ext4", "local"), ("xfs", "local"), ("btrfs", "local"), ("weirdfs", "unknown"), (None, "unknown"),
])
def test_classify_fstype(fstype, kind):
    assert fs.classify(fstype) == kind


MOUNTINFO = """\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
30 22 0:40 / /mnt/data rw,relatime shared:2 - nfs4 filer:/export/data rw,vers=4.2
31 30 0:41 / /mnt/data/cache rw - tmpfs tmpfs rw
32 22 0:42 / /mnt/my\\040bucket rw,nosuid - fuse.s3fs s3fs rw,user_id=0
33 22 0:43 / /mnt/data2 rw - ext4 /dev/sdb rw
34 22 0:44 / /mnt/data2 rw - nfs filer:/over rw
"""


def test_parse_mountinfo_and_find_mount():
    mounts = fs.parse_mountinfo(MOUNTINFO)
    assert mounts[3] == {"mount_point": "/mnt/my bucket", "fstype": "fuse.s3fs", "source": "s3fs"}
    assert fs.find_mount("/mnt/data/imagenet/train", mounts)["fstype"] == "nfs4"
    assert fs.find_mount("/mnt/data/cache/x", mounts)["fstype"] == "tmpfs"
    assert fs.find_mount("/mnt/database", mounts)["fstype"] == "ext4"  # not under /mnt/data
    assert fs.find_mount("/mnt/my bucket/a.jpg", mounts)["fstype"] == "fuse.s3fs"
    assert fs.find_mount("/mnt/data2/x", mounts)["source"] == "filer:/over"  # the later mount hides the earlier


def _small_files(folder, n, size=100):
    (folder / "sub").mkdir(parents=True)
    for i in range(n):
        (folder / ("sub" if i % 2 else "") / f"{i}.jpg").write_bytes(b"x" * size)


def test_scan_counts_and_stops(tmp_path):
    _small_files(tmp_path, 40)
    full = fs.scan(str(tmp_path))
    assert full["files"] == 40 and full["total_bytes"] == 4000 and full["mean_file_bytes"] == 100
    assert not full["truncated"] and full["stopped_by"] is None
    part = fs.scan(str(tmp_path), max_files=10)
    assert part["files"] == 10 and part["truncated"] and part["stopped_by"] == "files"
    one = fs.scan(str(tmp_path / "0.jpg"))
    assert one["files"] == 1 and one["mean_file_bytes"] == 100


def test_small_files_on_nfs_is_an_input_pipeline_finding(tmp_path):
    _small_files(tmp_path, 30)
    mounts = [{"mount_point": "/", "fstype": "ext4", "source": "/dev/vda"},
              {"mount_point": str(tmp_path), "fstype": "nfs4", "source": "filer:/data"}]
    data = fs.describe(str(tmp_path), mounts=mounts, max_files=25)  # stopped early: a sample of a large set
    assert data["kind"] == "network" and data["small_files"] and data["fstype"] == "nfs4"
    f = _only(rules_env.diagnose(_facts(torch=_torch(), data=data)))
    assert f["id"] == "input_pipeline_config" and f["severity"] == "warning"
    assert f["evidence"]["cause"] == "network_filesystem" and f["evidence"]["fstype"] == "nfs4"
    assert "25+ files" in f["summary"] and "rsync" in f["fix"]["code"] and "ShardWriter" in f["fix"]["code"]
    assert exit_code({"findings": [f]}) == 1

    fuse = dict(data, fstype="fuse.gcsfuse", kind="fuse")
    assert _only(rules_env.diagnose(_facts(data=fuse)))["evidence"]["cause"] == "fuse_filesystem"
    assert rules_env.diagnose(_facts(data=dict(data, kind="local", fstype="ext4"))) == []
    assert rules_env.diagnose(_facts(data=dict(data, small_files=False))) == []


def test_few_files_or_large_files_are_not_small_file_datasets(tmp_path):
    _small_files(tmp_path, 30)
    mounts = [{"mount_point": "/", "fstype": "nfs", "source": "filer:/"}]
    assert not fs.describe(str(tmp_path), mounts=mounts)["small_files"]  # 30 files: all seen, too few
    big = tmp_path / "shards"
    big.mkdir()
    for i in range(3):
        (big / f"train-{i}.tar").write_bytes(b"\0" * (2 << 20))
    assert not fs.describe(str(big), mounts=mounts, max_files=2)["small_files"]


def test_missing_data_path_raises_before_probing():
    with pytest.raises(DataPathError, match="data path not found: /no/such/dir"):
        check("/no/such/dir", frameworks={})


# -- framework probes in real subprocesses ---------------------------------------------------------------

@pytest.mark.slow
def test_probe_frameworks_on_this_machine():
    """Real subprocess probes: PyTorch and TensorFlow are installed here; a missing one says so."""
    res = probe.probe_frameworks()
    assert set(res) == {"torch", "tensorflow", "jax"}
    torch = res["torch"]
    assert torch["installed"] and torch["probe"] == "ok", torch
    assert torch["version"] and isinstance(torch["sees_gpu"], bool)
    if "+cpu" in torch["version"]:
        assert torch["cuda_build"] is None and torch["sees_gpu"] is False
    tf = res["tensorflow"]
    if tf["installed"]:
        assert tf["probe"] == "ok", tf
        assert tf["version"] and isinstance(tf["is_cuda_build"], bool) and isinstance(tf["sees_gpu"], bool)
    if not probe.installed("jax"):
        assert res["jax"] == {"name": "JAX", "installed": False}
        assert {"what": "JAX", "why": "not installed"} in rules_env.unchecked({"frameworks": res, "driver": {}})


def test_probe_timeout_crash_and_log_spam(monkeypatch):
    monkeypatch.setitem(probe._SCRIPTS, "torch", "import time\ntime.sleep(30)")
    res = probe.probe_frameworks(["torch"], timeout_s=0.5)["torch"]
    assert res["probe"] == "timeout" and "after 0.5 s" in res["error"] and res["probe_s"] < 10
    monkeypatch.setitem(probe._SCRIPTS, "torch", "import os, sys\nsys.stderr.write('boom\\n')\nos.abort()")
    res = probe.probe_frameworks(["torch"])["torch"]
    assert res["probe"] == "crashed" and "signal 6" in res["error"] and "boom" in res["error"]
    monkeypatch.setitem(probe._SCRIPTS, "torch", probe._PRELUDE + "print('noise ' * 100)\nout['version'] = '9'\ndone()")
    res = probe.probe_frameworks(["torch"])["torch"]
    assert res["probe"] == "ok" and res["version"] == "9"


FAKE_TORCH = """
__version__ = "2.7.0+cu128"
class version:
    cuda = "12.8"
    hip = None
class backends:
    class cudnn:
        @staticmethod
        def version():
            return 90100
class cuda:
    @staticmethod
    def get_arch_list():
        return ["sm_80", "sm_90"]
    @staticmethod
    def is_available():
        return False
    @staticmethod
    def init():
        raise RuntimeError("The NVIDIA driver on your system is too old (found version 12040).")
"""

FAKE_JAX = """
__version__ = "0.4.30"
class _Dev:
    platform = "cpu"
def devices(backend=None):
    if backend is not None:
        raise RuntimeError(f"Unknown backend {backend}")
    return [_Dev()]
def default_backend():
    return "cpu"
"""


def test_probe_scripts_against_fake_frameworks(monkeypatch, tmp_path):
    """The CUDA-build branch of the PyTorch probe and the JAX probe, against stand-in modules (the
    real ones here are a CPU build and absent)."""
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text(FAKE_JAX)
    (tmp_path / "jaxlib").mkdir()
    (tmp_path / "jaxlib" / "__init__.py").write_text('__version__ = "0.4.30"\n')
    monkeypatch.syspath_prepend(str(tmp_path))  # find_spec("jax") in this process
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    res = probe.probe_frameworks(["torch", "jax"])
    torch, jax = res["torch"], res["jax"]
    assert torch["probe"] == "ok" and torch["cuda_build"] == "12.8" and torch["cudnn_build"] == 90100
    assert torch["sees_gpu"] is False and "too old" in torch["cuda_error"]
    assert jax["probe"] == "ok" and jax["version"] == "0.4.30" and jax["jaxlib"] == "0.4.30"
    assert jax["cuda_build"] is None and jax["sees_gpu"] is False and "Unknown backend cuda" in jax["cuda_error"]
    assert jax["backend"] == "cpu"
    facts = _facts(torch=torch, jax=jax)
    causes = {f["evidence"]["framework"]: f["evidence"]["cause"] for f in rules_env.diagnose(facts)}
    assert causes == {"torch": "build_newer_than_driver", "jax": "cpu_build"}
    out = io.StringIO()
    env_report.render(dict(facts, findings=[], unchecked=[]), file=out, width=120)
    assert "CUDA 12.8 / cuDNN 9.1.0" in out.getvalue() and "jaxlib 0.4.30, no CUDA plugin" in out.getvalue()


def test_probe_environment(monkeypatch):
    monkeypatch.setenv("WHYIDLE_RUN_DIR", "/tmp/x")
    monkeypatch.setitem(probe._SCRIPTS, "torch", probe._PRELUDE + "out.update({k: os.environ.get(k) for k in "
                        "('XLA_PYTHON_CLIENT_PREALLOCATE', 'TF_CPP_MIN_LOG_LEVEL', 'WHYIDLE_RUN_DIR')})\n"
                        "out['cwd_on_path'] = os.getcwd() in sys.path or '' in sys.path\ndone()")
    res = probe.probe_frameworks(["torch"])["torch"]
    assert res["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and res["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert res["WHYIDLE_RUN_DIR"] is None and res["cwd_on_path"] is False


# -- CLI ---------------------------------------------------------------------------------------------------

def test_cli_missing_data_path_exits_2_with_one_line():
    result = CliRunner().invoke(main, ["env", "--data", "/no/such/dir"])
    assert result.exit_code == 2
    assert result.output.strip() == "whyidle: data path not found: /no/such/dir"


def test_cli_json_and_exit_code(monkeypatch, tmp_path):
    facts = _facts(torch=_torch(cuda_build=None, sees_gpu=False, gpu_count=0))
    facts.update(schema=env_mod.SCHEMA, tool_version="0", findings=rules_env.diagnose(facts), unchecked=[])
    monkeypatch.setattr(env_mod, "check", lambda data_path=None: facts)
    result = CliRunner().invoke(main, ["env", "--json"])
    assert result.exit_code == 1
    out = json.loads(result.output)
    assert out["schema"] == "whyidle.env/1" and out["findings"][0]["id"] == "gpu_not_visible"
    result = CliRunner().invoke(main, ["env"])
    assert result.exit_code == 1 and "GPU not visible to PyTorch" in result.output


@pytest.mark.slow
def test_cli_env_on_this_machine(tmp_path):
    """`whyidle env --json --data DIR` as a user runs it (real probes, real NVML or its absence)."""
    import subprocess

    _small_files(tmp_path, 4)
    proc = subprocess.run([sys.executable, "-m", "whyidle", "env", "--json", "--data", str(tmp_path)],
                          capture_output=True, text=True, timeout=180)
    env = json.loads(proc.stdout)
    assert env["schema"] == "whyidle.env/1" and proc.returncode == exit_code(env)
    assert env["data"]["files"] == 4 and env["data"]["kind"] in ("local", "unknown", "network", "fuse", "parallel")
    if not env["driver"]["nvml"] and not env["driver"]["pci_gpus"]:
        assert env["gpus"] == [] and env["findings"] == [] and proc.returncode == 0
        assert any(u["what"].startswith("GPU driver") for u in env["unchecked"])
