"""Strict JSON (RFC 8259) out of whyidle's dicts: no NaN or Infinity, which JSON lacks and other
tools' readers reject. Standard library only (the in-process agent's writer imports it)."""

from __future__ import annotations

import json
import math


def finite(obj):
    """``obj`` (JSON-like: dicts, lists, tuples, numbers, numpy arrays and scalars) with every NaN
    and infinity replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy arrays and scalars
        return finite(obj.tolist())
    return obj


def json_text(obj, indent: int | None = 1) -> str:
    """``obj`` as strict JSON text (:func:`finite` applied when it holds a non-finite number;
    other values JSON lacks as their ``str``)."""
    try:
        return json.dumps(obj, indent=indent, default=str, allow_nan=False)
    except ValueError:  # a non-finite number got past the builders
        return json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)
