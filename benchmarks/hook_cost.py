"""Per-step cost of each whyidle hook family on a ~2 ms CPU training step (in-process).

Measurement code for the adaptive-thinning work (issue 12): which part of whyidle's in-process
agent costs how many µs per step, on the ~2 ms loop of ``benchmarks/overhead.py`` (case ``2ms``:
an MLP, an in-memory TensorDataset behind a DataLoader, SGD, one intra-op thread).

How. This process builds the loop, then starts whyidle's agent in-process exactly as the
bootstrap would (``Agent(run_dir)``, ``whyidle.instrument.torch.install(agent, torch)``) and takes
control of each hook family, so any subset can be switched on or off between steps:

============  ==================================================================================
family        switched by
============  ==================================================================================
data          ``_BaseDataLoaderIter.__next__`` / ``DataLoader.__iter__``: whyidle's wrappers or
              the originals
fwd_root      ``torch.nn.Module.__call__``: whyidle's wrapper (``instrument/forward.py``) after
              the learning steps (its steady state on a phase-tracked step): the model's outermost
              call goes to ``on_forward_pre``/``on_forward_post``, each nested call passes through
              after ``is_dynamo_compiling()`` and two attribute reads
fwd_global    the same wrapper in learning mode (``inst.learning``, its first 3 optimizer steps):
              every module call goes to ``on_forward_pre``/``on_forward_post``
bwd           ``torch.autograd.backward``: whyidle's wrapper or the original
opt           whyidle's global optimizer step pre/post hooks (in ``torch.optim.optimizer``'s
              global hook dicts); they end each step and write the step record. Off: steps end
              at the next batch instead (``by="loader"``, as whyidle does without an optimizer)
stacks        one ``StackSampler`` (timer signal, ``--stack-hz``), armed or disarmed with
              ``timer_settime``; also ``inst.stacks`` (the per-step ``maybe_reinstall`` check)
flush         the agent's flusher thread: every 0.5 s it encodes the queued records (JSON) and
              writes them; off, it only drops the queue
audit         the copy/read audit (``TransferAudit``: ``Tensor.to``/``item``/... wrapped), which
              whyidle runs for the first 3 optimizer steps only, here kept on
noop          empty hooks in the same places as data, bwd and opt (pass-through
              ``__next__``/``__iter__``/``backward`` wrappers and global optimizer hooks that do
              nothing) and whyidle's ``Module.__call__`` wrapper passing every call through
              (``tracking`` off: the path of every module call on a lite step once the program
              compiled; before that, lite steps get PyTorch's own ``__call__`` back): what
              hooking there costs before any of whyidle's bookkeeping runs (not combined with the
              real families)
============  ==================================================================================

The agent's own sampler is not started (``stack_hz=0``); the one above stands in for it, with the
same arguments. Every step is recorded in full detail (the detail stride is pinned to 1): on the
lite steps of a short-step loop whyidle takes its phase hooks out itself, which would undo the
switchboard's choice between steps; a lite step's forward is the noop family's, its other costs
are ``benchmarks/overhead_inproc.py``'s. The repeated-module count (``module_calls.py``, which
also runs only while learning) is off: fwd_global is the wrapper and ``on_forward_pre``/``post``
alone; table 3 has the count's own cost per call. ``watch_placement`` wraps ``Module.to``/``cuda``
and ``torch.cuda.is_available``: set-up calls, not made in the loop, so it has no per-step cost;
its per-call cost is in table 3.

Three tables:

1. Ablation. Configurations (each family alone, everything, everything minus one family, and
   "plain (control)") run as blocks of ``--block`` steps (first 2 skipped), every configuration
   once per round in a shuffled order, each block between two plain blocks; ``--rounds`` rounds.
   A block's cost is its statistic minus the mean of the same for the two plain blocks around
   it (~40 ms away on either side: the speed of this shared VM changes by tens of percent over
   seconds, with the other jobs on its host); a configuration's cost is the median of its
   blocks' costs. Statistics: the median step time of the block (the goal metric of
   ``benchmarks/overhead.py``: a fixed per-step cost), its mean (samples/s: also a cost paid
   every few steps, such as a stack sample; not a flush, which lands in one block of ~12 and is
   dropped by the median over rounds: table 2 measures it), the median CPU time of the training
   thread per step (``thread_time_ns``: immune to preemption, blind to the flusher thread).
   "plain (control)" is a plain block between plain blocks: its cost is the noise floor.
2. Self time. With everything on, whyidle's functions are wrapped with ``perf_counter_ns``
   (exclusive time: a nested timed call is subtracted from its caller; the timer's own cost,
   calibrated on an empty function, is subtracted per call): its wrapper functions and hook
   closures ("glue": PyTorch's original inside them is timed as a child and left out), the
   ``TorchInstrument`` methods they call, ``Agent.record``, the stack sampler's ``sample``.
   "typical" is the median call times calls per step; "total" the sum, which also carries
   preemptions and collector passes. Also: the flusher's CPU time per step (``thread_time_ns``
   in its thread) and its effect on the training thread (per flush, the excess time of the steps
   that overlap it over the median step), and the garbage collector's time per step with
   everything on and plain (``gc.callbacks``). What the ablation's "all" has beyond the typical
   self time is PyTorch's hook dispatch, whyidle's code running cold between the step's
   kernels (several times slower than in a tight microbenchmark), and contention. The
   ``Module.__call__`` wrapper is timed on every module call, the nested ones included (a few
   hundred ns each: the timer's calibrated cost is of the same order; table 3 has them without it).
3. Per call: the clocks whyidle reads, the audit wrappers, ``watch_placement``, the
   ``Module.__call__`` wrapper (a root call, a nested call, a call passed through, a call in
   learning mode with and without the repeated-module count: the extra time of a forward through
   a ``Sequential`` of 8 and of 72 ``Identity`` modules over PyTorch's own ``__call__``, the
   per-call cost from the difference), and one stack sample on this loop's stack and on a
   Lightning ``training_step`` stack (deeper: the sampler formats a site for every frame up to the
   4th user frame).

``--loop lightning`` runs the same on overhead.py's Lightning case (one ``Trainer.fit`` drives all
blocks; a Callback switches configurations at ``on_train_batch_start``, where it also times the
steps). ``whyidle.instrument.frameworks`` (Lightning's ``Trainer.fit`` wrapper: one record per
call) is not installed here; it costs nothing per step.

Not measured here: the ``whyidle run`` parent process (host polling every 0.25 s, on the same two
cores; see ``benchmarks/overhead.py`` for end to end), CUDA marks and sync counting (CPU only).

    flock /tmp/whyidle-timing.lock python benchmarks/hook_cost.py [--rounds 50] [--block 20]
        [--width 256] [--batch 32] [--stack-hz 100] [--item] [--seed 0] [--loop plain|lightning]

Run it plainly (not under ``whyidle run``). It depends on whyidle internals (``TorchInstrument``
attributes such as ``learning``, ``root_refs``, ``marker``, ``stride``; the ``Module.__call__``
wrapper's free variable ``call``; ``StackSampler``, ``ThreadTimer``); when those move it stops
with a message naming what it missed.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from time import perf_counter, perf_counter_ns, thread_time_ns

import torch
import torch.optim.optimizer as optim_mod
import torch.utils.data.dataloader as dl
from torch.utils.data import DataLoader, TensorDataset

import whyidle.instrument.torch as wtorch
from whyidle.instrument import stacks as wstacks
from whyidle.instrument.agent import Agent
from whyidle.instrument.transfers import TransferAudit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead import machine_state  # noqa: E402  (the benchmarks share one record of the machine)

FAMILIES = ("data", "fwd_root", "fwd_global", "bwd", "opt", "stacks", "flush", "audit", "noop")
#: whyidle's steady state in a training loop (after its first 3 steps).
ALL = frozenset({"data", "fwd_root", "bwd", "opt", "stacks", "flush"})
LABELS = {
    "data": "DataLoader __next__/__iter__ wrappers",
    "fwd_root": "Module.__call__ wrapper, root mode",
    "fwd_global": "Module.__call__ wrapper, learning mode",
    "bwd": "autograd.backward wrapper",
    "opt": "optimizer hooks + step record",
    "stacks": "stack sampler (timer signal)",
    "flush": "flusher thread (JSON encode + write)",
    "audit": "copy/read audit kept on (first 3 steps)",
    "noop": "empty hooks / pass-through wrappers",
}
SKIP = 2  # steps skipped at the start of each block (the switch itself, a step ended late)


class Loop:
    """The ~2 ms training loop of ``benchmarks/overhead.py`` (case ``2ms``), run a block at a time."""

    def __init__(self, width: int, batch: int, item: bool) -> None:
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(4096, width), torch.randint(0, 10, (4096,)))
        self.loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                         torch.nn.ReLU(), torch.nn.Linear(width, 10))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.item = item
        self.it = None

    def run(self, steps: int, cpu: list | None = None, ends: list | None = None) -> list[float]:
        """Runs ``steps`` steps; returns the wall interval between consecutive step ends, in
        seconds (batch fetch included, as in ``benchmarks/overhead.py``). With ``cpu``, also
        appends each step's CPU time of this thread (``thread_time_ns``, immune to preemption by
        other processes, blind to other threads), in seconds. With ``ends``, also appends each
        step's end (``perf_counter``)."""
        model, opt, loader, f = self.model, self.opt, self.loader, torch.nn.functional.cross_entropy
        times = []
        t = perf_counter()
        c = thread_time_ns()
        for _ in range(steps):
            try:
                if self.it is None:
                    raise StopIteration
                x, y = next(self.it)
            except StopIteration:  # end of an epoch (or the first call): a new iterator
                self.it = iter(loader)
                x, y = next(self.it)
            loss = f(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if self.item:
                loss.item()
            now = perf_counter()
            times.append(now - t)
            t = now
            if ends is not None:
                ends.append(now)
            if cpu is not None:
                now_c = thread_time_ns()
                cpu.append((now_c - c) / 1e9)
                c = now_c
        return times

    def run_plan(self, board: "Switchboard", plan: list, progress=None) -> list[tuple[list, list]]:
        """Runs ``plan``, a list of ``(families, steps)`` blocks: switches to each block's families,
        runs ``SKIP`` + ``steps`` steps; returns per block ``(wall s, CPU s)`` of the last ``steps``.
        ``progress(i)`` is called after block ``i``."""
        out = []
        for i, (fams, steps) in enumerate(plan):
            board.set(fams)
            c: list[float] = []
            w = self.run(steps + SKIP, c)
            out.append((w[SKIP:], c[SKIP:]))
            if progress is not None:
                progress(i)
        return out


class LightningLoop:
    """The Lightning case of ``benchmarks/overhead.py``: a LightningModule with the same MLP, the same
    DataLoader, ``Trainer(enable_progress_bar=False, logger=False, enable_checkpointing=False)``.
    A step is the interval between two ``on_train_batch_start`` calls of a Callback (as there);
    blocks switch configuration in that callback, between steps, inside one ``fit``."""

    def __init__(self, width: int, batch: int, item: bool) -> None:
        import logging
        import warnings

        import lightning as L

        warnings.filterwarnings("ignore")
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.ERROR)
        self.L = L
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(4096, width), torch.randint(0, 10, (4096,)))
        self.loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
        net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                  torch.nn.ReLU(), torch.nn.Linear(width, 10))
        opt: list = []

        class MLP(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = net

            def training_step(self, b, batch_idx):
                loss = torch.nn.functional.cross_entropy(self.net(b[0]), b[1])
                if item:
                    loss.item()
                return loss

            def configure_optimizers(self):
                # one optimizer for every fit: whyidle takes the first optimizer that steps as the one
                # whose steps end training steps, by identity; a new one per fit would end none
                if not opt:
                    opt.append(torch.optim.SGD(self.parameters(), lr=0.01))
                return opt[0]

        self.module = MLP()
        self.model = net  # the root module whyidle learns: training_step calls self.net, not the LightningModule

    def run_plan(self, board: "Switchboard | None", plan: list, progress=None, ends: list | None = None):
        """As :meth:`Loop.run_plan`, in one ``Trainer.fit``; ``board`` None: no switching."""
        L = self.L
        out: list[tuple[list, list]] = []
        state = {"block": -1, "wall": [], "cpu": [], "prev": None}

        def start_block():
            state["block"] += 1
            if state["block"] < len(plan) and board is not None:
                board.set(plan[state["block"]][0])
            state["wall"], state["cpu"] = [], []

        class Driver(L.Callback):
            def on_train_start(self, trainer, pl_module):
                if board is not None:
                    board.ensure_handler()

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                now, c = perf_counter(), thread_time_ns()
                if state["prev"] is not None and state["block"] < len(plan):
                    state["wall"].append(now - state["prev"][0])
                    state["cpu"].append((c - state["prev"][1]) / 1e9)
                    if ends is not None:
                        ends.append(now)
                    if len(state["wall"]) == plan[state["block"]][1] + SKIP:
                        out.append((state["wall"][SKIP:], state["cpu"][SKIP:]))
                        if progress is not None:
                            progress(state["block"])
                        start_block()
                        now, c = perf_counter(), thread_time_ns()  # the switch itself is not timed
                state["prev"] = (now, c)

        start_block()
        total = sum(n + SKIP for _f, n in plan) + 2
        trainer = L.Trainer(max_steps=total, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, callbacks=[Driver()])
        trainer.fit(self.module, self.loader)
        return out

    def run(self, steps: int, cpu: list | None = None, ends: list | None = None) -> list[float]:
        """Runs one ``fit`` of ``steps`` steps in the current configuration (see :meth:`Loop.run`)."""
        (wall, c), = self.run_plan(None, [(None, steps - SKIP if steps > SKIP else 1)], ends=ends)
        if cpu is not None:
            cpu.extend(c)
        return wall


class Switchboard:
    """whyidle's agent, installed in this process, with each hook family switchable between steps."""

    def __init__(self, loop: Loop, stack_hz: float, run_dir: str) -> None:
        self.loop = loop
        self.stack_hz = stack_hz
        # PyTorch's originals, before whyidle replaces them
        self.orig_next = dl._BaseDataLoaderIter.__next__
        self.orig_iter = dl.DataLoader.__iter__
        self.orig_backward = torch.autograd.backward
        self.orig_module_to = torch.nn.Module.to
        self.orig_call = torch.nn.Module.__call__
        pre_keys = set(optim_mod._global_optimizer_pre_hooks)
        post_keys = set(optim_mod._global_optimizer_post_hooks)

        self.agent = Agent(run_dir, stack_hz=0)  # its own sampler stays off; self.sampler stands in
        self.inst = inst = wtorch.install(self.agent, torch)
        self.wy_next = dl._BaseDataLoaderIter.__next__
        self.wy_iter = dl.DataLoader.__iter__
        self.wy_backward = torch.autograd.backward
        self.wy_call = torch.nn.Module.__call__
        self.wy_opt_pre = {k: v for k, v in optim_mod._global_optimizer_pre_hooks.items() if k not in pre_keys}
        self.wy_opt_post = {k: v for k, v in optim_mod._global_optimizer_post_hooks.items() if k not in post_keys}
        if (self.wy_next is self.orig_next or self.wy_backward is self.orig_backward or not self.wy_opt_post
                or self.wy_call is self.orig_call):
            raise SystemExit("whyidle.instrument.torch.install did not wrap what this benchmark expects")
        for name in ("learning", "root_refs", "learn_until", "module_calls", "depth", "marker", "stride",
                     "tid", "native_tid", "phase", "on_stack_sample", "site_of", "_update_stride"):
            if not hasattr(inst, name):
                raise SystemExit(f"TorchInstrument has no attribute {name!r}: update benchmarks/hook_cost.py")
        _cell(self.wy_call, "call")  # the wrapper calls PyTorch's __call__ through this free variable (table 2)
        # every step in full detail: the stride stays 1, so the instrument never takes its phase hooks
        # out (or puts them back) between steps on its own
        inst.stride = 1
        inst._update_stride = lambda now: None
        # forward: no root learning; the families set the wrapper's mode themselves (_set_forward).
        # Learning never ends on its own, and the repeated-module count is off (module docstring).
        inst.learn_until = (float("inf"), float("inf"))
        inst.module_calls = None
        inst.learning = False
        # flusher: gated; off, it drops what was queued (so a later "on" block flushes no backlog)
        self.real_flush = self.agent.flush
        self.flush_cpu_ns = 0  # CPU time of real flushes while self.time_flush
        self.flushes = 0
        self.flush_windows: list[tuple[float, float]] = []  # perf_counter (start, end) while self.time_flush
        self.time_flush = False
        self.agent.flush = self._gated_flush
        self.sampler = None
        self.audit = None
        self.on: set[str] = set(FAMILIES)
        self.set(frozenset())

    def _gated_flush(self) -> None:
        if "flush" in self.on:
            if self.time_flush:
                t0, c0 = perf_counter(), thread_time_ns()
                self.real_flush()
                self.flush_cpu_ns += thread_time_ns() - c0
                self.flushes += 1
                self.flush_windows.append((t0, perf_counter()))
            else:
                self.real_flush()
        else:
            queue = getattr(self.agent.writer, "_queue", None)
            if queue is not None:
                queue.clear()

    def _noop(self, on: bool) -> None:
        """Empty hooks where whyidle hooks (family ``noop``; its forward part: :meth:`_set_forward`)."""
        if on:
            orig_next, orig_iter, orig_backward = self.orig_next, self.orig_iter, self.orig_backward

            def __next__(self):
                return orig_next(self)

            def __iter__(self):
                return orig_iter(self)

            def backward(*args, **kwargs):
                return orig_backward(*args, **kwargs)

            dl._BaseDataLoaderIter.__next__ = __next__
            dl.DataLoader.__iter__ = __iter__
            torch.autograd.backward = backward
            self.noop_handles = [
                optim_mod.register_optimizer_step_pre_hook(lambda opt, args, kwargs: None),
                optim_mod.register_optimizer_step_post_hook(lambda opt, args, kwargs: None)]
        else:
            dl._BaseDataLoaderIter.__next__ = self.orig_next
            dl.DataLoader.__iter__ = self.orig_iter
            torch.autograd.backward = self.orig_backward
            for h in getattr(self, "noop_handles", []):
                h.remove()
            self.noop_handles = []

    def ensure_handler(self) -> None:
        """Puts the sampler's signal handler back if something reset it (Lightning restores, at the
        end of every ``fit``, the handlers it found at its start). Main thread, between steps."""
        import signal

        sampler = self.sampler
        if sampler is None or sampler._timer is None:
            return
        handler = getattr(sampler, "_handler", None) or sampler._on_signal
        signum = sampler._timer.signum
        if signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
            signal.siginterrupt(signum, False)

    def _arm(self, on: bool) -> None:
        timer = self.sampler._timer
        if timer is None:
            raise SystemExit("the stack sampler has no timer (it fell back to a thread?)")
        sec, frac = divmod(1.0 / self.stack_hz, 1.0) if on else (0, 0.0)
        spec = wstacks._Timespec(int(sec), int(frac * 1e9))
        if timer._libc.timer_settime(timer._timer, 0, ctypes.byref(wstacks._Itimerspec(spec, spec)), None) != 0:
            raise SystemExit("timer_settime failed")
        self.sampler._last = None  # the next sample stands for one period, not the whole pause

    def set(self, families: frozenset) -> None:
        """Switches the families in ``families`` on and all others off (call between steps)."""
        inst = self.inst
        want = set(families)
        for fam in FAMILIES:
            if (fam in want) == (fam in self.on):
                continue
            on = fam in want
            if fam == "data":
                dl._BaseDataLoaderIter.__next__ = self.wy_next if on else self.orig_next
                dl.DataLoader.__iter__ = self.wy_iter if on else self.orig_iter
            elif fam in ("fwd_root", "fwd_global"):
                pass  # _set_forward, below
            elif fam == "bwd":
                torch.autograd.backward = self.wy_backward if on else self.orig_backward
            elif fam == "opt":
                for hooks, mine in ((optim_mod._global_optimizer_pre_hooks, self.wy_opt_pre),
                                    (optim_mod._global_optimizer_post_hooks, self.wy_opt_post)):
                    for k, v in mine.items():
                        if on:
                            hooks[k] = v
                        else:
                            hooks.pop(k, None)
            elif fam == "stacks":
                if self.sampler is None and not on:
                    pass  # never started: nothing to disarm
                elif on and self.sampler is None:
                    self.sampler = wstacks.StackSampler(inst.tid, self.stack_hz, lambda: inst.phase,
                                                        native_id=inst.native_tid, on_sample=inst.on_stack_sample)
                    self.sampler.start()
                    if self.sampler.mode != "signal":
                        raise SystemExit(f"stack sampler mode {self.sampler.mode!r}, expected 'signal'")
                    self.agent.collectors.append(self.sampler.drain)
                    self.agent.on_exit.append(self.sampler.stop)
                else:
                    self._arm(on)
                if on:
                    self.ensure_handler()
                inst.stacks = self.sampler if on else None
            elif fam == "noop":
                self._noop(on)
            elif fam == "audit":
                if self.audit is None:
                    self.audit = TransferAudit(torch, inst.tid, inst.site_of, threading.get_ident,
                                               inst._is_compiling)
                if on:
                    self.audit.start()
                else:
                    self.audit.stop()
            if on:
                self.on.add(fam)
            else:
                self.on.discard(fam)
        self._set_forward()
        # what ends a step: the optimizer's steps; without its hooks, the next batch (as whyidle does
        # without an optimizer) when the DataLoader wrappers are in, else nothing (never the backward
        # calls, which whyidle would take as the steps' ends in a loop without optimizer and batches)
        inst.marker = "loader" if "data" in self.on and "opt" not in self.on else "optimizer"

    def _set_forward(self) -> None:
        """``Module.__call__`` and the wrapper's mode for the families on: fwd_global, learning mode;
        fwd_root, after the learning steps; noop, passing every call through (``tracking`` off, as
        on a lite step); none of them, PyTorch's own ``__call__``. Between steps only."""
        inst, on = self.inst, self.on
        if on & {"fwd_root", "fwd_global", "noop"}:
            torch.nn.Module.__call__ = self.wy_call
            inst.learning = "fwd_global" in on
        else:
            torch.nn.Module.__call__ = self.orig_call
            inst.learning = False
        inst.tracking = not ("noop" in on and not on & {"fwd_root", "fwd_global"})
        inst.depth = 0

    def close(self) -> None:
        self.set(frozenset())
        if self.sampler is not None:
            self.sampler.stop()


# -- table 2: exclusive self time ----------------------------------------------------------------

class SelfTimer:
    """Exclusive wall time of wrapped callables in the main thread (nested timed calls subtracted),
    kept per call so that a typical call (the median) can be told from the total, which also
    carries preemptions by other processes and garbage-collector passes."""

    def __init__(self) -> None:
        self.samples: dict[str, list[int]] = collections.defaultdict(list)  # self ns of each call
        self.child_calls: dict[str, int] = collections.defaultdict(int)
        self._stack: list[list[int]] = []  # per open call: [child wall ns, child calls]

    def wrap(self, name: str, fn):
        stack, samples, child_calls = self._stack, self.samples[name], self.child_calls

        def timed(*args, **kwargs):
            entry = [0, 0]
            stack.append(entry)
            t0 = perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = perf_counter_ns() - t0
                stack.pop()
                samples.append(dt - entry[0])
                child_calls[name] += entry[1]
                if stack:
                    stack[-1][0] += dt
                    stack[-1][1] += 1

        return timed

    @staticmethod
    def calibrate(n: int = 20000) -> tuple[float, float]:
        """(ns a timed call adds to its own self time, ns a timed child adds to its caller's),
        medians over ``n`` calls of an empty function."""
        probe = SelfTimer()
        inner = probe.wrap("inner", lambda: None)

        def outer_fn():
            inner()

        outer = probe.wrap("outer", outer_fn)
        plain_outer = probe.wrap("plain_outer", lambda: None)
        for _ in range(n):
            outer()
            plain_outer()
        own = statistics.median(probe.samples["inner"])
        leak = statistics.median(probe.samples["outer"]) - statistics.median(probe.samples["plain_outer"])
        return own, max(leak, 0.0)


class GcClock:
    """Time spent in the garbage collector (``gc.callbacks``), by generation."""

    def __init__(self) -> None:
        self.ns = collections.Counter()
        self.count = collections.Counter()
        self._t0 = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = perf_counter_ns()
        else:
            self.ns[info["generation"]] += perf_counter_ns() - self._t0
            self.count[info["generation"]] += 1

    def run(self, loop: "Loop", steps: int, ends: list | None = None) -> "GcClock":
        import gc

        gc.callbacks.append(self)
        try:
            loop.run(steps, ends=ends)
        finally:
            gc.callbacks.remove(self)
        return self


def _cell(fn, name: str):
    """The closure cell of ``fn`` holding the free variable ``name``."""
    try:
        return fn.__closure__[fn.__code__.co_freevars.index(name)]
    except (ValueError, TypeError, AttributeError):
        raise SystemExit(f"{getattr(fn, '__qualname__', fn)} has no free variable {name!r}: "
                         "update benchmarks/hook_cost.py") from None


def self_times(board: Switchboard, steps: int) -> dict:
    """Runs ``steps`` steps with everything on and whyidle's functions timed (table 2), then
    ``steps`` plain steps (the collector's share); returns the rows and the flusher's costs.

    Timed, by family: whyidle's wrapper functions and hook closures themselves ("glue": what they
    do besides calling the instrumentation's methods and PyTorch's original, both timed as
    children), the ``TorchInstrument`` methods they call, ``Agent.record``, the stack sampler's
    ``sample`` (its signal handler's work) and ``maybe_reinstall``, and the helpers they call
    (``batch_size_of``, the two clocks; their time leaves their callers' self time). PyTorch's
    originals called by the wrappers are timed too (as children) but not reported. The timer's
    own cost is measured in the step itself: an empty timed function, and one with a timed child,
    called from a forward pre-hook of the root (code that runs between the step's kernels is
    several times slower than in a tight loop, the timer's included).
    """
    timer = SelfTimer()
    own, leak = SelfTimer.calibrate()
    inst, agent, sampler = board.inst, board.agent, board.sampler
    rows_spec: list[tuple[str, str]] = []  # (family, timer name) in print order
    undo = []

    def timed_attr(fam: str, obj, name: str, label: str | None = None) -> None:
        if obj is None or not hasattr(obj, name):
            return
        label = label or name
        had, old = name in obj.__dict__, obj.__dict__.get(name)
        setattr(obj, name, timer.wrap(label, getattr(obj, name)))
        undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))
        rows_spec.append((fam, label))

    def timed_cell(fn, var: str, label: str) -> None:
        cell = _cell(fn, var)
        old = cell.cell_contents
        cell.cell_contents = timer.wrap(label, old)
        undo.append(lambda: setattr(cell, "cell_contents", old))

    board.set(frozenset())
    # glue: whyidle's wrappers / hook closures, with the PyTorch originals inside timed as children
    saved = (board.wy_next, board.wy_iter, board.wy_backward, board.wy_call,
             dict(board.wy_opt_pre), dict(board.wy_opt_post))
    timed_cell(board.wy_next, "orig_next", "(torch) DataLoader __next__")
    timed_cell(board.wy_iter, "orig_iter", "(torch) DataLoader __iter__")
    timed_cell(board.wy_backward, "orig_backward", "(torch) autograd.backward")
    timed_cell(board.wy_call, "call", "(torch) Module.__call__")
    board.wy_next = timer.wrap("__next__ wrapper", board.wy_next)
    board.wy_iter = timer.wrap("__iter__ wrapper", board.wy_iter)
    board.wy_backward = timer.wrap("backward wrapper", board.wy_backward)
    board.wy_call = timer.wrap("__call__ wrapper", board.wy_call)
    board.wy_opt_pre = {k: timer.wrap("optimizer pre-hook", v) for k, v in board.wy_opt_pre.items()}
    board.wy_opt_post = {k: timer.wrap("optimizer post-hook", v) for k, v in board.wy_opt_post.items()}
    rows_spec += [("data", "__next__ wrapper"), ("data", "__iter__ wrapper")]
    timed_attr("data", inst, "on_fetch_start")
    timed_attr("data", inst, "on_fetch_end")
    timed_attr("data", inst, "on_iter")
    rows_spec += [("fwd_root", "__call__ wrapper")]  # every module call: the root's and the nested ones
    timed_attr("fwd_root", inst, "on_forward_pre")
    timed_attr("fwd_root", inst, "on_forward_post")
    rows_spec += [("bwd", "backward wrapper")]
    rows_spec += [("opt", "optimizer pre-hook"), ("opt", "optimizer post-hook")]
    timed_attr("opt", inst, "on_optimizer_pre")
    timed_attr("opt", inst, "on_optimizer_post")
    timed_attr("opt", inst, "wrap_closure")  # step(closure) only (Lightning): a functools.wraps wrapper per step
    timed_attr("opt", inst, "end_step")
    timed_attr("opt", inst, "_begin_step")
    timed_attr("opt", agent, "record")
    timed_attr("phases", inst, "enter")
    timed_attr("phases", inst, "leave")
    timed_attr("stacks", sampler, "sample")
    timed_attr("stacks", sampler, "maybe_reinstall")
    # what the functions above spend in helpers of whyidle.instrument.torch (module globals, so
    # patching the module's namespace reaches every caller)
    timed_attr("helpers", wtorch, "batch_size_of")
    timed_attr("helpers", wtorch, "thread_time_ns", "thread_time_ns (clock)")
    timed_attr("helpers", wtorch, "monotonic_ns", "monotonic_ns (clock)")
    # in-situ calibration of the timer: an empty timed function, and one with a timed child, called
    # from a forward pre-hook of the root in every step (cold, like the code being timed)
    probe_inner = timer.wrap("(probe) inner", lambda: None)
    probe_outer = timer.wrap("(probe) outer", lambda: probe_inner())
    probe_single = timer.wrap("(probe) single", lambda: None)

    def probe(module, args):
        probe_single()
        probe_outer()

    probe_handle = board.loop.model.register_forward_pre_hook(probe)
    undo.append(probe_handle.remove)

    board.set(ALL)
    board.loop.run(50)
    for samples in timer.samples.values():  # the warm-up's calls are not the timed steps'
        samples.clear()
    timer.child_calls.clear()
    step0 = inst.step
    board.flush_cpu_ns, board.flushes, board.flush_windows, board.time_flush = 0, 0, [], True
    ends: list[float] = []
    try:
        gc_all = GcClock().run(board.loop, steps, ends)
    finally:
        board.time_flush = False
        board.set(frozenset())
        for fn in reversed(undo):
            fn()
        (board.wy_next, board.wy_iter, board.wy_backward, board.wy_call,
         board.wy_opt_pre, board.wy_opt_post) = saved
    # the flusher's effect on the training thread: per flush, the excess time (over the median step) of
    # the steps that overlap it; the median flush is shown too (one flush that meets a stall of the
    # shared box would make the mean)
    starts, ends = ends[:-1], ends[1:]  # consecutive step ends (the first step is left out)
    dts = [b - a for a, b in zip(starts, ends)]
    hit = [any(a < f1 and f0 < b for f0, f1 in board.flush_windows) for a, b in zip(starts, ends)]
    clean = statistics.median([d for d, h in zip(dts, hit) if not h] or [0.0])
    per_flush = [sum(d - clean for a, b, d in zip(starts, ends, dts) if a < f1 and f0 < b)
                 for f0, f1 in board.flush_windows]
    n = max(board.flushes, 1)
    flush = {"cpu_us_step": board.flush_cpu_ns / steps / 1e3, "n": board.flushes,
             "cpu_ms_each": board.flush_cpu_ns / n / 1e6,
             "wall_ms_each": sum(f1 - f0 for f0, f1 in board.flush_windows) / n * 1e3,
             "steps_hit": sum(hit),
             "excess_ms_median": statistics.median(per_flush) * 1e3 if per_flush else 0.0,
             "excess_ms_mean": statistics.fmean(per_flush) * 1e3 if per_flush else 0.0,
             "flushes_per_step": board.flushes / steps}
    board.loop.run(50)
    gc_plain = GcClock().run(board.loop, steps)
    rows = []
    if timer.samples.get("(probe) inner"):
        own_hot, leak_hot = own, leak
        own = statistics.median(timer.samples["(probe) inner"])
        leak = max(statistics.median(timer.samples["(probe) outer"]) - statistics.median(timer.samples["(probe) single"]),
                   0.0)
    else:
        own_hot, leak_hot = own, leak
    for fam, name in rows_spec:
        samples = timer.samples.get(name)
        if not samples:
            continue
        calls = len(samples)
        children = timer.child_calls[name] / calls
        typical_ns = max(statistics.median(samples) - own - children * leak, 0.0)
        total_ns = max(sum(samples) - calls * (own + children * leak), 0.0)
        rows.append((fam, name, calls / steps, typical_ns / 1e3, typical_ns * calls / steps / 1e3,
                     total_ns / steps / 1e3))
    return {"rows": rows, "flush": flush, "own_ns": own, "leak_ns": leak, "own_hot_ns": own_hot,
            "leak_hot_ns": leak_hot, "gc_all": gc_all, "gc_plain": gc_plain,
            "steps_ended": inst.step - step0}


# -- table 3: per call ---------------------------------------------------------------------------

def per_call(board: Switchboard) -> list[tuple[str, float]]:
    """ns per call of the clocks, and the extra ns per call of the audit / placement wrappers (each
    timed alternately wrapped and unwrapped, best of 7 of each, so drift hits both alike)."""

    def ns(fn, n: int) -> float:
        t0 = perf_counter_ns()
        for _ in range(n):
            fn()
        return (perf_counter_ns() - t0) / n

    def best(fn, n: int = 20000) -> float:
        return min(ns(fn, n) for _ in range(7))

    def extra(fn, wrap_on, wrap_off, n: int = 20000) -> float:
        on, off = [], []
        for _ in range(7):
            wrap_on()
            on.append(ns(fn, n))
            wrap_off()
            off.append(ns(fn, n))
        return min(on) - min(off)

    empty = best(lambda: None)
    out = [("time.monotonic_ns() (each phase change)", best(time.monotonic_ns) - empty),
           ("time.thread_time_ns() (3 per step)", best(time.thread_time_ns) - empty),
           ("threading.get_ident() (each hook)", best(threading.get_ident) - empty)]
    board.set(frozenset())
    t = torch.ones(1)
    audit_on, audit_off = (lambda: board.set(frozenset({"audit"}))), (lambda: board.set(frozenset()))
    out.append(("audit: Tensor.item() extra", extra(lambda: t.item(), audit_on, audit_off)))
    out.append(("audit: Tensor.to('cpu') extra", extra(lambda: t.to("cpu"), audit_on, audit_off)))
    model = board.loop.model
    wrapped_to = torch.nn.Module.to
    for _ in range(20):  # past watch_placement's first records (it keeps 16)
        model.to("cpu")

    def placement_on():
        torch.nn.Module.to = wrapped_to

    def placement_off():
        torch.nn.Module.to = board.orig_module_to

    try:
        base_to = min(ns(lambda: model.to("cpu"), 200) for _ in range(3))
        out.append((f"watch_placement: Module.to('cpu') extra (not in the loop; the call: {base_to / 1e3:.0f} µs)",
                    extra(lambda: model.to("cpu"), placement_on, placement_off, 2000)))
    finally:
        placement_on()

    out += forward_calls(board, extra)

    # one stack sample (what the timer signal's handler does) on the stack of this loop's forward,
    # and on a Lightning training_step's stack: the sampler walks the frames up to the 4th user frame
    # and formats a site for each, so its cost grows with the depth
    if board.sampler is not None:
        frames = {}

        def grab(module, args):
            frames[f"{type(board.loop).__name__} forward"] = sys._getframe(1)

        handle = model.register_forward_pre_hook(grab)
        try:
            board.loop.run(1)
        finally:
            handle.remove()
        lightning = _lightning_frame()
        if lightning is not None:
            frames["Lightning training_step"] = lightning
        for label, frame in frames.items():
            depth, f = 0, frame
            while f is not None:
                depth, f = depth + 1, f.f_back
            cost = best(lambda: board.sampler.sample(frame, "forward", 0.01), 2000) - empty
            out.append((f"stack sample, {label} stack ({depth} frames)", cost))
        board.sampler.drain()
    return out


def forward_calls(board: Switchboard, extra) -> list[tuple[str, float]]:
    """Extra ns per module call of the ``Module.__call__`` wrapper in each mode, over PyTorch's own
    ``__call__``: a forward through a ``Sequential`` of n modules (n + 1 calls) for n = 8 and 72, the
    cost of a nested call from the difference, the outermost call's from the rest. ``extra``:
    :func:`per_call`'s alternating timer."""
    from whyidle.instrument.module_calls import ModuleCalls

    inst = board.inst
    x = torch.ones(1, 2)
    sizes = (8, 72)

    def chain(make, fams, count: bool = False) -> tuple[float, float]:
        costs = []
        for n in sizes:
            model = torch.nn.Sequential(*[make() for _ in range(n)])

            def on():
                board.set(frozenset(fams))
                inst.module_calls = ModuleCalls(inst.site_of) if count else None

            def off():
                board.set(frozenset())
                inst.module_calls = None

            costs.append(extra(lambda: model(x), on, off, 500))
        nested = (costs[1] - costs[0]) / (sizes[1] - sizes[0])
        return costs[0] - sizes[0] * nested, nested

    board.set(frozenset())
    try:
        root_outer, root_nested = chain(torch.nn.Identity, {"fwd_root"})
        _, through = chain(torch.nn.Identity, {"noop"})
        learn_outer, learn_nested = chain(torch.nn.Identity, {"fwd_global"})
        _, lin_learn = chain(lambda: torch.nn.Linear(2, 2), {"fwd_global"})
        _, lin_count = chain(lambda: torch.nn.Linear(2, 2), {"fwd_global"}, count=True)
    finally:
        board.set(frozenset())
        inst.module_calls = None
        inst.roots = {}
    return [("Module.__call__ wrapper, root mode: the root's call (on_forward_pre/post)", root_outer),
            ("Module.__call__ wrapper, root mode: a nested call", root_nested),
            ("Module.__call__ wrapper: a call passed through (lite step of a compiled program)", through),
            ("Module.__call__ wrapper, learning mode: the outermost call", learn_outer),
            ("Module.__call__ wrapper, learning mode: a nested call", learn_nested),
            ("  repeated-module count (learning): + per nested Linear call", lin_count - lin_learn)]


def _lightning_frame():
    """A frame inside a Lightning ``training_step`` (its whole caller chain kept alive), or None when
    Lightning is not installed. Runs a 2-step ``Trainer.fit`` with whyidle's hooks off."""
    try:
        import logging
        import warnings

        import lightning as L
    except ImportError:
        return None
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    grabbed = []

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            grabbed.append(sys._getframe())
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(max_steps=2, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                            enable_checkpointing=False, enable_model_summary=False)
        trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    return grabbed[-1] if grabbed else None


# -- table 1: ablation ---------------------------------------------------------------------------

def configurations() -> list[tuple[str, frozenset]]:
    configs = [("plain", frozenset()), ("plain (control)", frozenset())]
    configs += [(f"only {fam}", frozenset({fam})) for fam in FAMILIES]
    configs.append(("all (steady state)", ALL))
    configs += [(f"all - {fam}", ALL - {fam}) for fam in sorted(ALL)]
    configs.append(("all, fwd learning mode", (ALL - {"fwd_root"}) | {"fwd_global"}))
    return configs


def block_costs(names: list[str], results: list[tuple[list, list]]) -> dict:
    """Per configuration, the cost of each of its blocks against the plain blocks right before
    and after it (µs/step): ``{name: {"median": [...], "mean": [...], "cpu": [...]}}``."""
    out: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    stats = {"median": lambda w, c: statistics.median(w), "mean": lambda w, c: statistics.fmean(w),
             "cpu": lambda w, c: statistics.median(c)}
    for i, name in enumerate(names):
        if name == "plain":
            continue
        before, after, this = results[i - 1], results[i + 1], results[i]
        for key, f in stats.items():
            ref = (f(*before) + f(*after)) / 2
            out[name][key].append((f(*this) - ref) * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50, help="rounds; each runs every configuration once")
    ap.add_argument("--block", type=int, default=20, help="steps per block (after 2 skipped)")
    ap.add_argument("--width", type=int, default=256, help="MLP width (overhead.py 2ms case: 256)")
    ap.add_argument("--batch", type=int, default=32, help="batch size (overhead.py 2ms case: 32)")
    ap.add_argument("--stack-hz", type=float, default=100.0, help="stack samples per second")
    ap.add_argument("--item", action="store_true", help="call loss.item() every step, as loops that log do")
    ap.add_argument("--timed-steps", type=int, default=3000, help="steps of the self-time run (table 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the block order")
    ap.add_argument("--loop", choices=("plain", "lightning"), default="plain",
                    help="the training loop: overhead.py's 2ms case (plain) or its Lightning case")
    args = ap.parse_args()
    if os.environ.get("WHYIDLE_RUN_DIR"):
        raise SystemExit("run this benchmark plainly, not under `whyidle run`")
    torch.set_num_threads(1)
    print(f"start: {machine_state(full=True)}", flush=True)
    rng = random.Random(args.seed)
    configs = [(name, fams) for name, fams in configurations() if name != "plain"]
    with tempfile.TemporaryDirectory() as run_dir:
        loop = (LightningLoop if args.loop == "lightning" else Loop)(args.width, args.batch, args.item)
        loop.run(100)  # warm-up, plain
        board = Switchboard(loop, args.stack_hz, run_dir)
        board.set(ALL)
        loop.run(100)  # whyidle's first steps: audits, graph counts, the transfer audit come and go
        # each round: every configuration once, shuffled, each between two plain blocks
        plan, names = [(frozenset(), args.block)], ["plain"]
        for _r in range(args.rounds):
            order = configs[:]
            rng.shuffle(order)
            for name, fams in order:
                plan += [(fams, args.block), (frozenset(), args.block)]
                names += [name, "plain"]
        t_start = time.monotonic()
        per_round = 2 * len(configs)
        every = per_round * max(1, args.rounds // 10)

        def progress(i: int) -> None:
            if i and i % every == 0:
                print(f"round {i // per_round}/{args.rounds}  ({time.monotonic() - t_start:.0f} s, load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)

        results = loop.run_plan(board, plan, progress)
        st = self_times(board, args.timed_steps)
        calls = per_call(board)
        board.close()
    print(f"end:   {machine_state(full=True)}\n")

    plain_w = [x for name, (w, _c) in zip(names, results) if name == "plain" for x in w]
    plain_c = [x for name, (_w, c) in zip(names, results) if name == "plain" for x in c]
    base, base_mean, base_cpu = statistics.median(plain_w), statistics.fmean(plain_w), statistics.median(plain_c)
    costs = block_costs(names, results)

    def iqr(v: list[float]) -> str:
        qs = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0], v[0], v[0]]
        return f"{qs[0]:7.1f}..{qs[2]:<6.1f}"

    print(f"Table 1. Step-time cost per configuration: {'Lightning, ' if args.loop == 'lightning' else ''}"
          f"{args.width}-wide MLP, batch {args.batch}; plain step {base * 1e3:.3f} ms (wall median; mean "
          f"{base_mean * 1e3:.3f} ms, CPU {base_cpu * 1e3:.3f} ms); stack sampler {args.stack_hz:g} Hz; {args.rounds} "
          f"rounds, each configuration once per round in {args.block}-step blocks between plain blocks"
          f"{'; loss.item() every step' if args.item else ''}.")
    print("  cost of a block = its statistic - the mean of the same for the plain blocks right before and after it;")
    print("  shown: the median over rounds [p25..p75]. median: of the block's step times, the goal metric of")
    print("  overhead.py, blind to a cost paid on few steps (a stack sample every ~5th step, a flush every ~250);")
    print("  mean: samples/s, sees a cost paid every few steps (a stack sample) but not a flush (one in ~12 blocks:")
    print("  the median over rounds drops it; see the flusher line of table 2); CPU: the median CPU time of the")
    print("  training thread per step (blind to whyidle's other thread).")
    print(f"  {'configuration':<24} {'median µs':>9} {'% step':>7} {'p25..p75':>15}  {'mean µs':>8} {'% step':>7} "
          f"{'p25..p75':>15}  {'CPU µs':>7}")
    cost, cost_mean, cost_cpu = {"plain": 0.0}, {"plain": 0.0}, {"plain": 0.0}
    for name, _fams in configs:
        c = costs[name]
        cost[name], cost_mean[name] = statistics.median(c["median"]), statistics.median(c["mean"])
        cost_cpu[name] = statistics.median(c["cpu"])
        print(f"  {name:<24} {cost[name]:9.1f} {cost[name] / (base * 1e6) * 100:6.2f}% {iqr(c['median']):>15}  "
              f"{cost_mean[name]:8.1f} {cost_mean[name] / (base_mean * 1e6) * 100:6.2f}% {iqr(c['mean']):>15}  "
              f"{cost_cpu[name]:7.1f}")

    print("\n  Per family, µs/step (median | mean | CPU): alone = 'only X'; marginal = 'all' - 'all - X'")

    def trio(a: str, b: str | None = None) -> str:
        vals = [c[a] - (c[b] if b else 0.0) for c in (cost, cost_mean, cost_cpu)]
        return " | ".join(f"{v:6.1f}" for v in vals)

    for fam in FAMILIES:
        alone = trio(f"only {fam}")
        if fam in ALL:
            marginal = trio("all (steady state)", f"all - {fam}")
        elif fam == "fwd_global":
            marginal = trio("all, fwd learning mode", "all - fwd_root") + "  (learning instead of root mode)"
        else:
            marginal = "(not in the steady state)"
        print(f"  {fam:<10} {LABELS[fam]:<40} alone {alone}   marginal {marginal}")
    print("  (opt's marginal keeps the step record: without optimizer hooks steps end at the next batch; the record's")
    print("  own cost is end_step/_begin_step/record in table 2. data alone, opt alone: each writes the step record.)")
    total = cost["all (steady state)"]
    print(f"  all: {total:.1f} µs/step median ({total / (base * 1e6) * 100:.2f}%), "
          f"{cost_mean['all (steady state)']:.1f} mean "
          f"({cost_mean['all (steady state)'] / (base_mean * 1e6) * 100:.2f}%), "
          f"{cost_cpu['all (steady state)']:.1f} CPU ({cost_cpu['all (steady state)'] / (base_cpu * 1e6) * 100:.2f}%)"
          f" of a {base * 1e3:.2f} ms step")

    print(f"\nTable 2. Self time of whyidle's code, everything on ({args.timed_steps} steps; exclusive wall time; "
          f"timer cost {st['own_ns']:.0f} ns/call + {st['leak_ns']:.0f} ns/timed child subtracted, measured in the "
          f"step (in a tight loop: {st['own_hot_ns']:.0f} + {st['leak_hot_ns']:.0f})):")
    ended = st["steps_ended"]
    if ended < 0.9 * args.timed_steps:
        print(f"  WARNING: whyidle ended only {ended} steps in these {args.timed_steps}: its state is not what a real "
              "run has")
    print("  typical = median self time of one call x calls per step; total = all self time / steps (also carries")
    print("  preemption by other processes and the collector passes that land in whyidle's code). Rows named")
    print("  '... wrapper' / '... hook' are whyidle's glue: the wrapper or hook closure itself, without the methods")
    print("  below it and without PyTorch's original.")
    print(f"  {'family':<8} {'function':<20} {'calls/step':>10} {'µs/call':>8} {'typical µs/step':>16} "
          f"{'total µs/step':>14}")
    typical = total_self = 0.0
    by_family: dict[str, float] = collections.defaultdict(float)
    for fam, name, n, per_call_us, typ, tot in st["rows"]:
        if name.startswith("(torch)"):
            continue
        typical += typ
        total_self += tot
        by_family[fam] += typ
        print(f"  {fam:<8} {name:<20} {n:10.2f} {per_call_us:8.2f} {typ:16.2f} {tot:14.2f}")
    print(f"  {'':<8} {'sum (main thread)':<20} {'':>10} {'':>8} {typical:16.2f} {total_self:14.2f}")
    print("  typical per family: " + ", ".join(f"{fam} {us:.1f}" for fam, us in by_family.items()) +
          " µs/step ('phases' = enter/leave: the ph list and acc dict, called by every family; 'helpers' =")
    print("  batch_size_of and the clock reads, taken out of their callers' self time)")
    fl = st["flush"]
    print(f"  flusher: {fl['n']} flushes in {args.timed_steps} steps, each {fl['cpu_ms_each']:.2f} ms CPU "
          f"({fl['wall_ms_each']:.2f} ms wall) = {fl['cpu_us_step']:.2f} µs/step of the other thread's CPU;")
    print(f"           {fl['steps_hit']} steps overlapped a flush; their excess over the median step, per flush: "
          f"median {fl['excess_ms_median']:.2f} ms = {fl['excess_ms_median'] * 1e3 * fl['flushes_per_step']:.2f} "
          f"µs/step (mean {fl['excess_ms_mean']:.2f} ms = {fl['excess_ms_mean'] * 1e3 * fl['flushes_per_step']:.2f} "
          "µs/step) of training-thread time")
    for label, clock in (("everything on", st["gc_all"]), ("plain", st["gc_plain"])):
        n = args.timed_steps
        print(f"  garbage collector, {label:<13}: {sum(clock.ns.values()) / n / 1e3:6.2f} µs/step  (collections "
              f"per 1000 steps by generation: " + (", ".join(f"gen{g} {clock.count[g] * 1000 / n:.1f}"
                                                            for g in sorted(clock.count)) or "none") + ")")
    print(f"  ablation 'all' (median {total:.1f}, mean {cost_mean['all (steady state)']:.1f}) - typical self time "
          f"({typical:.1f}) = {total - typical:.1f} / {cost_mean['all (steady state)'] - typical:.1f} µs/step: "
          "PyTorch's hook dispatch (the optimizer's hook loop), cache misses in")
    print("  code that runs cold between the step's kernels, collector passes, contention for the GIL and the cores")

    print("\nTable 3. Per call (ns; clocks: best of 7; wrappers: extra over the original, alternated, best of 7):")
    for label, v in calls:
        print(f"  {label:<72} {v:8.0f}")


if __name__ == "__main__":
    main()
