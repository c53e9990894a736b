"""``whyidle demo``: diagnose a beginner's image pipeline on real photos, apply the fix, compare.

Both runs go through :func:`whyidle.run.session.observe`, the code path of ``whyidle run``: the
training script (:mod:`whyidle.demo.train`) is an ordinary PyTorch program that knows nothing
about whyidle (it reports its validation accuracy with ``whyidle.log_metric``, a no-op without
whyidle). The fix applied in the second run is the one the first run's report recommends; the demo
ends with ``whyidle compare`` of the two runs.
"""

from __future__ import annotations

import datetime as dt
import os
import sys

from rich.console import Console

from whyidle.run.launcher import LaunchError


def run_demo(out_dir: str = "whyidle-runs", data_dir: str | None = None, steps: int = 100, stream=None) -> int:
    """Runs the demo and returns the exit code (0 on success).

    Args:
        out_dir: parent of the two run directories.
        data_dir: image folder cache (default :func:`whyidle.demo.data.default_dir`).
        steps: training steps per run.
        stream: output (default stdout).
    """
    from whyidle.demo.data import ensure_images
    from whyidle.pipeline import compare as compare_runs
    from whyidle.report import compare_terminal, terminal
    from whyidle.report.compare import CompareError
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
    console.print("\n[bold]Before / after[/], measured (whyidle compare on the two run directories):")
    try:
        result = compare_runs([before_dir, after_dir])
    except CompareError as exc:
        console.print(f"whyidle: {exc}")
        return 1
    compare_terminal.render(result, file=stream)
    console.print(f"[dim]HTML reports: {os.path.join(before_dir, 'report.html')}  "
                  f"{os.path.join(after_dir, 'report.html')}[/]")
    return 0
