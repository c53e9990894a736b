"""What whyidle left in a process after ``whyidle.watch()`` / ``%%whyidle`` ended: imported by the
tests (and by the notebook test's kernel), never by whyidle itself."""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
import warnings

import whyidle

PACKAGE = os.path.dirname(os.path.abspath(whyidle.__file__)) + os.sep
#: Top-level packages whose classes and module attributes whyidle's instruments replace.
PATCHED = ("torch", "keras", "tensorflow", "tf_keras", "lightning", "pytorch_lightning", "transformers",
           "accelerate", "wandb", "mlflow", "safetensors", "warnings")


def _ours(value) -> bool:
    try:
        for v in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            filename = getattr(getattr(v, "__code__", None), "co_filename", None)
            if isinstance(filename, str) and filename.startswith(PACKAGE):
                return True
        return str(getattr(type(value), "__module__", "")).startswith("whyidle.")
    except Exception:  # an object whose attributes cannot be read is not ours
        return False


def leftovers(objects=()) -> list[str]:
    """Every trace of whyidle in this process: attributes of the frameworks' modules and classes
    that are whyidle's functions, hooks of ``objects`` (modules, tensors) that are whyidle's
    timers, global optimizer and module hooks, import hooks, threads, the stack sampler's signal
    handler, the dynamo callbacks and the agent itself. Empty when nothing is left."""
    from whyidle.instrument import agent, patches

    found = []
    with warnings.catch_warnings():  # reading deprecated attributes (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        found += _attributes()
    for obj in objects:
        subs = obj.modules() if hasattr(obj, "modules") else [obj]
        for m in subs:
            for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
                found += [f"{type(m).__name__}.{attr}" for h in (getattr(m, attr, None) or {}).values() if _ours(h)]
    optim = sys.modules.get("torch.optim.optimizer")
    for attr in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        found += [f"optimizer.{attr}" for h in (getattr(optim, attr, None) or {}).values() if _ours(h)]
    module_mod = sys.modules.get("torch.nn.modules.module")
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks"):
        found += [f"module.{attr}" for h in (getattr(module_mod, attr, None) or {}).values() if _ours(h)]
    cb = getattr(sys.modules.get("torch._dynamo.callback"), "callback_handler", None)
    for attr in ("start_callbacks", "end_callbacks"):
        found += [f"dynamo.{attr}" for h in getattr(cb, attr, None) or () if _ours(h)]
    if cb is not None and _ours(vars(cb).get("clear")):
        found.append("dynamo.callback_handler.clear")
    found += [f"sys.meta_path {type(f).__name__}" for f in sys.meta_path if _ours(f)]
    found += [f"thread {t.name}" for t in threading.enumerate() if t.name.startswith("whyidle")]
    urg = getattr(signal, "SIGURG", None)
    if urg is not None and _ours(signal.getsignal(urg)):
        found.append("SIGURG handler")
    if agent.current() is not None:
        found.append("agent")
    if patches.active():
        found.append(f"{patches.active()} patches")
    return found


def _attributes() -> list[str]:
    found = []
    for name, mod in list(sys.modules.items()):
        if mod is None or name.split(".")[0] not in PATCHED:
            continue
        owners = [(name, mod)]
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        owners += [(f"{name}.{k}", v) for k, v in items
                   if inspect.isclass(v) and getattr(v, "__module__", None) == name]
        for label, owner in owners:
            try:
                attrs = list(vars(owner).items())
            except TypeError:
                continue
            found += [f"{label}.{k}" for k, v in attrs if not k.startswith("__whyidle") and _ours(v)]
    return found
