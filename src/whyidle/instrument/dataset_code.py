"""Where a DataLoader's Dataset class is defined, and what the workers start with (``loader`` record).

A fix that moves the loading into worker processes must know whether those workers can import the
Dataset class: under the ``spawn`` and ``forkserver`` start methods each worker unpickles the
dataset, so its class (and the functions its methods call) must be importable by name, which a
class defined in a notebook cell (module ``__main__`` of the kernel) is not. :func:`dataset_code`
says where the class's code is (a site string, named like every other site, so the analysis renames
a notebook cell's file to ``cell N:L``) and which of its module's functions and classes its methods
call; :func:`start_method` reads the start method the workers would use without choosing one.

Standard library only; both are called once per DataLoader (its first iteration) and never raise.
"""

from __future__ import annotations

import sys
import types

#: Wrapped datasets followed (``Subset(ds).dataset``, a wrapper's ``.dataset``) looking for the
#: program's own class.
WRAPPER_DEPTH = 4

#: Names of the class's module its methods call that are kept (the ``calls`` list).
MAX_CALLS = 12

#: Levels of calls followed from the class's methods into the module's own functions.
CALL_DEPTH = 3

#: The methods whose code tells where the class is (the first one the class itself defines).
METHODS = ("__getitem__", "__iter__", "__init__", "__len__")


def _function(value):
    """The plain function behind a class attribute (a method, staticmethod, classmethod, property
    getter), or None."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if isinstance(value, types.FunctionType) else None


def _codes(code: types.CodeType):
    """``code`` and every code object nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _own_method(cls, classify) -> tuple[str, types.FunctionType] | None:
    """The first of :data:`METHODS` that ``cls`` defines itself in the program's code."""
    for name in METHODS:
        fn = _function(cls.__dict__.get(name))
        if fn is not None and classify(fn.__code__.co_filename)[0] == 0:
            return name, fn
    return None


def _calls(cls, module: str) -> list[str]:
    """The functions and classes of ``module`` (the class's own) that ``cls``'s methods call, and
    those they call in turn (:data:`CALL_DEPTH` levels), in order of first reference."""
    found: list[str] = []
    todo = [f for f in map(_function, vars(cls).values()) if f is not None]
    seen = {cls}
    for _ in range(CALL_DEPTH):
        nxt = []
        for fn in todo:
            names = fn.__globals__
            for code in _codes(fn.__code__):
                for name in code.co_names:
                    value = names.get(name)
                    if not isinstance(value, (types.FunctionType, type)) or value in seen \
                            or getattr(value, "__module__", None) != module:
                        continue
                    if isinstance(value, types.FunctionType):
                        nxt.append(value)
                    else:
                        nxt.extend(f for f in map(_function, vars(value).values()) if f is not None)
                    seen.add(value)
                    if name not in found and len(found) < MAX_CALLS:
                        found.append(name)
        todo = nxt
    return found


def dataset_code(dataset, classify) -> dict | None:
    """Where the program's Dataset class of a DataLoader is defined.

    Args:
        dataset: the DataLoader's ``dataset``; wrappers (``Subset``, any object whose class is not
            the program's and that has a ``dataset`` attribute) are followed
            :data:`WRAPPER_DEPTH` levels to the program's class.
        classify: ``callable(filename) → (kind, label)``, kind 0 for the program's code
            (:meth:`whyidle.instrument.stacks.FrameClassifier.classify`).
    Returns: ``{"class": name, "module": the class's module (``"__main__"`` for a notebook cell or
    a script), "site": "<file label>:<line> <Class.method>" (the first line of the first of
    :data:`METHODS` the class defines), "calls": [names of the module's functions and classes its
    methods call]}``, or None when no class of the program's code is found. Never raises.
    """
    try:
        obj = dataset
        for _ in range(WRAPPER_DEPTH + 1):
            if obj is None:
                return None
            cls = type(obj)
            own = _own_method(cls, classify)
            if own is not None:
                name, fn = own
                code = fn.__code__
                module = getattr(cls, "__module__", None)
                return {"class": cls.__name__, "module": module,
                        "site": f"{classify(code.co_filename)[1]}:{code.co_firstlineno} {cls.__name__}.{name}",
                        "calls": _calls(cls, module) if isinstance(module, str) else []}
            obj = getattr(obj, "dataset", None)
    except Exception:
        return None
    return None


def start_method(loader) -> dict:
    """What decides the start method of a DataLoader's workers, without deciding it:
    ``mp_context`` (the loader's own ``multiprocessing_context``: its start method, or None),
    ``start_method_set`` (``multiprocessing.get_start_method(allow_none=True)``: the method the
    program fixed, None while it is still the platform's default; never called without
    ``allow_none``, which would fix it for the program) and ``platform`` (``sys.platform``). The
    analysis computes the platform's default (:func:`whyidle.analysis.notebook.worker_start`)."""
    ctx = getattr(loader, "multiprocessing_context", None)
    method = None
    try:
        import multiprocessing
        from multiprocessing.context import DefaultContext

        if isinstance(ctx, DefaultContext):  # its get_start_method() would fix the default
            method = ctx.get_start_method(allow_none=True)
        elif hasattr(ctx, "get_start_method"):
            method = ctx.get_start_method()
        elif isinstance(ctx, str):
            method = ctx
        chosen = multiprocessing.get_start_method(allow_none=True)
    except Exception:
        chosen = None
    return {"mp_context": method if isinstance(method, str) else None,
            "start_method_set": chosen if isinstance(chosen, str) else None, "platform": sys.platform}
