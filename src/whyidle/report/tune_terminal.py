"""Terminal rendering of ``whyidle tune``: the live progress of the trials and the ranked table
of a ``whyidle.tune/1`` result (rich)."""

from __future__ import annotations

import time
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

#: Width of the output when it is not a terminal (characters).
TABLE_WIDTH = 150
_STATUS = {"ok": "", "failed": "failed", "oom": "out of memory", "memory": "memory ceiling", "no_steps": "no steps",
           "interrupted": "interrupted", "skipped": "skipped (budget)"}


def _x(v) -> str:
    return "—" if v is None else f"{v:.2f}×"


def _ci(ci, fmt=lambda v: f"{v:.2f}") -> str:
    return f" [{fmt(ci[0])}–{fmt(ci[1])}]" if ci else ""


def _rate(v) -> str:
    return "—" if v is None else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


class Progress:
    """Live progress on stderr: one line per finished trial; on a terminal, a status line for the
    running one (trial k of n, steps, elapsed / budget), redrawn once a second."""

    def __init__(self, file: IO | None = None) -> None:
        import sys

        self.console = Console(file=file or sys.stderr, highlight=False)
        if not self.console.is_terminal:  # a log file: one line per trial, not wrapped at 80 columns
            self.console.width = TABLE_WIDTH
        self.status = None
        self.t_tune = time.monotonic()
        self.text = ""

    def start(self, k: int, n: int, label: str, budget_s: float | None, elapsed_s: float | None) -> None:
        self.k, self.n, self.label, self.budget = k, n, label, budget_s
        self.t0 = time.monotonic()
        self.text = f"trial {k}: {label}"
        if self.console.is_terminal:
            self.status = self.console.status(escape(self.text))
            self.status.start()

    def tick(self, steps: int, steady: int) -> None:
        if self.status is None:
            return
        used = time.monotonic() - self.t_tune
        budget = f" · {used:.0f} of {self.budget:.0f} s" if self.budget else ""
        self.status.update(escape(f"{self.text} · {steps} steps ({steady} steady) · {time.monotonic() - self.t0:.0f} s"
                                  + budget))

    def done(self, trial, outcome) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        if trial is None and outcome is None:
            return
        secs = f"{trial.seconds:.0f} s" if trial else ""
        if outcome is None:  # a baseline run
            rep = (trial.report or {}) if trial else {}
            sps = (rep.get("metrics") or {}).get("samples_per_s")
            line = (f"  {escape(self.text)}: {_rate(sps)} samples/s, verdict {rep.get('verdict')} ({secs})"
                    if trial and trial.status == "ok" else
                    f"  {escape(self.text)}: {_STATUS.get(trial.status if trial else 'skipped')} ({secs})"
                    + (f": {escape(trial.detail)}" if trial and trial.detail else ""))
        elif outcome.status == "ok":
            word = {"faster": "[green]faster[/]", "slower": "[red]slower[/]"}.get(outcome.claim, "no measurable change")
            line = (f"  {escape(self.text)}: {_x(outcome.ratio)}{_ci(outcome.ci)} {word}"
                    + (f" ({secs})" if secs else ""))
        else:
            line = (f"  {escape(self.text) if trial else 'trial: ' + escape(outcome.candidate.settings.__repr__())}: "
                    f"{_STATUS.get(outcome.status, outcome.status)}" + (f" ({secs})" if secs else "")
                    + (f": {escape(trial.detail)}" if trial and trial.detail else ""))
        self.console.print(line)

    def say(self, text: str) -> None:
        self.console.print(f"  [yellow]note[/]: {escape(text)}")


def render(res: dict, file: IO | None = None) -> None:
    """The ranked table, the winner's code change and the notes."""
    import sys

    console = Console(file=file or sys.stdout, highlight=False)
    if not console.is_terminal:  # a pipe or a file: wide enough for the table, not 80 columns
        console.width = TABLE_WIDTH
    base = res["baseline"]
    console.rule("[bold]whyidle tune[/]")
    console.print(f"Baseline (as written): {_rate(base['samples_per_s'])} samples/s{_ci(base['ci'], _rate)}, "
                  f"verdict {base['verdict']}; {len(res['trials'])} trial(s) in {res['elapsed_s']:.0f} s of a "
                  f"{res['budget_s']:.0f} s budget ({res['tune_dir']})")
    if res["trials"]:
        table = Table(title_justify="left", caption_justify="left",
                      caption="ratio: throughput over the baseline's, in brackets its 95 % bootstrap CI; "
                              "predicted: the diagnosis' estimate for that fix")
        for name, just in (("#", "right"), ("setting", "left"), ("samples/s", "right"), ("ratio", "right"),
                           ("data wait", "right"), ("verdict", "left"), ("applied", "left"), ("predicted", "right")):
            table.add_column(name, justify=just)
        for i, t in enumerate(res["trials"], 1):
            applied = ", ".join(f"{k} {'no' if v is False else 'partly' if v == 'partial' else 'yes'}"
                                for k, v in t["applied"].items() if v is not True) or ("yes" if t["applied"] else "—")
            ratio = (_x(t["ratio"]) + _ci(t["ratio_ci"]) + {"faster": " ▲", "slower": " ▼"}.get(t["claim"], " n.s.")
                     if t["status"] == "ok" else _STATUS.get(t["status"], t["status"]))
            table.add_row(str(i), escape(t["label"]), _rate(t["samples_per_s"]) + _ci(t["ci"], _rate), ratio,
                          "—" if t["data_wait_share"] is None else f"{t['data_wait_share']:.0%}",
                          escape(str(t["verdict"] or "—")), escape(applied), _x(t["predicted"]))
        console.print(table)
    win = res["winner"]
    if win:
        console.print(f"\n[bold]Best: {escape(win['label'])}[/] — {_x(win['ratio'])}{_ci(win['ci'])} the baseline's "
                      "throughput. The change to make:")
        console.print(escape(win["code"]), style="cyan")
        if win.get("statement"):
            console.print(escape(win["statement"]))
    batch = res.get("batch")
    if batch and batch.get("largest_stable"):
        console.print(f"\nBatch size: largest that ran {batch['largest_stable']}"
                      + (f", fastest {batch['fastest']}" if batch.get("fastest") else "")
                      + (f"; failed at {', '.join(map(str, batch['failed']))}" if batch.get("failed") else "")
                      + ("; the budget ended the ladder while samples/s still rose (a larger --budget goes on)"
                         if batch.get("budget_ended") else "")
                      + f". {escape(batch['note'])}")
    if res["estimates"]:
        console.print("\nEstimates checked: " + "; ".join(
            f"{e['finding']} predicted {_x(e['predicted'])}, measured {_x(e['measured'])}" for e in res["estimates"]))
    ceiling = res.get("input_ceiling")
    if ceiling and ceiling.get("status") == "ok":
        held = "; ".join(f"{escape(f['label'])} {_x(f['ratio'])}"
                         + (f" ({f['of_ceiling']:.0%} of the reachable gain)" if f.get("of_ceiling") is not None else "")
                         for f in ceiling["fixes"])
        console.print(f"\nInput ceiling (the DataLoader out of the step, its first batches replayed): "
                      f"{_x(ceiling['ratio'])}{_ci(ceiling['ci'])}"
                      + (f", estimated {_x(ceiling['predicted'])}" if ceiling.get("predicted") else "")
                      + (f". Input fixes against it: {held}" if held else "") + ".")
    for c in res.get("code_fixes") or []:
        est = f"est. {_x(c['est_speedup'])}" if c.get("est_speedup") else "no estimate"
        console.print(f"\nNot tried — the fix needs code: [bold]{escape(c['finding'])}[/] ({c['severity']}, {est}): "
                      f"{escape(c.get('fix') or c.get('title') or '')}")
    val = res.get("validation")
    if val:
        comp = val.get("comparison")
        console.print("\nValidation (full runs): " + escape(comp["comparisons"][0]["statement"] if comp else val["status"]))
    for n in res["notes"]:
        console.print(f"[dim]note:[/] {escape(n)}")
