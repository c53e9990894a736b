"""The ``%%whyidle`` cell magic: ``%load_ext whyidle``, then ``%%whyidle [options]`` on a cell.

The cell's body runs in the kernel as it would without the magic (the user's namespace, its last
expression's value as the cell's result, its exceptions and ``KeyboardInterrupt`` raised
unchanged), inside a :class:`whyidle.run.watch.Watch`: the hooks go in for the cell and come out
after it, whatever way it ends. The cell's output shows a live status line while it runs
(updated in place: ``display_id``), then the report as the terminal shows it (rich text, with a
plain-text copy) and the HTML report inline: an ``<iframe srcdoc=...>`` holding the
self-contained page (no server, no file URL: JupyterLab, classic Notebook, VS Code), the page
itself on Colab (whose outputs are their own frames and drop a raw ``<iframe>``), and a
plain-text line with the page's path where HTML is not rendered.

Body lines are cell lines shifted by one (the ``%%whyidle`` line): the body's file is registered
with its cell number and offset (:func:`whyidle.instrument.cells.note_offset`) so that findings
name ``cell N, line L`` of what the user sees.
"""

from __future__ import annotations

import ast
import base64
import gzip
import html
import io
import json
import os
import shlex
import sys

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.display import display

from whyidle.run.watch import Watch

#: Characters of the report's terminal view (the notebook's output area is about this wide).
REPORT_WIDTH = 100
#: Height in pixels of the inline HTML report's frame (it scrolls inside).
FRAME_HEIGHT_PX = 720


class UsageError(IPythonUsageError):
    """Bad ``%%whyidle`` options: IPython shows it as one ``UsageError:`` line, no traceback, and the
    cell ends in error without running (a "Run All" stops there)."""


def parse_options(line: str) -> dict:
    """``%%whyidle`` options → :class:`Watch` keyword arguments: ``--name N``, ``--out DIR``,
    ``--stack-hz HZ``, ``--interval S``, ``--no-html``, ``--json FILE``, ``-q/--quiet`` (no live
    status, no report in the output: ``_whyidle.report`` still has it).
    Errors: :class:`UsageError` with one line."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # argparse would exit the kernel
            raise UsageError(f"%%whyidle: {message}")

    p = Parser(prog="%%whyidle", add_help=False)
    p.add_argument("--name")
    p.add_argument("--out")
    p.add_argument("--stack-hz", type=float, default=100.0)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--no-html", action="store_true")
    p.add_argument("--json")
    p.add_argument("-q", "--quiet", action="store_true")
    try:
        args = p.parse_args(shlex.split(line))
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"%%whyidle: {exc}") from None
    if args.stack_hz < 0 or args.interval <= 0:
        raise UsageError("%%whyidle: --stack-hz must be ≥ 0 and --interval > 0")
    return {"name": args.name, "out": args.out, "stack_hz": args.stack_hz, "interval_s": args.interval,
            "html": not args.no_html, "json_path": args.json, "quiet": args.quiet}


@magics_class
class WhyidleMagics(Magics):
    """``%%whyidle``: observe the cell and show why the device waited (see the module docstring)."""

    @cell_magic
    def whyidle(self, line: str, cell: str):
        options = parse_options(line)
        shell = self.shell
        number = cell_number(shell)
        quiet = options.pop("quiet")
        live = None if quiet else display({"text/plain": "[whyidle] starting…"}, raw=True, display_id=True)
        options["name"] = options["name"] or f"cell{number}"
        w = Watch(**options, quiet=True, live=(lambda text: live.update({"text/plain": text}, raw=True)) if live else None,
                  command=["%%whyidle", *shlex.split(line)])
        shell.user_ns["_whyidle"] = w  # _whyidle.report, _whyidle.run_dir after the cell
        code, last, filename = _compile(shell, cell, number)
        w.start()
        try:
            exec(code, shell.user_ns)
            result = eval(last, shell.user_ns) if last is not None else None
        except BaseException as exc:
            w.stop(exc)
            _show(w, live, quiet)
            raise exc.with_traceback(_from_cell(exc.__traceback__, filename))
        w.stop()
        _show(w, live, quiet)
        return result


def cell_number(shell) -> int:
    """The running cell's execution count (``In [N]``): the one IPython gave the cell being run
    (its ``ExecutionResult``; IPython ≥ 9 counts the next cell from the start of this one), else
    the shell's counter."""
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    number = getattr(result, "execution_count", None)
    return number if isinstance(number, int) else shell.execution_count


def _compile(shell, cell: str, number: int):
    """The body compiled as IPython compiles a cell (its input transformations, its file name in
    ``linecache`` for tracebacks): ``(code of all but a last expression, that expression's code
    or None, the file name)``. Errors: ``SyntaxError`` (shown by IPython as for any cell)."""
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, number, raw_code=cell)
    try:
        from whyidle.instrument import cells

        cells.note_offset(filename, number, 1, cell)  # body line 1 is the cell's line 2
    except Exception:
        pass
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = shell.compile(ast.Expression(tree.body.pop().value), filename, "eval")
    return shell.compile(tree, filename, "exec"), last, filename


def _from_cell(tb, filename: str):
    """The traceback from the cell's own first frame on (the magic's frames left out)."""
    t = tb
    while t is not None and t.tb_frame.f_code.co_filename != filename:
        t = t.tb_next
    return t or tb


def _show(w: Watch, live, quiet: bool) -> None:
    """The report in the cell's output: the live line replaced by the terminal view, then the
    HTML report inline (see the module docstring)."""
    if quiet:
        return
    if w.report is None:
        text = f"[whyidle] {w.problem or 'no report'}"
        (live.update if live else display)({"text/plain": text}, raw=True)
        return
    bundle = terminal_bundle(w.report)
    if live is not None:
        live.update(bundle, raw=True)
    else:
        display(bundle, raw=True)
    page = os.path.join(w.run_dir, "report.html")
    if w.opts.html and os.path.exists(page):
        with open(page, encoding="utf-8") as f:
            display(inline_page(f.read(), page), raw=True)


def terminal_bundle(report: dict) -> dict:
    """The terminal view of ``report`` as a display bundle: ``text/html`` (rich's HTML export,
    colours inline) and ``text/plain``."""
    from rich.console import Console

    from whyidle.report import terminal

    console = Console(file=io.StringIO(), record=True, width=REPORT_WIDTH, highlight=False, soft_wrap=False,
                      force_terminal=False, force_jupyter=False)
    terminal.render(report, console=console)
    plain = console.export_text(clear=False)
    page = console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace;"
                               "font-size:12px;line-height:1.35;white-space:pre\">{code}</pre>")
    return {"text/plain": plain, "text/html": page}


def inline_page(page: str, path: str) -> dict:
    """The HTML report ``page`` (self-contained) as a display bundle for the notebook's output.

    In an ``<iframe srcdoc>`` (its scripts and styles apart from the notebook's), the page
    gzip-compressed and base64-encoded (5.6 MB of escaped page → 2 MB in the notebook file),
    decompressed by the browser (``DecompressionStream``: Chromium ≥ 80, so VS Code, Firefox ≥ 113,
    Safari ≥ 16.4) and written into the frame; a browser without it shows where the page is. On
    Colab (whose outputs are frames of their own and drop a raw ``<iframe>``) the page itself.
    ``text/plain`` names ``path`` for front ends that render no HTML."""
    plain = f"whyidle HTML report: {path}"
    if "google.colab" in sys.modules:
        return {"text/html": page, "text/plain": plain}
    packed = base64.b64encode(gzip.compress(page.encode("utf-8"), 9)).decode("ascii")
    loader = (
        "<!doctype html><meta charset=utf-8><body><p id=whyidle-wait>whyidle report: loading…</p><script>"
        f"const packed='{packed}';"
        "(async()=>{try{const bytes=Uint8Array.from(atob(packed),c=>c.charCodeAt(0));"
        "const text=await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'))).text();"
        "document.open();document.write(text);document.close();}catch(e){"
        f"document.getElementById('whyidle-wait').textContent={json.dumps('this browser cannot open the inline report: open ' + path)};"
        "}})();</script>")
    frame = (f'<iframe srcdoc="{html.escape(loader, quote=True)}" title="whyidle report" '
             f'style="width:100%;height:{FRAME_HEIGHT_PX}px;border:1px solid #ddd" '
             'sandbox="allow-scripts allow-popups allow-downloads"></iframe>')
    return {"text/html": frame, "text/plain": plain}


def load_ipython_extension(ipython) -> None:
    """Registers :class:`WhyidleMagics` (``%load_ext whyidle``)."""
    ipython.register_magics(WhyidleMagics)
