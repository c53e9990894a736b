"""The ``%%whyidle`` cell magic: ``%load_ext whyidle``, then ``%%whyidle [options]`` on a cell.

The cell's body runs in the kernel as it would without the magic (the user's namespace, its last
expression's value as the cell's result, its exceptions and ``KeyboardInterrupt`` raised
unchanged), inside a :class:`whyidle.run.watch.Watch`: the hooks go in for the cell and come out
after it, whatever way it ends; the cell's output is :mod:`whyidle.run.cell_output`'s.

Body lines are cell lines shifted by one (the ``%%whyidle`` line): the body's file is registered
with its cell number and offset (:func:`whyidle.instrument.cells.note_offset`) so that findings
name ``cell N, line L`` of what the user sees.
"""

from __future__ import annotations

import ast
import shlex

from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from whyidle.run.watch import Watch


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
        options["name"] = options["name"] or f"cell{number}"
        w = Watch(**options, command=["%%whyidle", *shlex.split(line)])
        shell.user_ns["_whyidle"] = w  # _whyidle.report, _whyidle.run_dir after the cell
        code, last = _compile(shell, cell, number)
        __tracebackhide__ = True  # IPython shows the cell's frames of a traceback, not this one
        with w:  # in a kernel its output is the cell's (whyidle.run.cell_output)
            exec(code, shell.user_ns)
            return eval(last, shell.user_ns) if last is not None else None


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
    or None)``. Errors: ``SyntaxError`` (shown by IPython as for any cell)."""
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
    return shell.compile(tree, filename, "exec"), last


def load_ipython_extension(ipython) -> None:
    """Registers :class:`WhyidleMagics` (``%load_ext whyidle``)."""
    ipython.register_magics(WhyidleMagics)
