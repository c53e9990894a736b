"""Host-side timing of a rank's ``torch.distributed`` collectives, per training step.

In a DDP job every rank meets the others at the step's collectives: the buffer broadcast at the
start of forward (``broadcast_buffers=True``), the gradient all-reduce of each bucket during
backward, and whatever the program calls itself (metric all-reduces, barriers). A rank that gets
there early waits for the last one, so the time a rank spends in them, less the least any rank
spent in that step, is the time it waited for the others; the rank that spent the least arrived
last: the *culprit* (:mod:`whyidle.analysis.collectives`). Each rank measures on its own clock:
no cross-node clock alignment is needed.

What is timed, on the training thread, from the host:

- the program's blocking collectives: the ``torch.distributed`` functions in :data:`COLLECTIVES`
  (``async_op=True`` calls are counted, their wait is the program's ``Work.wait`` and is not timed);
  only the outermost call when one calls another (``all_gather_object`` gathers);
- DDP's buffer broadcast (``DistributedDataParallel._distributed_broadcast_coalesced``);
- DDP's gradient reduction: the step's first bucket, from the moment its hook runs (arrival) to its
  future's completion. DDP accepts one communication hook, registered once; a *trampoline* hook is
  registered when the module is built and runs the hook the program registers later (through the
  patched ``register_comm_hook`` / ``_register_builtin_comm_hook``) or, without one, PyTorch's own
  ``allreduce_hook`` (documented as what DDP does without a hook). Completion is read by a
  ``add_done_callback`` on the hook's own future: the future DDP waits for is unchanged.

Only for host-synchronous backends (gloo, mpi): NCCL (and other device backends) return as soon
as the collective is queued on the device, so host times say nothing about arrival; there, none
of this is installed and the ranks' phases tell the straggler (:mod:`whyidle.analysis.ranks`).
No synchronization is added. Rows: one per step with collectives, ``COLLS_COLUMNS``
(docs/run-format.md).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import weakref
from time import monotonic_ns

from whyidle.instrument import patches

#: The ``torch.distributed`` collectives timed when the program calls them.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
               "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "scatter_object_list")

#: Backends whose collectives return to the host only once done (gloo, mpi): host times are waits.
HOST_SYNC_BACKENDS = frozenset({"gloo", "mpi"})
#: Device backends: their collectives return once queued on the device.
DEVICE_BACKENDS = ("nccl", "xccl", "hccl", "ucc")


def host_synchronous(backend: str) -> bool:
    """Whether the default group's collectives block the host until done: ``gloo``/``mpi``, or a
    device map (``"cpu:gloo,cuda:nccl"``) without a device backend; ``"undefined"`` (no backend
    given to ``init_process_group``: gloo for CPU tensors, NCCL for CUDA ones) only without CUDA."""
    if any(b in backend for b in DEVICE_BACKENDS):
        return False
    if backend == "undefined":
        torch = sys.modules.get("torch")
        return torch is not None and not torch.cuda.is_available()
    return any(b in backend for b in HOST_SYNC_BACKENDS)

#: Row of a ``colls`` record: step index, the program's blocking collectives (count, ns), their
#: elements (the largest tensor's ``numel``, -1 unknown), DDP's buffer broadcast (ns), DDP gradient
#: buckets reduced (count) and the first one's arrival-to-completion time (ns, None unknown), the
#: times the whole gradient was reduced (rounds: arrivals of the step's first bucket index: one
#: per backward outside ``no_sync``) and the backward time after each round's last bucket was
#: ready (ns: the reduction's time not hidden behind backward compute; None on steps recorded
#: without the backward hook, docs/run-format.md ``steps``).
COLLS_COLUMNS = ("i", "n", "ns", "numel", "bcast_ns", "buckets", "lag_ns", "rounds", "exposed_ns")

#: A ``colls`` record is written once this many rows are queued or the oldest is this old
#: (seconds): a killed run loses at most that much.
FLUSH_ROWS = 256
FLUSH_AGE_S = 2.0


class CollectiveTimer:
    """The current step's collective times in one rank, and the rows of the steps before."""

    def __init__(self, record, tid: int) -> None:
        self.record = record  # agent.record
        self.tid = tid  # the training thread's ident
        self.depth = 0  # a timed call in progress on the training thread (nested calls are its own)
        self.rows: list[list] = []
        self.t_rows = 0  # when the oldest queued row was queued (monotonic ns)
        self.enabled: bool | None = None  # None until the backend is known
        self._clear()

    def _clear(self) -> None:
        self.n = 0
        self.ns = 0
        self.numel = 0
        self.bcast_ns = 0
        self.buckets = 0
        self.slot: list | None = None  # [arrival, completion] of this step's first bucket
        self.first_index: int | None = None  # the index of the step's first bucket
        self.rounds = 0
        self.last_arrival = 0  # when the current backward's last bucket so far was ready
        self.exposed_ns = 0
        self.timed_rounds = 0  # backwards timed by backward_done (not on steps whose hooks are out)

    def host_sync(self, dist) -> bool:
        """Whether the default process group's backend is host-synchronous (decided once)."""
        if self.enabled is None:
            try:
                if not dist.is_initialized():
                    return False
                self.enabled = host_synchronous(str(dist.get_backend()))
            except Exception:
                self.enabled = False
        return self.enabled

    def end_step(self, i: int) -> None:
        """Closes step ``i``: a row when it had collectives (training thread)."""
        if self.n or self.bcast_ns or self.buckets:
            now = monotonic_ns()
            if not self.rows:
                self.t_rows = now
            self.rows.append([i, self.n, self.ns, self.numel, self.bcast_ns, self.buckets, self.slot, self.rounds,
                              self.exposed_ns if self.timed_rounds else None])
            if len(self.rows) >= FLUSH_ROWS or now - self.t_rows > FLUSH_AGE_S * 1e9:
                self.flush()
        self._clear()

    def flush(self) -> None:
        """Writes the queued rows as one ``colls`` record. A bucket's completion lands in its slot
        from the backend's thread; by now DDP has waited for it (the end of that backward)."""
        rows, self.rows = self.rows, []
        if not rows:
            return
        out = []
        for r in rows:
            slot = r[6]
            r[6] = slot[1] - slot[0] if slot and slot[1] else None
            out.append(r)
        self.record({"k": "colls", "t": monotonic_ns(), "rows": out})

    def arrive(self, index: int) -> list | None:
        """Gradient bucket ``index`` is ready: its slot when it is the step's first, else None."""
        now = monotonic_ns()
        self.buckets += 1
        self.last_arrival = now
        if self.first_index is None:
            self.first_index = index
        if index == self.first_index:
            self.rounds += 1
        if self.slot is None:
            self.slot = [now, 0]
            return self.slot
        return None

    def backward_done(self) -> None:
        """A backward returned (DDP has waited for its buckets): the time since its last bucket
        was ready is reduction that compute did not hide."""
        if self.last_arrival:
            self.exposed_ns += monotonic_ns() - self.last_arrival
            self.timed_rounds += 1
            self.last_arrival = 0


def _numel(args) -> int:
    """The largest tensor argument's element count (a list of tensors counts its largest), -1 when
    none is a tensor."""
    best = -1
    for a in args[:2]:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            n = getattr(t, "numel", None)
            if callable(n):
                try:
                    best = max(best, int(n()))
                except Exception:
                    pass
    return best


def _async_index(fn) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
        return names.index("async_op") if "async_op" in names else None
    except (TypeError, ValueError):
        return None


def _timed(timer: CollectiveTimer, dist, fn, is_compiling):
    """``fn`` (a ``torch.distributed`` collective) timed when it blocks the training thread."""
    get_ident = threading.get_ident
    at = _async_index(fn)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if timer.depth or timer.enabled is False or get_ident() != timer.tid or is_compiling():
            return fn(*args, **kwargs)
        if kwargs.get("async_op") or (at is not None and len(args) > at and args[at]) or not timer.host_sync(dist):
            return fn(*args, **kwargs)
        timer.depth += 1
        t0 = monotonic_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            timer.depth -= 1
            timer.ns += monotonic_ns() - t0
            timer.n += 1
            try:
                timer.numel = max(timer.numel, _numel(args))
            except Exception:
                pass

    return timed


class _Trampoline:
    """State of the communication hook whyidle registers on one DDP module: the hook that does the
    reduction (the program's, once it registers one) and its state."""

    __slots__ = ("inner", "state", "user")

    def __init__(self, default, state) -> None:
        self.inner = default
        self.state = state
        self.user = False  # the program registered its own hook (a second one is refused as upstream)


def _trampoline_hook(timer: CollectiveTimer):
    def whyidle_comm_hook(state, bucket):  # DDP checks the parameter is named ``bucket``
        slot = None
        try:
            slot = timer.arrive(bucket.index())
        except Exception:
            pass
        fut = state.inner(state.state, bucket)
        if slot is not None:
            try:
                fut.add_done_callback(lambda _f, s=slot: s.__setitem__(1, monotonic_ns()))
            except Exception:
                pass
        return fut

    return whyidle_comm_hook


def install(torch, timer: CollectiveTimer, notice) -> None:
    """Wraps the collectives and DDP's broadcast, hook registration and construction (see the
    module docstring). Raises what the patching raises; the caller turns it into one notice."""
    dist = torch.distributed
    if not dist.is_available():
        return
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if callable(fn):
            patches.assign(dist, name, _timed(timer, dist, fn, is_compiling))

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    get_ident = threading.get_ident
    orig_bcast = DDP._distributed_broadcast_coalesced

    @functools.wraps(orig_bcast)
    def bcast(self, *args, **kwargs):
        if timer.depth or not timer.enabled or get_ident() != timer.tid:
            return orig_bcast(self, *args, **kwargs)
        timer.depth += 1
        t0 = monotonic_ns()
        try:
            return orig_bcast(self, *args, **kwargs)
        finally:
            timer.depth -= 1
            timer.bcast_ns += monotonic_ns() - t0

    patches.assign(DDP, "_distributed_broadcast_coalesced", bcast)
    hook = _trampoline_hook(timer)
    # DDP module → its trampoline, beside the module, never on it: DDP pickles and deep-copies its
    # attributes (less the process group and reducer), and the trampoline holds the process group
    trampolines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    orig_init = DDP.__init__

    @functools.wraps(orig_init)
    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if self in trampolines or not timer.host_sync(dist):
            return
        try:  # the reducer's own registration (register_comm_hook's last line), without its logging
            state = _Trampoline(default_hooks.allreduce_hook, self.process_group)
            dist._register_comm_hook(self.reducer, state, hook)
            trampolines[self] = state
        except Exception as exc:
            notice(f"DDP gradient all-reduce not timed: {exc!r}")

    orig_register = DDP.register_comm_hook

    @functools.wraps(orig_register)
    def register_comm_hook(self, state, hook):
        tramp = trampolines.get(self)
        if tramp is None or tramp.user:
            return orig_register(self, state, hook)
        self._check_comm_hook(hook)  # the program's errors, as upstream raises them
        tramp.inner, tramp.state, tramp.user = hook, state, True
        try:
            self.logger._set_comm_hook_name(hook.__qualname__)
            self._comm_hooks.append((hook, state))
        except Exception:
            pass
        return None

    orig_builtin = DDP._register_builtin_comm_hook

    @functools.wraps(orig_builtin)
    def _register_builtin_comm_hook(self, comm_hook_type):
        tramp = trampolines.get(self)
        python = {"ALLREDUCE": default_hooks.allreduce_hook, "FP16_COMPRESS": default_hooks.fp16_compress_hook}
        fn = python.get(getattr(comm_hook_type, "name", None))
        if tramp is None or tramp.user or fn is None:
            return orig_builtin(self, comm_hook_type)
        tramp.inner, tramp.state, tramp.user = fn, self.process_group, True
        return None

    patches.assign(DDP, "__init__", __init__)
    patches.assign(DDP, "register_comm_hook", register_comm_hook)
    patches.assign(DDP, "_register_builtin_comm_hook", _register_builtin_comm_hook)
