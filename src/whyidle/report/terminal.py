"""Terminal renderer: verdict first, then the numbers, then each finding with its fix (rich)."""

from __future__ import annotations

import shlex
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from whyidle.report.windows import over_time_lines
from whyidle.report import cell_sites
from whyidle.report.build import framework_text, logged_text, option_gain, steady_line, verdict_line

_SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}
_PHASES = (("data_wait", "data wait", "red"), ("forward", "forward", "green"), ("backward", "backward", "blue"),
           ("optimizer", "optimizer", "magenta"), ("eval", "eval", "cyan"), ("compute", "compute (train step)", "green"),
           ("other_host", "other host", "yellow"))
#: ProfilerStep shares of a trace report (analysis/trace.py).
_TRACE_PHASES = (("dataloader", "dataloader", "red"), ("kernel", "kernels", "green"), ("memcpy", "memcpy", "blue"),
                 ("memset", "memset", "blue"), ("runtime", "CUDA runtime", "magenta"),
                 ("cpu_only", "CPU only", "yellow"), ("other", "other", "cyan"))


def _indent(renderable, n: int) -> Padding:
    """Left margin without padding lines out to the terminal width (no trailing spaces)."""
    return Padding(renderable, (0, 0, 0, n), expand=False)


def _print_whole(console: Console, text: Text, n: int = 0) -> None:
    """Prints ``text`` indented by ``n`` spaces and never wrapped or cropped: code and paths a user
    copies stay one line each, whatever the width (80 columns when the output is not a terminal)."""
    text = text.copy()
    if n:
        text = Text("\n").join(Text(" " * n) + line for line in text.split("\n"))
    console.print(text, soft_wrap=True)


def _ms(x) -> str:
    return "n/a" if x is None else f"{x * 1000:.1f} ms"


def _share_bar(shares: dict, width: int = 50, phases=_PHASES, trains: bool = True) -> Text:
    bar = Text()
    for key, _label, style in phases:
        n = round((shares.get(key) or 0) * width)
        if n:
            bar.append("█" * n, style=style)
    legend = Text()
    always = ("data_wait", "other_host", "dataloader", "kernel")
    always += ("compute",) if "compute" in shares else ("forward", "backward") if trains else ()  # Keras: one fused step
    for key, label, style in phases:
        v = shares.get(key) or 0
        if v >= 0.005 or key in always:
            legend.append("■ ", style=style)
            legend.append(f"{label} {v:.0%}  ")
    return Text.assemble(bar, "\n", legend)


def _verdict_text(report: dict) -> Text:
    vtext, gain, ok = verdict_line(report)
    speed = f"  (fixing it: ~{gain:.2f}× faster)" if gain else ""
    steady = steady_line(report)
    return Text.assemble(("Verdict: ", "bold"), (vtext, "bold green" if ok else "bold red"), speed,
                         ("\n  " + steady, "bold") if steady else "")


def _render_gpu(console: Console, gpu: dict) -> None:
    """GPU lines: NVML utilization beside GPM SM activity, memory, then the measured starvation
    by cause, the source lines holding the GPU idle, and syncs per step."""
    if gpu.get("source") == "trace":
        if gpu.get("busy_share") is None:  # no span of device activity to measure (one instant)
            console.print(f"[bold]GPU[/] activity traced, but no measurable span ({gpu.get('window_s') or 0:.2f} s)")
            return
        console.print(f"[bold]GPU[/] busy {gpu['busy_share']:.0%} of the traced time (kernels "
                      f"{gpu['compute_busy_share']:.0%}), {gpu['window_s']:.2f} s traced")
        by = gpu.get("idle_s_by_cause") or {}
        window = gpu.get("window_s") or 0
        if window and gpu.get("idle_share") is not None:
            parts = [f"{name} {by[key] / window:.0%}" for key, name in
                     (("host", "host wait"), ("launch", "kernel wait"), ("other", "other")) if by.get(key) is not None]
            console.print(f"[bold]GPU idle[/] {gpu['idle_share']:.0%}: " + " · ".join(parts) + "  (HTA's breakdown)")
        syncs = gpu.get("syncs") or {}
        if syncs.get("count"):
            console.print(f"[bold]syncs[/] {syncs['count']}, {syncs.get('idle_after_s') or 0:.3f} s of GPU idle after them")
        return
    util = gpu.get("util_mean")
    line = "[bold]GPU[/] util " + (f"{util:.0f}% (NVML, {gpu.get('util_source')})" if util is not None else "n/a")
    if gpu.get("sm_active_mean") is not None:
        line += f" · SM active {gpu['sm_active_mean']:.0%} (GPM)"
        if gpu.get("tensor_active_mean") is not None:
            line += f" · tensor cores {gpu['tensor_active_mean']:.0%}"
    if gpu.get("memory_used_max_bytes") and gpu.get("memory_total_bytes"):
        line += f" · memory {gpu['memory_used_max_bytes'] / 2**30:.1f}/{gpu['memory_total_bytes'] / 2**30:.0f} GiB"
    console.print(line)
    if gpu.get("idle_share") is None:
        return
    by = gpu.get("idle_share_by_cause") or {}
    parts = [f"{cause} {by[cause]:.0%}" for cause in ("data", "sync", "host", "launch", "other")
             if (by.get(cause) or 0) >= 0.005]
    console.print(f"[bold]GPU starved[/] {gpu['idle_share']:.0%} of the step time ({gpu['starved_s']:.2f} s, "
                  "measured with CUDA events)" + (": " + " · ".join(parts) if parts else ""))
    for site in (gpu.get("idle_sites") or [])[:3]:
        where = site.get("site") or site.get("leaf")
        console.print(_indent(Text(f"· {site['share']:.0%} of the idle at {where} ({site['phase']})", style="dim"), 2))
    syncs = gpu.get("syncs") or {}
    if syncs.get("count"):
        tops = ", ".join(f"{s.get('site') or s.get('leaf')}" + (f" ({s['op']})" if s.get("op") else "")
                         + (f" {s['per_step']:.1f}/step" if s.get("per_step") is not None else "")
                         for s in syncs["sites"][:3])
        per = f"{syncs['per_step']:.1f} per step" if syncs.get("per_step") is not None else f"{syncs['count']}"
        console.print(f"[bold]syncs[/] {per}, {syncs['idle_s']:.2f} s of GPU idle: {escape(tops)}")


def render_brief(report: dict, file: IO[str] | None = None, width: int | None = None) -> None:
    """Prints the verdict and one line per finding (no fixes): for before/after views."""
    report = cell_sites.for_display(report)
    console = Console(file=file, width=width, highlight=False)
    console.print(_verdict_text(report))
    for f in report.get("findings") or []:
        console.print(_indent(Text.assemble((f"[{f['severity']}] ", _SEVERITY_STYLE.get(f["severity"], "")),
                                            f["summary"]), 2))


#: Wall-time parts in the order the job goes through them, with the words the terminal uses.
TIME_PARTS = (("startup", "start-up"), ("training", "training"), ("compile", "compiling"), ("evaluation", "evaluation"),
              ("checkpoint", "checkpoints"), ("logging", "logging"), ("epoch_boundary", "epoch boundaries"),
              ("teardown", "teardown"))


def _startup_split(part: dict) -> str:
    """``": imports 4.2 s, set-up 3.3 s, framework start 0.8 s, first step 0.2 s"`` (pieces of at
    least 0.1 s), or ``""``
    without a sampled split."""
    split = part.get("split") or {}
    if not split.get("sampled"):
        return ""
    pieces = [(split["framework_import_s"] + split["imports_s"], "imports"), (split["program_s"], "set-up"),
              (split.get("framework_s", 0.0), "framework start"), (split.get("compile_s", 0.0), "compile"),
              (split["first_step_s"], "first step")]
    shown = [f"{label} {s:.1f} s" for s, label in pieces if s >= 0.1]
    return ": " + ", ".join(shown) if shown else ""


def time_line(t: dict) -> str:
    """One line: the command's wall time and its parts (seconds and share), parts under 0.5 % left out."""
    parts = t.get("parts") or {}
    shown = [f"{label} {parts[k]['s']:.1f} s ({parts[k]['share']:.0%}{_startup_split(parts[k]) if k == 'startup' else ''})"
             for k, label in TIME_PARTS if k in parts and parts[k]["share"] >= 0.005]
    return f"[bold]wall time[/] {t['wall_s']:.1f} s: " + " · ".join(shown)


#: Ranks listed one per line; a bigger job lists the straggler and the slowest and fastest others.
MAX_RANK_LINES = 8


def _rank_row(r: dict) -> dict:
    """A ``ranks`` entry in the live form: a trace report's (``{rank, metrics, wait_s}``) gets
    its step time and step shares from its ``metrics``."""
    if "shares" in r:
        return r
    m = r.get("metrics") or {}
    return {"rank": r.get("rank"), "node": None, "samples_per_s": None, "step_time_s": m.get("step_time_s") or {},
            "shares": {k: v for k, v in (m.get("shares") or {}).items() if k != "data_wait" and v is not None},
            "wait_s": r.get("wait_s")}


def _n(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


def loop_text(loop: dict) -> str | None:
    """What a step of the loop is, when it is not one step of one optimizer (``metrics.loop``):
    the optimizers of a GAN-like step by name, a loop without ``torch.optim``, or no training."""
    if not loop:
        return None
    if not loop.get("trains"):
        calls, rate = loop.get("forward_calls_per_step"), loop.get("forward_calls_per_s")
        per = "DataLoader batch" if loop.get("marker") == "loader" else "call of the model"
        return (f"no training (no backward, no optimizer step): a step per {per}"
                + (f", {_n(calls)} model call{'s' if calls != 1 else ''} per step, {rate:,.1f}/s" if calls and rate else ""))
    parts = loop.get("parts") or []
    if len(parts) >= 2:
        return (f"a step runs {len(parts)} optimizers: " + " · ".join(
            f"{p['name']} ({p['class']}) {_n(p['backward_per_step'])} backward + {_n(p['steps_per_step'])} step"
            for p in parts))
    if loop.get("marker") == "backward":
        bwd = loop.get("backward_per_step")
        return "a step per backward() (weights updated without torch.optim)" + (
            f", {_n(bwd)} backward per step" if bwd and bwd != 1 else "")
    return None


def workers_line(lw: dict | None) -> str | None:
    """One line on the DataLoader workers (``metrics.loader_workers``): how many, the range of
    their batch p50s and the largest p95 (ms), the range of their busy shares, the batches ready when
    the loop asked (``queue``) and the wait spent behind a slow batch, what the training thread did
    in its wait (``wait_split``: parts of 5 % or more), the slowest sample; None without worker
    records or queue samples."""
    rows = (lw or {}).get("workers") or []
    p50s = sorted(r["batch_ms"]["p50"] for r in rows if (r.get("batch_ms") or {}).get("p50") is not None)
    queue = (lw or {}).get("queue")
    parts = []
    if p50s:
        p95 = max((r["batch_ms"].get("p95") or 0.0) for r in rows if r.get("batch_ms"))
        spread = f"{p50s[0]:.1f}" + (f"–{p50s[-1]:.1f}" if p50s[-1] - p50s[0] >= 0.05 else "")
        parts.append(f"{len(rows)} process{'es' if len(rows) > 1 else ''} (their own time per batch: p50 {spread} ms, "
                     f"p95 up to {p95:.1f} ms)")
        busy = [r["busy_share"] for r in rows if r.get("busy_share") is not None]
        if busy:
            lo, hi = min(busy), max(busy)
            parts.append(f"building batches {lo:.0%}" + (f"–{hi:.0%}" if hi - lo >= 0.005 else "") + " of the time")
    split = (lw or {}).get("wait_split")
    if queue:
        # the wait of fetches that ended with later batches held, less the loop's own receiving in it
        behind = (queue.get("behind_wait_share") or 0) * (1 - (split or {}).get("receiving", 0)
                                                          - (split or {}).get("snapshot", 0))
        parts.append(f"when the loop asked: {queue['ready_mean']:.1f} of {queue['cap']} batches ready on average, "
                     f"none in {queue['empty_share']:.0%} of the fetches"
                     + (f", {behind:.0%} of the wait behind a slow batch" if behind >= 0.05 else ""))
    if split:
        named = [(k, v) for k, v in sorted(split.items(), key=lambda kv: -kv[1]) if v >= 0.05]
        parts.append("the loop's wait: " + ", ".join(f"{k} {v:.0%}" for k, v in named))
    slow = ((lw or {}).get("slowest") or [None])[0]
    if slow:
        parts.append(f"slowest sample: index {slow['index']} {slow['ms']:.1f} ms (worker {slow['worker']})")
    return " · ".join(parts) or None


def rank_lines(report: dict) -> list[str]:
    """A distributed job's ranks, one line each (rank, node, samples/s, mean step, the two largest
    shares, its wait for the others in collectives where measured), the straggler marked; at most
    ``MAX_RANK_LINES`` (then the slowest, the fastest and the straggler; in traces, by wait)."""
    rows = [_rank_row(r) for r in report.get("ranks") or []]
    rows = [r for r in rows if r["step_time_s"].get("mean")]
    if len(rows) < 2:
        return []
    late = (report.get("straggler") or {}).get("rank")
    live = report.get("source") != "trace"
    if len(rows) > MAX_RANK_LINES:
        by_rate = sorted(rows, key=lambda r: (r.get("samples_per_s") or 0.0) if live else -(r.get("wait_s") or 0.0))
        keep = {id(r) for r in by_rate[:3] + by_rate[-2:]} | {id(r) for r in rows if r["rank"] == late}
        shown = [r for r in rows if id(r) in keep]
    else:
        shown = rows
    counted = (report.get("metrics") or {}).get("samples_per_s") is not None
    head = ("samples/s above: their sum" if counted else "no batch size read: no samples/s") if live else "a trace each"
    which = "the slowest, the fastest" if live else "those waiting most and least"
    out = [f"[bold]ranks[/] {len(rows)} ({head}" + ("; * the straggler)" if late is not None else ")")
           + (f" (showing {len(shown)}: {which} and the straggler)" if len(shown) < len(rows) else "")]
    nodes = len({r.get("node") for r in rows})
    for r in shown:
        top = sorted(r["shares"].items(), key=lambda kv: -kv[1])[:2]
        rate = f"{r['samples_per_s']:,.1f} samples/s · " if r.get("samples_per_s") else ""
        out.append(f"  rank {r['rank']}" + ("*" if r["rank"] == late else "") + (f" node {r['node']}" if nodes > 1 else "")
                   + f": {rate}step {_ms(r['step_time_s']['mean'])} · "
                   + " · ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in top)
                   + (f" · waits {_ms(r['wait_s'])} in collectives" if r.get("wait_s") else ""))
    return out


def render(report: dict, file: IO[str] | None = None, width: int | None = None, console: Console | None = None) -> None:
    """Prints ``report`` (a ``whyidle.report/1`` dict) for a human to ``file`` (default stdout), or
    to ``console`` when given (a recording console: the ``%%whyidle`` cell shows its HTML export)."""
    report = cell_sites.for_display(report)  # notebook sites read "cell 5, line 28"
    console = console or Console(file=file, width=width, highlight=False, soft_wrap=False)
    m = report.get("metrics") or {}
    cmd = shlex.join(report.get("command") or []) or "(no command)"
    run = report.get("run") or {}
    status = []
    if run.get("signal"):
        status.append(f"ended by signal {run['signal']}")
    elif run.get("exit_code") is not None:
        status.append(f"exit {run['exit_code']}")
    console.print()
    console.rule(Text("whyidle report", style="bold"))
    if report.get("source") == "trace":
        console.print(f"[bold]trace[/]    {escape(str(report.get('trace')))}  ({len(report.get('files') or [])} file(s))")
    else:
        console.print(f"[bold]command[/]  {escape(cmd)}" + (f"   ({', '.join(status)})" if status else ""))
    device = report.get("device") or {}
    console.print(f"[bold]device[/]   {escape(str(device.get('name') or device.get('kind') or 'unknown'))}"
                  f" ({device.get('kind', '?')})   [bold]framework[/] {escape(framework_text(report))}")

    console.print()
    console.print(_verdict_text(report))

    if m.get("step_time_s"):
        st = m["step_time_s"]
        sps = m.get("samples_per_s")
        console.print()
        steady = m.get("steady_samples_per_s")
        console.print(f"[bold]steps[/] {m.get('steps')} ({m.get('steps_analyzed')} analyzed)   "
                      f"[bold]step time[/] p50 {_ms(st['p50'])} · p90 {_ms(st['p90'])}   "
                      + (f"[bold]samples/s[/] {sps:,.1f}" if sps else "")
                      + (f" (steady steps {steady:,.1f})" if sps and steady and abs(steady - sps) > 0.005 * sps else "")
                      + (f"   [bold]batch[/] {m.get('batch_size'):g}" if sps and m.get("batch_size") else "")
                      + (f" × {m['batches_per_step']:g} per step" if (m.get("batches_per_step") or 1) > 1 else ""))
        trace = report.get("source") == "trace"
        loop = m.get("loop") or {}
        console.print(_share_bar(m.get("shares") or {}, phases=_TRACE_PHASES if trace else _PHASES,
                                 trains=loop.get("trains", True)))
        text = loop_text(loop)
        if text:
            console.print("[bold]loop[/] " + escape(text))
        for line in rank_lines(report):
            console.print(line)
    if m.get("time"):
        console.print(time_line(m["time"]))
    host = m.get("host")
    if host:
        parts = [f"{host['cores']} cores {host['cpu_busy_share']:.0%} busy"]
        if host.get("cores_limit_by"):  # the job may use fewer than the machine has
            parts[0] = (f"{host['cores_usable']:g} usable of {host['cores']} cores ({host['cores_limit_by']}) · "
                        f"machine {host['cpu_busy_share']:.0%} busy")
            if (host.get("cpu_throttled_share") or 0) >= 0.01:
                parts.append(f"throttled by the quota in {host['cpu_throttled_share']:.0%} of periods")
        if m.get("steps"):  # without a training process there is no trainer to show
            parts.append(f"trainer {host['trainer_cores']:.2f} cores")
        if host.get("workers"):
            parts.append(f"{host['workers']} worker{'s' if host['workers'] != 1 else ''} {host['workers_cores']:.2f} cores")
        parts.append(f"other processes {host['other_procs_cores']:.2f} cores")
        if (host.get("yielding_procs_cores") or 0) >= 0.05:
            parts.append(f"low-priority processes {host['yielding_procs_cores']:.2f} cores (they yield)")
        if host.get("trainer_run_delay_share") is not None:
            parts.append(f"run-queue wait {host['trainer_run_delay_share']:.0%}")
        if (host.get("steal_share") or 0) >= 0.01:
            parts.append(f"stolen by the hypervisor {host['steal_share']:.0%}")
        console.print("[bold]CPU[/] " + " · ".join(parts))
    workers = workers_line(m.get("loader_workers"))
    if workers:
        console.print("[bold]DataLoader workers[/] " + escape(workers))
    gpu = m.get("gpu")
    if gpu:
        _render_gpu(console, gpu)
    else:
        console.print("[bold]GPU[/] none observed")
    logged = logged_text(report)
    if logged:
        console.print("[bold]logged[/] " + escape(logged))
    for label, text in over_time_lines(report):
        console.print(f"[bold]{label}[/] " + escape(text))

    findings = report.get("findings") or []
    if findings:
        console.print()
        console.rule(Text("findings", style="bold"), align="left")
    for n, f in enumerate(findings, 1):
        head = Text.assemble((f"{n}. ", "bold"), (f"[{f['severity']}] ", _SEVERITY_STYLE.get(f["severity"], "")),
                             (f["title"], "bold"), (f"  ({f['id']})", "dim"))
        if f.get("bound") is not None and f["id"] != "device_bound":
            whole = (f.get("evidence") or {}).get("part_s") is not None
            head.append(f"  holds {f['bound']:.0%}" + (" of wall time" if whole else ""), style="bold")
        if f.get("est_speedup"):
            head.append(f"  fix est. {f['est_speedup']:.2f}×", style="bold")
        console.print(head)
        console.print(_indent(Text(f["summary"]), 3))
        for site in (f.get("evidence") or {}).get("sites") or []:
            line = f"· {site.get('site') or site.get('leaf')}"
            if site.get("op"):
                line += f" ({site['op']})"
            if site.get("per_step") is not None:
                line += f"  {site['per_step']:.1f}/step"
            if site.get("share") is not None:
                line += f"  idle {site['share']:.0%}"
            console.print(_indent(Text(line, style="dim"), 5))
        for h in (f.get("evidence") or {}).get("hotspots") or []:
            share = f" {h['share']:.0%}" if h.get("share") is not None else ""
            line = f"·{share} {h['function'] if h.get('framework') else h['site']}" + (
                f"   {h['code']}" if h.get("code") else "")
            if h.get("leaf") and h["leaf"] != h["site"]:
                line += f"  → {h['leaf']}"
            console.print(_indent(Text(line, style="dim"), 5))
        fix = f.get("fix") or {}
        if fix.get("text"):
            console.print(_indent(Text.assemble(("Fix: ", "bold green"), fix["text"]), 3))
        if fix.get("code"):
            _print_whole(console, Text(fix["code"], style="cyan"), 5)
        options = fix.get("options") or []
        if options and options[0].get("condition"):
            console.print(_indent(Text(f"(grows: {options[0]['condition']})", style="dim"), 5))
        for o in options[1:]:
            console.print(_indent(Text.assemble(("Or: ", "bold"), o["text"], (f"  ({option_gain(o)})", "dim")), 3))
            if o.get("code"):
                _print_whole(console, Text(o["code"], style="cyan"), 5)
        console.print()
    notes = report.get("notes") or []
    if notes:
        table = Table.grid(padding=(0, 1))
        for note in notes:
            table.add_row("[dim]note[/]", Text(note, style="dim"))
        console.print(table)
    if run.get("html"):
        _print_whole(console, Text(f"HTML report: {run['html']}", style="dim"))
    if run.get("timeline"):
        _print_whole(console, Text(f"timeline (ui.perfetto.dev, chrome://tracing): {run['timeline']}", style="dim"))
    nodes = run.get("run_dirs") or []
    if len(nodes) > 1:  # a merge of node runs: re-rendered from all of them
        again = " ".join(shlex.quote(d) for d in nodes) if len(nodes) <= 4 else f"<the same {len(nodes)} node runs>"
        _print_whole(console, Text(f"node runs: {len(nodes)}, described: {run.get('run_dir')}  "
                                   f"(re-render: whyidle report {again})", style="dim"))
    elif run.get("run_dir"):
        _print_whole(console, Text(f"run directory: {run['run_dir']}  (re-render: whyidle report {run['run_dir']})",
                                   style="dim"))
