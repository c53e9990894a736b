"""Terminal renderer of ``whyidle env`` (a ``whyidle.env/1`` object, see :func:`whyidle.env.check`):
frameworks, GPU, CPU/memory, data, then findings with their fixes, then what could not be checked."""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from whyidle.diagnose.rules_env import size_text
from whyidle.report.terminal import _SEVERITY_STYLE, _indent


def _build(fw: dict) -> str:
    """``CUDA 12.8 / cuDNN 9.1.0``, ``CPU-only``, ``ROCm 6.2``."""
    if fw.get("hip_build"):
        return f"ROCm {fw['hip_build']}"
    if fw.get("is_rocm_build"):
        return "ROCm"
    cuda = fw.get("cuda_build")
    if fw.get("is_cuda_build") is False or not cuda:
        if fw.get("jaxlib") is not None:
            return f"jaxlib {fw['jaxlib']}, no CUDA plugin"
        return "CPU-only"
    text = f"CUDA {cuda}"
    cudnn = fw.get("cudnn_build")
    if isinstance(cudnn, int) and cudnn > 0:  # torch.backends.cudnn.version(): 90100 = 9.1.0, 8902 = 8.9.2
        cudnn = (f"{cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}" if cudnn >= 10000
                 else f"{cudnn // 1000}.{cudnn % 1000 // 100}.{cudnn % 100}")
    if cudnn:
        text += f" / cuDNN {cudnn}"
    if fw.get("cuda_plugins"):
        text += " (" + ", ".join(f"{k} {v}" for k, v in fw["cuda_plugins"].items()) + ")"
    return text


def _frameworks(console: Console, frameworks: dict) -> None:
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold")
    for col in ("framework", "version", "build", "sees GPU"):
        table.add_column(col)
    for fw in frameworks.values():
        name = fw.get("name", "?")
        if not fw.get("installed"):
            table.add_row(name, Text("not installed", style="dim"), "", "")
            continue
        if fw.get("probe") != "ok":
            table.add_row(name, fw.get("version") or "?", Text(fw.get("probe") or "probe failed", style="yellow"),
                          Text("?", style="yellow"))
            continue
        sees = fw.get("sees_gpu")
        seen = Text(f"yes ({fw.get('gpu_count')})", style="green") if sees else Text("no", style="bold")
        table.add_row(name, escape(str(fw.get("version"))), escape(_build(fw)), seen)
    console.print(_indent(table, 2))


def _mixed_precision(mp: dict | None) -> str:
    if not mp:
        return "mixed precision: unknown for this compute capability"
    if not mp.get("dtype"):
        return f"mixed precision: little gain on this GPU ({mp.get('note')})"
    vs_tf32 = f", ≈{mp['speedup_vs_tf32']:g}× over TF32" if mp.get("speedup_vs_tf32") else ""
    return (f"mixed precision ({mp['dtype']} autocast): ≈{mp['speedup_vs_fp32']:g}× the GPU math of float32{vs_tf32} "
            f"— {mp.get('note')}")


def _gpus(console: Console, env: dict) -> None:
    drv = env.get("driver") or {}
    gpus = env.get("gpus") or []
    if not gpus:
        pci = drv.get("pci_gpus") or []
        if pci:
            slots = ", ".join(f"{p['slot']} (driver: {p.get('driver') or 'none'})" for p in pci)
            console.print(f"  [bold red]{len(pci)} NVIDIA GPU(s) on the PCI bus[/] ({escape(slots)}) but NVML cannot "
                          f"reach them: {escape(str(drv.get('reason')))}")
        elif drv.get("pci_readable"):
            console.print("  no NVIDIA GPU on this machine [dim](no NVIDIA device on the PCI bus)[/]")
        else:
            console.print("  no NVIDIA GPU found" + (f" [dim]({escape(str(drv.get('reason')))})[/]" if drv.get("reason") else ""))
        return
    for g in gpus:
        cc = g.get("compute_capability")
        head = (f"  [bold]GPU {g.get('index')}[/]  {escape(str(g.get('name')))} · {size_text(g.get('memory_total_bytes'))}"
                f" · compute capability {cc or 'n/a'}" + (f" ({g['arch']})" if g.get("arch") else ""))
        console.print(head)
        if g.get("tensor_cores") is not None:
            tc = (f"tensor cores: {', '.join(g.get('tensor_core_dtypes') or [])}" if g["tensor_cores"]
                  else "tensor cores: none")
            console.print(_indent(Text(f"{tc} · bf16: {'yes' if g.get('bf16') else 'no'}"), 8))
        console.print(_indent(Text(_mixed_precision(g.get("mixed_precision"))), 8))
    cvd = drv.get("cuda_visible_devices")
    cvd_text = ("CUDA_VISIBLE_DEVICES unset" if cvd is None
                else f"CUDA_VISIBLE_DEVICES={cvd!r} ({drv.get('visible_gpus')} of {len(gpus)} visible)")
    console.print(f"  [bold]driver[/] {drv.get('version') or 'n/a'} · supports CUDA {drv.get('cuda_version') or 'n/a'}"
                  f" · {escape(cvd_text)}")


def _host(console: Console, env: dict) -> None:
    cpu = env.get("cpu") or {}
    limits = []
    if cpu.get("affinity") is not None and cpu.get("affinity") != cpu.get("logical"):
        limits.append(f"affinity {cpu['affinity']}")
    if cpu.get("cgroup_quota") is not None:
        limits.append(f"cgroup quota {cpu['cgroup_quota']:g}")
    console.print(f"[bold]CPU[/]     {cpu.get('logical')} logical cores ({cpu.get('physical') or '?'} physical) · "
                  f"this process may use {cpu.get('usable'):g}" + (f" ({', '.join(limits)})" if limits else ""))
    mem = env.get("memory") or {}
    limit = f" · cgroup limit {size_text(mem['cgroup_limit_bytes'])}" if mem.get("cgroup_limit_bytes") else ""
    console.print(f"[bold]Memory[/]  {size_text(mem.get('total_bytes'))} total · {size_text(mem.get('available_bytes'))} "
                  f"available{limit}")


def _data(console: Console, data: dict) -> None:
    kind = {"network": "network file system", "parallel": "parallel file system", "fuse": "FUSE file system",
            "local": "local", "unknown": "unknown kind"}.get(data.get("kind"), data.get("kind"))
    files = f"{data.get('files'):,}{'+' if data.get('truncated') else ''} files"
    if data.get("stopped_by") == "time":
        files += f" (scan stopped after {data.get('scan_s'):.1f} s)"
    elif data.get("truncated"):
        files += f" (scan stopped at {data.get('files'):,})"
    if data.get("mean_file_bytes") is not None:
        files += f", mean {size_text(data['mean_file_bytes'])}"
    if data.get("small_files"):
        files += ": small-file dataset" + (" (fine on a local disk)" if data.get("kind") == "local" else "")
    console.print(f"[bold]Data[/]    {escape(str(data.get('path')))} → {escape(str(data.get('fstype')))} "
                  f"{escape(str(data.get('source')))} at {escape(str(data.get('mount_point')))} ({kind}) · "
                  f"{escape(files)}")


def _findings(console: Console, findings: list[dict]) -> None:
    console.print()
    if not findings:
        console.print("[bold green]No problems found.[/]")
        return
    console.rule(Text("findings", style="bold"), align="left")
    for n, f in enumerate(findings, 1):
        console.print(Text.assemble((f"{n}. ", "bold"), (f"[{f['severity']}] ", _SEVERITY_STYLE.get(f["severity"], "")),
                                    (f["title"], "bold"), (f"  ({f['id']})", "dim")))
        console.print(_indent(Text(f["summary"]), 3))
        fix = f.get("fix") or {}
        if fix.get("text"):
            console.print(_indent(Text.assemble(("Fix: ", "bold green"), fix["text"]), 3))
        if fix.get("code"):
            console.print(_indent(Text(fix["code"], style="cyan"), 5))
        for url in fix.get("docs") or []:
            console.print(_indent(Text(url, style="dim"), 5))
        console.print()


def render(env: dict, file: IO[str] | None = None, width: int | None = None) -> None:
    """Prints a ``whyidle.env/1`` object for a human to ``file`` (default stdout)."""
    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    console.print()
    console.rule(Text("whyidle env", style="bold"))
    console.print("[bold]Frameworks[/]")
    _frameworks(console, env.get("frameworks") or {})
    console.print("[bold]GPU[/]")
    _gpus(console, env)
    _host(console, env)
    if env.get("data"):
        _data(console, env["data"])
    _findings(console, env.get("findings") or [])
    unchecked = env.get("unchecked") or []
    if unchecked:
        if not env.get("findings"):
            console.print()
        console.print("[bold]Could not check[/]")
        for u in unchecked:
            console.print(_indent(Text(f"· {u['what']}: {u['why']}", style="dim"), 2))
