"""PyTorch instrumentation: step boundaries and the split of each step into phases.

Installed by the agent right after the user's program imports ``torch``; nothing in the user's
code changes. What it hooks (all public PyTorch hooks except the two DataLoader methods):

- step end: ``torch.optim.optimizer.register_optimizer_step_post_hook`` (global). The first
  optimizer that steps is the *primary* one: each of its steps ends a training step; other
  optimizers' steps count as optimizer time. Without any optimizer step, a step ends where the next
  batch is fetched (``by = "loader"``).
- data wait: ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` and
  ``DataLoader.__iter__`` (iterator creation, where non-persistent workers start), wrapped.
- forward: global module forward pre/post hooks (``register_module_forward_pre_hook``,
  ``register_module_forward_hook(always_call=True)``), counting only the outermost call. After
  :data:`ROOT_LEARNING_STEPS` steps they are replaced by hooks on the top-level modules seen, so
  inner modules keep PyTorch's hook-free fast path. Forward with grad disabled is ``eval``.
- backward: ``torch.autograd.backward`` wrapped (``Tensor.backward`` calls it).
- optimizer: global optimizer step pre/post hooks.

Phases are exclusive (a forward inside an optimizer closure counts as forward, not twice); the rest
of the step is ``other`` host time. Only the training thread (the main thread, or the thread of
the first optimizer step) is accounted. Once the model is on CUDA, every phase boundary also
records a mark on the CUDA timeline (:mod:`whyidle.instrument.cuda`: events read later with
``query()``, never a synchronize) and syncs are counted; the first steps audit copies and host
reads (:mod:`whyidle.instrument.transfers`). Every hook catches its own errors and turns the
instrumentation off with one notice.
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import math
import os
import sys
import threading
from time import monotonic_ns, thread_time_ns

from whyidle.instrument.cuda import (
    MAX_SYNCS_PER_STEP,
    MIN_MARKED_STEP_S,
    STRIDE_WINDOW,
    CudaTimeline,
    SyncWatch,
)
from whyidle.record.steptable import MAX_PH_VALUES, PHASE_CODES

#: Steps during which global forward hooks watch for top-level modules before being replaced by
#: per-module hooks on those roots (global hooks force every submodule off PyTorch's fast path).
ROOT_LEARNING_STEPS = 3

#: Steps whose parameter / batch / input devices are recorded (enough to see a placement error;
#: walking all parameters every step would cost time on large models).
DEVICE_AUDIT_STEPS = 3

#: Autograd graph nodes counted at most per audited step (a transformer has a few thousand; the
#: count only needs to tell "tens" from "thousands").
MAX_GRAPH_NODES = 50_000

#: Steps at whose first backward the autograd graph is counted: early enough for short runs,
#: late enough that gradient accumulation or warm-up has settled into the loop's shape.
GRAPH_COUNT_STEPS = (2, 5, 10)

PHASES = ("setup", "data", "forward", "backward", "optimizer", "eval", "other")
PHASE_CODE = {name: code for code, name in enumerate(PHASE_CODES)}

_INSTANCE: "TorchInstrument | None" = None


def _is_array(obj) -> bool:
    return getattr(obj, "shape", None) is not None


def batch_size_of(batch, _depth: int = 0) -> int | None:
    """Number of samples in a DataLoader batch.

    Rules, in order: a tensor/array gives its leading dimension; a mapping is looked into
    (``{"input_ids": ...}``); in a list/tuple, a list of per-sample dicts counts its length, a
    tensor column (``(x, y)``, ``((x1, x2), y)``) gives its leading dimension, a mapping column is
    looked into, a column that is itself a sequence (``tuple(zip(*batch))`` detection batches,
    lists of strings) counts its length, and a list of per-sample lists or scalars counts its own
    length. ``None`` when nothing tells (e.g. a 0-d tensor, an empty batch).
    """
    if _depth > 4:
        return None
    if _is_array(batch):
        return int(batch.shape[0]) if len(batch.shape) else None
    if isinstance(batch, collections.abc.Mapping):
        return batch_size_of(next(iter(batch.values())), _depth + 1) if batch else None
    if not isinstance(batch, (list, tuple)) or not batch:
        return None
    if all(isinstance(item, collections.abc.Mapping) for item in batch) and len(batch) > 1:
        return len(batch)
    for item in batch:
        if _is_array(item):
            return batch_size_of(item, _depth + 1)
    first = batch[0]
    if isinstance(first, collections.abc.Mapping):
        return batch_size_of(first, _depth + 1)
    if isinstance(first, (list, tuple)) and first:
        scalars = all(not isinstance(x, (list, tuple, collections.abc.Mapping)) and not _is_array(x) for x in first)
        return len(batch) if scalars and _depth == 0 and not isinstance(first[0], str) else len(first)
    return len(batch)


def _tensors_in(obj, limit: int = 16):
    """Yields up to ``limit`` tensors found in nested tuples/lists/dicts (shallow, cheap)."""
    stack = [obj]
    found = 0
    while stack and found < limit:
        item = stack.pop()
        if hasattr(item, "device") and hasattr(item, "is_pinned"):
            found += 1
            yield item
        elif isinstance(item, (list, tuple)):
            stack.extend(item[:limit])
        elif isinstance(item, collections.abc.Mapping):
            stack.extend(list(item.values())[:limit])


def count_graph_nodes(roots, limit: int = MAX_GRAPH_NODES) -> int:
    """Autograd graph nodes reachable from ``roots`` (a tensor or a sequence of tensors), at most
    ``limit``. One node per differentiable operation of the step: a measure of how many
    operations (on a GPU: kernel launches) forward and backward issue."""
    if hasattr(roots, "grad_fn"):
        roots = (roots,)
    stack = [t.grad_fn for t in roots if getattr(t, "grad_fn", None) is not None]
    seen: set = set()
    while stack and len(seen) < limit:
        fn = stack.pop()
        if fn in seen:
            continue
        seen.add(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions if nxt is not None and nxt not in seen)
    return len(seen)


class TorchInstrument:
    """State of the PyTorch instrumentation in one process. Use :func:`install`."""

    def __init__(self, agent, torch) -> None:
        self.agent = agent
        self.torch = torch
        self.tid = threading.main_thread().ident
        self.native_tid = threading.main_thread().native_id
        self.phase = "setup"
        self.ph: list[int] = []
        self.t_phase = monotonic_ns()
        self.saved: list[str] = []
        self.acc = dict.fromkeys(PHASES, 0)
        self.step = 0
        self.t0: int | None = None
        self.cpu0 = 0
        self.data_cpu = 0
        self.batches = 0
        self.samples = 0
        self.samples_known = True
        self.boundary = False
        self.by_optimizer = False
        self.primary_opt: int | None = None
        self.depth = 0
        self.roots: dict[int, object] = {}
        self.graph_counted: set[int] = set()
        self.global_hooks: list = []
        self.root_hooks: list = []
        self.loaders: set[int] = set()
        self.audit = _new_audit()
        self.timeline = None  # CudaTimeline once the model is on CUDA
        self.marking = False  # this step gets phase marks (see CudaTimeline stride)
        self.stride = 1
        self._stride_ref: tuple[int, int] | None = None
        self.sync_watch = None
        self.syncs_in_step = 0
        self.transfers = None
        self.compiled = False  # torch.compile was called
        self.classifier = None
        self.stacks = None
        self.off = False
        self._is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    # -- phase accounting ------------------------------------------------------------------------
    def _begin_step(self, now: int) -> None:
        self.t0 = now
        self.t_phase = now
        self.phase = "other"
        self.saved = []
        self.ph = []  # phase changes: code, µs since t0 (docs/run-format.md)
        self.acc = dict.fromkeys(PHASES, 0)
        self.cpu0 = thread_time_ns()
        self.data_cpu = 0
        self.batches = 0
        self.samples = 0
        self.samples_known = True
        self.boundary = False
        self.syncs_in_step = 0
        tl = self.timeline
        if tl is not None:
            was = self.marking
            self.marking = self.step % self.stride == 0
            if was or self.marking:
                tl.mark("other", "step", self.step)

    def enter(self, phase: str) -> None:
        now = monotonic_ns()
        if self.t0 is None:  # the first training activity: start the step clock and the samplers
            self._begin_step(now)
            self._start_stacks()
            self._start_transfer_audit()
        self.acc[self.phase] += now - self.t_phase
        self.saved.append(self.phase)
        self.phase = phase
        self.t_phase = now
        if len(self.ph) < MAX_PH_VALUES:
            self.ph += (PHASE_CODE[phase], (now - self.t0) // 1000)
        tl = self.timeline
        if self.marking and tl is not None:
            tl.mark(phase, "phase", self.step)

    def leave(self) -> None:
        now = monotonic_ns()
        self.acc[self.phase] += now - self.t_phase
        self.phase = self.saved.pop() if self.saved else "other"
        self.t_phase = now
        if self.t0 is not None and len(self.ph) < MAX_PH_VALUES:
            self.ph += (PHASE_CODE[self.phase], (now - self.t0) // 1000)
        tl = self.timeline
        if self.marking and tl is not None:
            tl.mark(self.phase, "phase", self.step)

    def end_step(self, by: str) -> None:
        now = monotonic_ns()
        if self.t0 is None:
            self._begin_step(now)
            return
        acc = self.acc
        acc[self.phase] += now - self.t_phase
        rec = {
            "k": "step", "t": now, "i": self.step, "t0": self.t0, "t1": now, "by": by,
            "data": acc["data"], "fwd": acc["forward"], "bwd": acc["backward"],
            "opt": acc["optimizer"], "eval": acc["eval"],
            "batches": self.batches, "samples": self.samples if self.samples_known and self.batches else None,
            "cpu": thread_time_ns() - self.cpu0, "data_cpu": self.data_cpu, "boundary": self.boundary,
            "ph": self.ph,
        }
        self.agent.record(rec)
        if self.transfers is not None:
            self._drain_transfers(now)
        self.step += 1
        if self.timeline is not None and self.step % STRIDE_WINDOW == 0:
            self._update_stride(now)
        self._begin_step(now)

    def fail(self, where: str, exc: BaseException) -> None:
        """Turns the instrumentation off and says so once; the user's program goes on."""
        self.off = True
        self.uninstall_hooks()
        self.timeline = None
        self.marking = False
        for stop in (getattr(self.sync_watch, "uninstall", None), getattr(self.transfers, "stop", None)):
            try:
                if stop is not None:
                    stop()
            except Exception:
                pass
        self.agent.notice(f"PyTorch instrumentation disabled after an error in {where}: {exc!r}")

    # -- hooks -----------------------------------------------------------------------------------
    def on_fetch_start(self) -> None:
        if not self.by_optimizer and self.batches >= 1:
            self.end_step("loader")
        self.enter("data")

    def on_fetch_end(self, batch, cpu_start: int, stopped: bool) -> None:
        self.data_cpu += thread_time_ns() - cpu_start
        self.leave()
        if stopped:
            self.boundary = True
            return
        self.batches += 1
        n = batch_size_of(batch)
        if n is None:
            self.samples_known = False
        else:
            self.samples += n
        if self.step < DEVICE_AUDIT_STEPS:
            self._audit_batch(batch)

    def on_iter(self, loader, t0: int, t1: int) -> None:
        self.boundary = True
        key = id(loader)
        if key not in self.loaders:
            self.loaders.add(key)
            self.agent.record(_loader_config(loader, key, t0))
        self.agent.record({"k": "iter", "t": t1, "loader": key, "t0": t0, "t1": t1})

    def on_forward_pre(self, module, args) -> None:
        if self.depth == 0:
            self.enter("forward" if self.torch.is_grad_enabled() else "eval")
            if self.phase == "eval":
                self.boundary = True
            if self.step < ROOT_LEARNING_STEPS and self.global_hooks:
                self.roots[id(module)] = module
            if self.step < DEVICE_AUDIT_STEPS:
                for t in _tensors_in(args):
                    self.audit["inputs"].add(t.device.type)
                if self.audit["autocast"] is not True:
                    self.audit["autocast"] = _autocast_enabled(self.torch)
        self.depth += 1

    def on_forward_post(self) -> None:
        if self.depth <= 0:
            return
        self.depth -= 1
        if self.depth == 0:
            self.leave()

    def on_optimizer_pre(self, optimizer) -> None:
        if not self.by_optimizer:
            self.by_optimizer = True
            if threading.get_ident() != self.tid:  # training runs in another thread: follow it
                self.tid = threading.get_ident()
                self.native_tid = threading.get_native_id()
                if self.stacks is not None:
                    self.stacks.stop()
                    self.stacks = None
            self._start_stacks()
        self.enter("optimizer")

    def on_optimizer_post(self, optimizer) -> None:
        self.leave()
        if self.primary_opt is None:
            self.primary_opt = id(optimizer)
        if id(optimizer) != self.primary_opt:
            return
        if self.step < DEVICE_AUDIT_STEPS:
            self._audit_step(optimizer)
        self.end_step("optimizer")
        if self.step == ROOT_LEARNING_STEPS and self.global_hooks:
            self._switch_to_root_hooks()

    # -- audits ----------------------------------------------------------------------------------
    def _audit_batch(self, batch) -> None:
        cuda_ready = self.torch.cuda.is_initialized()
        for t in _tensors_in(batch):
            if self.transfers is not None:
                self.transfers.batch_ids.add(id(t))
            self.audit["batch"].add(t.device.type)
            if cuda_ready and t.device.type == "cpu":
                pinned = bool(t.is_pinned())
                self.audit["pinned"] = pinned if self.audit["pinned"] is None else (self.audit["pinned"] and pinned)

    def _audit_step(self, optimizer) -> None:
        params: dict[str, int] = {}
        dtypes: dict[str, int] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                params[p.device.type] = params.get(p.device.type, 0) + p.numel()
                name = str(p.dtype).replace("torch.", "")
                dtypes[name] = dtypes.get(name, 0) + p.numel()
        cuda_ready = self.torch.cuda.is_initialized()
        try:
            tf32 = bool(self.torch.backends.cuda.matmul.allow_tf32)
        except Exception:
            tf32 = None
        self.agent.record({
            "k": "devices", "t": monotonic_ns(), "step": self.step, "params": params,
            "batch": sorted(self.audit["batch"]), "inputs": sorted(self.audit["inputs"]),
            "cuda_initialized": cuda_ready, "pinned": self.audit["pinned"],
            "threads": self.torch.get_num_threads(), "param_dtypes": dtypes,
            "autocast": self.audit["autocast"], "matmul_tf32": tf32,
        })
        self.audit = _new_audit()
        if cuda_ready and "cuda" in params and self.timeline is None:
            self._start_gpu_timeline()

    # -- GPU timeline, syncs, transfers ----------------------------------------------------------
    def site_of(self, frame) -> tuple[str | None, str | None]:
        """``(innermost user site, innermost site)`` of ``frame`` as ``"file:line function"``."""
        if self.classifier is None:
            from whyidle.instrument.stacks import FrameClassifier

            self.classifier = FrameClassifier()
        return self.classifier.site_pair(frame)

    def _start_gpu_timeline(self) -> None:
        """Starts the CUDA timeline and the sync watch (once the model is on CUDA)."""
        cuda = self.torch.cuda
        capturing = getattr(cuda, "is_current_stream_capturing", lambda: False)
        self.timeline = CudaTimeline(lambda: cuda.Event(enable_timing=True), capturing=capturing)
        self.agent.collectors.append(self._poll_timeline)
        try:
            watch = SyncWatch(cuda.get_sync_debug_mode, cuda.set_sync_debug_mode, self.on_sync, self.on_sync_start)
            if watch.install(self.torch):
                self.sync_watch = watch
                self.agent.on_exit.append(watch.uninstall)
            else:
                self.agent.notice("sync counting off: the program set torch.cuda.set_sync_debug_mode itself")
        except Exception as exc:
            self.agent.notice(f"sync counting disabled: {exc!r}")

    def _poll_timeline(self) -> list[dict]:
        tl = self.timeline
        if tl is None:
            return []
        try:
            return tl.poll()
        except Exception as exc:
            self.timeline = None
            self.marking = False
            self.agent.notice(f"GPU timeline disabled after an error: {exc!r}")
            return []

    def _update_stride(self, now: int) -> None:
        ref = self._stride_ref
        if ref is not None and self.step > ref[0]:
            mean_s = (now - ref[1]) / 1e9 / (self.step - ref[0])
            self.stride = max(1, min(STRIDE_WINDOW, math.ceil(MIN_MARKED_STEP_S / max(mean_s, 1e-9))))
        self._stride_ref = (self.step, now)

    def on_sync(self, frame, explicit: str | None) -> None:
        """A host↔device sync returned (see :class:`whyidle.instrument.cuda.SyncWatch`)."""
        if threading.get_ident() != self.tid or self.timeline is None or self.off:
            return
        self.syncs_in_step += 1
        if self.syncs_in_step > MAX_SYNCS_PER_STEP and self.sync_watch is not None:
            self.sync_watch.stop_debug_mode()
            self.agent.notice(f"sync counting stopped: more than {MAX_SYNCS_PER_STEP} syncs in one step")
            return
        user, leaf = self.site_of(frame)
        tl = self.timeline
        if tl is not None:
            tl.mark(self.phase, "sync", self.step, [user, leaf, explicit])

    def on_sync_start(self, frame) -> None:
        """An explicit sync (``torch.cuda.synchronize``, ``Event.synchronize``) is about to wait."""
        tl = self.timeline
        if threading.get_ident() == self.tid and tl is not None and not self.off:
            tl.mark(self.phase, "sync0", self.step)

    def on_stack_sample(self, user: str | None, leaf: str | None, weight_s: float, phase: str) -> None:
        """A stack sample of the training thread: record a probe mark carrying its source line."""
        tl = self.timeline
        if tl is not None and threading.get_ident() == self.tid and not self.off:
            tl.mark(phase, "probe", self.step, [user, leaf, round(weight_s * 1000, 3)])

    def _start_transfer_audit(self) -> None:
        if self.compiled:
            # torch.compile is in use: its first steps trace the model, and wrapped Tensor methods
            # could end up in guards and cost a recompilation once the audit removes them.
            self.agent.notice("copy/read audit skipped: torch.compile is in use")
            return
        from whyidle.instrument.transfers import TransferAudit

        try:
            audit = TransferAudit(self.torch, self.tid, self.site_of, threading.get_ident, self._is_compiling)
            audit.start()
        except Exception as exc:
            self.agent.notice(f"transfer audit disabled: {exc!r}")
            return
        self.transfers = audit
        self.agent.on_exit.append(audit.stop)

    def _drain_transfers(self, now: int) -> None:
        self.agent.record(self.transfers.drain(self.step, now))
        if self.step + 1 >= DEVICE_AUDIT_STEPS:
            self.transfers.stop()
            self.transfers = None

    # -- installation ----------------------------------------------------------------------------
    def _start_stacks(self) -> None:
        if self.stacks is not None or self.agent.stack_hz <= 0:
            return
        from whyidle.instrument.stacks import StackSampler

        self.stacks = StackSampler(self.tid, self.agent.stack_hz, lambda: self.phase, native_id=self.native_tid,
                                   on_sample=self.on_stack_sample)
        self.agent.collectors.append(self.stacks.drain)
        self.agent.on_exit.append(self.stacks.stop)
        self.stacks.start()

    def _switch_to_root_hooks(self) -> None:
        for h in self.global_hooks:
            h.remove()
        self.global_hooks = []
        pre, post = _forward_hooks(self)
        for module in self.roots.values():
            self.root_hooks.append(module.register_forward_pre_hook(pre))
            self.root_hooks.append(module.register_forward_hook(post, always_call=True))
        self.roots = {}

    def uninstall_hooks(self) -> None:
        for h in self.global_hooks + self.root_hooks:
            try:
                h.remove()
            except Exception:
                pass
        self.global_hooks = []
        self.root_hooks = []


def _new_audit() -> dict:
    return {"batch": set(), "inputs": set(), "pinned": None, "autocast": None}


def _autocast_enabled(torch) -> bool | None:
    """Whether CUDA autocast is on (``torch.is_autocast_enabled("cuda")``, PyTorch ≥ 2.4; the
    argument-less form before)."""
    try:
        return bool(torch.is_autocast_enabled("cuda"))
    except TypeError:
        try:
            return bool(torch.is_autocast_enabled())
        except Exception:
            return None
    except Exception:
        return None


def _forward_hooks(inst: TorchInstrument):
    get_ident = threading.get_ident
    is_compiling = inst._is_compiling

    def pre(module, args):
        if inst.off or is_compiling() or get_ident() != inst.tid:
            return None
        try:
            inst.on_forward_pre(module, args)
        except Exception as exc:
            inst.fail("a forward pre-hook", exc)
        return None

    def post(module, args, output):
        if inst.off or is_compiling() or get_ident() != inst.tid:
            return None
        try:
            inst.on_forward_post()
        except Exception as exc:
            inst.fail("a forward hook", exc)
        return None

    return pre, post


def _loader_config(loader, key: int, t: int) -> dict:
    def attr(name):
        value = getattr(loader, name, None)
        return value if isinstance(value, (int, float, bool, str, type(None))) else str(value)

    try:
        length = len(loader.dataset)
    except Exception:
        length = None
    ctx = getattr(loader, "multiprocessing_context", None)
    collate = getattr(loader, "collate_fn", None)
    try:
        from torch.utils.data import IterableDataset

        iterable = isinstance(getattr(loader, "dataset", None), IterableDataset)
    except Exception:
        iterable = None
    return {
        "k": "loader", "t": t, "id": key, "num_workers": attr("num_workers"),
        "pin_memory": attr("pin_memory"), "persistent_workers": attr("persistent_workers"),
        "prefetch_factor": attr("prefetch_factor"), "batch_size": attr("batch_size"),
        "dataset": type(getattr(loader, "dataset", None)).__name__, "dataset_len": length,
        "mp_context": ctx.get_start_method() if hasattr(ctx, "get_start_method") else ctx,
        "worker_init_fn": getattr(loader, "worker_init_fn", None) is not None,
        "iterable": iterable, "sampler": type(getattr(loader, "sampler", None)).__name__,
        "collate_fn": getattr(collate, "__name__", type(collate).__name__) if collate is not None else None,
        "drop_last": attr("drop_last"),
    }


def install(agent, torch) -> TorchInstrument:
    """Installs the hooks in this process (once) and writes the ``proc`` record.

    Args:
        agent: the process's :class:`whyidle.instrument.agent.Agent`.
        torch: the imported ``torch`` module.
    Errors: propagates exceptions from hook registration; the agent turns them into one notice.
    """
    global _INSTANCE
    if _INSTANCE is not None:
        return _INSTANCE
    import torch.optim.optimizer as optim_mod
    import torch.utils.data.dataloader as dl
    from torch.nn.modules import module as module_mod

    inst = TorchInstrument(agent, torch)
    _INSTANCE = inst
    get_ident = threading.get_ident

    agent.record({
        "k": "proc", "t": monotonic_ns(), "pid": os.getpid(), "ppid": os.getppid(),
        "argv": list(getattr(sys, "argv", [])), "python": sys.version.split()[0],
        "framework": "torch", "framework_version": str(torch.__version__),
        "cuda_build": getattr(torch.version, "cuda", None), "threads": torch.get_num_threads(),
    })
    agent.start_background()

    orig_next = dl._BaseDataLoaderIter.__next__

    @functools.wraps(orig_next)
    def __next__(self):
        if inst.off or agent.disabled or get_ident() != inst.tid:
            return orig_next(self)
        try:
            inst.on_fetch_start()
            c0 = thread_time_ns()
        except Exception as exc:
            inst.fail("DataLoader.__next__", exc)
            return orig_next(self)
        try:
            batch = orig_next(self)
        except StopIteration:
            _safe(inst, inst.on_fetch_end, None, c0, True)
            raise
        except BaseException:
            _safe(inst, inst.on_fetch_end, None, c0, True)
            raise
        _safe(inst, inst.on_fetch_end, batch, c0, False)
        return batch

    orig_iter = dl.DataLoader.__iter__

    @functools.wraps(orig_iter)
    def __iter__(self):
        if inst.off or agent.disabled or get_ident() != inst.tid:
            return orig_iter(self)
        t0 = monotonic_ns()
        _safe(inst, inst.enter, "data")
        try:
            return orig_iter(self)
        finally:
            if not inst.off:
                _safe(inst, inst.leave)
                _safe(inst, inst.on_iter, self, t0, monotonic_ns())

    dl._BaseDataLoaderIter.__next__ = __next__
    dl.DataLoader.__iter__ = __iter__

    orig_backward = torch.autograd.backward

    @functools.wraps(orig_backward)
    def backward(*args, **kwargs):
        if inst.off or agent.disabled or get_ident() != inst.tid:
            return orig_backward(*args, **kwargs)
        if inst.step in GRAPH_COUNT_STEPS and inst.step not in inst.graph_counted and args:
            inst.graph_counted.add(inst.step)
            try:  # a few backwards only: walking the graph costs ~1 µs per node
                agent.record({"k": "graph", "t": monotonic_ns(), "step": inst.step,
                              "nodes": count_graph_nodes(args[0])})
            except Exception:
                pass
        _safe(inst, inst.enter, "backward")
        try:
            return orig_backward(*args, **kwargs)
        finally:
            if not inst.off:
                _safe(inst, inst.leave)

    torch.autograd.backward = backward

    try:
        from whyidle.instrument.transfers import watch_placement

        watch_placement(torch, agent.record, inst.site_of)
    except Exception as exc:
        agent.notice(f"placement audit disabled: {exc!r}")

    orig_compile = getattr(torch, "compile", None)
    if orig_compile is not None:

        @functools.wraps(orig_compile)
        def compile(*args, **kwargs):
            inst.compiled = True
            return orig_compile(*args, **kwargs)

        torch.compile = compile

    def opt_pre(optimizer, args, kwargs):
        if inst.off or agent.disabled or (inst.by_optimizer and get_ident() != inst.tid):
            return None
        _safe(inst, inst.on_optimizer_pre, optimizer)
        return None

    def opt_post(optimizer, args, kwargs):
        if inst.off or agent.disabled or get_ident() != inst.tid:
            return None
        _safe(inst, inst.on_optimizer_post, optimizer)
        return None

    pre, post = _forward_hooks(inst)
    inst.global_hooks = [
        module_mod.register_module_forward_pre_hook(pre),
        module_mod.register_module_forward_hook(post, always_call=True),
    ]
    optim_mod.register_optimizer_step_pre_hook(opt_pre)
    optim_mod.register_optimizer_step_post_hook(opt_post)
    # Stack sampling starts with the first training activity (a batch, a forward, a step), so
    # processes that only import torch (spawned DataLoader workers, tools) are never sampled.
    return inst


def _safe(inst: TorchInstrument, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:
        inst.fail(getattr(fn, "__name__", "a hook"), exc)
