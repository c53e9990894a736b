"""Every attribute whyidle replaces on the program's classes and modules, so that it can be undone.

``whyidle run`` never undoes its hooks: they live as long as the process. ``whyidle.watch()`` and
the ``%%whyidle`` cell magic observe one part of a long-lived process (a notebook kernel, a test
harness) and must leave it as they found it (issue 33): each instrument replaces attributes
through :func:`assign` and registers its other clean-up (hook handles, module state) with
:func:`on_restore`; :func:`restore` undoes all of it, last change first.

An attribute that someone else replaced after us (another profiler wrapping ``Module.__call__``)
is left as it is: their wrapper calls ours, which passes every call through once the agent is
stopped (every wrapper tests its instrument's ``off`` / the agent's ``disabled``). Standard
library only.
"""

from __future__ import annotations

import threading

#: (id(owner), name) → [owner, name, had its own attribute, the original, ours now]
_ASSIGNED: dict[tuple[int, str], list] = {}
_UNDO: list = []
_LOCK = threading.Lock()
_MISSING = object()


def assign(owner, name: str, value) -> None:
    """``setattr(owner, name, value)``, remembering what ``owner`` itself held before whyidle's
    first change of that attribute (``owner`` a class or a module). No ``setattr`` when ``owner``
    holds ``value`` already: assigning a class attribute, even the same one, invalidates the
    attribute caches of the class and of every subclass (``torch.nn.Module``: hundreds, ~0.4 ms of a
    training step, ``instrument/torch.py`` ``FORWARD_SWITCH_NS``). Errors: those of ``setattr``."""
    with _LOCK:
        key = (id(owner), name)
        own = _own(owner)
        entry = _ASSIGNED.get(key)
        if entry is None:
            entry = _ASSIGNED[key] = [owner, name, name in own, own.get(name), value]
        entry[4] = value
    if own.get(name, _MISSING) is not value:
        setattr(owner, name, value)


def on_restore(undo) -> None:
    """Calls ``undo()`` (no arguments) at :func:`restore`, before the attributes are put back."""
    with _LOCK:
        _UNDO.append(undo)


def restore() -> list[str]:
    """Undoes every :func:`on_restore` clean-up (last registered first), then every
    :func:`assign` whose value is still ours (last first); forgets them all.

    Returns: ``"owner.name"`` of the attributes left as they were because someone replaced ours
    since (their wrappers still call ours, which then only pass calls through). Never raises:
    a clean-up that fails is skipped.
    """
    with _LOCK:
        undo, assigned = _UNDO[::-1], list(_ASSIGNED.values())[::-1]
        _UNDO.clear()
        _ASSIGNED.clear()
    for fn in undo:
        try:
            fn()
        except Exception:
            pass
    kept = []
    for owner, name, had, original, ours in assigned:
        try:
            own = _own(owner)
            now = own.get(name, _MISSING)
            if now is not ours:  # put back already (an instrument's own stop), or replaced since
                if now is not (original if had else _MISSING):
                    kept.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{name}")
            elif had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        except Exception:
            pass
    return kept


def active() -> int:
    """How many attributes are replaced now (0 after :func:`restore`)."""
    return len(_ASSIGNED)


def _own(owner) -> dict:
    try:
        return vars(owner)
    except TypeError:
        return {}
