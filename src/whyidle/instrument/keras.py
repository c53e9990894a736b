"""Keras 3 and TensorFlow instrumentation (runs inside the trainer; imported only once the user's
program has imported ``keras`` or ``tensorflow``).

What it observes, without a code change in the user's program:

- ``Model.fit`` / ``evaluate`` / ``predict`` get one whyidle callback put first in their
  ``callbacks`` (``async_safe``, and without batch-*end* hooks, so Keras keeps dispatching the
  user's batch-end callbacks asynchronously when it would have). At the start of training the
  compiled ``train_function`` is wrapped to time each call. A step runs from one batch's
  ``on_train_batch_begin`` to the next: ``fn`` is the time inside the compiled train function
  (the next batch's ``GetNext`` + forward + backward + optimizer, fused by ``tf.function``), the
  rest is host work between batches (callbacks, logging, the Keras loop). One call covers
  ``steps_per_execution`` batches.
- **Input wait inside ``fn``**: a callback cannot see it, so a short window of the TensorFlow
  profiler (:mod:`whyidle.instrument.tfprof`) is opened around a few training steps after
  warm-up (TensorFlow backend only) and its trace is read for the ``IteratorGetNext`` time within
  each train-function call. The window steps aside when the program profiles itself (a
  ``TensorBoard`` callback with ``profile_batch``, ``tf.profiler.experimental.start``,
  ``tf.summary.trace_on(profiler=True)``): a user's start while whyidle's window is open closes
  whyidle's window first, discarding it.
- **On-demand deep traces** (``whyidle run``'s requests in ``RUN_DIR/control/trace.json``): on the
  TensorFlow backend a TensorFlow profiler window of the request's N train-function calls, looked
  for at the training batch begins (one clock comparison per batch, one ``stat`` at most once a
  second; :mod:`whyidle.instrument.tf_deep_trace`); it too steps aside for the program's own
  profiling and waits for the window above.
- **Input wait on the torch and JAX backends**: their trainers take each batch from the iterator
  the epoch iterator makes (``TorchEpochIterator`` / ``JAXEpochIterator._get_iterator``: a torch
  ``DataLoader`` over the input, or a generator over it), whatever ``fit`` was given
  (``PyDataset``, Python generator, tf.data, torch ``DataLoader``, arrays). That iterator is
  wrapped: each ``next()`` of a training batch is timed as ``data`` (on torch between train-function
  calls, on JAX inside them: ``comp`` is the train function's time less that), with the training
  thread's CPU time in it (``data_cpu``). Nothing is synchronized: the time is what the loop waits.
  On JAX the first call of the train function compiles it with ``jit``: it is the first step's
  (start-up, like TensorFlow's tracing).
- **Completion on JAX**: JAX dispatches each train step asynchronously (on the CPU too), so the
  loop runs ahead of the computation and Keras waits for it in the batch-end callbacks it runs in
  its own threads (and at each epoch's end). The whyidle callback's ``on_train_batch_end`` runs in
  that thread once Keras has read the step's logs, i.e. once the step's computation finished: its
  time is the step's completion (``keras_done`` records), from which the analysis puts the steps
  on the computation's pace (:func:`whyidle.analysis.keras.completion_paced`). Keras's own wait
  for those callbacks at an epoch's end is training, not the epoch-end callbacks' evaluation
  region: it runs before that region opens.
- On the torch backend the PyTorch instrumentation stands aside during ``fit``/``evaluate``/
  ``predict`` (:meth:`whyidle.instrument.torch.TorchInstrument.stand_aside`: Keras's own loop, not
  PyTorch's hooks, says what a step is) and lends its stack sampler, whose samples then take
  Keras's phases. Keras's own ``model.eval()`` of the modules is not an evaluation region (its
  ``evaluate`` is).
- The dataset given to ``fit`` is described once (:func:`whyidle.instrument.tfdata.describe`) for
  the tf.data lint; a ``PyDataset``'s ``workers``/``use_multiprocessing``/``max_queue_size``, a torch
  ``DataLoader``'s ``num_workers`` and the user's lines (the class, ``fit``'s call) are kept in the
  ``keras_call`` record; the GPUs TensorFlow sees, its CUDA/cuDNN build and the Keras dtype policy
  are recorded once (``tf_devices``).
- Custom loops (``for x, y in dataset:`` with a ``tf.GradientTape`` step, no ``fit``): each eager
  ``next()`` on a tf.data iterator of the main thread marks a step; ``data`` is the time inside
  ``next()``, ``comp`` the time inside ``tf.function`` calls of that step and ``grad`` the eager
  ``GradientTape.gradient`` calls (a loop with neither only reads data and is not training).

Records: ``proc``, ``step`` (``by``: ``"keras"`` or ``"iterator"``), ``keras_call``, ``tfdata``,
``tf_devices``, ``tf_window`` (docs/run-format.md). Every hook catches its own errors, turns the
instrumentation off and says so once; nothing here synchronizes a device.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import threading
from time import monotonic_ns, thread_time_ns

from whyidle.instrument import patches
from whyidle.instrument import regions as region_mod
from whyidle.instrument import startup
from whyidle.instrument.hooks import defined_at
from whyidle.instrument.user_metrics import record_epoch_logs
from whyidle.record.steptable import MAX_PH_VALUES, PHASE_CODES
from whyidle.redact import redact_argv

#: Training batches (train-function calls) before the profiler window opens: the first call
#: traces and compiles the function, the next ones fill tf.data's buffers and autotune
#: (the TensorFlow profiler guide's own advice is to skip the first steps).
WINDOW_AFTER_CALLS = 3
#: Train-function calls the window covers; enough to average a few steps' input wait while
#: keeping the trace small (the profiler adds a few % to the profiled steps only).
WINDOW_CALLS = 10
#: The window closes after this long even when steps are slow (at least one call is covered).
WINDOW_MAX_S = 3.0

#: A custom loop's dataset is described (for the tf.data lint) at this many next() calls on one
#: iterator: a loop that really trains, not a peek such as ``for x in ds.take(1): print(x)``.
ITERATOR_DESCRIBE_AT = 3

#: JAX step completions per ``keras_done`` record (besides one at each epoch's end): a few KB.
DONE_PER_RECORD = 256

_INSTANCE: "KerasInstrument | None" = None


def _samples_of(element) -> int | None:
    """Leading dimension of the first tensor in a (nested) batch, or None."""
    for _ in range(4):
        if isinstance(element, dict):
            element = next(iter(element.values()), None)
        elif isinstance(element, (tuple, list)):
            element = element[0] if element else None
        else:
            break
    shape = getattr(element, "shape", None)
    try:
        return int(shape[0]) if shape is not None and len(shape) > 0 else None
    except Exception:
        return None


class KerasInstrument:
    """Keras/TensorFlow hooks of one process (see the module docstring)."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.off = False
        self.tid: int | None = None  # the thread that runs fit (or iterates a dataset)
        self.phase = "setup"
        self.calls = 0  # train-function calls seen in this process
        self.step_i = 0  # next step index (steps of every fit, in order)
        self.cur: dict | None = None  # the open step
        self.training = 0  # > 0 inside fit (between on_train_begin and on_train_end)
        self.fit_info: dict = {}
        self.spe = 1
        self.batch_size: int | None = None
        self.devices_recorded = False
        self.window = None  # whyidle.instrument.tfprof.ProfilerWindow once it may run
        self.user_profiles = False
        self.deep = None  # on-demand deep traces (tf_deep_trace.KerasDeepTrace), from the first fit
        self.tb_profilers: list = []  # this fit's TensorBoard callbacks with a profile_batch
        self.last_end = 0  # monotonic ns: the end of the last keras step
        self.it_step: dict | None = None  # the open custom-loop step
        self.it_last = None  # the iterator of the last next()
        self.stacks = None
        self.cur_first = True  # the next step is the first of an epoch
        self.keras_proc: dict | None = None  # written at the first fit/evaluate/predict
        self.described_iterator = False  # a custom loop's dataset is described once
        self.it_count = 0  # next() calls on the current iterator
        self.backend: str | None = None  # Keras backend, once Keras is imported
        self.input_timed = False  # the backend's epoch iterator is wrapped (_watch_input): steps carry data
        self.testing = False  # validation inside fit: its batches are no training input
        self.in_fn = False  # inside the train function (JAX fetches its batches there)
        self.fn_data: list = []  # (t0, t1) of the batches fetched inside the current train-function call
        self.open_calls = 0  # Keras fit/evaluate/predict calls running (the stack samples' phase is ours)
        self.torch_aside = False  # the PyTorch instrumentation stands aside for the Keras call
        self.model = None  # the model whose train_function is wrapped, until its fit ends
        self.done: list = []  # JAX: (step, monotonic ns) of completed steps, appended by Keras's callback threads
        self.batch_step: dict = {}  # JAX: Keras's end_step of this epoch → our step index

    # -- errors ----------------------------------------------------------------------------------
    def fail(self, where: str, exc: BaseException) -> None:
        """Turns the Keras instrumentation off and says so once."""
        if not self.off:
            self.off = True
            self.agent.notice(f"Keras/TensorFlow instrumentation disabled after an error in {where}: {exc!r}")
        if self.window is not None:
            self.window.abandon()
        if self.deep is not None:
            self.deep.drop("the Keras instrumentation stopped: whyidle's deep-trace window was discarded")

    # -- fit ---------------------------------------------------------------------------------------
    def on_fit_start(self, method: str, model, bound: dict, site: str | None = None) -> None:
        """``Model.fit``/``evaluate``/``predict`` was called (main thread); ``bound`` holds its
        arguments by name, ``site`` the program's line that called it (``"train.py:40"``)."""
        startup.entered(self.agent)  # until its first step, Keras's own start
        if self.tid is None:
            self.tid = threading.get_ident()
            self._start_stacks()
        if self.keras_proc is not None:  # the program trains with Keras (TensorFlow imports keras.src itself)
            tf = sys.modules.get("tensorflow")
            self.agent.record(dict(self.keras_proc, t=monotonic_ns(), tf_version=getattr(tf, "__version__", None)))
            self.keras_proc = None
            self.agent.start_background()
        if method != "fit":
            return
        x = bound.get("x")
        self.fit_info = {"t0": monotonic_ns(), "input": _input_kind(x), "source": _input_source(x),
                         **_input_settings(x), "site": site, "jit_compile": _jit_compile(model),
                         "epochs": bound.get("epochs"),
                         "batch_size": bound.get("batch_size"), "steps_per_epoch": bound.get("steps_per_epoch"),
                         "validation": bound.get("validation_data") is not None or bool(bound.get("validation_split"))}
        try:
            self.spe = int(getattr(model, "steps_per_execution", 1) or 1)
        except Exception:
            self.spe = 1
        self.batch_size = None
        if self.fit_info["input"] in ("numpy", "tensor"):
            self.batch_size = bound.get("batch_size") or 32  # Keras's default
        if self.fit_info["input"] == "tf.data":
            self._describe_dataset(x)
        self.tb_profilers = [cb for cb in bound.get("callbacks") or []
                             if type(cb).__name__ == "TensorBoard" and (getattr(cb, "_start_batch", 0) or 0) > 0]
        if self.tb_profilers:
            self.user_profile("a TensorBoard callback with profile_batch")

    def _describe_dataset(self, ds) -> None:
        try:
            from whyidle.instrument.tfdata import describe

            desc = describe(ds)
        except Exception as exc:
            self.agent.notice(f"tf.data lint disabled: {exc!r}")
            return
        bs = None
        for stage in desc.get("stages") or []:
            if stage.get("op") in ("batch", "padded_batch") and stage.get("batch_size"):
                bs = stage["batch_size"]
        self.batch_size = bs or desc.get("batch_size")
        self.agent.record(dict(desc, k="tfdata", t=monotonic_ns()))

    def on_train_begin(self, model) -> None:
        self.training += 1
        self.phase = "other"
        self.testing = False
        fn = getattr(model, "train_function", None)
        if fn is not None and not getattr(fn, "_whyidle", False):
            model.train_function = self._timed(fn)
            self.model = model
        if not self.devices_recorded:
            self.devices_recorded = True
            self.agent.record(_devices_record(model))
        if self.window is None and not self.user_profiles:
            self.window = _new_window(self)
        if self.deep is None:
            from whyidle.instrument.tf_deep_trace import KerasDeepTrace

            self.deep = KerasDeepTrace(self.agent, self)

    def _timed(self, fn):
        inst = self

        def train_function(*args, **kwargs):
            if inst.off or not inst.training or threading.get_ident() != inst.tid:
                return fn(*args, **kwargs)
            inst.phase = "compute"
            inst.in_fn = True
            t0 = monotonic_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = monotonic_ns()
                inst.phase = "other"
                inst.in_fn = False
                cur = inst.cur
                if cur is not None:
                    cur["fn"] += t1 - t0
                    _spans(cur, t0, t1, COMPUTE, inst.fn_data)
                inst.fn_data = []
                inst.calls += 1

        train_function._whyidle = True
        train_function.__wrapped__ = fn
        return train_function

    def on_batch_begin(self, batch: int = 0) -> None:
        now = monotonic_ns()
        if self.cur is not None:
            self._end_step(now, False)
        if self.stacks is not None:
            self.stacks.maybe_reinstall()  # a library reset the sampler's SIGURG handler (stacks.py)
        w = self.window
        if w is not None and not self.off and w.before_call(self.calls, now):
            now = monotonic_ns()  # the profiler's own start / stop-and-save is in no step
        d = self.deep
        if d is not None and now >= d.due:  # a deep-trace request to look for, or its window open
            now = d.boundary(self.calls, self.step_i, now)
        self.cur = {"t0": now, "c0": thread_time_ns(), "fn": 0, "data": 0, "data_in_fn": 0, "data_cpu": 0,
                    "i": self.step_i, "ph": [], "first": self.cur_first, "profiled": w is not None and w.active}
        self.cur_first = False
        if self.backend == "jax":
            self.batch_step[batch + self.spe - 1] = self.step_i  # the end_step Keras gives on_train_batch_end
        self.step_i += 1

    def _end_step(self, now: int, boundary: bool) -> None:
        cur, self.cur = self.cur, None
        self.last_end = now
        samples = self.batch_size * self.spe if self.batch_size else (cur.get("samples") or None)
        rec = {
            "k": "step", "t": now, "i": cur["i"], "t0": cur["t0"], "t1": now, "by": "keras",
            "fn": cur["fn"], "batches": self.spe, "samples": samples, "cpu": thread_time_ns() - cur["c0"],
            "boundary": bool(boundary or cur["first"]), "profiled": cur["profiled"], "ph": cur["ph"],
        }
        if self.input_timed:  # the batches' wait, measured (on JAX inside the train function)
            rec.update(data=cur["data"], comp=cur["fn"] - cur["data_in_fn"], data_cpu=cur["data_cpu"])
        self.agent.record(rec)
        if len(self.done) >= DONE_PER_RECORD:
            self.flush_done(now)

    def on_step_done(self, batch: int) -> None:
        """JAX: Keras read the logs of the step ending at its ``batch`` (in its callback thread): that
        step's computation has finished."""
        i = self.batch_step.get(batch)
        if i is not None:
            self.done.append((i, monotonic_ns()))

    def flush_done(self, now: int) -> None:
        """Writes the completions gathered so far as one ``keras_done`` record."""
        done, self.done = self.done, []
        if done:
            self.agent.record({"k": "keras_done", "t": now, "done": [list(d) for d in done]})

    def on_batch_fetched(self, t0: int, t1: int, c0: int, batch) -> None:
        """The training loop took a batch from its input (``t0``/``t1`` monotonic ns, ``c0`` the
        thread's CPU time at ``t0``); ``batch`` is None at the input's end."""
        cur = self.cur
        if cur is None:  # the epoch's first batch, fetched before its first step begins
            return
        cur["data"] += t1 - t0
        cur["data_cpu"] += thread_time_ns() - c0
        if self.in_fn:
            cur["data_in_fn"] += t1 - t0
            self.fn_data.append((t0, t1))
        else:
            _spans(cur, t0, t1, DATA)
        if batch is not None and not self.batch_size:
            cur["samples"] = (cur.get("samples") or 0) + (_samples_of(batch) or 0)
        if batch is not None and "batch_bytes" not in self.fit_info:  # once: what worker processes would pickle
            self.fit_info["batch_bytes"] = _nbytes(batch)

    def on_epoch_begin(self) -> None:
        self.cur_first = True

    def on_epoch_end(self) -> None:
        now = monotonic_ns()
        if self.cur is not None:
            self._end_step(now, True)
        self.flush_done(now)  # Keras waited for every batch-end callback of the epoch before this
        self.batch_step = {}

    def on_train_end(self) -> None:
        now = monotonic_ns()
        if self.cur is not None:
            self._end_step(now, True)
        self.training = max(0, self.training - 1)
        self.phase = "setup"
        model, self.model = self.model, None
        fn = getattr(model, "train_function", None)
        if getattr(fn, "_whyidle", False):  # nothing of ours left on the program's model
            model.train_function = fn.__wrapped__
        if self.window is not None:
            self.window.close(now)
        if self.deep is not None:
            self.deep.fit_ended(now)
        self.flush_done(now)
        self.batch_step = {}
        info = self.fit_info
        if info:
            self.agent.record(dict(info, k="keras_call", t=now, fn="fit", t1=now, steps_per_execution=self.spe,
                                   batch_size=self.batch_size))
            self.fit_info = {}

    def after_fit(self) -> None:
        """``fit`` returned or raised: whatever ``on_train_end`` did not close is closed here."""
        if self.training:
            self.on_train_end()

    # -- calls on the torch backend ----------------------------------------------------------------
    def enter_call(self) -> None:
        """A Keras ``fit``/``evaluate``/``predict`` starts (outermost): on the torch backend the
        PyTorch instrumentation stands aside until it ends."""
        self.open_calls += 1
        if self.backend == "torch" and self.open_calls == 1:
            torch_inst = _torch_instrument()
            self.torch_aside = torch_inst is not None and torch_inst.stand_aside(True)

    def leave_call(self, model) -> None:
        """The Keras call ended: the PyTorch instrumentation takes its hooks back, and the
        ``model.eval()`` Keras left its modules in is no evaluation region (``evaluate``'s is)."""
        self.open_calls = max(0, self.open_calls - 1)
        if self.backend != "torch" or self.open_calls:
            return
        if self.torch_aside:
            self.torch_aside = False
            _torch_instrument().stand_aside(False)
        regions = region_mod.get(self.agent)
        if regions.eval_module == id(model):
            regions.eval_module = None
            regions.end("mode", "Module.eval", drop=True)

    def on_other_call(self, fn: str, t0: int, batches: int) -> None:
        """``evaluate``/``predict`` ended (outside ``fit``)."""
        self.agent.record({"k": "keras_call", "t": monotonic_ns(), "fn": fn, "t0": t0, "t1": monotonic_ns(),
                           "batches": batches, "steps_per_execution": self.spe})

    # -- profiler --------------------------------------------------------------------------------
    def user_profile(self, how: str) -> None:
        """The program profiles itself: whyidle's profiler window steps aside for good, and an
        open deep-trace window is stopped first (its start would fail otherwise)."""
        if self.deep is not None:
            self.deep.program_starts()
        if self.user_profiles:
            return
        self.user_profiles = True
        w = self.window
        if w is not None and w.active:
            w.abandon()
        self.agent.notice(f"the program profiles itself ({how}): whyidle's TensorFlow profiler window steps aside, "
                          "so the input wait inside Keras's train step is not measured")

    # -- custom loops ----------------------------------------------------------------------------
    def on_next(self, iterator, t0: int, t1: int, element, stopped: bool) -> None:
        """An eager ``next()`` on a tf.data iterator returned (main thread, outside ``fit``)."""
        cur = self.it_step
        if cur is not None:
            self.agent.record({
                "k": "step", "t": t0, "i": cur["i"], "t0": cur["t0"], "t1": t0, "by": "iterator",
                "data": cur["data"], "comp": cur["comp"], "grad": cur["grad"], "batches": 1, "samples": cur["samples"],
                "cpu": thread_time_ns() - cur["c0"], "boundary": cur["new"] or stopped, "ph": cur["ph"],
            })
        if stopped:
            self.it_step = None
            self.it_last = None
            return
        new = iterator is not self.it_last
        if self.stacks is not None:
            self.stacks.maybe_reinstall()
        self.it_step = {"i": self.step_i, "t0": t0, "data": t1 - t0, "comp": 0, "grad": 0, "c0": thread_time_ns(),
                        "samples": _samples_of(element), "new": new, "ph": []}
        _spans(self.it_step, t0, t1, DATA)
        self.step_i += 1
        self.it_last = iterator
        self.it_count = 1 if new else self.it_count + 1
        if self.it_count == ITERATOR_DESCRIBE_AT and not self.described_iterator:
            self.described_iterator = True
            self._describe_dataset(getattr(iterator, "_dataset", None))

    def on_function(self, t0: int, t1: int) -> None:
        cur = self.it_step
        if cur is not None:
            cur["comp"] += t1 - t0
            _spans(cur, t0, t1, COMPUTE)

    def on_gradient(self) -> None:
        """An eager ``GradientTape.gradient`` call: the loop trains (not just reads data)."""
        cur = self.it_step
        if cur is not None:
            cur["grad"] += 1

    # -- stacks ----------------------------------------------------------------------------------
    def _start_stacks(self) -> None:
        startup.hand_over(self.agent)
        if self.stacks is not None or self.agent.stack_hz <= 0:
            return
        regions = region_mod.get(self.agent)
        torch_inst = _torch_instrument() if self.backend == "torch" else None
        if torch_inst is not None and torch_inst.tid == self.tid:  # one sampler per thread: PyTorch's, lent
            self.stacks = torch_inst.lend_stacks(lambda: regions.sample_phase(self.phase) if self.open_calls else None)
            return
        from whyidle.instrument.stacks import StackSampler

        self.stacks = StackSampler(self.tid, self.agent.stack_hz, lambda: regions.sample_phase(self.phase),
                                   native_id=threading.get_native_id(), notify=self.agent.notice)
        self.agent.collectors.append(self.stacks.drain)
        self.agent.on_exit.append(self.stacks.stop)
        self.stacks.start()


def _nbytes(batch, _depth: int = 0) -> int:
    """Bytes of the arrays/tensors in a (nested) batch (``nbytes``; 0 for anything else)."""
    if _depth > 4:
        return 0
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        return sum(_nbytes(b, _depth + 1) for b in batch)
    n = getattr(batch, "nbytes", 0)
    return n if isinstance(n, int) else 0


def _input_kind(x) -> str:
    """What was passed to fit as ``x``: ``tf.data``, ``numpy``, ``tensor``, ``generator``,
    ``PyDataset``, ``torch DataLoader``, ``none`` or the class name."""
    if x is None:
        return "none"
    names = {c.__name__ for c in type(x).__mro__}
    if "DatasetV2" in names or "DistributedDataset" in names:
        return "tf.data"
    if "ndarray" in names:
        return "numpy"
    if "PyDataset" in names or "Sequence" in names:
        return "PyDataset"
    if "DataLoader" in names:
        return "torch DataLoader"
    if inspect.isgenerator(x):
        return "generator"
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return "tensor"
    if isinstance(x, (dict, list, tuple)):
        return "numpy"
    return type(x).__name__


def _input_source(x) -> str | None:
    """Where a Python input source passed to fit is defined (``"train.py:12 batches"``: a
    generator's function, or a ``PyDataset`` class's ``__getitem__``), else None."""
    try:
        code = getattr(x, "gi_code", None)
        if code is None and _input_kind(x) == "PyDataset":
            code = getattr(type(x).__getitem__, "__code__", None)
        if code is None:
            return None
        return f"{defined_at(code)} {code.co_name}"
    except Exception:
        return None


def _input_settings(x) -> dict:
    """The settings of a Python input a fix names: a ``PyDataset``'s ``workers``,
    ``use_multiprocessing``, ``max_queue_size``, its class (``input_class``), where that class's own
    ``__init__`` is (``input_init``, ``"file:line"``, None when it inherits PyDataset's) and whether it
    takes ``**kwargs`` (``input_kwargs``: PyDataset's settings can be passed where it is built); a
    torch ``DataLoader``'s ``num_workers``. Empty for other inputs."""
    out: dict = {}
    try:
        kind = _input_kind(x)
        if kind == "PyDataset":
            cls = type(x)
            init = cls.__dict__.get("__init__")
            code = getattr(init, "__code__", None)
            out = {"workers": getattr(x, "workers", None), "use_multiprocessing": getattr(x, "use_multiprocessing", None),
                   "max_queue_size": getattr(x, "max_queue_size", None), "input_class": cls.__name__,
                   "input_init": defined_at(code) if code is not None else None,
                   "input_kwargs": bool(code is not None and code.co_flags & inspect.CO_VARKEYWORDS)}
        elif kind == "torch DataLoader":
            out = {"workers": getattr(x, "num_workers", None)}
    except Exception:
        pass
    return out


def _jit_compile(model):
    """The model's ``jit_compile`` (True/False; None when unknown)."""
    try:
        value = getattr(model, "jit_compile", None)
        return value if isinstance(value, bool) else None
    except Exception:
        return None


def _call_site(frame) -> str | None:
    """``"file:line"`` of the program's line that called ``fit``/``evaluate``/``predict``."""
    try:
        return f"{defined_at(frame.f_code).rpartition(':')[0]}:{frame.f_lineno}"
    except Exception:
        return None


def _torch_instrument():
    """The process's PyTorch instrumentation (:mod:`whyidle.instrument.torch`), or None."""
    return getattr(sys.modules.get("whyidle.instrument.torch"), "_INSTANCE", None)


#: Where each backend's trainer takes its batches: the epoch iterator whose ``_get_iterator``
#: makes the iterator ``fit`` draws from (Keras 3.x, ``keras/src/backend/*/trainer.py``).
EPOCH_ITERATORS = {"torch": ("keras.src.backend.torch.trainer", "TorchEpochIterator"),
                   "jax": ("keras.src.backend.jax.trainer", "JAXEpochIterator")}


class _TimedBatches:
    """The iterator a torch/JAX epoch iterator draws batches from, each training batch's
    ``next()`` timed (:meth:`KerasInstrument.on_batch_fetched`). Keras's own object, not the
    program's; it lives for one epoch's iteration."""

    __slots__ = ("_it", "_inst")

    def __init__(self, it, inst: KerasInstrument) -> None:
        self._it = it
        self._inst = inst

    def __iter__(self):
        return self

    def __next__(self):
        inst = self._inst
        if inst.off or not inst.training or inst.testing or threading.get_ident() != inst.tid:
            return next(self._it)
        prev = inst.phase
        inst.phase = "data"
        batch = None
        c0 = thread_time_ns()
        t0 = monotonic_ns()
        try:
            batch = next(self._it)
            return batch
        finally:
            t1 = monotonic_ns()
            inst.phase = prev
            _safe(inst, inst.on_batch_fetched, t0, t1, c0, batch)


def _watch_input(inst: KerasInstrument, backend: str | None) -> None:
    """Times the batches of the torch and JAX backends' training loops (module docstring): the
    iterator their epoch iterator's ``_get_iterator`` returns is wrapped in :class:`_TimedBatches`.
    A Keras without that method gets one notice and steps without an input wait."""
    where = EPOCH_ITERATORS.get(backend or "")
    if where is None:
        return
    try:
        mod = sys.modules.get(where[0]) or importlib.import_module(where[0])
        cls = getattr(mod, where[1])
        orig = cls.__dict__["_get_iterator"]
    except Exception as exc:
        inst.agent.notice(f"Keras on the {backend} backend: its batches are not timed in this Keras version "
                          f"({where[1]}._get_iterator: {exc!r}), so the input wait stays inside the train step")
        return

    @functools.wraps(orig)
    def _get_iterator(self):
        it = orig(self)
        return it if inst.off else _TimedBatches(iter(it), inst)

    patches.assign(cls, "_get_iterator", _get_iterator)
    inst.input_timed = True


def _devices_record(model) -> dict:
    """GPUs TensorFlow sees, its CUDA/cuDNN build, the Keras dtype policy (``tf_devices``)."""
    rec: dict = {"k": "tf_devices", "t": monotonic_ns(), "backend": None}
    try:
        import keras

        rec["backend"] = keras.backend.backend()
        config = getattr(keras, "config", None)
        policy = config.dtype_policy() if hasattr(config, "dtype_policy") else keras.mixed_precision.global_policy()
        rec["policy"] = policy.name  # Keras 3: keras.config; Keras 2: keras.mixed_precision
        layers = getattr(model, "layers", None) or []
        if layers:
            rec["output_dtype"] = getattr(layers[-1], "compute_dtype", None)
        dtypes: dict = {}
        for v in getattr(model, "trainable_weights", None) or []:
            d = str(getattr(v, "dtype", "?"))
            dtypes[d] = dtypes.get(d, 0) + 1
        rec["weight_dtypes"] = dtypes
        rec["jit_compile"] = bool(getattr(model, "jit_compile", False))
    except Exception as exc:
        rec["error"] = repr(exc)
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            build = dict(tf.sysconfig.get_build_info())
            rec["is_cuda_build"] = bool(build.get("is_cuda_build"))
            rec["cuda_build"] = build.get("cuda_version")
            rec["cudnn_build"] = build.get("cudnn_version")
            rec["physical_gpus"] = len(tf.config.list_physical_devices("GPU"))
            rec["tf_version"] = tf.__version__
        except Exception as exc:
            rec["error"] = repr(exc)
    return rec


def _new_window(inst: KerasInstrument):
    """The profiler window for this process, or None where it cannot run (said once)."""
    try:
        import keras

        backend = keras.backend.backend()
    except Exception:
        backend = None
    if backend != "tensorflow":  # the batches are timed where the trainer takes them (_watch_input)
        return None
    from whyidle.instrument.tfprof import ProfilerWindow

    return ProfilerWindow(inst.agent, os.path.join(inst.agent.run_dir, f"tfprof-{os.getpid()}"),
                          after_calls=WINDOW_AFTER_CALLS, calls=WINDOW_CALLS, max_s=WINDOW_MAX_S,
                          fail=inst.fail)


def _make_callback(keras, inst: KerasInstrument):
    class WhyidleCallback(keras.callbacks.Callback):
        """whyidle's timing callback (added by ``whyidle run``; it changes nothing in training)."""

        async_safe = True  # Keras may keep dispatching batch ends asynchronously

        def __init__(self, method: str) -> None:
            super().__init__()
            self._method = method
            self._t0 = 0
            self._batches = 0

        def on_train_begin(self, logs=None):
            _safe(inst, inst.on_train_begin, self.model)

        def on_train_end(self, logs=None):
            _safe(inst, inst.on_train_end)

        def on_epoch_begin(self, epoch, logs=None):
            _safe(inst, inst.on_epoch_begin)

        def on_epoch_end(self, epoch, logs=None):
            _safe(inst, inst.on_epoch_end)
            if self._method == "fit" and not inst.off:
                _safe(inst, record_epoch_logs, inst.agent, epoch, logs)

        def on_train_batch_begin(self, batch, logs=None):
            if not inst.off and threading.get_ident() == inst.tid:
                _safe(inst, inst.on_batch_begin, batch)

        def on_train_batch_end(self, batch, logs=None):  # async_safe: Keras's dispatch stays as it was
            if inst.backend == "jax" and inst.training and not inst.off:
                _safe(inst, inst.on_step_done, batch)

        def on_test_begin(self, logs=None):
            self._t0, self._batches = monotonic_ns(), 0
            inst.testing = True  # validation inside fit: its batches are not the training's

        def on_test_batch_begin(self, batch, logs=None):
            self._batches += 1

        def on_test_end(self, logs=None):
            inst.testing = False
            if self._method == "evaluate" and not inst.off:
                _safe(inst, inst.on_other_call, "evaluate", self._t0, self._batches)

        def on_predict_begin(self, logs=None):
            self._t0, self._batches = monotonic_ns(), 0

        def on_predict_batch_begin(self, batch, logs=None):
            self._batches += 1

        def on_predict_end(self, logs=None):
            if not inst.off:
                _safe(inst, inst.on_other_call, "predict", self._t0, self._batches)

    return WhyidleCallback


def _safe(inst: KerasInstrument, fn, *args) -> None:
    """Runs one hook; once the instrumentation is off (an earlier error), none runs."""
    if inst.off:
        return
    try:
        fn(*args)
    except Exception as exc:
        inst.fail(getattr(fn, "__name__", "a hook"), exc)


def _wrap_method(cls, name: str, inst: KerasInstrument, callback_cls) -> None:
    orig = getattr(cls, name)
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def method(self, *args, **kwargs):
        if inst.off or inst.agent.disabled or inst.training:  # nested (validation inside fit): leave it
            return orig(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
            user = bound.arguments.get("callbacks")
            if user is not None and not isinstance(user, (list, tuple)):
                raise TypeError(f"callbacks given as {type(user).__name__}")
            bound.arguments["callbacks"] = [callback_cls(name)] + list(user or [])
            inst.on_fit_start(name, self, dict(bound.arguments, callbacks=user), _call_site(sys._getframe(1)))
        except Exception as exc:
            inst.agent.notice(f"Keras {name}() not instrumented: {exc!r}")
            return orig(self, *args, **kwargs)
        _safe(inst, inst.enter_call)
        try:
            return orig(*bound.args, **bound.kwargs)
        finally:
            if name == "fit":
                _safe(inst, inst.after_fit)
            try:  # even once off: the PyTorch instrumentation must get its hooks back
                inst.leave_call(self)
            except Exception as exc:
                inst.fail("leave_call", exc)

    patches.assign(cls, name, method)


def install_keras(agent, keras) -> KerasInstrument:
    """Instruments ``keras.Model.fit``/``evaluate``/``predict`` (once). The ``proc`` record with
    ``framework: "keras"`` is written at the first of those calls: TensorFlow imports parts of
    Keras itself, so an import alone does not mean the program trains with Keras.

    Errors: propagates exceptions from patching; the agent turns them into one notice.
    """
    inst = _instance(agent)
    if getattr(inst, "keras_done", False):
        return inst
    inst.keras_done = True
    backend = None
    try:
        backend = keras.backend.backend()
    except Exception:
        pass
    inst.backend = backend
    _watch_input(inst, backend)
    inst.keras_proc = {"k": "proc", "pid": os.getpid(), "ppid": os.getppid(),
                       "argv": redact_argv(list(getattr(sys, "argv", []))),
                       "python": sys.version.split()[0], "framework": "keras",
                       "framework_version": str(getattr(keras, "__version__", "?")), "backend": backend,
                       "started": agent.t_start}
    major = str(getattr(keras, "__version__", "0")).split(".")[0]
    if major.isdigit() and int(major) < 3:
        agent.notice(f"Keras {keras.__version__}: whyidle is built for Keras 3; Keras 2 is observed as far as its "
                     "callbacks and train_function allow")
    callback_cls = _make_callback(keras, inst)
    for name in ("fit", "evaluate", "predict"):
        _wrap_method(keras.Model, name, inst, callback_cls)
    for name in ("evaluate", "predict", "predict_on_batch", "test_on_batch"):
        region_mod.wrap(keras.Model, name, "evaluation", agent, f"Model.{name}")
    for name in ("save", "save_weights"):
        region_mod.wrap(keras.Model, name, "checkpoint", agent, f"Model.{name}")
    callback_list = getattr(getattr(keras, "callbacks", None), "CallbackList", None)
    if callback_list is not None:  # the program's callbacks at epoch end (fit's validation runs before)
        region_mod.wrap(callback_list, "on_epoch_end", "evaluation", agent, "callbacks.on_epoch_end")
        _flush_first(callback_list)
    return inst


def _flush_first(callback_list) -> None:
    """``CallbackList.on_epoch_end`` first waits for the batch-end callbacks Keras dispatched to
    its threads (``_flush_futures``: on JAX, the computation the loop ran ahead of); that wait is
    done here, before the epoch-end callbacks' evaluation region opens. Keras's own wait then finds
    nothing left: the order of what runs is unchanged."""
    inner = callback_list.on_epoch_end

    @functools.wraps(inner)
    def on_epoch_end(self, *args, **kwargs):
        flush = getattr(self, "_flush_futures", None)
        if flush is not None and getattr(self, "_async_train", False) and getattr(self, "_futures", None):
            flush()
        return inner(self, *args, **kwargs)

    patches.assign(callback_list, "on_epoch_end", on_epoch_end)


def install_tensorflow(agent, tf) -> KerasInstrument:
    """Instruments TensorFlow itself (once): eager tf.data iteration marks custom-loop steps,
    ``tf.function`` calls are timed as compute, and the program's own profiler starts are watched.

    Errors: propagates exceptions from patching; the agent turns them into one notice.
    """
    inst = _instance(agent)
    if getattr(inst, "tf_done", False):
        return inst
    inst.tf_done = True
    agent.record({
        "k": "proc", "t": monotonic_ns(), "pid": os.getpid(), "ppid": os.getppid(),
        "argv": redact_argv(list(getattr(sys, "argv", []))), "python": sys.version.split()[0],
        "framework": "tensorflow", "framework_version": str(getattr(tf, "__version__", "?")),
        "started": agent.t_start,
    })
    agent.start_background()
    startup.start(agent)
    _watch_profiler(inst)
    _watch_iterators(inst, tf)
    return inst


def _instance(agent) -> KerasInstrument:
    global _INSTANCE
    if _INSTANCE is None:
        _INSTANCE = KerasInstrument(agent)
        patches.on_restore(_forget)
    return _INSTANCE


def _forget() -> None:
    """Undoes what outlives a ``fit`` (``whyidle.watch()`` ended, maybe inside one): the model's
    ``train_function`` timer; the next watch makes a new instrument."""
    global _INSTANCE
    inst, _INSTANCE = _INSTANCE, None
    model = getattr(inst, "model", None)
    fn = getattr(model, "train_function", None)
    if getattr(fn, "_whyidle", False):
        model.train_function = fn.__wrapped__


def _watch_profiler(inst: KerasInstrument) -> None:
    from tensorflow.python.profiler import profiler_v2

    orig_start = profiler_v2.start

    @functools.wraps(orig_start)
    def start(*args, **kwargs):
        _safe(inst, inst.user_profile, "tf.profiler.experimental.start")
        return orig_start(*args, **kwargs)

    start._whyidle_orig = orig_start
    patches.assign(profiler_v2, "start", start)
    try:
        import tensorflow as tf

        if tf.profiler.experimental.start is orig_start:
            patches.assign(tf.profiler.experimental, "start", start)
    except Exception:
        pass


DATA, OTHER, COMPUTE = (PHASE_CODES.index(p) for p in ("data", "other", "compute"))


def _spans(step: dict, t0: int, t1: int, code: int, inner=()) -> None:
    """Adds the phase span [t0, t1] (ns) of ``code`` to a step's ``ph`` values, then back to other;
    ``inner``: the ``(t0, t1)`` data spans inside it (batches JAX fetches inside the train function).
    A span that would pass ``MAX_PH_VALUES`` is left out whole."""
    ph = step["ph"]
    if len(ph) + 4 + 4 * len(inner) > MAX_PH_VALUES:
        return
    base = step["t0"]
    ph += (code, (t0 - base) // 1000)
    for a, b in inner:
        ph += (DATA, (a - base) // 1000, code, (b - base) // 1000)
    ph += (OTHER, (t1 - base) // 1000)


def _watch_iterators(inst: KerasInstrument, tf) -> None:
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.eager import context
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    get_ident = threading.get_ident
    orig_next = iterator_ops.OwnedIterator.__next__

    @functools.wraps(orig_next)
    def __next__(self):
        if inst.off or inst.training or not context.executing_eagerly():
            return orig_next(self)
        if inst.tid is None:
            inst.tid = get_ident()
            _safe(inst, inst._start_stacks)
        if get_ident() != inst.tid:
            return orig_next(self)
        prev = inst.phase
        inst.phase = "data"
        t0 = monotonic_ns()
        try:
            element = orig_next(self)
        except StopIteration:
            inst.phase = prev
            _safe(inst, inst.on_next, self, t0, monotonic_ns(), None, True)
            raise
        inst.phase = "other"
        _safe(inst, inst.on_next, self, t0, monotonic_ns(), element, False)
        return element

    patches.assign(iterator_ops.OwnedIterator, "__next__", __next__)

    orig_call = polymorphic_function.Function.__call__

    @functools.wraps(orig_call)
    def __call__(self, *args, **kwds):
        if inst.off or inst.it_step is None or inst.training or get_ident() != inst.tid:
            return orig_call(self, *args, **kwds)
        inst.phase = "compute"
        t0 = monotonic_ns()
        try:
            return orig_call(self, *args, **kwds)
        finally:
            inst.phase = "other"
            _safe(inst, inst.on_function, t0, monotonic_ns())

    patches.assign(polymorphic_function.Function, "__call__", __call__)

    from tensorflow.python.eager import backprop

    orig_gradient = backprop.GradientTape.gradient

    @functools.wraps(orig_gradient)
    def gradient(self, *args, **kwargs):
        if not inst.off and inst.it_step is not None and context.executing_eagerly() and get_ident() == inst.tid:
            _safe(inst, inst.on_gradient)
        return orig_gradient(self, *args, **kwargs)

    patches.assign(backprop.GradientTape, "gradient", gradient)
