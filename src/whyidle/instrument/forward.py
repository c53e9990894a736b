"""Forward timing with nothing on the program's modules.

Every module call goes through ``torch.nn.Module.__call__``, a class attribute of PyTorch's own
class; :func:`install` replaces it by one wrapper. Unlike module hooks (per-module
``register_forward_hook``: closures in the module's ``_forward_hooks``, which ``torch.save(model)``,
``pickle`` and ``torch.jit.script`` then meet and ``copy.deepcopy`` copies onto the copy; issue 30)
or global module hooks (every submodule off PyTorch's hook-free fast path, and a warning from
``torch.compile``'s ``OptimizedModule`` on each call), the wrapper leaves no trace on any module
or on the program's classes: PyTorch's class is pickled by reference, by every pickler.

Two modes, read from the instrument (``inst``) on each call:

- *learning* (``inst.learning``): every call of the training thread goes to
  ``inst.on_forward_pre(module, args, frame)`` / ``inst.on_forward_post()`` (the outermost calls
  are the step's forward, the nested ones feed the repeated-module count; the top-level modules
  are learnt);
- then only the outermost calls (``inst.depth`` 0), of any module: a teacher or EMA copy that is
  first called after the learning steps is the model's work too, timed by its own calls (not by
  hooks copied from the model, as per-module hooks were), and only while the phase hooks are in
  (``inst.tracking``) or the calls mark the steps (``inst.marker == "forward"``). A nested call
  costs one Python frame and a few attribute reads (~0.3 µs, ``benchmarks/hook_cost.py``); on the
  lite steps of short CPU steps PyTorch's own ``__call__`` is put back (the switch :func:`install`
  returns), so they cost nothing, until the program compiles (:func:`pin`), unless the model is
  small enough that passing its calls through costs less than the switch
  (``inst.fwd_resident``, ``TorchInstrument._forward_residency``): assigning ``Module.__call__``
  walks every ``Module`` subclass and slows the steps around it by ~0.4 ms.

Under TorchDynamo tracing (``torch.compile``) the wrapper is traced too: it calls
``is_dynamo_compiling()`` first, which Dynamo folds to True, so it reads none of whyidle's state
there (a read would become a guard, and a changed value a recompilation). Dynamo inlines it where
compiled code calls a module, like PyTorch's own ``__call__``; where Dynamo meets it as a frame of
its own (``torch.compile(model)`` calls the model's ``__call__`` in its compiled region; under
``model.compile()``, between PyTorch's frames that it skips), :func:`install_dynamo` makes it skip
that frame, as it skips PyTorch's, and every frame of whyidle's bookkeeping under it, instead of
compiling frames the program never had. Standard library only; ``torch`` is the program's own
module, passed in.
"""

from __future__ import annotations

import sys
import threading

from whyidle.instrument import patches

#: ``(code, recursive)`` of whyidle's functions that TorchDynamo must not compile as frames of their
#: own: the wrappers that sit where PyTorch's frames were (this module's ``__call__``, the hook
#: timer's; the frames they call, the program's, are Dynamo's as without us) and, recursively, the
#: bookkeeping they call.
_SKIPPED_CODES: list = []
_SKIP = None  # callable(code, recursive) once torch._dynamo is imported


def skip_in_dynamo(code, recursive: bool = False) -> None:
    """TorchDynamo will skip frames of ``code`` (``recursive``: and every frame they call) reached
    outside a compiled region; it still inlines calls from compiled code. Now if ``torch._dynamo``
    is imported, else when it is. Raises nothing."""
    _SKIPPED_CODES.append((code, recursive))
    if _SKIP is not None:
        try:
            _SKIP(code, recursive)
        except Exception:
            pass


def install_dynamo(agent, dynamo) -> None:
    """Post-import hook of ``torch._dynamo``: the codes of :data:`_SKIPPED_CODES` are skipped
    (``torch._dynamo.eval_frame.set_code_exec_strategy``, the mechanism of its ``skip_code``).
    Errors propagate (the agent's one notice)."""
    global _SKIP
    from torch._dynamo import eval_frame
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    def skip(code, recursive: bool) -> None:
        strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP if recursive else FrameAction.DEFAULT)
        eval_frame.set_code_exec_strategy(code, strategy)

    for code, recursive in _SKIPPED_CODES:
        skip(code, recursive)
    _SKIP = skip


def put_in() -> None:
    """The wrapper in ``Module.__call__`` now: right before ``torch._dynamo`` imports, which keeps
    the ``__call__`` it finds as PyTorch's own (it compiles a module whose ``__call__`` is that one
    through its ``forward``, and traces any other). Raises nothing."""
    if _WRAPPER is not None:
        module_cls, wrapper, call = _WRAPPER
        if module_cls.__dict__.get("__call__") is call:
            patches.assign(module_cls, "__call__", wrapper)


def pin() -> None:
    """The wrapper goes in for good, no more :func:`install`'s switch: called when the program
    compiles (``torch.compile``), since compiled code may be guarded on ``Module.__call__``.
    Raises nothing."""
    global _PINNED
    _PINNED = True
    put_in()


_PINNED = False
_WRAPPER = None  # (torch.nn.Module, the wrapper, PyTorch's __call__) once installed


#: Modules of TorchDynamo holding the ``Module.__call__`` it found at import as PyTorch's own
#: (``unpatched_nn_module_call``: a module whose ``__call__`` is that one is compiled through its
#: ``forward``, any other ``__call__`` is traced).
_DYNAMO_HOLDERS = ("torch._dynamo.utils", "torch._dynamo.variables.nn_module")


def _dynamo_sees(value, instead_of) -> None:
    """TorchDynamo takes ``value`` for PyTorch's ``Module.__call__`` where it holds ``instead_of``."""
    for name in _DYNAMO_HOLDERS:
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "unpatched_nn_module_call", None) is instead_of:
            mod.unpatched_nn_module_call = value


def _forget() -> None:
    """``whyidle.watch()`` ended: PyTorch's ``__call__`` is back, and TorchDynamo sees it as its own."""
    global _PINNED, _WRAPPER
    if _WRAPPER is not None:
        _dynamo_sees(_WRAPPER[2], _WRAPPER[1])
    _PINNED, _WRAPPER = False, None


def install(torch, inst):
    """Replaces ``torch.nn.Module.__call__`` by the timing wrapper (once per process).

    Args:
        torch: the program's ``torch`` module.
        inst: the :class:`whyidle.instrument.torch.TorchInstrument` whose attributes ``off``,
            ``tid``, ``depth``, ``learning``, ``tracking``, ``marker`` (and ``fwd_resident``) the wrapper reads and
            whose ``on_forward_pre`` / ``on_forward_post`` / ``fail`` it calls.
    Returns:
        ``switch(on)``: between steps, puts the wrapper in where it has work (learning, phase-tracked
        steps, forward-marked steps) and PyTorch's ``__call__`` back where it has none (the lite
        steps of short CPU steps: module calls then cost nothing), unless :func:`pin` ran or another
        library replaced ``__call__`` since.
    Errors: none raised; an error in whyidle's own work turns the instrumentation off
    (``inst.fail``) and the call goes on.
    """
    global _WRAPPER
    module_cls = torch.nn.Module
    call = module_cls.__call__
    compiler = getattr(torch, "compiler", None)
    is_compiling = (getattr(compiler, "is_dynamo_compiling", None) or getattr(compiler, "is_compiling", None)
                    or (lambda: False))
    get_ident = threading.get_ident

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest leave whyidle's frame out of the program's tracebacks
        if is_compiling() or not (inst.tracking or inst.learning or inst.marker == "forward"):
            return call(self, *args, **kwargs)  # (the second test first: a lite step's calls pass here)
        if (inst.depth and not inst.learning) or inst.off or get_ident() != inst.tid:
            return call(self, *args, **kwargs)
        try:
            inst.on_forward_pre(self, args, sys._getframe(1))
        except Exception as exc:
            inst.fail("a forward pre-hook", exc)
            return call(self, *args, **kwargs)
        try:
            return call(self, *args, **kwargs)
        finally:
            if not inst.off:
                try:
                    inst.on_forward_post()
                except Exception as exc:
                    inst.fail("a forward hook", exc)

    __call__.__doc__ = call.__doc__
    __call__.__wrapped__ = call  # inspect.signature(Module.__call__) reads PyTorch's
    patches.assign(module_cls, "__call__", __call__)
    _dynamo_sees(__call__, call)  # TorchDynamo imported before (an earlier watch, a notebook's cell)
    _WRAPPER = (module_cls, __call__, call)
    patches.on_restore(_forget)
    skip_in_dynamo(__call__.__code__)
    for method in (type(inst).on_forward_pre, type(inst).on_forward_post, type(inst).fail):
        skip_in_dynamo(method.__code__, recursive=True)

    def switch(on: bool) -> None:
        if _PINNED or module_cls.__dict__.get("__call__") not in (__call__, call):
            return
        needed = not inst.off and (inst.learning or inst.tracking or inst.marker == "forward"
                                   or getattr(inst, "fwd_resident", False))
        patches.assign(module_cls, "__call__", __call__ if needed else call)

    return switch
