"""The source text of the call a frame is executing: its arguments, callee and statement.

A fix is only useful if it can be pasted: ``DataLoader(self.train_ds, ...)`` where the program wrote
``self.train_ds``, not a name whyidle made up, and every other argument (``sampler=``,
``collate_fn=``, ``**kwargs``) kept, or the pasted line silently trains differently. When the
program builds a ``DataLoader``, the caller's frame is executing that call; Python 3.11+ maps each
instruction to the exact span of source it came from (``code.co_positions()``, PEP 657), so the
call expression can be found in the file's syntax tree (:mod:`ast`), with the statement around it
(``train_loader = ...``, ``return ...``). Runs once per DataLoader construction, never per step.
"""

from __future__ import annotations

import ast
import linecache
import sys

#: Longest argument text kept in :func:`call_arguments` (characters); longer expressions are not
#: worth pasting into an illustrative snippet.
MAX_ARG_CHARS = 80

#: Longest call kept whole by :func:`call_site` (characters of source): a longer one (a dataset
#: built inline over many lines) is not recorded, and fixes fall back to the named arguments.
MAX_CALL_CHARS = 2000

#: Largest source file parsed whole to find the statement around the call (characters); a larger
#: one is cut to the call's own span (the call is kept, its assignment target is not).
MAX_SOURCE_CHARS = 500_000

#: Statements whose value can be the call itself: the text before the call is kept as written.
_LEADS = (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)

def call_arguments(frame, spec: dict[str, int | None], callee: str) -> dict[str, str]:
    """Source text of some arguments of the call ``frame`` is executing.

    Args:
        frame: a Python frame stopped inside a call (e.g. ``sys._getframe(1)`` in a wrapper).
        spec: argument name → its position (0-based, None for keyword-only), e.g.
            ``{"dataset": 0, "collate_fn": None}``.
        callee: the name the call must be made through (``DataLoader`` in ``DataLoader(...)`` or
            ``data.DataLoader(...)``): a frame calling something else (a helper, ``trainer.fit``)
            gives ``{}``.

    Returns:
        name → the argument's source text as written, whitespace runs collapsed (e.g.
        ``{"dataset": "self.train_ds"}``), for the arguments passed and at most
        :data:`MAX_ARG_CHARS` long; ``{}`` when the call is not to ``callee``, when the source is
        not available (no file, ``python -c``, a compiled module), the call cannot be located
        (Python before 3.11) or does not parse. Never raises.
    """
    try:
        found = _locate(frame, callee, whole=False)
        if found is None:
            return {}
        source, call, _stmt = found
        out = {}
        for name, pos in spec.items():
            node = next((k.value for k in call.keywords if k.arg == name), None)
            if node is None and pos is not None and pos < len(call.args):
                if any(isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
                    continue
                node = call.args[pos]
            if node is not None:
                src = " ".join(_segment(source, node).split())
                if len(src) <= MAX_ARG_CHARS:
                    out[name] = src
        return out
    except Exception:
        return {}


def call_site(frame, callee: str, params: list[str] | tuple = (), options: tuple = ()) -> dict | None:
    """The whole call ``frame`` is executing, as written, for a fix that replaces it.

    Args:
        frame: a Python frame stopped inside a call to ``callee``.
        callee: the name the call must be made through (see :func:`call_arguments`).
        params: the callee's positional parameter names in order (``["dataset", "batch_size",
            ...]``), to name positional arguments.
        options: parameter names whose argument, when written ``ns.attr`` with ``ns`` an
            ``argparse.Namespace`` in the frame, gets the command-line option that sets it.

    Returns:
        ``{"callee": "torch.utils.data.DataLoader", "lead": "train_loader = " | "return " | "" |
        None, "lines": [first, last], "params": [...], "args": [{"kind": "pos" | "kw" | "*" |
        "**", "name": parameter name or None, "text": source as written, "option"?: {"flag":
        "--workers", "action": "store" | "store_true" | "store_false" | "optional"}}, ...]}`` in
        the order written. ``lead`` is the statement's text before the call (its assignment
        target) when the call is the statement's whole value, else None (the call sits inside
        another expression: ``lines`` are then the call's own). None when the call is not to
        ``callee``, its source is unavailable, or it is longer than :data:`MAX_CALL_CHARS`.
        Never raises.
    """
    try:
        found = _locate(frame, callee, whole=True)
        return None if found is None else _describe(*found, params, options, frame)
    except Exception:
        return None


def _describe(source: "_Source", call: ast.Call, stmt, params, options: tuple, frame) -> dict | None:
    """The :func:`call_site` record of ``call`` (in ``stmt``, or None) read from ``source``; options
    are looked up in ``frame`` (None: not looked up). None when the call is too long."""
    if len(_segment(source, call)) > MAX_CALL_CHARS:
        return None
    positional = list(params)
    args = []
    starred = False
    for i, node in enumerate(call.args):
        text = _segment(source, node)
        if isinstance(node, ast.Starred):
            starred = True
            args.append((node, {"kind": "*", "name": None, "text": text[1:].strip()}))
        else:
            name = positional[i] if not starred and i < len(positional) else None
            if isinstance(node, ast.GeneratorExp) and not text.startswith("("):
                text = f"({text})"  # a lone generator argument needs its parentheses beside others
            args.append((node, {"kind": "pos", "name": name, "text": text}))
    for kw in call.keywords:  # the keyword's own span keeps the value's parentheses as written
        text = _segment(source, kw)
        text = text.split("=", 1)[1].strip() if kw.arg else text[2:].strip()
        args.append((kw, {"kind": "kw" if kw.arg else "**", "name": kw.arg, "text": text}))
    args.sort(key=lambda pair: (pair[0].lineno, pair[0].col_offset))
    for node, arg in args:
        if arg["name"] in options and frame is not None:
            option = _option(frame, node.value if isinstance(node, ast.keyword) else node)
            if option:
                arg["option"] = option
    lead, lines = None, [call.lineno, call.end_lineno]
    if stmt is not None and isinstance(stmt, _LEADS) and stmt.value is call:
        lead = source.cut(stmt.lineno, stmt.col_offset, call.lineno, call.col_offset)
        if "\n" in lead:  # `loader = \` continued on the next line
            lead = " ".join(lead.replace("\\\n", " ").split()) + " "
        lines = [stmt.lineno, stmt.end_lineno]
    return {"callee": _segment(source, call.func), "lead": lead, "lines": lines, "params": positional,
            "args": [arg for _, arg in args]}


def assigned_call(names, filenames, callee: str, params: list[str] | tuple = ()) -> tuple[str, dict] | None:
    """Where an object made before whyidle watched was built: the last statement ``NAME = callee(...)``
    (``NAME`` one of ``names``, ``callee`` the name the call is made through) of the first of
    ``filenames`` holding one (their :mod:`linecache` text: a notebook's cells, the program's file),
    as ``(filename, call_site record)``; None when there is none. Parses each file once (at most
    :data:`MAX_SOURCE_CHARS`); never raises. ``whyidle.watch()`` / ``%%whyidle`` use it for a
    DataLoader built in an earlier cell than the observed one."""
    wanted = set(names)
    for filename in filenames:
        try:
            lines = linecache.getlines(filename)
            if not lines or sum(map(len, lines)) > MAX_SOURCE_CHARS:
                continue
            source = "".join(lines)
            found = None
            for stmt in ast.walk(ast.parse(source)):
                value = getattr(stmt, "value", None)
                if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or not isinstance(value, ast.Call):
                    continue
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                func = value.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
                if name == callee and any(isinstance(t, ast.Name) and t.id in wanted for t in targets):
                    if found is None or stmt.lineno > found.lineno:
                        found = stmt
            if found is not None:
                described = _describe(_Source(source), found.value, found, params, (), None)
                if described is not None:
                    return filename, described
        except Exception:
            continue
    return None


def argument_texts(call: dict, spec: dict[str, int | None]) -> dict[str, str]:
    """The :func:`call_arguments` answer (name → text, whitespace runs collapsed, at most
    :data:`MAX_ARG_CHARS`) read from a :func:`call_site` record, without parsing again."""
    out = {}
    for arg in call["args"]:
        if arg["name"] in spec and arg["kind"] in ("pos", "kw"):
            text = " ".join(arg["text"].split())
            if len(text) <= MAX_ARG_CHARS:
                out[arg["name"]] = text
    return out


def _locate(frame, callee: str, whole: bool):
    """``(source, call node, innermost statement or None)`` for the call ``frame`` executes, or None.
    ``whole``: parse the whole file (up to :data:`MAX_SOURCE_CHARS`) to find the statement; else,
    or when that fails, only the call's span is parsed (positions then relative to it)."""
    code = frame.f_code
    line0, line1, col0, col1 = list(code.co_positions())[frame.f_lasti // 2]
    if None in (line0, line1, col0, col1):
        return None
    lines = linecache.getlines(code.co_filename, frame.f_globals)
    if len(lines) < line1:
        return None
    found = None
    if whole and sum(map(len, lines)) <= MAX_SOURCE_CHARS:
        found = _in_tree(lines, (line0, col0, line1, col1))
    if found is None:
        text = _Source("".join(lines[line0 - 1:line1])).cut(1, col0, line1 - line0 + 1, col1)
        found = (_Source(text), ast.parse(text, mode="eval").body, None)
    call = found[1]
    if not isinstance(call, ast.Call):
        return None
    func = call.func
    if (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None) != callee:
        return None
    return found


def _in_tree(lines: list[str], span: tuple[int, int, int, int]):
    """The call at ``span`` (line0, col0, line1, col1; columns in UTF-8 bytes) in the parsed file,
    with the innermost statement holding it; None when the file does not parse or holds no such call."""
    source = "".join(lines)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    line0, col0, line1, col1 = span
    call = stmt = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset) == span:
            call = node
        elif isinstance(node, ast.stmt) and (node.lineno, node.col_offset) <= (line0, col0) \
                and (node.end_lineno, node.end_col_offset) >= (line1, col1):
            if stmt is None or (node.lineno, node.col_offset) >= (stmt.lineno, stmt.col_offset):
                stmt = node  # a nested statement starts after the one holding it
    return None if call is None else (_Source(source), call, stmt)


class _Source:
    """Source text cut by :mod:`ast` positions: lines 1-based, columns UTF-8 byte offsets (as in
    ``co_positions``); the lines are split and encoded once."""

    def __init__(self, text: str):
        self.lines = text.encode().splitlines(keepends=True)  # \n, \r\n, \r: Python's line ends

    def cut(self, line0: int, col0: int, line1: int, col1: int) -> str:
        raw = self.lines[line0 - 1:line1]
        if not raw:
            return ""
        if len(raw) == 1:
            return raw[0][col0:col1].decode()
        return (raw[0][col0:] + b"".join(raw[1:-1]) + raw[-1][:col1]).decode()


def _segment(source: _Source, node: ast.AST) -> str:
    return source.cut(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset) or ast.unparse(node)


def _option(frame, node: ast.AST) -> dict | None:
    """The command-line option behind ``ns.attr`` (``args.workers``) when ``ns`` is an
    ``argparse.Namespace`` in the frame and exactly one ``ArgumentParser`` in the frame's locals or
    globals has a plain option for ``attr``: ``{"flag": "--workers", "action": "store"}``; else None."""
    argparse = sys.modules.get("argparse")
    if argparse is None or not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Name):
        return None
    scopes = (frame.f_locals, frame.f_globals)
    name = node.value.id
    ns = next((scope[name] for scope in scopes if name in scope), None)
    if not isinstance(ns, argparse.Namespace) or not hasattr(ns, node.attr):
        return None
    parsers: list = []
    for scope in scopes:
        for value in list(scope.values()):
            if isinstance(value, argparse.ArgumentParser) and not any(value is p for p in parsers):
                parsers.append(value)
    actions = [a for p in parsers for a in p._actions if a.dest == node.attr and a.option_strings]
    if len(actions) != 1:
        return None
    action = actions[0]
    kind = {argparse._StoreAction: "store", argparse._StoreTrueAction: "store_true",
            argparse._StoreFalseAction: "store_false", argparse.BooleanOptionalAction: "optional"}.get(type(action))
    if kind is None or (kind == "store" and action.nargs is not None):
        return None
    long = [o for o in action.option_strings if o.startswith("--")]
    return {"flag": (long or action.option_strings)[0], "action": kind}
