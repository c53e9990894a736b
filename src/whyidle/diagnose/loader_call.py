"""A recorded ``DataLoader(...)`` call rewritten with changed settings, to paste over the original (pure).

The program's call is recorded as written when it builds its loader (the ``loader`` record's
``call``: :func:`whyidle.instrument.callsite.call_site`): every argument in order with its source
text, the callee (``torch.utils.data.DataLoader``) and the text before it (``train_loader = ``).
:func:`rewrite` keeps all of that and changes only the named settings, so ``sampler=``,
``collate_fn=``, ``generator=`` and ``**kwargs`` survive the paste:

- a literal the fix changes is replaced in place (positional ones too), marked ``# was 0``;
- an expression (``num_workers=args.workers``) is kept, marked with its value here and the value
  to give it (``# 0 here: make it 4``), and the command-line option that sets it where one was
  found (``run with --workers 4``); settings that need workers then follow it
  (``persistent_workers=args.workers > 0``), so the pasted line runs either way;
- a setting not passed is added as a keyword, or merged into the call's ``**kwargs``
  (``**{**loader_kwargs, "num_workers": 4}``) so no keyword is given twice; one that ``*args``
  may already pass is only named in a comment.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

#: Widest line of plain (uncommented) arguments before the next one wraps (characters).
WIDTH = 100

#: Longest call head (``train_loader = torch.utils.data.DataLoader(``) that the arguments are
#: aligned under; past it they go on the next lines, indented 4.
MAX_ALIGN = 32

_KINDS = ("pos", "kw", "*", "**")


@dataclass(frozen=True)
class Change:
    """One setting a fix changes.

    ``name``: the parameter (``num_workers``); ``text``: its new source text (``"4"``, ``"True"``,
    ``"torch.cuda.is_available()"``); ``now``: its value in the run (the ``loader`` record), for the
    comment; ``note``: the comment for a setting added (default ``was {now}``; ``""``: none);
    ``off``: its text when there are no workers (``"False"``, ``"None"``) for settings that need
    ``num_workers > 0``; ``replace``: replace an expression too (the new text calls the old one);
    ``if_absent``: only add it, never change what the program passes.
    """

    name: str
    text: str
    now: object = None
    note: str | None = None
    off: str | None = None
    replace: bool = False
    if_absent: bool = False


def valid(call) -> bool:
    """True when ``call`` has the shape :func:`rewrite` reads (a run directory is input like any other)."""
    if not isinstance(call, dict) or not isinstance(call.get("callee"), str) or not call["callee"]:
        return False
    if call.get("lead") is not None and not isinstance(call["lead"], str):
        return False
    args = call.get("args")
    return isinstance(args, list) and all(
        isinstance(a, dict) and a.get("kind") in _KINDS and isinstance(a.get("text"), str) and a["text"]
        and (a.get("name") is None or isinstance(a["name"], str)) for a in args)


def target(call: dict) -> str | None:
    """The name the call's value is assigned to (``train_loader`` of ``train_loader = ...``), or None."""
    lead = (call.get("lead") or "").strip()
    if not lead.endswith("=") or lead.endswith(("==", "!=", "<=", ">=")):
        return None
    name = lead[:-1].split("=")[-1].split(":")[0].strip()
    return name if name.replace(".", "").replace("_", "").isalnum() else None


def _literal(text: str) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _same(text: str, value) -> bool:
    ok, new = _literal(text)
    return ok and type(new) is type(value) and new == value


def operand(text: str) -> str:
    """``text`` safe as an operand (parenthesized unless a name or attribute chain)."""
    return text if text.replace(".", "").replace("_", "").isalnum() else f"({text})"


def _hint(arg: dict, ch: Change) -> str:
    """`` (run with --workers 4)`` when the recorded command-line option sets the new value."""
    option = arg.get("option") if isinstance(arg.get("option"), dict) else {}
    flag, action = option.get("flag"), option.get("action")
    ok, value = _literal(ch.text)
    if not isinstance(flag, str) or not ok:
        return ""
    if action == "store" and isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return f" (run with {flag} {value})"
    if (action, value) in (("store_true", True), ("store_false", False)):
        return f" (run with {flag})"
    if action == "optional" and isinstance(value, bool) and flag.startswith("--"):
        return f" (run with {flag if value else '--no-' + flag[2:]})"
    return ""


def _conditional(ch: Change, workers: str | None) -> str:
    """The new text of a setting that needs workers, when ``num_workers`` stays the expression ``workers``."""
    if workers is None or ch.off is None:
        return ch.text
    if ch.text == "True" and ch.off == "False":
        return f"{operand(workers)} > 0"
    return f"{ch.text} if {operand(workers)} > 0 else {ch.off}"


def rewrite(call: dict, changes: list[Change], site: str | None = None) -> list[str] | None:
    """The statement of ``call`` with ``changes`` applied, as lines of code to paste over it.

    Args:
        call: a ``loader`` record's ``call`` (docs/run-format.md).
        changes: the settings to change, in the order to add the missing ones.
        site: where the call is (``train.py:40 main``), put in a comment on the first line.
    Returns:
        lines of code: comment lines first for settings that could not be placed, then the
        statement (``lead`` + callee + arguments), each changed or added argument on its own line
        with its comment; None when ``call`` is not a valid record (:func:`valid`).
    """
    if not valid(call):
        return None
    wanted = {ch.name: ch for ch in changes}
    args = call["args"]
    items: list[tuple[str, str]] = []  # (argument text, comment), one per argument
    workers = None  # num_workers' text where the program's expression stays
    later: list[tuple[int, Change, dict]] = []  # expressions of settings that follow num_workers
    for arg in args:
        kind, name, text = arg["kind"], arg.get("name"), arg["text"]
        literal, value = _literal(text)
        if kind in ("pos", "kw") and name == "num_workers" and not literal:
            workers = text
        shown = {"pos": text, "kw": f"{name}={text}", "*": f"*{text}", "**": f"**{text}"}[kind]
        ch = wanted.get(name) if kind in ("pos", "kw") else None
        comment = ""
        if ch is None or ch.if_absent or (literal and _same(ch.text, value)):
            pass
        elif literal or ch.replace:
            shown = ch.text if kind == "pos" else f"{name}={ch.text}"
            comment = (f"{name}, " if kind == "pos" else "") + f"was {' '.join(text.split())}"
            if name == "num_workers":
                workers = None
        elif ch.now is not None and _same(ch.text, ch.now):
            pass
        elif ch.off is not None:
            later.append((len(items), ch, arg))
        else:
            comment = f"{ch.now} here: make it {ch.text}{_hint(arg, ch)}"
        items.append((shown, comment))
    for index, ch, arg in later:  # once num_workers' form is known
        items[index] = (items[index][0], f"{ch.now} here: make it {_conditional(ch, workers)}{_hint(arg, ch)}")
    passed = {a.get("name") for a in args if a["kind"] in ("pos", "kw")}
    positional = [a["kind"] for a in args if a["kind"] in ("pos", "*")]
    starred = positional.index("*") if "*" in positional else None
    params = [p for p in call["params"] if isinstance(p, str)] if isinstance(call.get("params"), list) else []
    kwargs = [i for i, a in enumerate(args) if a["kind"] == "**"]
    notes, merged, waiting = {}, [], []
    for ch in changes:
        if ch.name in passed or (ch.now is not None and _same(ch.text, ch.now)):
            continue
        text = _conditional(ch, workers)
        note = ch.note if ch.note is not None else (f"was {ch.now}" if ch.now is not None else "")
        if starred is not None and ch.name in params and params.index(ch.name) >= starred:
            notes[ch.name] = f"# {ch.name} may come from the *arguments: make it {text}"
        elif ch.off is not None and "num_workers" in notes:  # it needs the workers the note asks for
            waiting.append(f"{ch.name}={text}")
        elif kwargs:
            merged.append((ch.name, text, note))
        else:
            items.append((f"{ch.name}={text}", note))
    head = (call.get("lead") or "") + call["callee"] + "("
    if merged:  # into the last **kwargs: a keyword it may hold is then given once, with the new value
        i = kwargs[-1]
        pad = " " * (len(_indent(head)) + 3)  # under the `**{`: a multi-line argument starts its own line
        body = [f"**{{**{operand(args[i]['text'])},"] + [
            f'{pad}"{name}": {text},' + (f"   # {note}" if note else "") for name, text, note in merged[:-1]]
        name, text, note = merged[-1]
        items[i] = ("\n".join(body + [f'{pad}"{name}": {text}}}']), note)
    if waiting:
        notes["num_workers"] += f" (then {', '.join(waiting)})"
    return list(notes.values()) + _layout(head, items, site)


def _indent(head: str) -> str:
    """The indentation of the arguments' lines under ``head``: aligned after it, or 4 when it is long."""
    return " " * (len(head) if len(head) <= MAX_ALIGN else 4)


def _layout(head: str, items: list[tuple[str, str]], site: str | None) -> list[str]:
    """Arguments under ``head``: plain ones together up to :data:`WIDTH`, each commented one (or one
    spanning lines) on its own line; the site in a comment on the first line."""
    aligned = len(head) <= MAX_ALIGN
    indent = _indent(head)
    rows: list[tuple[list[str], str]] = []
    for text, comment in items:
        last = rows[-1] if rows else None
        if (last is not None and not last[1] and not comment and "\n" not in last[0][-1] + text
                and len(indent) + len(", ".join(last[0] + [text])) <= WIDTH):
            last[0].append(text)
        else:
            rows.append(([text], comment))
    lines = [] if aligned and rows else [[head + ("" if rows else ")"), ""]]
    for n, (texts, comment) in enumerate(rows):
        prefix = head if aligned and n == 0 else indent
        lines.append([prefix + ", ".join(texts) + (")" if n == len(rows) - 1 else ","), comment])
    first = []
    if site and lines[0][1]:
        first = [f"# {site}"]
    elif site:
        lines[0][1] = site
    return first + [code + (f"   # {comment}" if comment else "") for code, comment in lines]
