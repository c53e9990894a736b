"""Notebook cells: which code file is which cell, recorded in a Jupyter kernel (IPython).

IPython compiles each executed cell under a made-up file name (ipykernel:
``/tmp/ipykernel_<pid>/<hash>.py``, IPython's ``CachingCompiler``), keeps the cell's text in
:mod:`linecache` and maps the name to the cell's execution count ``N`` (``In [N]``) in
``shell.compile._filename_map``. The stack samples and every other site name that file, which no
longer exists when the report is read. :class:`CellCollector` (a collector of the agent's flusher,
``Agent.collectors``) writes, once per cell file, a ``cell`` record linking the file (as the
sites name it: :class:`whyidle.instrument.stacks.FrameClassifier`) to ``N`` and the cell's text,
and once per process a ``notebook`` record with the notebook's path when the kernel knows it. The
analysis renames the sites (``whyidle.record.cells``, docs/run-format.md).

Standard library only; every call is cheap (a dictionary copy and a few new entries per flush) and
never raises into the program: outside IPython it records nothing.
"""

from __future__ import annotations

import linecache
import os
import sys
import time

#: Characters of a cell's text kept in its ``cell`` record (a pasted data blob in a cell should not
#: swell ``proc-<pid>.jsonl``); lines past it read as unknown.
MAX_SOURCE_CHARS = 32_768

#: Environment variable where Jupyter Server puts the notebook's path relative to its root
#: (``jupyter_client`` passes it to the kernel, which also sets ``__session__`` from it).
SESSION_ENV = "JPY_SESSION_NAME"

#: Names a kernel's user namespace may hold the notebook's path under: VS Code's, then
#: ipykernel's copy of :data:`SESSION_ENV`.
NOTEBOOK_NAMES = ("__vsc_ipynb_file__", "__session__")


def _capped(text) -> str | None:
    if not isinstance(text, str):
        return None
    return text[:MAX_SOURCE_CHARS]


def _cached_source(name: str) -> str | None:
    """The text IPython cached for the cell file ``name`` (its :mod:`linecache` entry), or None."""
    entry = linecache.cache.get(name)
    try:
        return _capped("".join(entry[2])) if entry else None
    except (TypeError, IndexError):
        return None


class CellCollector:
    """The agent's collector of ``cell`` and ``notebook`` records (module docstring).

    Calling it returns the new records (a list, possibly empty); it runs on the flusher thread
    every flush and once at exit. Each agent (each run directory) has its own collector, so a
    second ``%%whyidle`` cell's run names the cells an earlier run already named.

    Args:
        shell: the IPython shell to read; None: found lazily, on each call until found, as
            ``IPython.get_ipython()`` once IPython is imported (never imported from here).
        label: callable(raw file name) → the name sites give that file; None: a
            :class:`~whyidle.instrument.stacks.FrameClassifier`'s label, created on first use.
        notes: the offsets noted so far (:meth:`note_offset`), ``{file: (cell, offset, source)}``;
            shared by the collectors of one process (:func:`install`).
    """

    def __init__(self, shell=None, label=None, notes: dict | None = None) -> None:
        self._shell = shell
        self._label = label
        self._notes: dict[str, tuple[int, int, str | None]] = {} if notes is None else notes
        self._written: dict[str, tuple[int, int]] = {}  # raw file name -> (cell, offset) written
        self._notebook_done = False

    def note_offset(self, file: str, cell: int, offset: int, source: str | None = None) -> None:
        """Says that ``file`` holds part of cell ``cell`` (its execution count) from cell line
        ``offset + 1`` on: a line L of ``file`` is cell line L + ``offset`` (the ``%%whyidle``
        magic compiles the cell's body, everything after its first line, under its own name:
        offset 1). ``source``: the text compiled under ``file`` (None: read from
        :mod:`linecache` at the next flush). Written at the next flush, after any plain record
        of the file (the last record of a file counts); may be called from any thread; never
        raises."""
        try:
            self._notes[str(file)] = (int(cell), max(0, int(offset)), _capped(source))
        except Exception:
            pass

    def __call__(self) -> list[dict]:
        try:
            return self._collect()
        except Exception:  # IPython's private map changed shape, a label failed: no cell names
            return []

    def _find_shell(self):
        if self._shell is None and "IPython" in sys.modules:
            get = getattr(sys.modules["IPython"], "get_ipython", None)
            self._shell = get() if get is not None else None
        return self._shell

    def _label_of(self, name: str) -> str:
        if self._label is None:
            from whyidle.instrument.stacks import FrameClassifier

            self._label = lambda f, c=FrameClassifier(): c.classify(f)[1]
        return self._label(name)

    def _record(self, now: int, name: str, cell: int, offset: int, source: str | None) -> dict:
        self._written[name] = (cell, offset)
        return {"k": "cell", "t": now, "file": self._label_of(name), "cell": cell, "offset": offset,
                "source": source if source is not None else _cached_source(name)}

    def _collect(self) -> list[dict]:
        out: list[dict] = []
        now = time.monotonic_ns()
        for name, (cell, offset, source) in list(self._notes.items()):
            if self._written.get(name) != (cell, offset):
                out.append(self._record(now, name, cell, offset, source))
        shell = self._find_shell()
        if shell is None:
            return out
        try:
            names = dict(shell.compile._filename_map)  # IPython-private: copied, read defensively
        except Exception:
            names = {}
        for name, number in names.items():
            if not isinstance(name, str) or name in self._written or name in self._notes or name.startswith("<"):
                continue  # a note made after this check is written again, with its offset, next time
            if isinstance(number, int) and not isinstance(number, bool):
                out.append(self._record(now, name, number, 0, None))
        if not self._notebook_done:
            path = notebook_path(shell)
            if path:
                self._notebook_done = True
                out.append({"k": "notebook", "t": now, "path": path})
        return out


def cell_files() -> list[str]:
    """The file names of the cells run so far in this IPython kernel, the latest first (empty outside
    IPython or when IPython's private map cannot be read). Never raises."""
    try:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        names = dict(shell.compile._filename_map) if shell is not None else {}
        return [n for n, _ in sorted(names.items(), key=lambda item: -item[1]) if isinstance(n, str)]
    except Exception:
        return []


def notebook_path(shell) -> str | None:
    """The path of the notebook a kernel runs, as the kernel knows it (Jupyter Server's
    :data:`SESSION_ENV`, VS Code's ``__vsc_ipynb_file__``, ipykernel's ``__session__``), or None
    (nbconvert, papermill and ``jupyter execute`` tell the kernel nothing)."""
    env = os.environ.get(SESSION_ENV)
    if env:
        return env
    try:
        ns = shell.user_ns
        for key in NOTEBOOK_NAMES:
            value = ns.get(key)
            if isinstance(value, str) and value:
                return value
    except Exception:
        pass
    return None


#: The process's noted offsets (:func:`note_offset`), shared by its collectors.
_NOTES: dict[str, tuple[int, int, str | None]] = {}


def install(agent) -> CellCollector:
    """Adds a :class:`CellCollector` to ``agent.collectors`` and returns it; an agent that already
    has one keeps it (returned). Cheap outside IPython: its calls look up ``sys.modules`` and
    return nothing."""
    found = next((c for c in agent.collectors if isinstance(c, CellCollector)), None)
    if found is None:
        found = CellCollector(notes=_NOTES)
        agent.collectors.append(found)
    return found


def note_offset(file: str, cell: int, offset: int, source: str | None = None) -> None:
    """:meth:`CellCollector.note_offset` for every collector of the process, present and future
    (the ``%%whyidle`` magic calls it before running the cell's body). Never raises."""
    CellCollector(notes=_NOTES).note_offset(file, cell, offset, source)
