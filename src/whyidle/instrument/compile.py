"""torch.compile's own account of its work: compilations, recompilations, graph breaks and the
recompile limit (runs inside the trainer, installed when the program imports ``torch._dynamo``).

Sources, all TorchDynamo's own (nothing is guessed from slow steps):

- **Compile time**: ``torch._dynamo.callback.callback_handler``'s start/end callbacks, run around
  every compilation (Dynamo's frame conversion, a lazily compiled backward, a CUDA-graph recording).
  PyTorch ≤ 2.7 calls them without arguments; later versions pass ``CallbackArgs``
  (``callback_trigger``, ``compile_id``). Both are accepted (``*args``). ``torch._dynamo.reset()``
  clears the callbacks: they are registered again right after. One ``compile`` record per
  compilation: ``t0``/``t1`` (monotonic ns), ``id`` (``"frame/recompile"``, None on old versions),
  ``trig`` (``DYNAMO``, ``LAZY_BACKWARD``, ``CUDAGRAPH_RECORDING``, ...), ``main`` (on the training
  thread).
- **What was compiled and why**: ``torch._dynamo.utils.get_compilation_metrics()`` (one entry per
  frame conversion: code name, file, first line, seconds, ``recompile_reason`` since 2.5,
  ``fail_type``/``fail_reason``), read on the compiling thread at each callback and at exit; one
  ``compile_frame`` record per forward entry.
- **Graph breaks and the recompile limit**: ``torch._dynamo.utils.counters`` at exit
  (``graph_break`` and ``unimplemented`` reasons with counts, ``resumes``: the resume functions
  Dynamo made at each break, named ``torch_dynamo_resume_in_<function>_at_<line>``), and the
  warning Dynamo logs when a frame hits ``config.recompile_limit`` (``cache_size_limit`` before
  2.6), seen by a logging filter that lets every record through (``compile_limit`` record, with its
  time: the frame runs eagerly from then on). One ``compile_summary`` record at exit.

What a version lacks is said once (a ``notice``) and left unobserved; nothing here runs in the
program's compiled code or adds a synchronization.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from time import monotonic_ns

from whyidle.instrument import patches

#: Dynamo's logger for frame conversion (where the recompile-limit warning is logged, 2.1–2.13).
CONVERT_LOGGER = "torch._dynamo.convert_frame"
#: The start of that warning's format string ("torch._dynamo hit config.%s (%s)" since 2.6,
#: "torch._dynamo hit config.cache_size_limit (%s)" before).
LIMIT_WARNING = "torch._dynamo hit config."
#: Reasons kept per summary (most frequent first) and characters per reason.
MAX_REASONS = 12
REASON_CHARS = 400


def _trigger(args) -> tuple[str | None, str | None]:
    """``(trigger name, compile id)`` of a callback's arguments: ``CallbackArgs`` (torch ≥ 2.8), or
    nothing (older versions)."""
    if not args:
        return None, None
    a = args[0]
    trig = getattr(a, "callback_trigger", None)
    name = getattr(trig, "name", None) or (str(trig) if trig is not None else None)
    cid = getattr(a, "compile_id", None)
    return name, (str(cid) if cid is not None else None)


class CompileWatch:
    """The callbacks and readers of the module docstring, for one process.

    Args:
        record: the agent's record function (thread-safe).
        main_tid: callable returning the training thread's ident (None while unknown).
        metrics: callable returning Dynamo's compilation metrics list (or None: not available).
        counters: callable returning Dynamo's counters mapping (or None).
        startup: callable returning the start-up stack sampler (:mod:`whyidle.instrument.startup`)
            or None: its samples during a compilation get the phase ``"compile"``.
    """

    def __init__(self, record, main_tid, metrics=None, counters=None, startup=None) -> None:
        self.record = record
        self.startup = startup  # callable: the start-up stack sampler while it samples, else None
        self.saved_phase = None
        self.main_tid = main_tid
        self.get_metrics = metrics
        self.get_counters = counters
        self.open: dict[int, int] = {}  # thread ident -> t0 (ns) of its compilation in progress
        self.seen: set = set()  # metrics entries recorded: (compile id, is_forward, start time)
        self.limits = 0

    def start(self, *args) -> None:
        """Compile-start callback (either signature)."""
        self.open[threading.get_ident()] = monotonic_ns()
        sampler = self.startup() if self.startup is not None else None
        if sampler is not None and threading.current_thread() is threading.main_thread():
            self.saved_phase, sampler.phase = sampler.phase, "compile"
        self.read_metrics()

    def end(self, *args) -> None:
        """Compile-end callback (either signature): one ``compile`` record."""
        t1 = monotonic_ns()
        tid = threading.get_ident()
        if tid not in self.open and self.open:
            # Dynamo runs the callbacks around the outermost of concurrent compilations (one counter
            # for all threads): the end can come on another thread than the start
            tid = min(self.open, key=self.open.get)
        t0 = self.open.pop(tid, None)
        if t0 is None:
            return
        sampler = self.startup() if self.startup is not None else None
        if sampler is not None and self.saved_phase is not None and tid == threading.main_thread().ident:
            sampler.phase, self.saved_phase = self.saved_phase, None
        trig, cid = _trigger(args)
        self.record({"k": "compile", "t": t1, "t0": t0, "t1": t1, "id": cid, "trig": trig,
                     "main": tid == self.main_tid()})
        self.read_metrics()

    def read_metrics(self) -> None:
        """Records the compilation-metrics entries not recorded yet (forward conversions)."""
        if self.get_metrics is None:
            return
        for m in self.get_metrics() or ():
            key = (getattr(m, "compile_id", None), getattr(m, "is_forward", True), getattr(m, "start_time", None))
            if key in self.seen:
                continue
            self.seen.add(key)
            if getattr(m, "is_forward", True) is False or not getattr(m, "co_name", None):
                continue  # a backward's own entry: its time is the forward conversion's compile record
            fname, line = getattr(m, "co_filename", None), getattr(m, "co_firstlineno", None)
            self.record({
                "k": "compile_frame", "t": monotonic_ns(), "id": str(key[0]) if key[0] is not None else None,
                "fn": m.co_name, "file": fname, "line": line,
                "s": _num(getattr(m, "entire_frame_compile_time_s", None)),
                "reason": _text(getattr(m, "recompile_reason", None)),
                "fail": _text(getattr(m, "fail_type", None)), "fail_reason": _text(getattr(m, "fail_reason", None)),
                "graph_breaks": getattr(m, "num_graph_breaks", None),
            })

    def on_limit(self, msg: str, args) -> None:
        """The recompile-limit warning was logged: its frame runs eagerly from now on."""
        self.limits += 1
        parts = [str(a) for a in (args or ())]
        if not msg.startswith(LIMIT_WARNING + "%s"):  # "...config.cache_size_limit (%s)": the name is in the text
            parts.insert(0, msg[len(LIMIT_WARNING):].split(" ")[0])
        self.record({"k": "compile_limit", "t": monotonic_ns(), "what": parts[0] if parts else None,
                     "limit": parts[1] if len(parts) > 1 else None,
                     "fn": parts[2] if len(parts) > 2 else None, "reason": _text(parts[3] if len(parts) > 3 else None)})

    def summary(self) -> dict:
        """The ``compile_summary`` record (at exit): graph-break reasons, resume functions, frames."""
        self.read_metrics()
        counters = self.get_counters() if self.get_counters is not None else None
        out = {"k": "compile_summary", "t": monotonic_ns(), "limit_hits": self.limits}
        if counters is None:
            return out
        breaks, unsupported = [], []
        for key, into in (("graph_break", breaks), ("unimplemented", unsupported)):
            for reason, n in sorted(dict(counters.get(key) or {}).items(), key=lambda kv: -kv[1])[:MAX_REASONS]:
                into.append({"reason": _text(reason), "count": int(n)})
        out.update(breaks=breaks, unsupported=unsupported,
                   resumes={str(k): int(v) for k, v in dict(counters.get("resumes") or {}).items()},
                   frames={str(k): int(v) for k, v in dict(counters.get("frames") or {}).items()})
        return out


def _num(x):
    return float(x) if isinstance(x, (int, float)) else None


def _text(x) -> str | None:
    if x is None:
        return None
    s = str(x).strip()
    return s[:REASON_CHARS] if s else None


class _LimitFilter(logging.Filter):
    """Sees Dynamo's recompile-limit warning; lets every record through (logging unchanged)."""

    def __init__(self, watch: CompileWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if isinstance(record.msg, str) and record.msg.startswith(LIMIT_WARNING):
                self.watch.on_limit(record.msg, record.args)
        except Exception:
            pass
        return True


def install(agent, dynamo) -> CompileWatch | None:
    """Post-import hook of ``torch._dynamo``: registers the callbacks (again after each
    ``callback_handler.clear()``, which ``torch._dynamo.reset()`` calls), the logging filter and the
    exit summary. Returns the watch, or None when this PyTorch has no compile callbacks (said in a
    notice). Errors: propagates exceptions from the registration (the agent's one notice)."""
    from whyidle.instrument import torch as torch_instrument

    def main_tid():
        inst = torch_instrument._INSTANCE
        return getattr(inst, "tid", None)

    try:
        from torch._dynamo import utils as dynamo_utils
    except Exception:
        dynamo_utils = None
    metrics = getattr(dynamo_utils, "get_compilation_metrics", None)
    counters = getattr(dynamo_utils, "counters", None)
    if metrics is None:
        agent.notice("torch.compile: this PyTorch has no get_compilation_metrics(): the frames compiled and "
                     "recompilation reasons are not observed")
    watch = CompileWatch(agent.record, main_tid, metrics, (lambda: counters) if counters is not None else None,
                         lambda: getattr(agent, "startup", None))
    try:
        from torch._dynamo.callback import callback_handler
    except Exception:
        callback_handler = None
    if callback_handler is None or not hasattr(callback_handler, "register_start_callback"):
        agent.notice(f"torch.compile: PyTorch {getattr(dynamo, '__version__', '') or _torch_version()} has no "
                     "compile callbacks: compile time is not separated from the steps")
    else:
        start, end = _safe(agent, watch.start), _safe(agent, watch.end)

        def register() -> None:
            if start not in getattr(callback_handler, "start_callbacks", ()):
                callback_handler.register_start_callback(start)
            if end not in getattr(callback_handler, "end_callbacks", ()):
                callback_handler.register_end_callback(end)

        register()
        clear = getattr(callback_handler, "clear", None)
        if clear is not None:  # torch._dynamo.reset() (torch.compiler.reset()) clears every callback: ours go back

            def clear_then_register(*args, **kwargs):
                try:
                    return clear(*args, **kwargs)
                finally:
                    try:
                        register()
                    except Exception as exc:
                        agent.notice(f"torch.compile timing stopped at torch._dynamo.reset(): {exc!r}")

            patches.assign(callback_handler, "clear", clear_then_register)

        def unregister() -> None:
            for remove, callback in (("remove_start_callback", start), ("remove_end_callback", end)):
                with contextlib.suppress(Exception):
                    getattr(callback_handler, remove)(callback)

        patches.on_restore(unregister)
    limit = _LimitFilter(watch)
    logging.getLogger(CONVERT_LOGGER).addFilter(limit)
    patches.on_restore(lambda: logging.getLogger(CONVERT_LOGGER).removeFilter(limit))

    def final():
        try:
            agent.record(watch.summary())
        except Exception as exc:
            agent.notice(f"torch.compile summary not recorded: {exc!r}")

    agent.on_exit.append(final)
    return watch


def _torch_version() -> str:
    return str(getattr(sys.modules.get("torch"), "__version__", "?"))


def _safe(agent, fn):
    """``fn`` for Dynamo's callback list: never raises into the compiler; the first error turns it
    off and is said once."""
    state = {"off": False}

    def callback(*args):
        if state["off"] or agent.disabled:
            return
        try:
            fn(*args)
        except Exception as exc:
            state["off"] = True
            agent.notice(f"torch.compile timing disabled: {exc!r}")

    callback.__name__ = f"whyidle_{fn.__name__}"
    return callback
