"""PyTorch instrumentation: step boundaries and the split of each step into phases.

Installed by the agent right after the user's program imports ``torch``; nothing in the user's
code changes. What it hooks (all public PyTorch hooks except the two DataLoader methods):

- step end (:attr:`TorchInstrument.marker`, ``by`` of the step records), the first that applies:
  ``"optimizer"``: ``torch.optim.optimizer.register_optimizer_step_post_hook`` (global). The first
  optimizer that steps is the *primary* one: each of its steps ends a training step; other
  optimizers' steps (a GAN's generator, an actor-critic's critic) are parts of the same step, each
  named in the ``optimizers`` record with its steps and backward calls, until one of them steps
  :data:`PRIMARY_TAKEOVER_STEPS` times in a row and replaces it. ``"backward"``: without
  ``torch.optim`` and without a DataLoader batch in the step (a loop that slices a token tensor and
  updates ``p.data`` by hand), each outermost ``backward()`` from the line of the first one.
  ``"loader"``: the next DataLoader batch. ``"forward"``: a program that never trains nor fetches a
  batch (inference over tensors), each outermost call of the first top-level module.
- data wait: ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` and
  ``DataLoader.__iter__`` (iterator creation, where non-persistent workers start), wrapped.
- forward: ``torch.nn.Module.__call__`` wrapped (:mod:`whyidle.instrument.forward`: nothing on
  the program's modules or classes, which ``torch.save``, pickle, ``deepcopy`` and
  ``torch.jit.script`` never meet), counting only the outermost call. For the first
  :data:`ROOT_LEARNING_STEPS` optimizer steps every call is seen (the top-level modules, the
  repeated-module count); then only the outermost calls are timed (of any module: a teacher first
  called late is model work too). Forward with grad disabled is ``eval``; a module the DataLoader
  runs in this process (a transform) is data.
- backward: ``torch.autograd.backward`` wrapped (``Tensor.backward`` calls it); each outermost call
  counts (``mb``; a reentrant checkpoint's backward inside it is part of it).
- optimizer: global optimizer step pre/post hooks. A closure passed to ``step(closure)`` (Lightning
  runs ``training_step`` and backward that way, LBFGS its loss) is wrapped by the pre-hook, so its
  time counts as host work with its own forward and backward, never as optimizer time.

Phases are exclusive (a forward inside an optimizer closure counts as forward, not twice); the rest
of the step is ``other`` host time. Only the training thread (the main thread, or the thread of
the first optimizer step) is accounted. Once the model is on CUDA, every phase boundary also
records a mark on the CUDA timeline (:mod:`whyidle.instrument.cuda`: events read later with
``query()``, never a synchronize) and syncs are counted; the first steps audit copies and host
reads (:mod:`whyidle.instrument.transfers`). In a ``torch.distributed`` job on gloo, each step's
collectives are timed (:mod:`whyidle.instrument.collectives`). The step boundaries also serve the
run's on-demand ``torch.profiler`` windows (:mod:`whyidle.instrument.deep_trace`). Every hook catches its own errors
and turns the instrumentation off with one notice.
"""

from __future__ import annotations

import collections
import collections.abc
import functools
import itertools
import math
import os
import random
import sys
import threading
import weakref
from time import monotonic_ns, perf_counter, thread_time_ns

from whyidle.instrument import collectives as coll_mod
from whyidle.instrument import dataset_code
from whyidle.instrument import deep_trace
from whyidle.instrument import forward as forward_mod
from whyidle.instrument import loader_workers
from whyidle.instrument import patches
from whyidle.instrument import regions as region_mod
from whyidle.instrument import startup
from whyidle.instrument.cells import cell_files
from whyidle.instrument.hooks import HookTimer
from whyidle.instrument.loader_queue import QueueTally
from whyidle.instrument import shape_probe
from whyidle.instrument.module_calls import ModuleCalls
from whyidle.instrument.cuda import (
    MAX_SYNCS_PER_STEP,
    STRIDE_WINDOW,
    CudaTimeline,
    SyncWatch,
)
from whyidle.record.steptable import BY_CODES, MAX_PH_VALUES, PHASE_CODES
from whyidle.redact import redact_argv

#: Optimizer steps during which every module call is seen (the top-level modules are learnt, the
#: repeated-module count taken); afterwards only the outermost calls of those roots are timed.
ROOT_LEARNING_STEPS = 3

#: Optimizer steps whose parameter / batch / input devices are recorded (enough to see a placement
#: error; walking all parameters every step would cost time on large models). Counted in optimizer
#: steps, not batches: with gradient accumulation the first optimizer step comes after several
#: micro-batches, and those must not use up the audit.
DEVICE_AUDIT_STEPS = 3

#: Side of the square matmul timed in float32 and in the CPU autocast dtype (see lowp_matmul_slowdown).
LOWP_MATMUL_N = 32

#: Steps shorter than this are recorded in full detail on one step in k only, k = ceil(
#: FULL_DETAIL_PERIOD_S / mean step time) (the *detail stride*, at most ``STRIDE_WINDOW``, set every
#: ``STRIDE_WINDOW`` steps; which step of each k is drawn at random, so a loop that logs every N
#: steps is neither always nor never in the sample). A full step has its phases (the hooks), ``ph``
#: spans, main-thread CPU time, samples and a ``step`` record; the others (*lite* steps) keep their
#: boundaries only, as rows of a ``steps`` record, and their hooks are taken out. Once the model is
#: on CUDA every step keeps its phases (the GPU-idle attribution needs the phase of every probe and
#: sync); only the spans, CPU times, sample counts, records and CUDA phase marks are thinned.
#: Full detail costs ~130 µs per step on a plain loop and ~225 µs under Lightning, a lite step a
#: few µs (benchmarks/hook_cost.py): one full step per 20 ms keeps whyidle near 1 % of a run.
FULL_DETAIL_PERIOD_S = 0.020

#: What whyidle's ``Module.__call__`` wrapper costs a module call on a lite step, passing it through
#: (ns; ~0.3-0.4 µs on this project's 2-core box, benchmarks/hook_cost.py's noop family).
FORWARD_PASS_NS = 400

#: What one assignment of ``torch.nn.Module.__call__`` costs the training loop (ns): the assignment
#: walks every subclass of ``Module`` (~350 after ``import torch``, thousands with ``transformers``)
#: and invalidates their attribute caches (and the interpreter's specialized instructions that read
#: them), so the step that makes it is ~350 µs slower on a 0.7 ms CPU loop and, the assignment made
#: every 26 steps, the median step ~14 µs slower (measured on this project's 2-core box by assigning
#: the same ``__call__`` every 26 steps of ``benchmarks/overhead.py``'s 2ms loop, 2026-12-05).
FORWARD_SWITCH_NS = 400_000

#: Most of a step's time that passing its module calls through the wrapper on a lite step may cost
#: for the wrapper to stay in over the lite steps (``TorchInstrument._forward_residency``): the lite
#: steps are most of a short-step run, so this is about what the median step pays.
FORWARD_RESIDENT_SHARE = 0.005

#: Steps in a row of one other optimizer, with no step of the primary between them, after which
#: that optimizer becomes the primary one: the program replaced its optimizer (a second
#: ``trainer.fit`` builds a new one). Alternating optimizers (a GAN's generator and discriminator)
#: never reach it; a critic stepping 5 times per generator step takes over once, and stays.
PRIMARY_TAKEOVER_STEPS = 3

#: Loader-marked steps (one batch each, before any optimizer step) after which the audits stop
#: even if no optimizer ever steps: a loop that trains without ``torch.optim`` or accumulates more
#: micro-batches than this. 64 covers the accumulation factors seen in practice (up to 32-64).
MAX_AUDITED_BATCHES = DEVICE_AUDIT_STEPS + 64

#: Autograd graph nodes counted at most per audited step (a transformer has a few thousand; the
#: count only needs to tell "tens" from "thousands").
MAX_GRAPH_NODES = 50_000

#: Steps at whose first backward the autograd graph is counted: early enough for short runs,
#: late enough that gradient accumulation or warm-up has settled into the loop's shape.
GRAPH_COUNT_STEPS = (2, 5, 10)

#: Optimizers named in the ``optimizers`` record (a program building a new optimizer per stage
#: or per epoch would otherwise grow it without bound).
MAX_PARTS = 16

PHASES = ("setup", "data", "forward", "backward", "optimizer", "eval", "other")
PHASE_CODE = {name: code for code, name in enumerate(PHASE_CODES)}
_BY_CODE = {name: code for code, name in enumerate(BY_CODES)}

_INSTANCE: "TorchInstrument | None" = None


def _is_array(obj) -> bool:
    return getattr(obj, "shape", None) is not None


def batch_size_of(batch, _depth: int = 0) -> int | None:
    """Number of samples in a DataLoader batch.

    Rules, in order: a tensor/array gives its leading dimension; a mapping is looked into
    (``{"input_ids": ...}``; a first field that is a list of per-sample lists counts its length); in a list/tuple, a list of per-sample dicts counts its length, a
    tensor column (``(x, y)``, ``((x1, x2), y)``) gives its leading dimension, a mapping column is
    looked into, a column that is itself a sequence (``tuple(zip(*batch))`` detection batches,
    lists of strings) counts its length, and a list of per-sample lists or scalars counts its own
    length. ``None`` when nothing tells (e.g. a 0-d tensor, an empty batch).
    """
    if _depth > 4:
        return None
    if _is_array(batch):  # a symbolic tensor (Keras's build) has an unknown leading dimension
        return int(batch.shape[0]) if len(batch.shape) and batch.shape[0] is not None else None
    if isinstance(batch, collections.abc.Mapping):
        if not batch:
            return None
        value = next(iter(batch.values()))
        if isinstance(value, list) and value and isinstance(value[0], (list, tuple)):
            return len(value)  # a field of per-sample Python lists ({"input_ids": [[...], [...]]})
        return batch_size_of(value, _depth + 1)
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


def count_tensors(obj, limit: int = 20_000) -> tuple[int, int]:
    """``(tensors, bytes)`` in a batch: every tensor in its nested tuples, lists and dicts (a
    detection batch's per-sample target dicts included), visiting at most ``limit`` objects.
    Each tensor a DataLoader worker returns crosses to the main process on its own (a shared-memory
    segment and a file descriptor), so the count is the hand-off's cost (cases.md C34)."""
    stack = [obj]
    seen = tensors = size = 0
    while stack and seen < limit:
        item = stack.pop()
        seen += 1
        if hasattr(item, "device") and hasattr(item, "element_size"):
            tensors += 1
            size += item.element_size() * item.numel()
        elif isinstance(item, (list, tuple)):
            stack.extend(item[:limit])
        elif isinstance(item, collections.abc.Mapping):
            stack.extend(itertools.islice(item.values(), limit))
    return tensors, size


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
        self.micro = 0  # outermost backward calls in this step: micro-batches under gradient accumulation
        self.marker = "loader"  # what ends a step (module docstring): optimizer, backward, loader or forward
        self.trained = False  # a backward or an optimizer step was seen (else evaluation is no boundary)
        self.fetched = False  # a DataLoader batch was counted on the training thread
        self.bwd_depth = 0  # backward calls open (a reentrant checkpoint's backward runs inside one)
        self.bwd_site = None  # (code, line) of the first backward that marked a step
        self.fwd_key: int | None = None  # id() of the module whose calls mark "forward" steps
        self.calls = 0  # outermost module calls in this step (step record "fc")
        self.parts: dict[int, list] = {}  # id(optimizer) → [name, class, parameters, steps, backward calls]
        self.bwd_since_opt = 0  # outermost backward calls since the last optimizer step (of any optimizer)
        self.primary_opt: int | None = None
        self.opt_steps = 0  # training steps: ended by the primary optimizer or, without one, a backward
        self.other_opt: int | None = None  # the last non-primary optimizer that stepped
        self.other_opt_steps = 0  # its steps since the primary's last one
        self.auditing = True  # this step's batches, inputs and copies are audited (see _begin_step)
        self.depth = 0
        self.data_calls = 0  # open module calls inside a DataLoader fetch (transforms): data, not forward
        self.roots: dict[int, object] = {}  # the top-level modules called while learning
        self.learning = True  # every module call is seen (see ROOT_LEARNING_STEPS)
        self.learn_calls = 0  # module calls (nested ones included) of the training thread while learning
        self.learn_steps = (0, 0)  # (step, module calls) where the current learning began
        self.calls_per_step = 0.0  # mean module calls per step of the last learning steps
        self.step_s = 0.0  # mean step time of the last STRIDE_WINDOW steps (s; 0 until known)
        self.fwd_resident = False  # the forward wrapper stays in over lite steps (see _forward_residency)
        self.learn_until = (ROOT_LEARNING_STEPS, MAX_AUDITED_BATCHES)  # (optimizer steps, steps) ending it
        self.root_refs: dict[int, object] = {}  # id → weak reference of the roots learnt (for _part, _root_parameters)
        self.graph_counted: set[int] = set()
        self.loaders: set[int] = set()
        self.iter_loader: dict[int, int] = {}  # id(iterator) -> id(its DataLoader)
        self.loader_key: int | None = None  # the DataLoader of this step's last batch
        self.created: dict[int, tuple] = {}  # id(DataLoader) -> (user site, leaf site, argument texts, call)
        self.audit = _new_audit()
        self.timeline = None  # CudaTimeline once the model is on CUDA
        self.marking = False  # this step gets CUDA phase marks (full steps, once the model is on CUDA)
        self.full = True  # this step is recorded in full detail (see FULL_DETAIL_PERIOD_S)
        self.wi = 0  # ns of whyidle's own step-boundary work at the start of this step (step record "wi")
        self.tracking = True  # the phase hooks are in: full steps, and every step on CUDA
        self.switches: list = []  # callables(on) putting the phase hooks in or taking them out
        self.phase_map = None  # PhaseMap for the stack samples of lite steps (install())
        self.next_full = 0  # the next step recorded in full detail
        self._rng = random.Random(0x5EED)  # our own: the program's random state is never touched
        self.lite_rows: list[tuple] = []  # the lite steps since the last full one (LITE_COLUMNS)
        self.stride = 1
        self._stride_ref: tuple[int, int] | None = None
        self.sync_watch = None
        self.syncs_in_step = 0
        self.transfers = None
        self.compiled = False  # torch.compile was called
        self.classifier = None
        self.cpu_matmul = None  # lowp_matmul_slowdown's result, once per process under CPU autocast
        self.layer_probe = None  # shape_probe.probe's result (the model's own layer shapes), once per process
        self.shape_probed = False
        self.stacks = None
        self.off = False
        self._is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        self._grad_enabled = torch.is_grad_enabled
        self.pending_first: int | None = None  # id() of a new DataLoader iterator before its first batch
        self.switch_next = None  # callable(on): the DataLoader __next__ wrapper working or passing batches through (install())
        self.module_calls = ModuleCalls(self.site_of)  # repeated submodule calls (module_calls.py)
        self.regions = region_mod.get(agent)  # evaluation / checkpoint / logging time (regions.py)
        self.hooks = HookTimer(self.site_of, os.path.dirname(torch.__file__), self.regions)  # the program's hooks
        self.regions.touch = self.mark_boundary
        self.colls = coll_mod.CollectiveTimer(agent.record, self.tid)  # torch.distributed collectives
        self.train_loader: int | None = None  # id() of the DataLoader the last optimizer step trained on
        self.loop_open = False  # another DataLoader is being iterated between training steps
        self.loader_sites: dict[int, str] = {}  # id() of a recorded DataLoader → the program's line that built it
        self.alias: dict[int, int] = {}  # id() of a DataLoader built again at the training loader's line → its id()
        self.rebuilt: set[int] = set()  # id() of a recorded DataLoader that a new one built at its line took over
        self.deep = None  # on-demand profiler windows (deep_trace.py), once installed
        self.trace_due = 1 << 62  # monotonic ns from which end_step calls self.deep.boundary
        self.queue = QueueTally()  # a multi-worker DataLoader's batches ready at the timed fetches

    # -- phase accounting ------------------------------------------------------------------------
    def _begin_step(self, now: int) -> None:
        full = self.step >= self.next_full
        if full:  # the next full step: one in ``stride`` on average, drawn at random
            self.next_full = self.step + (1 if self.stride <= 1 else 1 + self._rng.randrange(2 * self.stride - 1))
        tracking = full or self.timeline is not None
        if tracking != self.tracking:
            self._track(tracking)
        self.full = full
        self.t0 = now
        self.t_phase = now
        self.phase = "other" if tracking else "lite"
        if tracking:  # a lite step with its hooks out has no phases: nothing to allocate
            self.saved = []
            self.acc = dict.fromkeys(PHASES, 0)
        self.batches = 0
        self.samples = 0
        self.samples_known = True
        self.boundary = False
        self.micro = 0
        self.calls = 0
        self.loader_key = None
        self.syncs_in_step = 0
        if full:
            self.ph = []  # phase changes: code, µs since t0 (docs/run-format.md)
            self.cpu0 = thread_time_ns()
            self.data_cpu = 0
            self.auditing = self.opt_steps < DEVICE_AUDIT_STEPS and self.step < MAX_AUDITED_BATCHES
        else:
            self.auditing = False
        tl = self.timeline
        if tl is not None:
            was = self.marking
            self.marking = full
            if was or full:
                tl.mark("other", "step", self.step)

    def enter(self, phase: str) -> None:
        if not self.tracking and self.t0 is not None:  # a lite step: no phases (no clock read either)
            return
        now = monotonic_ns()
        if self.t0 is None:  # the first training activity: start the step clock and the samplers
            self._begin_step(now)
            self._start_stacks()
            self._start_transfer_audit()
        if not self.tracking:
            return
        self.acc[self.phase] += now - self.t_phase
        self.saved.append(self.phase)
        self.phase = phase
        self.t_phase = now
        if self.full:
            self._span(phase, now)

    def leave(self) -> None:
        if not self.tracking:
            return
        now = monotonic_ns()
        self.acc[self.phase] += now - self.t_phase
        self.phase = phase = self.saved.pop() if self.saved else "other"
        self.t_phase = now
        if self.full and self.t0 is not None:
            self._span(phase, now)

    def mark_boundary(self) -> None:
        """This step holds (part of) an evaluation, checkpoint or logging region (regions.py): the
        steady-state shares leave it out like an epoch boundary."""
        self.boundary = True

    def _span(self, phase: str, now: int) -> None:
        """A phase change of a full step: its ``ph`` span and, on CUDA, a timeline mark."""
        if len(self.ph) < MAX_PH_VALUES:
            self.ph += (PHASE_CODE[phase], (now - self.t0) // 1000)
        tl = self.timeline
        if self.marking and tl is not None:
            tl.mark(phase, "phase", self.step)

    def end_step(self, by: str) -> None:
        now = monotonic_ns()
        if self.t0 is None:
            self._begin_step(now)
            return
        if now >= self.trace_due:  # a deep-trace request to look for, or its window open (deep_trace.py)
            now = self.deep.boundary(now)
        step = self.step
        if (not self.tracking and step + 1 < self.next_full and not self.learning and self.transfers is None
                and not self.colls.enabled):
            # a lite step followed by another (most steps of short ones, hooks out, no audit): what
            # the general path below does then, without its tests and calls (~2 µs of each step)
            self.hooks.ns = 0  # the hooks' time is kept for full steps only
            self.lite_rows.append((step, self.t0, now, _BY_CODE.get(by, 2), None, None, None, None, None,
                                   self.batches if self.marker == "loader" else None, None, self.loader_key,
                                   1 if self.boundary else 0))
            if by in ("optimizer", "backward"):
                self.opt_steps += 1
            self.step = step = step + 1
            if step % STRIDE_WINDOW == 0:
                self._update_stride(now)
            stacks = self.stacks
            if stacks is not None and stacks._pending:
                stacks.maybe_reinstall()
            # _begin_step of a lite step after a lite one: tracking and auditing stay off
            self.t0 = self.t_phase = now
            self.phase = "lite"
            self.batches = self.samples = self.micro = self.calls = self.syncs_in_step = 0
            self.samples_known = True
            self.boundary = False
            self.loader_key = None
            return
        # the main thread's CPU time when this step or the next is recorded in full: this step's
        # ``cpu`` ends and the next step's ``wi`` (below) starts here
        cpu_now = thread_time_ns() if self.full or self.step + 1 >= self.next_full else None
        acc = self.acc
        if self.tracking:
            acc[self.phase] += now - self.t_phase
        hooks = self.hooks  # the ns in the program's timed hooks since the last step (HookTimer.take)
        hooks_ns = hooks.ns
        hooks.ns = 0
        if self.full:
            if self.lite_rows:  # keep the file in step order
                self.flush_lite()
            self.agent.record({
                "k": "step", "t": now, "i": self.step, "t0": self.t0, "t1": now, "by": by,
                "data": acc["data"], "fwd": acc["forward"], "bwd": acc["backward"],
                "opt": acc["optimizer"], "eval": acc["eval"],
                "batches": self.batches,
                "samples": self.samples if self.samples_known and (self.batches or self.marker == "forward") else None,
                "cpu": cpu_now - self.cpu0, "data_cpu": self.data_cpu, "boundary": self.boundary,
                "mb": self.micro, "ld": self.loader_key, "ph": self.ph, "wi": self.wi, "hk": hooks_ns,
                "fc": self.calls,
            })
        elif self.tracking:  # one tuple per lite step, in LITE_COLUMNS order
            self.lite_rows.append((self.step, self.t0, now, _BY_CODE.get(by, 2), acc["data"], acc["forward"],
                                   acc["backward"], acc["optimizer"], acc["eval"], self.batches, self.micro,
                                   self.loader_key, 1 if self.boundary else 0))
        else:  # hooks out: the boundaries (and batches when they mark the steps)
            self.lite_rows.append((self.step, self.t0, now, _BY_CODE.get(by, 2), None, None, None, None, None,
                                   self.batches if self.marker == "loader" else None, None, self.loader_key,
                                   1 if self.boundary else 0))
        if by in ("optimizer", "backward"):
            self.opt_steps += 1
        if self.module_calls is not None and self.learning:
            self.module_calls.end_step(now - self.t0)
        if self.transfers is not None:
            self._drain_transfers(now, by)
        if self.colls.enabled:
            self.colls.end_step(self.step)
        self.step += 1
        if self.step % STRIDE_WINDOW == 0:
            self._update_stride(now)
        if self.learning and (self.opt_steps >= self.learn_until[0] or self.step >= self.learn_until[1]):
            self._end_learning()
        stacks = self.stacks
        if stacks is not None and stacks._pending:  # a library reset the sampler's SIGURG handler (stacks.py)
            stacks.maybe_reinstall()
        self._begin_step(now)
        # this boundary's own cost, inside the next step's [t0, t1], as main-thread CPU time: the
        # boundary's CPU-time reads are where the kernel's scheduler catches up on a busy host
        # (reading a thread's CPU clock updates its run time and preempts it once its slice is
        # used), so its wall time would count other processes' turns as whyidle's own work
        if self.full:
            self.cpu0 = thread_time_ns()
            self.wi = self.cpu0 - cpu_now

    def _track(self, on: bool) -> None:
        """Puts the phase hooks in (``on``) or takes them out for lite steps (see
        ``FULL_DETAIL_PERIOD_S``): the backward wrapper, the ``Module.__call__`` wrapper once the
        top-level modules are learnt (unless :attr:`fwd_resident`) and, when optimizer steps mark
        the steps, the DataLoader ``__next__`` wrapper's work (that wrapper stays in place, passing
        batches through: assigning a class attribute slows the program's code that uses the class,
        see ``FORWARD_SWITCH_NS``). Between steps only."""
        self.tracking = on
        self.depth = self.data_calls = 0
        for switch in self.switches:
            switch(on)

    def flush_lite(self) -> None:
        """Queues the lite steps since the last full step as one ``steps`` record (training thread,
        and at exit)."""
        rows, self.lite_rows = self.lite_rows, []
        if rows:
            self.agent.record({"k": "steps", "t": monotonic_ns(), "rows": rows})

    def fail(self, where: str, exc: BaseException) -> None:
        """Turns the instrumentation off and says so once; the user's program goes on."""
        self.off = True  # the forward wrapper passes every call through from now on
        for switch in self.switches:
            try:
                switch(False)
            except Exception:
                pass
        self.timeline = None
        self.marking = False
        for stop in (getattr(self.sync_watch, "uninstall", None), getattr(self.transfers, "stop", None)):
            try:
                if stop is not None:
                    stop()
            except Exception:
                pass
        self.agent.notice(f"PyTorch instrumentation disabled after an error in {where}: {exc!r}")

    def stand_aside(self, aside: bool) -> bool:
        """While another instrumentation times this thread's loop itself (Keras's ``fit`` /
        ``evaluate`` / ``predict`` on the torch backend, :mod:`whyidle.instrument.keras`), every hook
        here passes its calls through and the wrappers that can come out are out, the copy audit
        for good (``aside`` True); False takes the hooks back. Returns whether it stood aside
        (False when the instrumentation is already off). Between steps only; raises nothing."""
        if aside == self.off:
            return False
        self.off = aside
        if aside and self.transfers is not None:  # its Tensor.to wrapper: Keras calls .to() for every op's input
            try:
                self.transfers.stop()
            except Exception:
                pass
            self.transfers = None
        for switch in self.switches:
            try:
                switch(not aside and self.tracking)
            except Exception:
                pass
        return True

    def lend_stacks(self, phase_of):
        """This thread's stack sampler for an instrumentation that times the loop itself (see
        :meth:`stand_aside`), started now if it is not running: its samples take ``phase_of()``
        whenever that is not None, this instrumentation's phase otherwise. Returns the sampler, or
        None when stack sampling is off."""
        self._start_stacks()
        sampler = self.stacks
        if sampler is not None:
            own = sampler.phase_of
            sampler.phase_of = lambda: phase_of() or own()
        return sampler

    # -- hooks -----------------------------------------------------------------------------------
    def on_fetch_start(self, it=None) -> None:
        if it is not None:
            self.queue.sample(it, self.iter_loader.get(id(it)))  # batches ready ahead (loader_queue.py)
        if self.loop_open and self.iter_loader.get(id(it)) == self.train_loader:
            self._end_loop()  # training resumes: the evaluation loop ended before this batch
        if self.marker == "loader" and self.batches >= 1:
            self.end_step("loader")
        elif self.stacks is not None:  # batches without steps (a validation loop) re-install too
            self.stacks.maybe_reinstall()
        self.enter("data")

    def on_fetch_end(self, batch, cpu_start: int, stopped: bool, it=None) -> None:
        if self.queue.open is not None:
            self.queue.done(it)  # the fetch's wait, and whether it waited behind a slow batch
        full = self.full
        if full:
            self.data_cpu += thread_time_ns() - cpu_start
        self.leave()
        if stopped:
            self.boundary = True
            return
        if self.trained and self.regions.open and self.regions.inside("evaluation"):
            return  # a validation batch: not one the step trains on
        if self.marker == "forward":  # batches come after all: they mark the steps
            self.marker = "loader"
        self.fetched = True
        self.batches += 1
        self.loader_key = self.iter_loader.get(id(it))
        if full:  # samples are read on full steps only (lite steps: the analysis uses full ones)
            n = batch_size_of(batch)
            if n is None:
                self.samples_known = False
            else:
                self.samples += n
            if self.auditing:
                self._audit_batch(batch)

    def on_iter(self, loader, t0: int, t1: int, it=None) -> None:
        self.boundary = True
        key = id(loader)
        if key not in self.created and key not in self.loaders and key not in self.alias:
            self._adopt(loader, sys._getframe(1))  # built before whyidle watched (an earlier cell)
        user = (self.created.get(key) or (None,))[0]
        train_site = self.loader_sites.get(self.train_loader) if self.train_loader is not None else None
        # a DataLoader built again at the line that built the training loader (inside the epoch
        # loop; its id() may even be the old one's): the training loader, its iterator an epoch's
        rebuilt = user is not None and user == train_site and (key != self.train_loader or key in self.rebuilt)
        self.rebuilt.discard(key)
        if rebuilt and key != self.train_loader:
            if len(self.alias) >= 64:
                self.alias.clear()
            self.alias[key] = self.train_loader
        if key not in self.loaders and key not in self.alias:
            self.loaders.add(key)
            rec = _loader_config(loader, key, t0)
            _, leaf, args, call = self.created.get(key) or (None, None, {}, None)
            rec["created"] = [user, leaf]
            rec["args"] = args
            rec["call"] = call
            rec["collate_user"] = self._user_code(getattr(loader, "collate_fn", None))
            rec["dataset_code"] = dataset_code.dataset_code(getattr(loader, "dataset", None), self.frames().classify)
            self.agent.record(rec)
            self.loader_sites[key] = user
        key = self.alias.get(key, key)
        if len(self.iter_loader) >= 64:  # one iterator per epoch without persistent workers
            self.iter_loader.clear()
        self.iter_loader[id(it)] = key
        self.agent.record({"k": "iter", "t": t1, "loader": key, "t0": t0, "t1": t1, **({"rebuilt": True} if rebuilt else {})})
        if key == self.train_loader:
            if self.loop_open:
                self._end_loop(t0)  # the training loader's next epoch
        elif self.train_loader is not None and not self.loop_open and not self.regions.inside("evaluation"):
            self._begin_loop(t0)
        if it is not None:  # time its first batch (worker start-up): the fetch wrapper goes in until then
            self.pending_first = id(it)
            if self.switch_next is not None and not self.tracking:
                self.switch_next(True)

    def on_first_batch(self, it, t0: int) -> None:
        """The first ``__next__`` of a new iterator returned (or ended it): an ``iter_first`` record."""
        self.pending_first = None
        now = monotonic_ns()
        self.agent.record({"k": "iter_first", "t": now, "loader": self.iter_loader.get(id(it)), "t0": t0, "t1": now})
        if self.switch_next is not None and not self.tracking and not self.loop_open:
            self.switch_next(False)

    def _begin_loop(self, t0: int) -> None:
        """Another DataLoader than the training one starts between training steps, outside any
        evaluation region (a custom loop evaluating under ``torch.no_grad()`` without
        ``model.eval()``): an evaluation region from its ``iter()`` until the training loader's
        next batch (the ``__next__`` wrapper stays in until then), an optimizer step, or exit."""
        self.loop_open = True
        self.regions.begin("loop", sys._getframe(2), at=t0)
        if self.switch_next is not None and not self.tracking:
            self.switch_next(True)

    def _end_loop(self, at: int | None = None) -> None:
        self.loop_open = False
        self.regions.end("loop", "DataLoader.__iter__", at=at)
        if self.switch_next is not None and not self.tracking and self.pending_first is None:
            self.switch_next(False)

    def on_loader_created(self, loader, frame) -> None:
        """A DataLoader was built: keep where (its caller's user site and innermost site) and, when
        the program's own code built it, its ``DataLoader(...)`` call as written (every argument,
        the callee and the assignment target: :func:`whyidle.instrument.callsite.call_site`) and
        the dataset, batch_size and collate_fn texts of it (``args``). One parse per construction."""
        if len(self.created) >= 64:
            self.created.clear()
        if id(loader) in self.loaders:  # a new DataLoader in a recorded one's memory (the old one is gone)
            self.rebuilt.add(id(loader))
        user, leaf = self.site_of(frame)
        args, call = {}, None
        if user is not None:  # the user's frame making the DataLoader(...) call, maybe through a
            # library's __init__ wrapper (Lightning wraps it); a call to anything else gives nothing
            import inspect

            from whyidle.instrument.callsite import argument_texts, call_arguments, call_site

            classify = self.frames().classify
            while frame is not None and classify(frame.f_code.co_filename)[0] != 0:
                frame = frame.f_back
            try:
                params = [p.name for p in inspect.signature(type(loader)).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            except (TypeError, ValueError):
                params = []
            name = type(loader).__name__
            # the settings a fix changes: `num_workers=args.workers` gets its command-line option
            call = call_site(frame, name, params, ("num_workers", "batch_size", "pin_memory", "persistent_workers",
                                                   "prefetch_factor"))
            spec = {"dataset": 0, "batch_size": 1, "collate_fn": None}
            args = argument_texts(call, spec) if call else call_arguments(frame, spec, name)
        self.created[id(loader)] = (user, leaf, args, call)

    def _adopt(self, loader, frame) -> None:
        """A DataLoader first seen when iterated (built before ``whyidle.watch()`` or the
        ``%%whyidle`` cell began: the usual notebook layout): its ``created`` site and call are
        those of the last ``NAME = DataLoader(...)`` assigning a name that refers to it in the
        iterating user frame, searched in that frame's file, then in the notebook's cells, the latest
        first (:func:`whyidle.instrument.callsite.assigned_call`). Once per such loader; nothing when
        no name or statement is found."""
        classify = self.frames().classify
        while frame is not None and classify(frame.f_code.co_filename)[0] != 0:
            frame = frame.f_back
        if frame is None:
            return
        names = [n for scope in (frame.f_locals, frame.f_globals) for n, v in list(scope.items()) if v is loader]
        if not names:
            return
        import inspect

        from whyidle.instrument.callsite import argument_texts, assigned_call

        files = [frame.f_code.co_filename] + cell_files()
        try:
            params = [p.name for p in inspect.signature(type(loader)).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            params = []
        found = assigned_call(names, dict.fromkeys(files), type(loader).__name__, params)
        if found is None:
            return
        filename, call = found
        site = f"{classify(filename)[1]}:{call['lines'][0]} <module>"
        self.created[id(loader)] = (site, site, argument_texts(call, {"dataset": 0, "batch_size": 1, "collate_fn": None}),
                                    call)

    def _user_code(self, fn) -> bool | None:
        """True when ``fn`` (a function, or an object with ``__call__``) is defined in the user's code,
        False in a library (e.g. transformers' ``RemoveColumnsCollator``), None when unknown."""
        code = getattr(fn, "__code__", None) or getattr(getattr(type(fn), "__call__", None), "__code__", None)
        return None if code is None else self.frames().classify(code.co_filename)[0] == 0

    def on_forward_pre(self, module, args, frame) -> None:
        """A module call of the training thread starts (``frame``: its caller's). An outermost call
        is the model's work, whatever module it is (a teacher or EMA copy first called late too),
        except inside a DataLoader fetch: a transform module the loader runs in this process is data."""
        if self.data_calls or (self.depth == 0 and self.phase == "data"):
            self.data_calls += 1
            self.depth += 1
            return
        calls = self.module_calls
        if self.learning:
            self.learn_calls += 1
        if calls is not None and self.learning:
            try:
                calls.pre(module, args, frame)
            except Exception as exc:  # only this count is lost
                self.module_calls = None
                self.agent.notice(f"repeated-module count disabled: {exc!r}")
        if self.depth == 0:
            if self.marker == "forward" or (self.marker == "loader" and not (self.fetched or self.trained)):
                self._forward_mark(module, args)
            self.calls += 1
            self.enter("forward" if self._grad_enabled() else "eval")
            if self.phase == "eval" and self.trained:  # evaluation inside training (else it is the job)
                self.boundary = True
            if self.learning:
                self.roots[id(module)] = module
            if self.auditing:
                for t in _tensors_in(args):
                    self.audit["inputs"].add(t.device.type)
                if self.audit["autocast"] is not True:
                    self.audit["autocast"] = _autocast_enabled(self.torch)
                self.audit["forward_t0"] = monotonic_ns()
        if self.auditing and self.audit["autocast_depth"] is None:
            self._audit_autocast(frame)
        self.depth += 1

    def _forward_mark(self, module, args) -> None:
        """An outermost module call in a program that has neither trained nor fetched a batch: the
        first module called marks the steps (``"forward"``: inference over tensors); its input's
        leading dimension is the step's samples."""
        key = id(module)
        if self.fwd_key is None:
            self.fwd_key = key
            self.marker = "forward"
        elif key != self.fwd_key:
            return
        elif self.t0 is not None:
            self.end_step("forward")
        if self.full:
            n = batch_size_of(args)
            if n is None:
                self.samples_known = False
            else:
                self.samples += n

    def on_backward(self, site) -> None:
        """An outermost ``backward()`` of the training thread returned (``site``: ``(code, line)``
        of its caller, or None once optimizer steps mark the steps)."""
        self.trained = True
        self.bwd_since_opt += 1
        if self.marker != "optimizer" and self.batches == 0:
            self.marker = "backward"  # no optimizer, no batch in the step: the backward marks it
        if self.marker == "backward":
            if self.bwd_site is None:
                self.bwd_site = site
            if site == self.bwd_site:
                if self.opt_steps < DEVICE_AUDIT_STEPS:
                    self._audit_step(self._root_parameters())
                self.end_step("backward")

    def _root_modules(self) -> list:
        """The top-level modules seen so far (those still alive)."""
        return [m for m in list(self.roots.values()) + [r() for r in self.root_refs.values()] if m is not None]

    def _root_parameters(self) -> list:
        """The parameters of the top-level modules (each once): what a loop without an optimizer trains."""
        seen, out = set(), []
        for module in self._root_modules():
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _audit_autocast(self, frame) -> None:
        """Opens the autocast window when this module call (at any depth: Accelerate and the HF
        Trainer turn autocast on inside the root's ``forward``, a decorated ``forward`` too) runs
        under autocast; :meth:`on_forward_post` closes it at the same depth."""
        dtypes = _autocast_dtypes(self.torch)
        if dtypes:
            audit = self.audit
            audit["autocast_dtypes"].update(dtypes)
            audit["autocast_depth"], audit["autocast_t0"] = self.depth, monotonic_ns()
            if audit["autocast_site"] is None:
                audit["autocast_site"] = self.site_of(frame)[0]

    def on_forward_post(self) -> None:
        """The innermost module call of the training thread returned (or raised)."""
        if self.data_calls:
            self.data_calls -= 1
            self.depth -= 1
            return
        if self.module_calls is not None and self.learning:
            self.module_calls.post()
        if self.depth <= 0:
            return
        self.depth -= 1
        if self.auditing:  # the first steps only: the autocast and forward windows (on_forward_pre)
            audit = self.audit
            if audit["autocast_depth"] == self.depth:
                audit["autocast_ns"] += monotonic_ns() - audit["autocast_t0"]
                audit["autocast_depth"] = None
            if self.depth == 0 and audit["forward_t0"] is not None:
                audit["forward_ns"] += monotonic_ns() - audit["forward_t0"]
                audit["forward_t0"] = None
        if self.depth == 0:
            self.leave()

    def on_optimizer_pre(self, optimizer) -> None:
        self.trained = True
        if self.marker != "optimizer":
            self.marker = "optimizer"
            if threading.get_ident() != self.tid:  # training runs in another thread: follow it
                self.tid = self.regions.tid = self.colls.tid = threading.get_ident()
                self.native_tid = threading.get_native_id()
                if self.stacks is not None:
                    self.stacks.stop()
                    self.stacks = None
            self._start_stacks()
        if self.loop_open:
            self._end_loop()
        self.train_loader = self.loader_key
        region_mod.optimizer_stepped()
        self.enter("optimizer")

    def on_optimizer_post(self, optimizer) -> None:
        if self.tracking:
            self.leave()
        key = id(optimizer)
        part = self.parts.get(key)
        if part is None and len(self.parts) < MAX_PARTS:
            part = self.parts[key] = self._part(optimizer)
        if part is not None and self.tracking:  # the backward wrapper counts on tracked steps only
            part[3] += 1
            part[4] += self.bwd_since_opt
        self.bwd_since_opt = 0
        if self.primary_opt is None:
            self.primary_opt = key
        if key != self.primary_opt:
            # another optimizer steps again and again while the primary does not: it replaced it (a
            # second trainer.fit, an optimizer rebuilt for a new training stage)
            self.other_opt_steps = self.other_opt_steps + 1 if self.other_opt == key else 1
            self.other_opt = key
            if self.other_opt_steps < PRIMARY_TAKEOVER_STEPS:
                return
            self.primary_opt = key
            self.learn_until = (self.opt_steps + ROOT_LEARNING_STEPS, self.step + MAX_AUDITED_BATCHES)
            self.learning = True  # a new training stage: its top-level modules are learnt too
            self.learn_steps = (self.step, self.learn_calls)
        self.other_opt_steps = 0
        if self.opt_steps < DEVICE_AUDIT_STEPS:
            self._audit_step(p for group in optimizer.param_groups for p in group["params"])
        self.end_step("optimizer")

    def wrap_closure(self, closure):
        """``closure`` (what ``optimizer.step(closure)`` re-evaluates: Lightning's training_step +
        backward, LBFGS's loss) wrapped so that its time is host work (``other``) with its own
        forward and backward inside, never optimizer time."""

        def timed_closure(*args, **kwargs):  # no functools.wraps: it costs ~15 µs per step
            if self.off or threading.get_ident() != self.tid:
                return closure(*args, **kwargs)
            _safe(self, self.enter, "other")
            try:
                return closure(*args, **kwargs)
            finally:
                if not self.off:
                    _safe(self, self.leave)

        return timed_closure

    # -- audits ----------------------------------------------------------------------------------
    def _audit_batch(self, batch) -> None:
        cuda_ready = self.torch.cuda.is_initialized()
        n, size = count_tensors(batch)
        if n > self.audit["batch_tensors"]:
            self.audit["batch_tensors"], self.audit["batch_bytes"] = n, size
        for t in _tensors_in(batch):
            if self.transfers is not None:
                self.transfers.add_batch(t)
            self.audit["batch"].add(t.device.type)
            if cuda_ready and t.device.type == "cpu":
                pinned = bool(t.is_pinned())
                self.audit["pinned"] = pinned if self.audit["pinned"] is None else (self.audit["pinned"] and pinned)

    def _audit_step(self, parameters) -> None:
        """The ``devices`` record of a training step: where ``parameters`` (the optimizer's, or
        without one the top-level modules') live, in which dtypes, and what the step's audit saw."""
        params: dict[str, int] = {}
        dtypes: dict[str, int] = {}
        for p in parameters:
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
            "autocast": self.audit["autocast"], "matmul_tf32": tf32, "compiled": self.compiled,
            "autocast_dtypes": self.audit["autocast_dtypes"], "cpu_matmul": self._cpu_matmul(),
            "shape_probe": self._shape_probe(),
            "autocast_share": (min(1.0, self.audit["autocast_ns"] / self.audit["forward_ns"])
                               if self.audit["forward_ns"] else None),
            "autocast_site": self.audit["autocast_site"], "dist": _dist_group(self.torch),
            "batch_tensors": self.audit["batch_tensors"], "batch_bytes": self.audit["batch_bytes"],
            "anomaly_detection": bool(self.torch.is_anomaly_enabled()),
            "launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") not in (None, "", "0"),
            "wrappers": parallel_wrappers(self.roots.values()),
            "nccl_env": {k: v[:200] for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")} or None,
        })
        self.audit = _new_audit()
        if cuda_ready and "cuda" in params and self.timeline is None:
            self._start_gpu_timeline()

    def _cpu_matmul(self) -> dict | None:
        """The CPU autocast dtype's matmul time against float32 on this CPU (see
        :func:`lowp_matmul_slowdown`), measured once per process and only under CPU autocast."""
        dtype = self.audit["autocast_dtypes"].get("cpu")
        if dtype not in ("bfloat16", "float16"):
            return None
        if self.cpu_matmul is None or self.cpu_matmul.get("dtype") != dtype:
            self.cpu_matmul = lowp_matmul_slowdown(self.torch, dtype)
        return self.cpu_matmul

    def _shape_probe(self) -> dict | None:
        """The model's Linear/ConvNd shapes timed once per process (:func:`whyidle.instrument.
        shape_probe.probe`): under CPU autocast (float32 against its dtype) or at a batch of at most
        ``shape_probe.SMALL_BATCH_MAX`` samples (the growth to ``TARGET_BATCH``); None otherwise."""
        calls = self.module_calls
        if self.shape_probed or calls is None:
            return self.layer_probe
        layers = calls.layer_times()
        if not layers:
            return None
        self.shape_probed = True
        dtype = self.audit["autocast_dtypes"].get("cpu")
        dtype = dtype if dtype in ("bfloat16", "float16") else None
        batch = self.samples // max(1, self.batches) if self.samples_known and self.samples and self.batches else None
        if dtype is None and not (batch and batch <= shape_probe.SMALL_BATCH_MAX):
            return None
        self.layer_probe = shape_probe.probe(self.torch, layers, dtype, batch)
        return self.layer_probe

    # -- GPU timeline, syncs, transfers ----------------------------------------------------------
    def frames(self):
        """The process's :class:`whyidle.instrument.stacks.FrameClassifier` (created on first use)."""
        if self.classifier is None:
            from whyidle.instrument.stacks import FrameClassifier

            self.classifier = FrameClassifier()
        return self.classifier

    def on_compile_call(self, frame, kwargs: dict) -> None:
        """``torch.compile(...)`` was called: a ``compile_call`` record with the program's line and
        the options a recompilation fix names (``dynamic``, ``mode``, ``backend``, ``fullgraph``)."""
        backend = kwargs.get("backend", "inductor")
        self.agent.record({"k": "compile_call", "t": monotonic_ns(), "site": self.site_of(frame)[0],
                           "dynamic": kwargs.get("dynamic") if isinstance(kwargs.get("dynamic"), bool) else None,
                           "mode": kwargs.get("mode") if isinstance(kwargs.get("mode"), str) else None,
                           "backend": backend if isinstance(backend, str) else getattr(backend, "__name__", "custom"),
                           "fullgraph": bool(kwargs.get("fullgraph", False))})

    def site_of(self, frame) -> tuple[str | None, str | None]:
        """``(innermost user site, innermost site)`` of ``frame`` as ``"file:line function"``."""
        return self.frames().site_pair(frame)

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
        """Sets the detail stride from the mean step time of the last ``STRIDE_WINDOW`` steps; a
        change is written as a ``detail`` record."""
        ref = self._stride_ref
        if ref is not None and self.step > ref[0]:
            mean_s = (now - ref[1]) / 1e9 / (self.step - ref[0])
            stride = max(1, min(STRIDE_WINDOW, math.ceil(FULL_DETAIL_PERIOD_S / max(mean_s, 1e-9))))
            if abs(stride - self.stride) > self.stride // 4:  # steadier than the step times: no flip-flop
                self.agent.record({"k": "detail", "t": now, "step": self.step, "stride": stride,
                                   "step_s": round(mean_s, 6)})
                self.stride = stride
            self.step_s = mean_s
            if not self.learning:
                self._forward_residency()
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
            tl.mark(phase.rpartition(":")[2], "probe", self.step, [user, leaf, round(weight_s * 1000, 3)])

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

    def _drain_transfers(self, now: int, by: str) -> None:
        rec = self.transfers.drain(self.step, now)
        rec["by"] = by
        rec["mb"] = self.micro
        self.agent.record(rec)
        if self.opt_steps >= DEVICE_AUDIT_STEPS or self.step + 1 >= MAX_AUDITED_BATCHES:
            self.transfers.stop()
            self.transfers = None

    # -- installation ----------------------------------------------------------------------------
    def _start_stacks(self) -> None:
        startup.hand_over(self.agent)
        if self.stacks is not None or self.agent.stack_hz <= 0:
            return
        from whyidle.instrument.stacks import StackSampler

        regions = self.regions
        # a program that never trained has no evaluation apart from its loop: its samples are the steps'
        self.stacks = StackSampler(self.tid, self.agent.stack_hz,
                                   lambda: regions.sample_phase(self.phase) if self.trained else self.phase,
                                   native_id=self.native_tid, on_sample=self.on_stack_sample, phases=self.phase_map)
        self.agent.collectors.append(self.stacks.drain)
        self.agent.on_exit.append(self.stacks.stop)
        self.stacks.start()

    def _end_learning(self) -> None:
        """The top-level modules are known: the repeated-module count is recorded and from now
        on only the outermost calls of those roots are timed (:mod:`whyidle.instrument.forward`)."""
        if self.module_calls is not None:
            rec = self.module_calls.record()
            self.module_calls = None
            if rec is not None:
                self.agent.record(rec)
        for key, module in self.roots.items():
            self.root_refs[key] = weakref.ref(module)  # nn.Module has __weakref__
        self.roots = {}
        self.learning = False
        step0, calls0 = self.learn_steps
        self.calls_per_step = (self.learn_calls - calls0) / max(1, self.step - step0)
        self.learn_steps = (self.step, self.learn_calls)
        self._forward_residency()
        for switch in self.switches:  # the forward wrapper may come out of the lite steps now
            switch(self.tracking)
        self.record_parts()

    def _forward_residency(self) -> None:
        """Whether the ``Module.__call__`` wrapper stays in over the lite steps
        (:attr:`fwd_resident`, read by the forward switch of :mod:`whyidle.instrument.forward`):
        yes when passing a lite step's module calls through it (``calls_per_step ×
        FORWARD_PASS_NS``, the calls counted while learning) costs at most
        :data:`FORWARD_RESIDENT_SHARE` of the step time, and the ``stride - 1`` lite steps' calls
        cost less than taking it out after a full step and putting it back before the next
        (``2 × FORWARD_SWITCH_NS``): a small model's short steps keep it (~2 µs per step instead of
        ~1 ms per full step), a deep model's (whose every step it would slow) take it out."""
        per_step = self.calls_per_step * FORWARD_PASS_NS
        lite = max(0, self.stride - 1)
        self.fwd_resident = (per_step <= FORWARD_RESIDENT_SHARE * self.step_s * 1e9
                             and per_step * lite < 2 * FORWARD_SWITCH_NS)

    def _part(self, optimizer) -> list:
        """A new optimizer's entry in :attr:`parts`: ``[name, class, parameters, steps, backward
        calls]``. The name is the program's: the variable that holds the top-level module with its
        first parameter in the frame that stepped it (``netD``), else that module's class
        (``Discriminator``: the model a GAN's optimizer trains), else the optimizer's variable
        (``optimizerD``), else its class."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        model = None
        if params:
            first = id(params[0])
            for module in self._root_modules():
                if any(id(p) == first for p in module.parameters()):
                    model = module
                    break
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)  # DDP, compile
        cls = type(inner if isinstance(inner, self.torch.nn.Module) else model).__name__ if model is not None else None
        frame = sys._getframe(1)
        classify = self.frames().classify
        while frame is not None and classify(frame.f_code.co_filename)[0] != 0:
            frame = frame.f_back  # the program's frame that called optimizer.step()
        name = _name_of(frame, model) or (cls if cls not in (None, "Sequential", "ModuleList", "ModuleDict") else None)
        name = name or _name_of(frame, optimizer) or cls or type(optimizer).__name__
        return [name, type(optimizer).__name__, sum(p.numel() for p in params), 0, 0]

    def record_parts(self) -> None:
        """The ``optimizers`` record (docs/run-format.md): every optimizer that stepped, with its
        steps and the backward calls before them, so far (written when the roots are learnt and at exit)."""
        if self.parts:
            self.agent.record({"k": "optimizers", "t": monotonic_ns(), "primary": self.primary_opt, "parts": [
                {"id": key, "name": p[0], "class": p[1], "params": p[2], "steps": p[3], "backward": p[4]}
                for key, p in self.parts.items()]})


def _new_audit() -> dict:
    return {"batch": set(), "inputs": set(), "pinned": None, "autocast": None, "batch_tensors": 0, "batch_bytes": 0,
            # autocast: dtype per device type, the forward time in module calls under it (outermost
            # window: depth and start), the forward time, and the user's line of the first such call
            "autocast_dtypes": {}, "autocast_depth": None, "autocast_t0": 0, "autocast_ns": 0,
            "forward_t0": None, "forward_ns": 0, "autocast_site": None}


#: torchrun's environment (torch.distributed.elastic): variable → key of the ``dist`` identity.
DIST_ENV = {"RANK": "rank", "LOCAL_RANK": "local_rank", "WORLD_SIZE": "world_size", "GROUP_RANK": "node",
            "LOCAL_WORLD_SIZE": "local_world_size", "TORCHELASTIC_RUN_ID": "run_id", "MASTER_ADDR": "master_addr",
            "MASTER_PORT": "master_port"}


def dist_identity(env) -> dict | None:
    """The process's place in a ``torch.distributed`` job from the launcher's environment (torchrun,
    torch.distributed.launch, Accelerate, Lightning and SLURM-style launchers set ``RANK`` and
    ``WORLD_SIZE``): ``{rank, local_rank, world_size, node, local_world_size, run_id, master_addr,
    master_port}`` (integers where numeric, None when unset), or None outside such a job."""
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    out = {}
    for var, key in DIST_ENV.items():
        value = env.get(var)
        out[key] = int(value) if value is not None and value.isdigit() else value
    return out


#: DDP's settings recorded by the device audit (attribute → key).
DDP_SETTINGS = {"gradient_as_bucket_view": "gradient_as_bucket_view", "bucket_bytes_cap": "bucket_bytes",
                "find_unused_parameters": "find_unused_parameters", "static_graph": "static_graph",
                "broadcast_buffers": "broadcast_buffers"}


def parallel_wrappers(modules) -> list[dict]:
    """The data-parallel wrappers among the top-level modules (at most 4): ``{"kind":
    "DataParallel", "devices": len(device_ids)}``, ``{"kind": "DistributedDataParallel",
    gradient_as_bucket_view, bucket_bytes, find_unused_parameters, static_graph, broadcast_buffers}``
    or ``{"kind": "FullyShardedDataParallel"}`` (by class name: subclasses and re-exports count)."""
    out = []
    for m in modules:
        names = {c.__name__ for c in type(m).__mro__}
        if "DataParallel" in names and "DistributedDataParallel" not in names:
            out.append({"kind": "DataParallel", "devices": len(getattr(m, "device_ids", None) or [])})
        elif "DistributedDataParallel" in names:
            rec = {"kind": "DistributedDataParallel"}
            for attr, key in DDP_SETTINGS.items():
                value = getattr(m, attr, None)
                rec[key] = value if isinstance(value, (bool, int, float, type(None))) else str(value)
            out.append(rec)
        elif "FullyShardedDataParallel" in names:
            out.append({"kind": "FullyShardedDataParallel"})
        if len(out) >= 4:
            break
    return out


def _dist_group(torch) -> dict | None:
    """``{rank, world_size, backend}`` of the default ``torch.distributed`` process group once it is
    initialized (launchers that set the environment only in the processes they spawn, such as
    Lightning's own, leave the first process without ``RANK``), else None."""
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "backend": str(dist.get_backend())}
    except Exception:
        return None


def _autocast_dtypes(torch) -> dict[str, str]:
    """Device type → autocast dtype name (``"bfloat16"``, ``"float16"``) for each of ``cpu`` and
    ``cuda`` whose autocast is on (``torch.is_autocast_enabled(device)`` and
    ``torch.get_autocast_dtype(device)``, PyTorch ≥ 2.4); empty when off or on older PyTorch."""
    out = {}
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                out[device] = str(torch.get_autocast_dtype(device)).replace("torch.", "")
        except Exception:
            pass
    return out


def lowp_matmul_slowdown(torch, dtype: str, n: int = LOWP_MATMUL_N, reps: int = 5) -> dict | None:
    """How much slower an ``n``×``n`` matmul runs in ``dtype`` (``"bfloat16"`` / ``"float16"``)
    than in float32 on this CPU, with the intra-op threads the program uses.

    A CPU without native 16-bit matmul units (bfloat16: AVX512-BF16 or AMX; float16: AVX512-FP16
    or AMX-FP16) runs autocast's matmuls through a slow fallback: measured 5.3–5.8× (n=32), 17×
    (n=64) and 113× (n=512) float32's time on an AVX2 EPYC with PyTorch 2.13. The small ``n`` keeps
    the cost near 0.1 ms on such a CPU and makes the ratio a lower bound (the gap widens with size).

    Returns ``{"dtype", "n", "float32_s", "lowp_s", "slowdown", "native", "cpu_flags"}`` (seconds
    per matmul, the best of ``reps``; ``slowdown`` = lowp_s / float32_s; ``native`` from oneDNN's
    ``torch.ops.mkldnn._is_mkldnn_bf16_supported`` / ``_is_mkldnn_fp16_supported``, None when
    unknown; ``cpu_flags``: :func:`whyidle.instrument.shape_probe.lowp_cpu_flags`), or None when
    the matmul cannot run. Raises nothing.
    """
    try:
        a = torch.rand(n, n, generator=torch.Generator().manual_seed(0))  # the program's RNG untouched
        times = {}
        for name in ("float32", dtype):
            x = a.to(getattr(torch, name))
            with torch.autocast("cpu", enabled=False):
                torch.mm(x, x)
                best = float("inf")
                for _ in range(reps):
                    t0 = perf_counter()
                    torch.mm(x, x)
                    best = min(best, perf_counter() - t0)
            times[name] = best
    except Exception:
        return None
    try:
        check = "_is_mkldnn_bf16_supported" if dtype == "bfloat16" else "_is_mkldnn_fp16_supported"
        native = bool(getattr(torch.ops.mkldnn, check)())
    except Exception:
        native = None
    return {"dtype": dtype, "n": n, "float32_s": times["float32"], "lowp_s": times[dtype],
            "slowdown": times[dtype] / max(times["float32"], 1e-9), "native": native,
            "cpu_flags": shape_probe.lowp_cpu_flags()}


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


def _loader_config(loader, key: int, t: int) -> dict:
    def attr(name):
        value = getattr(loader, name, None)
        return value if isinstance(value, (int, float, bool, str, type(None))) else str(value)

    try:
        length = len(loader.dataset)
    except Exception:
        length = None
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
        **dataset_code.start_method(loader),  # mp_context, start_method_set, platform
        "worker_init_fn": getattr(loader, "worker_init_fn", None) is not None,
        "iterable": iterable, "sampler": type(getattr(loader, "sampler", None)).__name__,
        "collate_fn": getattr(collate, "__name__", type(collate).__name__) if collate is not None else None,
        "drop_last": attr("drop_last"), "shard": _shard(getattr(loader, "sampler", None)),
        "loader_class": type(loader).__name__,
        "snapshot_every_n_steps": attr("snapshot_every_n_steps"),  # torchdata's StatefulDataLoader
        "dataset_set_epoch": callable(getattr(getattr(loader, "dataset", None), "set_epoch", None)),
    }


def _shard(sampler) -> dict | None:
    """A ``DistributedSampler``'s split (``num_replicas``, ``drop_last``, ``num_samples`` per rank,
    ``total_size`` over the ranks), or None for other samplers."""
    try:
        fields = {k: getattr(sampler, k) for k in ("num_replicas", "drop_last", "num_samples", "total_size")}
    except Exception:
        return None
    return {k: v for k, v in fields.items() if isinstance(v, (int, bool))} or None


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
        "argv": redact_argv(list(getattr(sys, "argv", []))), "python": sys.version.split()[0],
        "framework": "torch", "framework_version": str(torch.__version__),
        "cuda_build": getattr(torch.version, "cuda", None), "threads": torch.get_num_threads(),
        "started": agent.t_start, "dist": dist_identity(os.environ),
    })
    agent.start_background()
    worker = sys.modules.get("torch.utils.data._utils.worker")
    # the start-up until the first training activity; a DataLoader worker's loop ends it unrecorded
    startup.start(agent, until=lambda: getattr(worker, "_worker_info", None) is not None)
    agent.on_exit.append(inst.flush_lite)  # before the agent's last flush
    agent.on_exit.append(inst.record_parts)
    agent.on_exit.append(inst.colls.flush)
    inst.hooks.install(torch)

    def hooks_record() -> None:
        rec = inst.hooks.record(monotonic_ns())
        if rec is not None:
            agent.record(rec)

    agent.on_exit.append(hooks_record)

    orig_next = dl._BaseDataLoaderIter.__next__
    # whether __next__ below does its work (switch_next): it stays in place either way, since
    # assigning _BaseDataLoaderIter.__next__ around every full step would invalidate the attribute
    # caches of the iterator classes and slow every batch fetch (~5 µs on a 0.7 ms step)
    next_on = [True]

    @functools.wraps(orig_next)
    def __next__(self):
        __tracebackhide__ = True  # IPython and pytest leave whyidle's frame out of the program's tracebacks
        if not next_on[0] or inst.off or agent.disabled or get_ident() != inst.tid:
            return orig_next(self)
        try:
            inst.on_fetch_start(self)
            c0 = thread_time_ns() if inst.full else 0
        except Exception as exc:
            inst.fail("DataLoader.__next__", exc)
            return orig_next(self)
        first = inst.pending_first == id(self)
        t_first = monotonic_ns() if first else 0
        try:
            batch = orig_next(self)
        except BaseException:  # StopIteration included: the epoch ends inside this step
            _safe(inst, inst.on_fetch_end, None, c0, True, self)
            if first:
                _safe(inst, inst.on_first_batch, self, t_first)
            raise
        try:
            inst.on_fetch_end(batch, c0, False, self)
            if first:
                inst.on_first_batch(self, t_first)
        except Exception as exc:
            inst.fail("DataLoader.__next__", exc)
        return batch

    nested = [0, 0]  # calls of a wrapped __iter__ / __init__ now open: a subclass's calls its base's

    def wrap_iter(orig_iter):
        @functools.wraps(orig_iter)
        def __iter__(self):
            __tracebackhide__ = True
            if nested[0] or inst.off or agent.disabled or get_ident() != inst.tid:
                return orig_iter(self)  # the outermost __iter__ (a subclass's) records
            t0 = monotonic_ns()
            _safe(inst, inst.enter, "data")
            loader_workers.set_loader(id(self))  # the workers forked now record it
            it = None
            nested[0] += 1
            try:
                it = orig_iter(self)
                return it
            finally:
                nested[0] -= 1
                if not inst.off:
                    _safe(inst, inst.leave)
                    _safe(inst, inst.on_iter, self, t0, monotonic_ns(), it)
        return __iter__

    def wrap_init(orig_init):
        @functools.wraps(orig_init)
        def __init__(self, *args, **kwargs):
            __tracebackhide__ = True
            nested[1] += 1
            try:
                orig_init(self, *args, **kwargs)
            finally:
                nested[1] -= 1
            if not nested[1] and not inst.off:
                _safe(inst, inst.on_loader_created, self, sys._getframe(1))
        return __init__

    def wrap_subclass(cls) -> None:
        """A DataLoader subclass that defines its own ``__iter__`` / ``__init__`` without always calling
        the base's (torchdata's ``StatefulDataLoader``) is timed like the base."""
        for name, wrap in (("__iter__", wrap_iter), ("__init__", wrap_init)):
            own = cls.__dict__.get(name)
            if own is not None and not getattr(own, "_whyidle", False):
                wrapped = wrap(own)
                wrapped._whyidle = True
                patches.assign(cls, name, wrapped)

    def __init_subclass__(cls, **kwargs):
        super(dl.DataLoader, cls).__init_subclass__(**kwargs)
        if not inst.off:
            _safe(inst, wrap_subclass, cls)

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    orig_iter = dl.DataLoader.__iter__
    __iter__ = wrap_iter(orig_iter)
    __init__ = wrap_init(dl.DataLoader.__init__)
    for sub in list(subclasses(dl.DataLoader)):  # defined before whyidle came in
        _safe(inst, wrap_subclass, sub)

    orig_shutdown = dl._MultiProcessingDataLoaderIter._shutdown_workers

    @functools.wraps(orig_shutdown)
    def _shutdown_workers(self):
        __tracebackhide__ = True
        # an iterator's workers stopped and joined (the epoch's end without persistent workers:
        # 0.3-0.8 s per epoch for spawn workers on 2 cores): an ``iter_end`` record; once per iterator
        if inst.off or agent.disabled or get_ident() != inst.tid or getattr(self, "_shutdown", True):
            return orig_shutdown(self)
        t0 = monotonic_ns()
        try:
            return orig_shutdown(self)
        finally:
            key = inst.iter_loader.get(id(self))
            _safe(inst, agent.record, {"k": "iter_end", "t": monotonic_ns(), "loader": key, "t0": t0,
                                       "t1": monotonic_ns()})

    patches.assign(dl._BaseDataLoaderIter, "__next__", __next__)
    patches.assign(dl.DataLoader, "__iter__", __iter__)
    patches.assign(dl.DataLoader, "__init__", __init__)
    patches.assign(dl.DataLoader, "__init_subclass__", classmethod(__init_subclass__))
    patches.assign(dl._MultiProcessingDataLoaderIter, "_shutdown_workers", _shutdown_workers)
    loader_workers.install(torch, agent.run_dir, agent)  # the workers' own batch timing
    agent.collectors.append(inst.queue.drain)

    orig_backward = torch.autograd.backward

    torch_dir = os.path.dirname(torch.__file__) + os.sep

    @functools.wraps(orig_backward)
    def backward(*args, **kwargs):
        __tracebackhide__ = True
        if inst.off or agent.disabled or get_ident() != inst.tid or inst.bwd_depth:
            # another thread's, or a backward inside a backward (a reentrant checkpoint's): part of it
            return orig_backward(*args, **kwargs)
        if inst.step in GRAPH_COUNT_STEPS and inst.step not in inst.graph_counted and args:
            inst.graph_counted.add(inst.step)
            try:  # a few backwards only: walking the graph costs ~1 µs per node
                agent.record({"k": "graph", "t": monotonic_ns(), "step": inst.step,
                              "nodes": count_graph_nodes(args[0])})
            except Exception:
                pass
        site = None if inst.marker == "optimizer" else _caller(sys._getframe(1), torch_dir)
        inst.micro += 1
        inst.bwd_depth = 1
        try:
            inst.enter("backward")
        except Exception as exc:
            inst.fail("backward", exc)
        try:
            return orig_backward(*args, **kwargs)
        finally:
            inst.bwd_depth = 0
            if not inst.off:
                _safe(inst, inst.leave)
                if inst.colls.enabled:
                    inst.colls.backward_done()
                _safe(inst, inst.on_backward, site)

    patches.assign(torch.autograd, "backward", backward)

    try:
        from whyidle.instrument.transfers import watch_placement

        watch_placement(torch, agent.record, inst.site_of)
    except Exception as exc:
        agent.notice(f"placement audit disabled: {exc!r}")

    try:
        coll_mod.install(torch, inst.colls, agent.notice)
    except Exception as exc:
        agent.notice(f"collective timing disabled: {exc!r}")

    try:
        deep_trace.install(agent, torch, inst)
    except Exception as exc:
        agent.notice(f"deep traces disabled: {exc!r}")

    region_mod.wrap(torch, "save", "checkpoint", agent, "torch.save")
    region_mod.watch_module_mode(module_mod.Module, agent)

    orig_compile = getattr(torch, "compile", None)
    if orig_compile is not None:

        @functools.wraps(orig_compile)
        def compile(*args, **kwargs):
            __tracebackhide__ = True
            inst.compiled = True
            forward_mod.pin()  # compiled code may be guarded on Module.__call__: no more switching
            try:
                inst.on_compile_call(sys._getframe(1), kwargs)
            except Exception as exc:
                agent.notice(f"torch.compile call not recorded: {exc!r}")
            return orig_compile(*args, **kwargs)

        patches.assign(torch, "compile", compile)

    def opt_pre(optimizer, args, kwargs):
        if inst.off or agent.disabled or (inst.marker == "optimizer" and get_ident() != inst.tid):
            return None
        if not inst.tracking and inst.marker == "optimizer" and not inst.loop_open and inst.t0 is not None:
            # a lite step (most steps of short ones): what on_optimizer_pre does there, without its calls
            inst.trained = True
            inst.train_loader = inst.loader_key
            regions = region_mod._REGIONS
            if regions is not None and regions.eval_module is not None:
                region_mod.optimizer_stepped()
            return None
        try:  # _safe inlined: this runs on every step
            inst.on_optimizer_pre(optimizer)
        except Exception as exc:
            inst.fail("on_optimizer_pre", exc)
        if not inst.tracking:  # a lite step: no phases, the closure runs as it is
            return None
        # step(closure): the closure's work (Lightning's training_step and backward) is the step's
        # forward / backward / host work, not optimizer time. args[0] is the optimizer itself.
        try:
            if callable(kwargs.get("closure")):
                return args, dict(kwargs, closure=inst.wrap_closure(kwargs["closure"]))
            if len(args) > 1 and callable(args[1]):
                return (args[0], inst.wrap_closure(args[1]), *args[2:]), kwargs
        except Exception as exc:
            inst.fail("the optimizer closure", exc)
        return None

    def opt_post(optimizer, args, kwargs):
        if inst.off or agent.disabled or get_ident() != inst.tid:
            return None
        key = id(optimizer)
        if not inst.tracking and key == inst.primary_opt and inst.opt_steps >= DEVICE_AUDIT_STEPS and key in inst.parts:
            # the primary optimizer on a lite step: what on_optimizer_post does there, without its call
            inst.bwd_since_opt = 0
            inst.other_opt_steps = 0
            try:
                inst.end_step("optimizer")
            except Exception as exc:
                inst.fail("on_optimizer_post", exc)
            return None
        try:  # _safe inlined: this runs on every step
            inst.on_optimizer_post(optimizer)
        except Exception as exc:
            inst.fail("on_optimizer_post", exc)
        return None

    switch_forward = forward_mod.install(torch, inst)
    handles = [optim_mod.register_optimizer_step_pre_hook(opt_pre), optim_mod.register_optimizer_step_post_hook(opt_post)]

    def forget() -> None:  # whyidle.watch() ended: this process may be observed again later
        global _INSTANCE
        inst.off = True
        for handle in handles:
            handle.remove()
        _INSTANCE = None

    patches.on_restore(forget)

    def switch_backward(on: bool) -> None:
        # where backward calls mark the steps the wrapper stays
        if torch.autograd.backward in (backward, orig_backward):  # nobody else wrapped it since
            patches.assign(torch.autograd, "backward", backward if on or inst.marker == "backward" else orig_backward)

    def switch_next(on: bool) -> None:
        # where batches mark the steps (or may start to, after forward-marked ones) the wrapper
        # works; a new iterator's first batch is timed whatever the step's detail (TorchInstrument.on_iter)
        next_on[0] = bool(on or inst.marker in ("loader", "forward") or inst.pending_first is not None)

    inst.switches = [switch_backward, switch_next, switch_forward]
    inst.switch_next = switch_next
    inst.phase_map = _phase_map(torch, orig_next, orig_iter, orig_backward)
    # The training thread's stack sampling (a timer signal) starts with the first training activity
    # (a batch, a forward, a step): processes that only import torch (spawned DataLoader workers,
    # tools) get no timer; until then the start-up sampler's thread samples (instrument/startup.py).
    return inst


def _phase_map(torch, orig_next, orig_iter, orig_backward):
    """The :class:`whyidle.instrument.stacks.PhaseMap` of this PyTorch: the code objects of the
    entry points the phase hooks wrap (None when one cannot be found: lite samples stay ``lite``)."""
    from whyidle.instrument.stacks import PhaseMap

    try:
        module = torch.nn.Module
        codes = {orig_next.__code__: "data", orig_iter.__code__: "data", orig_backward.__code__: "backward",
                 module._call_impl.__code__: "forward"}
        wrapped = getattr(module, "_wrapped_call_impl", None)
        if wrapped is not None:
            codes[wrapped.__code__] = "forward"
        # every optimizer's step runs inside this one wrapper (Optimizer.profile_hook_step)
        codes[torch.optim.Optimizer.profile_hook_step(lambda *a, **k: None).__code__] = "optimizer"
        return PhaseMap(codes, torch.is_grad_enabled)
    except Exception:
        return None


def _name_of(frame, obj) -> str | None:
    """The name ``obj`` is bound to in ``frame`` (a local, else a global, else ``self.<attribute>``),
    or None. For naming, once per optimizer."""
    if frame is None or obj is None:
        return None
    for names in (frame.f_locals, frame.f_globals):
        for name, value in names.items():
            if value is obj and not name.startswith("_"):
                return name
    owner = frame.f_locals.get("self")
    for name, value in getattr(owner, "__dict__", {}).items():
        if value is obj and not name.startswith("_"):
            return name
    return None


def _caller(frame, torch_dir: str, depth: int = 8):
    """``(code, line)`` of the first frame from ``frame`` outward that is not PyTorch's own (the
    line that called ``loss.backward()``), or None within ``depth`` frames."""
    while frame is not None and depth > 0:
        if not frame.f_code.co_filename.startswith(torch_dir):
            return frame.f_code, frame.f_lineno
        frame = frame.f_back
        depth -= 1
    return None


def _safe(inst: TorchInstrument, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:
        inst.fail(getattr(fn, "__name__", "a hook"), exc)
