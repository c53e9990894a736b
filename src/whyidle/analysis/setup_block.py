"""The block of the program's own start-up lines that a cache goes around (pure; reads source files).

A start-up sample's program frames (innermost first) end in the function that ran the set-up: the
script's body, or ``main()`` when the body only calls it. That frame's line is the sample's
*anchor* (:func:`anchor`). The anchors' busiest function holds the set-up; its lines holding at
least :data:`MIN_LINE_SHARE` of that function's sampled time, widened to whole statements of the
function's body, are the block (:func:`setup_block`): ``texts, labels = make_corpus()`` …
``X = torch.tensor(...)``. The names the block assigns and the rest of the function reads are what
a cache must hold (``vocab, X, y``, not the intermediate token lists).
"""

from __future__ import annotations

import ast
import os
import re

from whyidle.analysis import stacks as stack_analysis
from whyidle.record import cells

#: A function's lines below this share of its sampled set-up time are stray samples (a print, a
#: model built between two data steps) and do not widen the block.
MIN_LINE_SHARE = 0.05
BARE_CALL = re.compile(r"^[\w.]+\(.*\)$")
#: Statements of a block that only define names (kept out of a cache's if/else: the rest of the
#: program may call them either way).
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)


def anchor(chain: list, source_root: str | None) -> str | None:
    """The frame of a sample's program frames (``"path:line function"``, innermost first) in the
    function that ran the set-up: the outermost, stepping inward past lines that only call the
    next frame's function (``main()``, ``run(args)``)."""
    chain = [c for c in chain if c]
    for i in range(len(chain) - 1, 0, -1):
        text = stack_analysis.source_line(chain[i], source_root) or ""
        if not BARE_CALL.match(text):
            return chain[i]
    return chain[0] if chain else None


def _source_path(path: str, root: str | None) -> str | None:
    if path.startswith("<"):
        return None
    if not os.path.isabs(path):
        if root is None:
            return None
        path = os.path.join(root, path)
    return path if os.path.isfile(path) else None


def _body(tree: ast.Module, function: str, line: int) -> list[ast.stmt] | None:
    """The statements of the function named ``function`` that contains ``line`` (the module's
    body for ``<module>``)."""
    if function == "<module>":
        return tree.body
    for node in ast.walk(tree):
        if (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return node.body
    return None


#: Nodes with their own scope: names bound inside them are not the block's.
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
          ast.GeneratorExp)


def _names(node: ast.AST, ctx: type, after: int = 0) -> list[str]:
    """Names used with ``ctx`` (``ast.Store`` / ``ast.Load``) in ``node`` on lines after ``after``,
    in order, outside nested scopes (a def's or a comprehension's own names)."""
    out: list[str] = []
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ctx) and n.lineno > after and n.id not in out:
            out.append(n.id)
        todo.extend(c for c in reversed(list(ast.iter_child_nodes(n))) if not isinstance(c, SCOPES) or c is node)
    return out


def _narrow(body: list[ast.stmt], first: int, last: int) -> list[ast.stmt]:
    """The innermost statement list holding lines ``first``..``last``: into an ``if``, ``with`` or
    ``try`` whose one branch holds them all (never into a loop: a cache inside it would run per
    iteration)."""
    while True:
        inside = [s for s in body if s.lineno <= last and (s.end_lineno or s.lineno) >= first]
        if len(inside) != 1 or not isinstance(inside[0], (ast.If, ast.With, ast.Try)):
            return inside
        stmt = inside[0]
        branches = [stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])]
        branches += [h.body for h in getattr(stmt, "handlers", [])]
        branch = next((b for b in branches if b and b[0].lineno <= first and (b[-1].end_lineno or 0) >= last), None)
        if branch is None:
            return inside
        body = branch


def setup_block(anchors: dict[str, float], source_root: str | None) -> dict | None:
    """The block of set-up statements (module docstring) from ``anchors`` (anchor site → sampled
    seconds).

    Returns:
        ``{"site": "path:first-last function", "path", "function", "first_line", "last_line",
        "seconds", "names", "source", "definitions"}``: the busiest function's block of whole statements,
        ``seconds`` the anchored time inside it, ``names`` the names it binds that the rest of the
        function reads (empty when the source cannot be read or parsed), ``source`` the block's
        statements' text (None then), ``definitions`` the text of its ``def``/``class``/``import``
        statements, left out of ``source`` (None without); None without anchors.
    """
    by_function: dict[tuple[str, str], dict[int, float]] = {}
    for site, s in anchors.items():
        path, line, function = stack_analysis.split_site(site)
        if line is not None:
            lines = by_function.setdefault((path, function), {})
            lines[line] = lines.get(line, 0.0) + s
    if not by_function:
        return None
    (path, function), lines = max(by_function.items(), key=lambda kv: sum(kv[1].values()))
    total = sum(lines.values())
    held = sorted(ln for ln, s in lines.items() if s >= MIN_LINE_SHARE * total)
    first, last = held[0], held[-1]
    out = {"path": path, "function": function, "first_line": first, "last_line": last, "names": [], "source": None,
           "definitions": None}
    src = _source_path(path, source_root)
    try:
        text = cells.cell_text(path, source_root)  # a notebook cell's recorded text (record/cells.py)
        if text is None:
            with open(src or "", encoding="utf-8") as f:
                text = f.read()
        body = _body(ast.parse(text), function, first)
    except (OSError, SyntaxError, ValueError):
        body = None
    if body:
        inside = _narrow(body, first, last)
        if inside:
            first, last = inside[0].lineno, inside[-1].end_lineno or inside[-1].lineno
            read = {n for stmt in body if (stmt.end_lineno or stmt.lineno) > last for n in _names(stmt, ast.Load, last)}
            bound = [n for stmt in inside if not isinstance(stmt, DEFINITIONS) for n in _names(stmt, ast.Store)]
            out["names"] = list(dict.fromkeys(n for n in bound if n in read))
            src_lines = text.splitlines()

            def segment(stmt: ast.stmt) -> str:
                start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
                return "\n".join(src_lines[start - 1:stmt.end_lineno or stmt.lineno])

            out["source"] = "\n".join(segment(s) for s in inside if not isinstance(s, DEFINITIONS)) or None
            out["definitions"] = "\n\n".join(segment(s) for s in inside if isinstance(s, DEFINITIONS)) or None
            out.update(first_line=first, last_line=last)
    out["seconds"] = sum(s for ln, s in lines.items() if first <= ln <= last)
    out["site"] = f"{path}:{first}" + (f"-{last}" if last != first else "") + f" {function}"
    return out
