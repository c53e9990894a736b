"""What a fix adds when the program runs in a notebook kernel (pure).

A kernel is one long-lived process: what a cell defines lives in its ``__main__``, and what a cell
changes outlives it. Three fixes read differently there (issue 33):

- DataLoader workers started with ``spawn`` or ``forkserver`` unpickle the dataset in a fresh
  interpreter, which imports its class by name; a class defined in a cell (``__main__`` of the
  kernel) cannot be imported, so the class and the functions it calls move to a module file beside
  the notebook (:func:`dataset_note`). With ``fork`` (Linux before Python 3.14) the workers inherit
  the kernel's memory and nothing changes.
- ``persistent_workers=True`` keeps workers for the life of their DataLoader: re-running a cell that
  builds the DataLoader starts new ones, and the old loader's workers live on while anything (the
  ``Out`` history, a variable) still refers to it (:func:`persistent_note`).
- ``torch.set_num_threads`` sets the kernel's intra-op threads until it restarts, for every later
  cell (:func:`threads_note`).

Each note is extra sentences for the fix's text and extra code lines around its code; the fix's own
first sentence stays first. Outside a notebook (``facts.notebook`` None) every function returns None,
so no fix changes.
"""

from __future__ import annotations

import dataclasses
import re

from whyidle.analysis.facts import RunFacts
from whyidle.analysis.notebook import IMPORTING_METHODS

#: How each start method's choice is told (``facts.worker_start.source``).
_SOURCES = {"loader": "the DataLoader's multiprocessing_context", "program": "the start method the program set"}

#: ``sys.platform`` values as people name them.
_PLATFORMS = {"darwin": "macOS", "win32": "Windows", "linux": "Linux"}


@dataclasses.dataclass(frozen=True)
class Note:
    """Extra words for a fix: ``text`` (sentences, each starting with a space) appended to its text;
    ``before`` / ``after``: code lines put before / after its code."""

    text: str
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


def with_notes(text: str, code: str | None, notes) -> tuple[str, str | None]:
    """``(text, code)`` with the notes (None entries skipped) added; a fix without code gets only
    the sentences."""
    notes = [n for n in notes if n is not None]
    for n in notes:
        text += n.text
    if code is not None:
        before = [line for n in notes for line in n.before]
        after = [line for n in notes for line in n.after]
        code = "\n".join(before + [code] + after)
    return text, code


def module_name(cls: str) -> str:
    """The module file a Dataset class moves to, from its name in snake case: ``Images`` →
    ``images_data``, ``ImageFolderDataset`` → ``image_folder_dataset`` (a name that already says
    data is kept)."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])|(?<=[A-Z])([A-Z])(?=[a-z])", r"_\1\2", cls).lower()
    snake = re.sub(r"[^a-z0-9_]+", "_", snake).strip("_") or "dataset"
    if snake[0].isdigit():
        snake = "ds_" + snake
    return snake if snake.endswith(("data", "dataset", "datasets")) else snake + "_data"


def _started_by(start: dict) -> str:
    """Why the workers start with this method: ``"the default on macOS"``, ``"the DataLoader's
    multiprocessing_context"``, ``"the default on Linux from Python 3.14"``."""
    source = start.get("source")
    if source in _SOURCES:
        return _SOURCES[source]
    platform = _PLATFORMS.get(start.get("platform") or "", start.get("platform") or "this platform")
    return f"the default on {platform}" + (" from Python 3.14" if start.get("method") == "forkserver" else "")


def importing_workers(facts: RunFacts) -> bool:
    """In a notebook, and the training DataLoader's workers start with ``spawn`` or ``forkserver``
    (:data:`whyidle.analysis.notebook.IMPORTING_METHODS`): they import by name what they run."""
    return bool(facts.notebook) and (facts.worker_start or {}).get("method") in IMPORTING_METHODS


def dataset_note(facts: RunFacts, workers: int, defines: tuple[str, ...] = ()) -> Note | None:
    """The move a worker fix needs in a notebook whose workers start with ``spawn`` or
    ``forkserver``: the Dataset class defined in a cell (``facts.notebook.dataset``) and the
    functions it calls from cells go to a module file beside the notebook (:func:`module_name`),
    imported before the DataLoader code. ``defines``: functions or classes the fix's own code
    defines that the workers run (a ``worker_init_fn``, a ``collate_fn``): they go there too.
    None when ``workers`` is 0, outside a notebook, with ``fork``, or with nothing to move."""
    if workers <= 0 or not importing_workers(facts):
        return None
    start = facts.worker_start or {}
    method = start.get("method")
    ds = (facts.notebook or {}).get("dataset")
    if not ds and not defines:
        return None
    cls = ds["class"] if ds else None
    mod = module_name(cls) if cls else "loader_fns"
    calls = [c for c in (ds or {}).get("calls") or [] if c not in defines]
    where = f" (defined in {ds['cell']})" if ds and ds.get("cell") else ""
    moved = ([f"`{cls}`{where}"] if cls else []) + [f"`{n}`" for n in calls + list(defines)]
    what = moved[0] if len(moved) == 1 else ", ".join(moved[:-1]) + " and " + moved[-1]
    subject = "a Dataset class defined in a notebook cell" if cls else "functions defined in a notebook cell"
    names = ([cls] if cls else []) + list(defines)
    text = (f" In this notebook the workers start with {method} ({_started_by(start)}), and {method} workers "
            f"cannot import {subject}: move {what} into {mod}.py, a file beside the notebook (with the imports "
            f"they use), then `from {mod} import {', '.join(names)}` before the DataLoader code.")
    parts = ([f"class {cls}{where}"] if cls else []) + list(calls) + list(defines)
    before = (f"# {mod}.py, beside the notebook: {', '.join(parts)}, moved out of the cells with their imports",
              f"# ({method} workers import these by name; a cell's definitions live in the kernel's __main__)",
              f"from {mod} import {', '.join(names)}")
    return Note(text, before=before)


def persistent_note(facts: RunFacts, workers: int) -> Note | None:
    """In a notebook, a fix that keeps workers alive (``persistent_workers=True``) also says to
    build the DataLoader in a cell of its own, run once: re-running the training cell then reuses
    its workers. None outside a notebook, without workers, and where the framework builds the
    DataLoader itself on each call (the HF Trainer; Lightning's ``train_dataloader`` hook)."""
    if workers <= 0 or not facts.notebook:
        return None
    api = facts.api or {}
    hook = api.get("name") == "lightning" and (api.get("config") or {}).get("train_dataloader")
    if api.get("name") == "hf_trainer" or hook:
        return None
    text = (" In a notebook, build the DataLoader in a cell of its own and run that cell once: re-running the "
            "training cell then reuses its persistent workers instead of starting new ones (a loader built again "
            "starts its own, and the old loader's workers live on while anything, e.g. the Out history, still "
            "refers to it).")
    after = ("# notebook: this DataLoader in a cell of its own, run once; the training cell re-run reuses its workers",
             "# (building it again starts new ones; the old ones live on while Out or a name refers to the old loader)")
    return Note(text, after=after)


def threads_note(facts: RunFacts) -> Note | None:
    """In a notebook, a fix that calls ``torch.set_num_threads(k)`` also says that it holds for the
    whole kernel until it restarts, and sets it back after training to the threads the kernel had
    (the ``proc`` record's ``threads``; read with ``torch.get_num_threads()`` first when not
    recorded). None outside a notebook."""
    if not facts.notebook:
        return None
    was = (facts.proc or {}).get("threads")
    if isinstance(was, int) and not isinstance(was, bool) and was > 0:
        return Note(f" In a notebook torch.set_num_threads holds for the whole kernel, every later cell included, "
                    f"until it restarts: set it back after training (torch.set_num_threads({was}), the kernel's "
                    "threads before).",
                    after=(f"torch.set_num_threads({was})   # after training: the kernel's threads before "
                           "(the setting outlives the cell)",))
    return Note(" In a notebook torch.set_num_threads holds for the whole kernel, every later cell included, until it "
                "restarts: read torch.get_num_threads() first and set it back after training.",
                before=("kernel_threads = torch.get_num_threads()   # notebook: the setting outlives the cell",),
                after=("torch.set_num_threads(kernel_threads)   # after training",))


def worker_notes(facts: RunFacts, workers: int, threads: bool = False, defines: tuple[str, ...] = (),
                 persistent: bool = True) -> list[Note]:
    """The notes of a fix that runs ``workers`` DataLoader workers (:func:`dataset_note`,
    :func:`persistent_note` when it keeps them alive, :func:`threads_note` when ``threads``: it
    calls ``torch.set_num_threads``); empty outside a notebook."""
    if not facts.notebook:
        return []
    notes = [dataset_note(facts, workers, defines), persistent_note(facts, workers) if persistent else None,
             threads_note(facts) if threads else None]
    return [n for n in notes if n is not None]
