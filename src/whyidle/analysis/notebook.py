"""The trainer ran in a notebook kernel; the start method its DataLoader's workers use (pure).

A notebook changes what some fixes must say (:mod:`whyidle.diagnose.notebook`): a class defined in
a cell lives in the kernel's ``__main__``, which workers started with ``spawn`` or ``forkserver``
cannot import; a kernel keeps its objects and its settings (``torch.set_num_threads``) from cell to
cell. :func:`notebook_facts` says whether the trainer's records come from a kernel (its ``cell``
records, :mod:`whyidle.record.cells`) and where the training loader's Dataset class is defined;
:func:`worker_start` says which start method the workers use and what decided it.
"""

from __future__ import annotations

import re

from whyidle.analysis.facts import NotebookFacts, WorkerStart
from whyidle.record import cells as cell_records

#: The start methods whose workers import the dataset's class by name (they unpickle it in a fresh
#: interpreter) instead of inheriting the parent's memory (``fork``).
IMPORTING_METHODS = ("spawn", "forkserver")


def default_start_method(platform: str | None, python: str | None) -> str | None:
    """The start method ``multiprocessing`` uses when the program chooses none, by platform
    (``sys.platform``) and Python version (``"3.11.7"``), from the Python documentation
    (library/multiprocessing.html, "Contexts and start methods"): ``spawn`` on Windows and, since
    Python 3.8, on macOS; on other POSIX platforms ``fork`` before Python 3.14 and ``forkserver``
    from 3.14 on ("Changed in version 3.14: On POSIX platforms the default start method was changed
    from fork to forkserver"; macOS keeps spawn). None when the platform, or the version a platform
    needs, is unknown."""
    if not isinstance(platform, str) or not platform:
        return None
    if platform == "win32":
        return "spawn"
    version = _version(python)
    if platform == "darwin":
        return "spawn" if version is None or version >= (3, 8) else "fork"
    if version is None:
        return None
    return "forkserver" if version >= (3, 14) else "fork"


def _version(python) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", python) if isinstance(python, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def worker_start(loader: dict | None, proc: dict | None) -> WorkerStart | None:
    """The start method of the training DataLoader's workers (whether or not it has any) and its
    ``source``: ``"loader"`` (its ``multiprocessing_context``), ``"program"`` (the program fixed it:
    ``multiprocessing.set_start_method``, read with ``allow_none=True``), ``"default"`` (the
    platform's, :func:`default_start_method`); ``method`` None when unknown (a run recorded before
    the ``platform`` field). ``platform`` and ``python`` as recorded. None without a loader."""
    if not loader:
        return None
    platform, python = loader.get("platform"), (proc or {}).get("python")
    for source, method in (("loader", loader.get("mp_context")), ("program", loader.get("start_method_set"))):
        if isinstance(method, str) and method:
            return WorkerStart(method=method, source=source, platform=platform, python=python)
    return WorkerStart(method=default_start_method(platform, python), source="default", platform=platform,
                       python=python)


def notebook_facts(recs: list[dict], meta: dict | None, loader: dict | None) -> NotebookFacts | None:
    """None unless the trainer's records hold ``cell`` records (it ran in an IPython kernel: a
    notebook, ``%%whyidle``, a notebook executed headless). Else ``path``: the notebook as the
    kernel knew it (its ``notebook`` record), else as the command names it (``jupyter nbconvert
    --execute X.ipynb``, :func:`whyidle.record.cells.notebook_of_command`), else None; and
    ``dataset``: the training loader's Dataset class when the kernel's own code defines it
    (``dataset_code.module`` is ``__main__``: a cell, or code the kernel ran as ``__main__``):
    ``class``, ``site`` (``"cell N:L Class.method"`` once renamed), ``cell`` (the label of the
    cell holding it, ``"cell N"`` / ``"train.ipynb cell N"``, None when its file is not a recorded
    cell), ``calls`` (the kernel's functions and classes its methods call); None otherwise."""
    if not any(r.get("k") == cell_records.CELL_KIND for r in recs):
        return None
    command_nb = cell_records.notebook_of_command((meta or {}).get("command"))
    path = next((r["path"] for r in recs if r.get("k") == cell_records.NOTEBOOK_KIND
                 and isinstance(r.get("path"), str) and r["path"]), None) or command_nb
    code = (loader or {}).get("dataset_code")
    dataset = None
    if isinstance(code, dict) and code.get("module") == "__main__" and isinstance(code.get("class"), str):
        site = code.get("site") if isinstance(code.get("site"), str) else None
        labels = {c.label for c in cell_records.cells_of(recs, command_nb).values()}
        cell = next((label for label in sorted(labels, key=len, reverse=True)
                     if site and site.startswith(label + ":")), None)
        calls = [n for n in code.get("calls") or [] if isinstance(n, str)]
        dataset = {"class": code["class"], "site": site, "cell": cell, "calls": calls}
    return NotebookFacts(path=path, dataset=dataset)

