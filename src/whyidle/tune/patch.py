"""A setting fix as a unified diff of the user's script (``whyidle tune --diff``, ``whyidle run --diff``).

The settings (:data:`whyidle.instrument.overrides.KNOBS`) are written where the program makes the
choice, on its own line: the argument of its ``DataLoader(...)``, ``Trainer(...)``,
``ModelCheckpoint(...)``, ``TrainingArguments(...)``, ``fit(...)`` or ``torch.autocast(...)`` call
is replaced where it is passed (by keyword, or by position for the parameters :data:`POSITIONAL`
names) and added as a keyword after the call's last argument where it is not (merged into the
call's ``**kwargs`` when it has one: ``**{**extra, "name": value}``, so a key the dict may hold is
not given twice, as :mod:`whyidle.diagnose.loader_call` does); ``threads`` replaces
the argument of ``torch.set_num_threads(...)`` or adds that call after ``import torch``. Nothing else
in the file changes, so the diff is as small as the change.

Which call: the one at the line a trial applied the setting (its ``override`` record's ``site``),
or the loader the run recorded (``loader.created``); without a line, the only call of that name in
the file (every ``autocast`` region for ``autocast="off"``). A setting with no such call (a loader
a library builds, Lightning's default checkpoint) is named in :attr:`Patch.unplaced`.

The diff's paths are relative to the directory ``whyidle`` ran in (``a/train.py``, ``b/train.py``),
so ``git apply`` and ``patch -p1`` from that directory accept it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import re

from whyidle.diagnose.loader_call import operand

#: HF ``TrainingArguments`` field of each DataLoader setting (as :data:`whyidle.tune.code.HF_FIELDS`).
HF_FIELDS = {"num_workers": "dataloader_num_workers", "persistent_workers": "dataloader_persistent_workers",
             "prefetch_factor": "dataloader_prefetch_factor", "pin_memory": "dataloader_pin_memory",
             "batch_size": "per_device_train_batch_size"}
LOADER = ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory", "batch_size")
#: Callee names (the last part of ``a.b.Name``) that take each setting, and the keyword it is.
CALLS = {
    **{k: (("DataLoader",), k) for k in LOADER},
    **{k: (("Trainer",), k) for k in ("val_check_interval", "check_val_every_n_epoch", "limit_val_batches",
                                      "log_every_n_steps")},
    "every_n_train_steps": (("ModelCheckpoint",), "every_n_train_steps"),
    **{k: (("TrainingArguments", "Seq2SeqTrainingArguments"), k) for k in ("eval_steps", "save_steps", "logging_steps")},
    "validation_freq": (("fit",), "validation_freq"),
    "autocast": (("autocast",), "enabled"),
    "threads": (("set_num_threads",), None),
}
#: Positional parameters of the calls above, in order (a setting passed by position is replaced there).
POSITIONAL = {
    "DataLoader": ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
                   "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator"),
    "autocast": ("device_type", "dtype", "enabled", "cache_enabled"),
    "set_num_threads": ("int",),
    "fit": ("x", "y", "batch_size", "epochs", "verbose", "callbacks", "validation_split", "validation_data",
            "shuffle", "class_weight", "sample_weight", "initial_epoch", "steps_per_epoch", "validation_steps",
            "validation_batch_size", "validation_freq"),
}
#: Keywords dropped from a call with the setting (``ModelCheckpoint`` takes one trigger).
DROPS = {"every_n_train_steps": ("every_n_epochs", "train_time_interval")}


class PatchError(Exception):
    """The diff cannot be written (no script, it does not parse, no setting could be placed)."""


@dataclasses.dataclass
class Patch:
    """A written diff: ``text`` (unified diff, empty when nothing changed), ``path`` (the script,
    relative to ``root``), ``placed`` (setting → ``file:line`` of the call changed), ``unplaced``
    (setting → why it is not in the diff)."""

    text: str
    path: str
    placed: dict
    unplaced: dict


def _name(func: ast.expr) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _offset(lines: list[str], line: int, col: int) -> int:
    """Character offset in the joined text of (1-based ``line``, UTF-8 byte ``col``)."""
    return sum(len(s) for s in lines[:line - 1]) + len(lines[line - 1].encode()[:col].decode(errors="ignore"))


def _calls(tree: ast.AST, names: tuple) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _name(n.func) in names]


def _choose(calls: list[ast.Call], line: int | None, every: bool) -> tuple[list[ast.Call], str | None]:
    """The calls to change: the one spanning ``line``; all of them (``every``); the only one; else
    none, with why."""
    if line is not None:
        hit = [c for c in calls if c.lineno <= line <= (c.end_lineno or c.lineno)]
        if hit:
            return [min(hit, key=lambda c: (c.end_lineno or c.lineno) - c.lineno)], None
    if every and calls:
        return calls, None
    if len(calls) == 1:
        return calls, None
    return [], ("no such call in the file" if not calls else
                f"{len(calls)} calls could take it and the run did not record which")


def _edits(call: ast.Call, pairs: list[tuple[str | None, str]], lines: list[str], drops: set) -> list[tuple]:
    """``(start, end, text)`` replacements in the joined text that make ``call`` pass each
    ``keyword=value_text`` of ``pairs`` (``keyword`` None: the first positional argument) and drop
    the keywords in ``drops``. A keyword the call does not pass is added after its last argument;
    merged into its ``**kwargs`` (``**{**kwargs, "name": value}``) when it has one, so no keyword
    is given twice."""
    pos = POSITIONAL.get(_name(call.func), ())
    out = []
    args = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    for i, kw in enumerate(args):
        if isinstance(kw, ast.keyword) and kw.arg is not None and kw.arg in drops:
            if i > 0:  # from the end of the argument before it: its comma goes with it
                prev = args[i - 1]
                out.append((_offset(lines, prev.end_lineno, prev.end_col_offset),
                            _offset(lines, kw.end_lineno, kw.end_col_offset), ""))
            elif i + 1 < len(args):  # the first: up to the next argument
                nxt = args[i + 1]
                out.append((_offset(lines, kw.lineno, kw.col_offset), _offset(lines, nxt.lineno, nxt.col_offset), ""))
            else:
                out.append((_offset(lines, kw.lineno, kw.col_offset), _offset(lines, kw.end_lineno, kw.end_col_offset), ""))
    added = []
    for keyword, value_text in pairs:
        target = next((kw.value for kw in call.keywords if keyword is not None and kw.arg == keyword), None)
        if target is None:
            index = 0 if keyword is None else (pos.index(keyword) if keyword in pos else None)
            if index is not None and index < len(call.args) and not any(isinstance(a, ast.Starred)
                                                                        for a in call.args[:index + 1]):
                target = call.args[index]
        if target is not None:
            out.append((_offset(lines, target.lineno, target.col_offset),
                        _offset(lines, target.end_lineno, target.end_col_offset), value_text))
        else:
            added.append((keyword, value_text))
    if not added:
        return out
    double = [kw for kw in call.keywords if kw.arg is None]
    if double and all(k is not None for k, _ in added):
        value = double[-1].value
        text = "".join(lines)[_offset(lines, value.lineno, value.col_offset):
                              _offset(lines, value.end_lineno, value.end_col_offset)]
        merged = ", ".join(f'"{k}": {v}' for k, v in added)
        return out + [(_offset(lines, value.lineno, value.col_offset),
                       _offset(lines, value.end_lineno, value.end_col_offset), f"{{**{operand(text)}, {merged}}}")]
    text = ", ".join(f"{k}={v}" if k else v for k, v in added)
    kept = [n for n in args if not (isinstance(n, ast.keyword) and n.arg is not None and n.arg in drops)]
    last = max(kept, key=lambda n: (n.end_lineno, n.end_col_offset), default=None)
    if last is None:  # no argument left: inside the parentheses
        end = _offset(lines, call.end_lineno, call.end_col_offset) - 1
        return out + [(end, end, text)]
    at = _offset(lines, last.end_lineno, last.end_col_offset)
    return out + [(at, at, ", " + text)]


def _site_line(site: str | None, path: str) -> int | None:
    """The line of ``site`` (``file.py:40`` or ``file.py:40 main``) when it names ``path``'s file."""
    m = re.match(r"\s*(.+?):(\d+)", site or "")
    if not m or os.path.basename(m.group(1)) != os.path.basename(path):
        return None
    return int(m.group(2))


def change_source(text: str, path: str, settings: dict, sites: dict | None = None,
                  api: str | None = None) -> tuple[str, dict, dict]:
    """``text`` (a Python file's source) with ``settings`` written into its calls.

    Args:
        text: the file's source.
        path: its path (only its base name is used, to match ``sites``).
        settings: knob → value (:data:`whyidle.instrument.overrides.KNOBS`).
        sites: knob → ``file:line`` where the setting took effect (``override`` records,
            ``loader.created``), to pick the call.
        api: the training API (``hf_trainer``: the loader settings go to ``TrainingArguments``).
    Returns: ``(new text, placed, unplaced)`` (knob → ``file:line`` / why not).
    Errors: :class:`PatchError` when the text does not parse.
    """
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise PatchError(f"{path} does not parse ({exc.msg}, line {exc.lineno})") from None
    lines = text.splitlines(keepends=True)
    sites = sites or {}
    edits, placed, unplaced = [], {}, {}
    wanted: dict[int, tuple[ast.Call, list, set]] = {}  # call → (call, [(keyword, text)], keywords to drop)
    for knob, value in settings.items():
        if knob not in CALLS:
            unplaced[knob] = "not a setting of a call in the program"
            continue
        names, keyword = CALLS[knob]
        if api == "hf_trainer" and knob in HF_FIELDS:
            names, keyword = ("TrainingArguments", "Seq2SeqTrainingArguments"), HF_FIELDS[knob]
        value_text = repr(value)
        if knob == "autocast":
            if value != "off":
                unplaced[knob] = "adding autocast is a code change (the printed code)"
                continue
            value_text = "False"
        calls, why = _choose(_calls(tree, names), _site_line(sites.get(knob), path), every=knob == "autocast")
        if knob == "threads" and not calls and not _calls(tree, names):
            imp = next((n for n in tree.body if isinstance(n, ast.Import) and any(a.name == "torch" and not a.asname
                                                                                 for a in n.names)), None)
            if imp is not None:
                at = _offset(lines, imp.end_lineno + 1, 0) if imp.end_lineno < len(lines) else len(text)
                edits.append((at, at, f"torch.set_num_threads({value})\n"))
                placed[knob] = f"{os.path.basename(path)}:{imp.end_lineno + 1}"
                continue
        if not calls:
            unplaced[knob] = why
            continue
        for call in calls:
            entry = wanted.setdefault(id(call), (call, [], set()))
            entry[1].append((keyword, value_text))
            entry[2].update(DROPS.get(knob, ()))
        placed[knob] = f"{os.path.basename(path)}:{calls[0].lineno}"
    for call, pairs, drops in wanted.values():
        edits += _edits(call, pairs, lines, drops)
    joined = "".join(lines)
    for start, end, new in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        joined = joined[:start] + new + joined[end:]
    return joined, placed, unplaced


def unified(old: str, new: str, rel: str) -> str:
    """The unified diff of ``old`` → ``new`` for file ``rel`` (``a/rel``, ``b/rel``), with the
    ``\\ No newline at end of file`` marker where a side lacks one (``git apply`` and ``patch``
    need it)."""
    out = []
    for line in difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     fromfile=f"a/{rel}", tofile=f"b/{rel}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def script_of(command: list[str], root: str) -> str | None:
    """The Python script a command runs (``python train.py ...``, ``./train.py``), absolute, or None."""
    for arg in command:
        if arg.endswith(".py"):
            path = os.path.join(root, arg) if not os.path.isabs(arg) else arg
            if os.path.isfile(path):
                return os.path.abspath(path)
    return None


def settings_patch(command: list[str], settings: dict, sites: dict | None = None, api: str | None = None,
                   root: str | None = None) -> Patch:
    """The diff of the command's script that makes ``settings`` (see the module docstring).

    Args:
        command: the command as run (its script is the file changed).
        settings, sites, api: as for :func:`change_source`.
        root: the directory the diff's paths are relative to (default: the working directory).
    Errors: :class:`PatchError` (no script, unreadable, does not parse, nothing could be placed).
    """
    root = os.path.abspath(root or os.getcwd())
    script = script_of(command, root)
    if script is None:
        raise PatchError("the command runs no Python script file whyidle could find: no diff written")
    try:
        with open(script, encoding="utf-8") as f:
            old = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PatchError(f"{script} cannot be read ({exc})") from None
    new, placed, unplaced = change_source(old, script, settings, sites, api)
    if not placed:
        why = "; ".join(f"{k}: {v}" for k, v in unplaced.items())
        raise PatchError(f"no setting could be written into {os.path.basename(script)} ({why})")
    rel = os.path.relpath(script, root)
    if rel.startswith(os.pardir):
        raise PatchError(f"{script} is outside {root}: run whyidle from a directory that holds the script")
    return Patch(unified(old, new, rel.replace(os.sep, "/")), rel, placed, unplaced)
