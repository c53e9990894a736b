"""The program's own hooks on the model, timed: forward hooks, backward hooks and gradient hooks
that a program or a tracker registers (``wandb.watch`` puts a forward hook on the model and a
gradient hook on every parameter, each reading whole tensors every ``log_freq`` calls; cases.md
C26). Their time sits inside ``forward`` and ``backward``, where it reads as device work unless
it is measured apart.

:meth:`HookTimer.install` wraps the registration methods (``nn.Module.register_forward_hook`` and
friends, ``Tensor.register_hook``, ``Tensor.register_post_accumulate_grad_hook``); a hook function
of the program's own files or of an experiment tracker is registered wrapped in a timer (the
handle the program gets back removes the wrapper: same semantics, same return value). Hooks of
PyTorch itself (DDP, FSDP, checkpointing), of other libraries and whyidle's own, and callable
objects, are left as they are. Per step the instrument takes
the nanoseconds spent in timed hooks (:meth:`take`); at exit :meth:`record` lists the hooks by
function and registration line. Standard library only.

The timer (:class:`TimedHook`) sits in the module's or tensor's hook dict in the hook's place, so
it must not change what the program does with its objects (issue 30): pickled (``torch.save(model)``,
``pickle``, ``multiprocessing``) it is the program's hook itself, a process without whyidle loads
it; ``copy.deepcopy`` gives the copy the hook, not the timer (the copy is not timed); attributes
(``__name__``...) read through to the hook; ``torch.jit.script`` compiles the hooks themselves
(:func:`plain_hooks` around ``torch.jit._recursive.create_script_module``); under TorchDynamo
tracing it calls the hook and nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import operator
import os
import sys
import types
from time import perf_counter_ns

from whyidle.instrument import patches
from whyidle.vocab import TRACKERS

#: Registration methods wrapped, with the phase their hooks run in.
MODULE_METHODS = {"register_forward_pre_hook": "forward", "register_forward_hook": "forward",
                  "register_full_backward_pre_hook": "backward", "register_full_backward_hook": "backward",
                  "register_backward_hook": "backward"}
TENSOR_METHODS = {"register_hook": "backward", "register_post_accumulate_grad_hook": "backward"}
#: Hook functions kept in the record (the costliest).
MAX_HOOKS = 8
_TIMED_OWNERS = TRACKERS | {"program"}
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # whyidle's package
#: The hook dicts of ``torch.nn.Module`` a registration method writes to.
MODULE_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


class TimedHook:
    """A hook of the program's, timed: calls ``hook`` and adds its time to ``timer`` and to
    ``entry`` (``[calls, ns]``), less the checkpoint or logging regions inside it (``regions``).

    Invisible to the program's objects: pickles as ``hook`` (``operator.getitem([hook], 0)``: the
    standard library rebuilds it), deep-copies to a deep copy of ``hook`` (a function is itself, a
    bound method is bound to the copy of its object), carries the hook's ``__name__``,
    ``__qualname__``, ``__module__`` and ``__doc__`` and reads its other attributes through.
    """

    def __init__(self, hook, timer, entry: list, regions, is_compiling) -> None:
        self.hook = hook
        self.timer = timer
        self.entry = entry
        self.regions = regions
        self.is_compiling = is_compiling
        for name in ("__name__", "__qualname__", "__module__", "__doc__"):
            try:
                setattr(self, name, getattr(hook, name))
            except AttributeError:  # a functools.partial has no __name__
                pass

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest leave whyidle's frame out of the program's tracebacks
        if self.is_compiling():  # TorchDynamo traces the hook: nothing of ours in its graph
            return self.hook(*args, **kwargs)
        regions = self.regions
        out0 = regions.outside_ns if regions is not None else 0
        t0 = perf_counter_ns()
        try:
            return self.hook(*args, **kwargs)
        finally:
            d = perf_counter_ns() - t0
            if regions is not None:
                d = max(0, d - (regions.outside_ns - out0))
            self.timer.ns += d
            self.entry[0] += 1
            self.entry[1] += d

    @property
    def __wrapped__(self):
        return self.hook

    def __getattr__(self, name):  # only for names not found on the timer itself
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.hook, name)

    def __reduce_ex__(self, protocol):
        return operator.getitem, ([self.hook], 0)

    def __deepcopy__(self, memo):
        return copy.deepcopy(self.hook, memo)

    def __repr__(self) -> str:
        return repr(self.hook)


@contextlib.contextmanager
def plain_hooks(module):
    """Within the block, the module hooks of ``module`` and its submodules are the program's own
    functions, not their :class:`TimedHook` timers (``torch.jit.script`` compiles each hook from
    its source). Restored at exit, where nothing replaced them meanwhile. Raises nothing of its own."""
    swapped = []
    try:
        for m in module.modules():
            for name in MODULE_HOOK_DICTS:
                hooks = getattr(m, name, None)
                for key, hook in list(hooks.items()) if isinstance(hooks, dict) else ():
                    if isinstance(hook, TimedHook):
                        hooks[key] = hook.hook
                        swapped.append((hooks, key, hook))
    except Exception:
        pass
    try:
        yield
    finally:
        for hooks, key, timed in swapped:
            if hooks.get(key) is timed.hook:
                hooks[key] = timed


def defined_at(code) -> str:
    """``"file:line"`` where a code object starts, the file relative to the working directory when
    it is under it (as the program's other sites are shown)."""
    cwd = os.getcwd() + os.sep
    path = code.co_filename
    return f"{path[len(cwd):] if path.startswith(cwd) else path}:{code.co_firstlineno}"


def owner(path: str | None) -> str:
    """The package a hook's code comes from (``wandb``, ``tensorboard`` …) for code installed in
    site-packages, else ``"program"`` (the user's own files)."""
    if not path:
        return "program"
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            i = parts.index(marker)
            if i + 1 < len(parts):
                return parts[i + 1].removesuffix(".py")
    return "program"


class HookTimer:
    """Times the program's hooks.

    Args:
        site_of: callable(frame) → (user site, leaf site) (the instrument's frame classifier),
            for the line that registered a hook.
        torch_dir: PyTorch's package directory (its own hooks are not timed).
        regions: the process's :class:`whyidle.instrument.regions.Regions` or None: a hook's
            checkpoint saving or tracker logging (``Regions.outside_ns``) is left out of its time,
            as the analysis leaves those regions out of the step (they are reported as themselves).
    """

    def __init__(self, site_of, torch_dir: str, regions=None) -> None:
        self.site_of = site_of
        self.regions = regions
        self.skip = (torch_dir.rstrip(os.sep) + os.sep, _OWN_DIR)
        self.ns = 0  # in timed hooks since the last take()
        self.by_hook: dict[tuple, list[int]] = {}  # (phase, function, def site, registered at) → [calls, ns]
        self.is_compiling = lambda: False  # TorchDynamo tracing (install() takes PyTorch's)
        self.placed: list[tuple] = []  # (weakref to a hook dict, key, TimedHook): see unwrap_all()
        self._placed_max = 1024

    def wrap(self, hook, phase: str, frame):
        """``hook`` wrapped in a timer when it is a function (or method, or ``functools.partial``
        of one) of the program's own files or of a tracker (:data:`whyidle.vocab.TRACKERS`); else ``hook``
        itself: PyTorch's, whyidle's and other libraries' hooks, and callable objects, which a
        library may look for again by type in the module's hook dicts (``torch.nn.utils.prune``)."""
        fn = hook.func if isinstance(hook, functools.partial) else hook
        if not isinstance(fn, (types.FunctionType, types.MethodType)):
            return hook
        code = fn.__code__
        path = code.co_filename
        if path.startswith(self.skip) or owner(path) not in _TIMED_OWNERS:
            return hook
        name = getattr(fn, "__qualname__", None) or fn.__name__
        where = defined_at(code)
        try:
            registered = self.site_of(frame)[0] if frame is not None else None
        except Exception:
            registered = None
        entry = self.by_hook.setdefault((phase, name, where, registered), [0, 0])
        return TimedHook(hook, self, entry, self.regions, self.is_compiling)

    def install(self, torch) -> None:
        """Wraps the registration methods of ``torch.nn.Module`` and ``torch.Tensor``, and
        ``torch.jit._recursive.create_script_module`` (the module scripting entry point) so that
        it compiles the program's hooks, not their timers."""
        compiler = getattr(torch, "compiler", None)
        self.is_compiling = (getattr(compiler, "is_dynamo_compiling", None) or getattr(compiler, "is_compiling", None)
                             or self.is_compiling)
        from whyidle.instrument.forward import skip_in_dynamo

        skip_in_dynamo(TimedHook.__call__.__code__)  # Dynamo compiles the hook's own frame, as without us
        patches.on_restore(self.unwrap_all)
        for cls, methods in ((torch.nn.Module, MODULE_METHODS), (torch.Tensor, TENSOR_METHODS)):
            for name, phase in methods.items():
                orig = cls.__dict__.get(name)
                if orig is None:
                    continue
                patches.assign(cls, name, self._registering(orig, phase))
        recursive = getattr(getattr(torch, "jit", None), "_recursive", None)
        create = getattr(recursive, "create_script_module", None)
        if create is not None:

            @functools.wraps(create)
            def create_script_module(nn_module, *args, **kwargs):
                with plain_hooks(nn_module):
                    return create(nn_module, *args, **kwargs)

            patches.assign(recursive, "create_script_module", create_script_module)

    def _registering(self, orig, phase: str):
        timer = self

        @functools.wraps(orig)
        def register(self, hook, *args, **kwargs):
            timed = hook
            try:
                timed = timer.wrap(hook, phase, sys._getframe(1))
            except Exception:  # never in the program's way
                pass
            handle = orig(self, timed, *args, **kwargs)
            if timed is not hook:
                timer._placed(handle, timed)
            return handle

        return register

    def _placed(self, handle, timed: TimedHook) -> None:
        """Remembers where a timer went (the handle's hook dict, weakly, and key) for :meth:`unwrap_all`;
        forgets dicts that are gone once the list grows (a tensor hook registered every step)."""
        ref = getattr(handle, "hooks_dict_ref", None)
        if ref is None:
            return
        if len(self.placed) >= 2 * self._placed_max:
            self.placed = [p for p in self.placed if p[0]() is not None]
            self._placed_max = max(self._placed_max, len(self.placed))
        self.placed.append((ref, handle.id, timed))

    def unwrap_all(self) -> int:
        """Puts the program's own hook back in place of every timer still in a hook dict (the
        registration keys, hence the program's handles, stay valid). Returns how many. Raises nothing."""
        n = 0
        for ref, key, timed in self.placed:
            try:
                hooks = ref()
                if hooks is not None and hooks.get(key) is timed:
                    hooks[key] = timed.hook
                    n += 1
            except Exception:
                pass
        self.placed = []
        return n

    def take(self) -> int:
        """Nanoseconds in timed hooks since the last call (a step's share)."""
        ns, self.ns = self.ns, 0
        return ns

    def record(self, t: int) -> dict | None:
        """The ``hooks`` record: the costliest hook functions (None when no hook ran)."""
        rows = sorted(((v[1], v[0], k) for k, v in self.by_hook.items() if v[0]), reverse=True)[:MAX_HOOKS]
        if not rows:
            return None
        return {"k": "hooks", "t": t, "hooks": [
            {"phase": phase, "function": name, "defined": where, "registered": registered, "owner": owner(where),
             "calls": calls, "s": round(ns / 1e9, 6)} for ns, calls, (phase, name, where, registered) in rows]}
