"""Notebook cells in a run's records: the kernel's made-up cell files renamed ``cell N`` (pure).

A Jupyter kernel runs each cell's code under a temporary file name
(``/tmp/ipykernel_<pid>/<hash>.py``) that no longer exists when the run is read; the agent
writes a ``cell`` record per such file (``file``, ``cell`` = the execution count ``N``,
``offset``, ``source``) and a ``notebook`` record when the kernel knows its notebook
(:mod:`whyidle.instrument.cells`, docs/run-format.md). :func:`name_cells`, called once when a run
directory is read (:func:`whyidle.record.reader.load_run`), rewrites every site of such a file in
that process's records, ``"<file>:<line> <function>"``, into ``"<label>:<line + offset>
<function>"`` with the label ``"<notebook>.ipynb cell N"`` (``"cell N"`` when the notebook is
unknown), and keeps the cells' text for :func:`cell_line` (the code shown beside a site). A
process without ``cell`` records is left untouched at the cost of one pass over its record kinds.

The notebook's name comes from the process's ``notebook`` record, else from the run's command when
it executes one notebook (:func:`notebook_of_command`).
"""

from __future__ import annotations

import dataclasses
import os
import re

#: Record kinds this module reads (written by :mod:`whyidle.instrument.cells`).
CELL_KIND, NOTEBOOK_KIND = "cell", "notebook"

#: Options of ``jupyter nbconvert`` / ``jupyter execute`` / papermill whose value is the next
#: argument and may end in ``.ipynb`` (an output name): that argument is not an input notebook.
VALUE_OPTIONS = frozenset({"--output", "--output-dir", "--output_dir", "-o", "--template", "--template-file",
                           "--config", "--cwd", "-f", "--parameters_file", "-y", "--parameters_yaml", "-b",
                           "--parameters_base64", "-k", "--kernel", "-l", "--language", "--log-level",
                           "--request-save-on-cell-execute", "--autosave-cell-every", "--execution-timeout",
                           "--start-timeout", "--start_timeout"})

#: papermill's options that take two values (``-p NAME VALUE``).
PAIR_OPTIONS = frozenset({"-p", "--parameters", "-r", "--parameters_raw"})

#: Modules run with ``python -m`` that execute notebooks (``python -m jupyter nbconvert ...``).
_MODULES = {"jupyter": None, "nbconvert": "nbconvert", "papermill": "papermill"}
_JUPYTER_SUBCOMMANDS = ("nbconvert", "execute")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One cell file of a kernel process.

    Attributes:
        label: what sites name it by (``"train.ipynb cell 5"``, ``"cell 5"``).
        offset: cell lines before the file's first line (1 under the ``%%whyidle`` magic).
        lines: the cell's text as cell lines (line L is ``lines[L - 1]``; the ``offset`` lines
            before the file's own are empty), or None when not recorded.
    """

    label: str
    offset: int
    lines: tuple[str, ...] | None


def notebook_of_command(command) -> str | None:
    """The one notebook a command executes: ``jupyter nbconvert ... X.ipynb``,
    ``jupyter execute X.ipynb`` (also as ``jupyter-nbconvert``, ``python -m nbconvert``,
    ``python -m jupyter nbconvert``), ``papermill IN.ipynb OUT.ipynb`` (the first). Returns the
    argument as given (a path), or None for any other command, or when it names no input notebook
    or several (each runs in its own kernel: which is which is not known)."""
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        return None
    base, args = os.path.basename(command[0]), list(command[1:])
    if base.startswith("python"):
        i = next((j for j, a in enumerate(args) if not a.startswith("-") or a == "-m"), None)
        if i is None or args[i] != "-m" or i + 1 >= len(args) or args[i + 1] not in _MODULES:
            return None
        base, args = _MODULES[args[i + 1]] or "jupyter", args[i + 2:]
    if base == "jupyter":
        if not args or args[0] not in _JUPYTER_SUBCOMMANDS:
            return None
        base, args = f"jupyter-{args[0]}", args[1:]
    if base in ("jupyter-nbconvert", "nbconvert", "jupyter-execute"):
        found = _inputs(args)
        return found[0] if len(found) == 1 else None
    if base == "papermill":
        found = _inputs(args)
        return found[0] if found else None
    return None


def _inputs(args: list[str]) -> list[str]:
    """The ``.ipynb`` arguments that are not an option's value."""
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
            continue
        if a in PAIR_OPTIONS:
            skip = 2
        elif a in VALUE_OPTIONS or (a.startswith("--") and "." in a and "=" not in a):
            skip = 1  # a traitlets ``--Class.trait VALUE``
        elif not a.startswith("-") and a.endswith(".ipynb"):
            out.append(a)
    return out


def cells_of(records: list[dict], notebook: str | None = None) -> dict[str, Cell]:
    """``{cell file as sites name it: Cell}`` from one process's ``cell`` records; the label is
    prefixed with the notebook's file name (the process's ``notebook`` record's, else
    ``notebook``, e.g. from :func:`notebook_of_command`). A file recorded twice keeps its last
    record (the ``%%whyidle`` magic's offset arrives after the plain record). Two files of one cell
    (the magic's cell and its body) share the label; the text of the one with the larger offset is
    kept (:func:`register`). Records with unusable values are skipped."""
    nb = next((r["path"] for r in records if r.get("k") == NOTEBOOK_KIND and isinstance(r.get("path"), str)
               and r["path"]), None) or notebook
    prefix = f"{os.path.basename(nb.rstrip('/'))} " if nb else ""
    out: dict[str, Cell] = {}
    for r in records:
        if r.get("k") != CELL_KIND:
            continue
        file, number, offset, source = r.get("file"), r.get("cell"), r.get("offset") or 0, r.get("source")
        if not isinstance(file, str) or not file or not _is_int(number) or not _is_int(offset) or offset < 0:
            continue
        lines = None
        if isinstance(source, str):
            lines = ("",) * offset + tuple(source.splitlines())
        out[file] = Cell(label=f"{prefix}cell {number}", offset=offset, lines=lines)
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def rename(records: list[dict], cells: dict[str, Cell]) -> int:
    """Rewrites, in place, every string in ``records`` (values and keys, at any depth) that
    starts with a file of ``cells`` followed by ``:<line>``: ``"<file>:<line><rest>"`` →
    ``"<label>:<line + offset><rest>"``; an object holding the site split as ``file`` (a cell file)
    and an integer ``line`` (``compile_frame``) gets the label and the shifted line. ``cell`` and
    ``notebook`` records are left as they are. Returns how many sites were rewritten."""
    if not cells:
        return 0
    files = sorted(cells, key=len, reverse=True)  # a longer name first: no prefix of it matches
    pattern = re.compile("(" + "|".join(map(re.escape, files)) + r"):(\d+)")
    starts = tuple(files)
    count = [0]

    def site(s: str) -> str:
        m = pattern.match(s)
        if m is None:
            return s
        cell = cells[m.group(1)]
        count[0] += 1
        return f"{cell.label}:{int(m.group(2)) + cell.offset}{s[m.end():]}"

    def walk(obj):
        if isinstance(obj, str):
            return site(obj) if obj.startswith(starts) else obj
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, (str, list, dict)):
                    new = walk(v)
                    if new is not v:
                        obj[i] = new
            return obj
        if isinstance(obj, dict):
            for key in [k for k in obj if isinstance(k, str) and k.startswith(starts)]:
                obj[site(key)] = obj.pop(key)
            cell = cells.get(obj.get("file")) if isinstance(obj.get("file"), str) else None
            if cell is not None and _is_int(obj.get("line")):  # a split site (``compile_frame``)
                obj["file"], obj["line"] = cell.label, obj["line"] + cell.offset
                count[0] += 1
            for key, v in obj.items():
                if isinstance(v, (str, list, dict)):
                    new = walk(v)
                    if new is not v:
                        obj[key] = new
        return obj

    for rec in records:
        if rec.get("k") not in (CELL_KIND, NOTEBOOK_KIND):
            walk(rec)
    return count[0]


#: (the run's working directory, label) → the cell's lines, filled by :func:`register`.
_SOURCES: dict[tuple[str | None, str], tuple[str, ...]] = {}


def register(root: str | None, cells: dict[str, Cell]) -> None:
    """Keeps the cells' text for :func:`cell_line` under ``root`` (the run's working directory,
    ``meta.json`` ``cwd``, as the analysis passes it along with sites). Of two files of one label
    the one with the larger offset wins (the ``%%whyidle`` body over the magic's call)."""
    best: dict[str, Cell] = {}
    for cell in cells.values():
        if cell.lines is not None and cell.offset >= getattr(best.get(cell.label), "offset", -1):
            best[cell.label] = cell
    for label, cell in best.items():
        _SOURCES[(root, label)] = cell.lines


def cell_line(label: str, line: int, root: str | None) -> str | None:
    """The text of line ``line`` (1-based, in the cell) of the cell ``label`` of the run whose
    working directory is ``root``, stripped (``""`` for a blank line); None when no such cell was
    read (:func:`name_cells`) or the line is past its recorded text."""
    lines = _SOURCES.get((root, label))
    if lines is None or not 1 <= line <= len(lines):
        return None
    return lines[line - 1].strip()


def cell_text(label: str, root: str | None) -> str | None:
    """The whole recorded text of the cell ``label`` (its lines, numbered as in the cell), or None."""
    lines = _SOURCES.get((root, label))
    return None if lines is None else "\n".join(lines) + "\n"


def name_cells(meta: dict, procs: dict[int, list[dict]]) -> None:
    """Renames the cell sites of every process of a run, in place (module docstring), and keeps
    the cells' text for :func:`cell_line`. ``meta``: ``meta.json`` (``command`` names the
    notebook when the process does not; ``cwd`` keys the text)."""
    notebook = None
    for records in procs.values():
        if not any(r.get("k") == CELL_KIND for r in records):
            continue
        if notebook is None:
            notebook = notebook_of_command(meta.get("command")) or ""
        cells = cells_of(records, notebook or None)
        rename(records, cells)
        register(meta.get("cwd"), cells)
