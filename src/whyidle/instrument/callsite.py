"""The source text of the arguments of the call a frame is executing.

A fix is only useful if it can be pasted: ``DataLoader(self.train_ds, ...)`` where the program wrote
``self.train_ds``, not a name whyidle made up. When the program builds a ``DataLoader``, the
caller's frame is executing that call; Python 3.11+ maps each instruction to the exact span of
source it came from (``code.co_positions()``, PEP 657), so the call expression can be cut out of
the file and parsed with :mod:`ast`. Runs once per DataLoader construction, never per step.
"""

from __future__ import annotations

import ast
import linecache

#: Longest argument text kept (characters); longer expressions are not worth pasting into a fix.
MAX_ARG_CHARS = 80


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
        name → the argument's source text as written (e.g. ``{"dataset": "self.train_ds"}``), for
        the arguments passed and at most :data:`MAX_ARG_CHARS` long; ``{}`` when the call is not to
        ``callee``, when the source is not
        available (no file, ``python -c``, a compiled module), the call cannot be located (Python
        before 3.11) or does not parse. Never raises.
    """
    try:
        code = frame.f_code
        line0, line1, col0, col1 = list(code.co_positions())[frame.f_lasti // 2]
        if None in (line0, line1, col0, col1):
            return {}
        lines = linecache.getlines(code.co_filename, frame.f_globals)[line0 - 1:line1]
        if not lines:
            return {}
        raw = [line.encode() for line in lines]  # columns are UTF-8 byte offsets
        raw[-1] = raw[-1][:col1]
        raw[0] = raw[0][col0:]
        text = b"".join(raw).decode()
        call = ast.parse(text, mode="eval").body
        if not isinstance(call, ast.Call):
            return {}
        func = call.func
        if (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None) != callee:
            return {}
        out = {}
        for name, pos in spec.items():
            node = next((k.value for k in call.keywords if k.arg == name), None)
            if node is None and pos is not None and pos < len(call.args):
                if any(isinstance(a, ast.Starred) for a in call.args[:pos + 1]):
                    continue
                node = call.args[pos]
            if node is not None:
                src = ast.get_source_segment(text, node) or ast.unparse(node)
                src = " ".join(src.split())
                if len(src) <= MAX_ARG_CHARS:
                    out[name] = src
        return out
    except Exception:
        return {}
