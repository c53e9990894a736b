"""``whyidle demo``: diagnose a beginner's image pipeline on real photos, apply the fix, compare.

Both runs go through :func:`whyidle.run.session.observe`, the code path of ``whyidle run``: the
training script (:mod:`whyidle.demo.train`) is an ordinary PyTorch program that knows nothing
about whyidle. The fix applied in the second run is the one the first run's report recommends.
"""

from __future__ import annotations

import datetime as dt
import os
import sys

from rich.console import Console
from rich.table import Table

from whyidle.run.launcher import LaunchError


def _row(report: dict) -> dict:
    m = report.get("metrics") or {}
    return {
        "samples_per_s": m.get("samples_per_s"),
        "step_p50": (m.get("step_time_s") or {}).get("p50"),
        "data_wait": (m.get("shares") or {}).get("data_wait"),
        "verdict": report.get("verdict"),
    }


def comparison_table(before: dict, after: dict) -> tuple[Table, str]:
    """The before/after table and a one-line statement of the measured change."""
    b, a = _row(before), _row(after)
    table = Table(title="before / after (measured, steady-state steps)", title_justify="left")
    for col in ("", "beginner (num_workers=0)", "with the fix", "change"):
        table.add_column(col, justify="right" if col else "left")

    def ratio(x, y):
        return f"{y / x:.2f}×" if x and y else "n/a"

    table.add_row("samples/s", f"{b['samples_per_s']:.1f}", f"{a['samples_per_s']:.1f}", ratio(b["samples_per_s"], a["samples_per_s"]))
    table.add_row("step time p50", f"{b['step_p50'] * 1000:.1f} ms", f"{a['step_p50'] * 1000:.1f} ms",
                  f"{(a['step_p50'] / b['step_p50'] - 1) * 100:+.0f} %")
    table.add_row("data-wait share", f"{b['data_wait']:.0%}", f"{a['data_wait']:.0%}",
                  f"{(a['data_wait'] - b['data_wait']) * 100:+.0f} pt")
    table.add_row("verdict", b["verdict"], a["verdict"], "")
    speed = a["samples_per_s"] / b["samples_per_s"]
    line = (f"The fixed pipeline trains {speed:.2f}× {'faster' if speed >= 1 else 'slower'} "
            f"({b['samples_per_s']:.0f} → {a['samples_per_s']:.0f} samples/s); "
            f"data wait {b['data_wait']:.0%} → {a['data_wait']:.0%} of each step.")
    return table, line


def run_demo(out_dir: str = "whyidle-runs", data_dir: str | None = None, steps: int = 100, stream=None) -> int:
    """Runs the demo and returns the exit code (0 on success).

    Args:
        out_dir: parent of the two run directories.
        data_dir: image folder cache (default :func:`whyidle.demo.data.default_dir`).
        steps: training steps per run.
        stream: output (default stdout).
    """
    from whyidle.demo.data import ensure_images
    from whyidle.report import terminal
    from whyidle.run.session import RunOptions, observe

    stream = stream or sys.stdout
    console = Console(file=stream, highlight=False)
    console.rule("[bold]whyidle demo[/]")
    try:
        root, count = ensure_images(data_dir)
    except ImportError as exc:
        console.print(f"whyidle: the demo needs Pillow and scikit-learn ({exc}); pip install 'whyidle[demo]'")
        return 2
    console.print(f"Training data: {count} JPEG crops of the two photographs scikit-learn ships, in {root}.\n"
                  "The training script decodes and augments every image with Pillow in its Dataset, the way a "
                  "beginner writes it, and trains a small CNN.\n")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = [sys.executable, "-m", "whyidle.demo.train", "--data", root, "--steps", str(steps)]

    console.print("[bold]1/2[/] as written (num_workers=0), under whyidle run:")
    try:
        before, status, before_dir = observe(base + ["--workers", "0"],
                                             RunOptions(out=os.path.join(out_dir, f"{stamp}-demo-before"),
                                                        name="demo-before"), stream=stream)
    except LaunchError as exc:
        console.print(f"whyidle: {exc}")
        return exc.exit_code
    if status.exit_code != 0 or before is None:
        console.print(f"whyidle: the demo training run failed ({status}).")
        return 1
    finding = next((f for f in before["findings"] if f["id"] == "input_bound"), None)
    if finding is None:
        console.print(f"\nwhyidle did not find this pipeline input-bound here (verdict: {before['verdict']}), "
                      "so there is no loader fix to try. Reports are in " + before_dir)
        return 0
    workers = int(finding["evidence"]["suggested_num_workers"])
    fix = ["--workers", str(workers), "--persistent-workers", "--prefetch-factor", "4"]
    on_cuda = (before.get("device") or {}).get("kind") == "cuda"
    if on_cuda:
        fix.append("--pin-memory")
    console.print(f"\n[bold]2/2[/] with the fix from the report: num_workers={workers}, persistent_workers=True, "
                  f"prefetch_factor=4{', pin_memory=True' if on_cuda else ''}:")
    after, status, after_dir = observe(base + fix, RunOptions(out=os.path.join(out_dir, f"{stamp}-demo-after"),
                                                               name="demo-after", show_report=False), stream=stream)
    if status.exit_code != 0 or after is None:
        console.print(f"whyidle: the fixed training run failed ({status}).")
        return 1
    terminal.render_brief(after, file=stream)
    table, line = comparison_table(before, after)
    console.print()
    console.print(table)
    console.print(f"[bold]{line}[/]")
    console.print(f"[dim]runs: {before_dir}  {after_dir}[/]")
    return 0
