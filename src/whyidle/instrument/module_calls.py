"""Repeated submodule calls in a training step: a Python loop over views, timesteps, crops or chunks
that calls the same module k times per step on slices of the batch (``host_bound`` kind
``module_loop``). On a GPU each call is a row of small kernel launches; on a CPU each is a small
matrix product; folding the loop dimension into the batch makes one call of k times the work.

While whyidle learns the top-level modules (:data:`whyidle.instrument.torch.ROOT_LEARNING_STEPS`
optimizer steps; :mod:`whyidle.instrument.forward`), every module call passes through
:meth:`ModuleCalls.pre` / :meth:`post`: per
module that has parameters (or that the program calls itself, outside any module: a loss module
called per sample), its calls and forward seconds in each step, the user's line that
first called it, its first input's batch size and the nearest parameterized module it was called
from. :meth:`record` then keeps the modules called at least :data:`LOOP_MIN_CALLS` times per step
(median over the observed steps) whose caller module is not itself repeated (a looped encoder's
layers repeat with it). Standard library only; the hooks' own cost is paid in those first steps.
"""

from __future__ import annotations

import statistics
from time import monotonic_ns

from whyidle.instrument.shape_probe import layer_of

#: Calls of one module per step from which a Python loop around it is reported (a module applied
#: twice, e.g. to two inputs of a siamese net, is ordinary; 4+ is a loop over a dimension).
LOOP_MIN_CALLS = 4
#: Modules kept in the record (the busiest by forward time).
MAX_MODULES = 8
#: Wrappers whose forward does their own work (gradient-sync set-up, parameter all-gather) before
#: calling the model: the preamble is timed from the wrapped model's forward instead.
WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "OptimizedModule"})


def _numel(module) -> int:
    """Parameters of ``module`` (elements); a lazy module's uninitialized parameter (``LazyLinear``
    before its first forward: ``numel()`` raises ``ValueError``) counts 1: the module has weights."""
    total = 0
    for p in module.parameters():
        try:
            total += p.numel()
        except ValueError:
            total += 1
    return total


def _batch_of(args) -> int | None:
    for a in args[:4] if isinstance(args, tuple) else ():
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) >= 1:
            return int(shape[0]) if shape[0] is not None else None  # Keras's symbolic build: (None, ...)
    return None


class ModuleCalls:
    """Calls per module per step while the top-level modules are learnt.

    Args:
        site_of: callable(frame) → (user site, leaf site), the instrumentation's frame classifier.
    """

    def __init__(self, site_of) -> None:
        self.site_of = site_of
        self.stack: list = []  # (key, t0) of the open calls of parameterized modules; None for others
        self.current: dict[int, list[int]] = {}  # key → [calls, forward ns] in this step
        self.info: dict[int, list | bool] = {}  # key → [class, site, batch, parent key, parameters] or False
        self.steps: list[tuple[int, dict]] = []  # (step ns, {key: (calls, ns)} of modules called twice+)
        self.root: list | None = None  # [class, site, t0] of the open top-level call until its first layer
        self.preamble = 0  # ns of preambles in this step
        self.preambles: list[int] = []  # per step
        self.roots: dict[tuple, int] = {}  # (class, site) of top-level calls → ns of their preambles
        self.layers: dict[int, list] = {}  # key → shape_probe.layer_of of a Linear/ConvNd/attention's first call
        self.layer_ns: dict[int, int] = {}  # key → forward ns of the ended steps (layers only)

    def pre(self, module, args, frame) -> None:
        """A module's forward starts (``frame``: its caller's, to find the user's line)."""
        key = id(module)
        opened = not self.stack or (len(self.stack) == 1 and self.root is not None and self.root[0] in WRAPPERS)
        if opened:  # a top-level call (or a wrapper's model): its preamble runs until its first layer
            self.root = [type(module).__name__, self.site_of(frame)[0], monotonic_ns()]
        info = self.info.get(key)
        if info is None:
            numel = _numel(module)
            if not numel and not opened:  # a model's activation or pooling layer
                info = False
            elif not numel:  # called by the program itself: a loss module (per sample in a loop?)
                info = [type(module).__name__, self.site_of(frame)[0], _batch_of(args), None, 0]
            else:
                parent = next((k for k, _ in (e for e in reversed(self.stack) if e is not None)), None)
                info = [type(module).__name__, self.site_of(frame)[0], _batch_of(args), parent, numel]
                try:
                    layers = layer_of(module, args)
                except Exception:  # a lazy module's uninitialized weight, an unusual input: not probed
                    layers = []
                if layers:
                    self.layers[key] = layers
            self.info[key] = info
        if info is False:
            self.stack.append(None)
            return
        now = monotonic_ns()
        if self.root is not None and not opened:  # the top-level call's first parameterized submodule
            cls, site, t0 = self.root
            self.root = None
            self.preamble += now - t0
            self.roots[(cls, site)] = self.roots.get((cls, site), 0) + now - t0
        self.stack.append((key, now))
        c = self.current.get(key)
        if c is None:
            self.current[key] = [1, 0]
        else:
            c[0] += 1

    def post(self) -> None:
        """The innermost open forward returned."""
        if not self.stack:
            return
        top = self.stack.pop()
        if top is not None:
            self.current[top[0]][1] += monotonic_ns() - top[1]

    def end_step(self, step_ns: int) -> None:
        """A step ended (``step_ns``: its wall time)."""
        self.steps.append((step_ns, {k: (c, ns) for k, (c, ns) in self.current.items() if c >= 2}))
        for k in self.layers:
            self.layer_ns[k] = self.layer_ns.get(k, 0) + self.current.get(k, (0, 0))[1]
        self.preambles.append(self.preamble)
        self.current = {}
        self.stack = []
        self.root = None
        self.preamble = 0

    def layer_times(self) -> list[tuple[dict, int, int]]:
        """The Linear/ConvNd/attention layers seen so far with their forward ns (ended steps and
        this one) and calls in this step (at least 1), for :func:`whyidle.instrument.shape_probe.probe`."""
        out = []
        for k, layers in self.layers.items():
            calls, ns = self.current.get(k, (0, 0))
            out += [(layer, self.layer_ns.get(k, 0) + ns, max(1, calls)) for layer in layers]
        return out

    def record(self) -> dict | None:
        """The ``module_calls`` record (docs/run-format.md), or None when no step was observed."""
        if not self.steps:
            return None
        n = len(self.steps)
        step_s = round(statistics.median(s for s, _ in self.steps) / 1e9, 6)
        root = max(self.roots, key=self.roots.get) if self.roots else None
        base = {"k": "module_calls", "t": monotonic_ns(), "steps": n, "step_s": step_s,
                "preamble_s": round(statistics.median(self.preambles) / 1e9, 6),
                "root": list(root) if root else None}

        def median(key, i):
            return statistics.median(s[1].get(key, (0, 0))[i] for s in self.steps)

        looped = {k for k in {k for _, m in self.steps for k in m} if median(k, 0) >= LOOP_MIN_CALLS}
        rows = []
        for key in looped:
            cls, site, batch, parent, numel = self.info[key]
            if parent in looped:  # repeats because its caller does: report the caller
                continue
            rows.append([cls, site, median(key, 0), round(median(key, 1) / 1e9, 6), batch, numel])
        rows.sort(key=lambda r: -r[3])
        return {**base, "modules": rows[:MAX_MODULES]}
