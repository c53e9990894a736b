"""Whole-job regions: the time a training process spends outside its training steps.

The step hooks (:mod:`whyidle.instrument.torch`, :mod:`whyidle.instrument.keras`) time the training
step; this module times what jobs also do between steps, by the frameworks' own entry points:

- ``evaluation``: a PyTorch model switched to eval mode (``model.eval()`` … ``model.train()``, how
  custom loops, Lightning's validation loop and the HF ``Trainer`` evaluate), a custom loop
  iterating another DataLoader between training steps without it (``loop``), ``trainer.validate``,
  HF ``Trainer.evaluate``/``predict``, Keras ``evaluate``/``predict`` (``fit``'s validation included)
  and Keras callbacks at epoch end;
- ``checkpoint``: ``torch.save``, ``safetensors`` ``save_file``, ``save_pretrained``, Lightning's
  ``Trainer.save_checkpoint``, Keras ``Model.save``/``save_weights``;
- ``logging``: experiment trackers (``wandb.log``/``wandb.watch``'s hooks, TensorBoard
  ``SummaryWriter.add_*``, ``mlflow.log_*``).

A call from the training thread that is not nested in another region of the same kind writes one
``region`` record when it ends: ``{k: "region", t, kind, t0, t1, entry, site}`` (monotonic ns;
``site``: the user's line that called it, ``"file:line function"``, or null; a ``model.eval()``
region also has ``device``: the device type of the evaluated module's first parameter). The innermost open
region names the stack samples taken inside it (:meth:`Regions.sample_phase`), so the analysis can say
which lines hold each part. Wrappers call the original with the same arguments and return what it
returns; their own errors turn into one notice.
"""

from __future__ import annotations

import functools
import sys
import threading
from time import monotonic_ns

from whyidle.instrument import overrides, patches, saves
from whyidle.vocab import OUTSIDE_STEP, REGION_KINDS

#: The kinds of region records (:data:`whyidle.vocab.REGION_KINDS`); those whose time inside a
#: training step the analysis leaves out of the step's shares are :data:`whyidle.vocab.OUTSIDE_STEP`
#: (:attr:`Regions.outside_ns` adds them up).
KINDS = REGION_KINDS
#: Slots counted apart from the wrapped calls' kinds: ``mode`` is a module's eval mode (opened by
#: ``model.eval()``, closed by ``model.train()``, which a framework may never call: Lightning restores
#: ``training`` flags by assignment), written as an ``evaluation`` record. Kept apart so that an
#: unbalanced mode region never unbalances the wrapped calls' nesting.
#: ``loop`` is a custom loop iterating a DataLoader other than the training one between two
#: training steps without ``model.eval()`` (opened by its ``iter()``, closed by the training
#: loader's next batch: :mod:`whyidle.instrument.torch`), also an ``evaluation`` record.
SLOT_KIND = {"evaluation": "evaluation", "checkpoint": "checkpoint", "logging": "logging", "mode": "evaluation",
             "loop": "evaluation"}

#: Region records written per kind (~150 bytes each): a job logging several values every step
#: would otherwise write one record per call for its whole life. Past it a notice says that the
#: later calls of that kind are not timed (their time stays in the training part).
MAX_RECORDS_PER_KIND = 20_000

_REGIONS: "Regions | None" = None


class Regions:
    """The open regions of the training thread. Use :func:`get`."""

    def __init__(self, agent, tid: int) -> None:
        self.agent = agent
        self.tid = tid
        self.depth = dict.fromkeys(SLOT_KIND, 0)
        self.t0 = dict.fromkeys(SLOT_KIND, 0)
        self.site: dict[str, str | None] = dict.fromkeys(SLOT_KIND)  # the user's line that opened it
        self.open: list[str] = []  # kinds, innermost last
        self.written = dict.fromkeys(KINDS, 0)
        self.classifier = None  # FrameClassifier, created at the first region's end
        self.eval_module: int | None = None  # id() of the module whose eval() opened a region
        self.eval_device: str | None = None  # device type of that module's first parameter
        self.touch = None  # callable() marking the current training step as holding a region
        self.outside_ns = 0  # ns in recorded OUTSIDE_STEP regions so far (a hook timer subtracts them)

    def sample_phase(self, step_phase: str) -> str:
        """A stack sample's phase: ``step_phase``, or ``"<kind>:<step_phase>"`` inside a region."""
        return f"{SLOT_KIND[self.open[-1]]}:{step_phase}" if self.open else step_phase

    def inside(self, kind: str) -> bool:
        """A region of ``kind`` is open (for ``evaluation``: an evaluation call or a module in eval mode)."""
        return any(SLOT_KIND[slot] == kind for slot in self.open)

    def begin(self, kind: str, frame=None, at: int | None = None) -> bool:
        """Opens a region of slot ``kind`` (a kind, ``mode`` or ``loop``) called from ``frame``, at
        ``at`` (monotonic ns; now when None); True when it is the outermost of its slot."""
        d = self.depth[kind]
        self.depth[kind] = d + 1
        if d == 0:
            self.t0[kind] = monotonic_ns() if at is None else at
            self.site[kind] = self._site(frame)
            self.open.append(kind)
            if self.touch is not None:
                self.touch()
        return d == 0

    def _site(self, frame) -> str | None:
        if frame is None:
            return None
        if self.classifier is None:
            from whyidle.instrument.stacks import FrameClassifier

            self.classifier = FrameClassifier()
        return self.classifier.site_pair(frame)[0]

    def end(self, kind: str, entry: str, drop: bool = False, at: int | None = None, saved=None) -> None:
        """Closes a region of slot ``kind`` at ``at`` (monotonic ns; now when None); the outermost
        one writes its record (not when ``drop``), with the ``path``, ``bytes`` and ``fs`` of
        ``saved`` (a checkpoint's destination, :mod:`whyidle.instrument.saves`) when given."""
        d = self.depth[kind] - 1
        if d < 0:
            return
        self.depth[kind] = d
        if d:
            return
        if kind in self.open:
            self.open.remove(kind)
        if self.touch is not None:
            self.touch()
        if drop or self.agent.disabled:
            return
        out = SLOT_KIND[kind]
        n = self.written[out]
        if n >= MAX_RECORDS_PER_KIND:
            if n == MAX_RECORDS_PER_KIND:
                self.written[out] = n + 1
                self.agent.notice(f"more than {MAX_RECORDS_PER_KIND} {out} calls: the later ones are not timed")
            return
        self.written[out] = n + 1
        t1 = monotonic_ns() if at is None else at
        rec = {"k": "region", "t": t1, "kind": out, "t0": self.t0[kind], "t1": t1, "entry": entry,
               "site": self.site[kind]}
        if kind == "mode" and self.eval_device is not None:
            rec["device"] = self.eval_device  # where the evaluated model's weights were
        if saved is not None:
            rec.update(saves.describe(saved, t1 - self.t0[kind]))
        self.agent.record(rec)
        if out in OUTSIDE_STEP:
            self.outside_ns += t1 - self.t0[kind]

    def close_all(self) -> None:
        """Ends every open region (at exit: an evaluation never followed by ``model.train()``)."""
        for kind in list(reversed(self.open)):
            self.depth[kind] = 1
            self.end(kind, "exit")


def get(agent) -> Regions:
    """The process's :class:`Regions` (created on first use; the training thread is the main thread)."""
    global _REGIONS
    if _REGIONS is None:
        _REGIONS = Regions(agent, threading.main_thread().ident)
        agent.on_exit.insert(0, _REGIONS.close_all)
        patches.on_restore(_forget)
    return _REGIONS


def _forget() -> None:
    global _REGIONS
    _REGIONS = None


def wrap(owner, name: str, kind: str, agent, entry: str | None = None) -> None:
    """Replaces ``owner.name`` (a function of a module, or a method of a class) by a wrapper that
    times each call from the training thread as a ``kind`` region. Idempotent; missing names are
    skipped.

    Errors: none raised; a failure inside the wrapper's own work turns into one notice.
    """
    orig = getattr(owner, name, None)
    if orig is None or getattr(orig, "__whyidle_region__", False):
        return
    regions = get(agent)
    label = entry or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
    get_ident = threading.get_ident

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True  # IPython and pytest leave whyidle's frame out of the program's tracebacks
        if kind == "checkpoint":  # in a tune trial, to its scratch folder (from any thread)
            args, kwargs = overrides.redirect(agent, args, kwargs, label)
        if get_ident() != regions.tid or agent.disabled:
            return orig(*args, **kwargs)
        try:
            regions.begin(kind, sys._getframe(1))
        except Exception as exc:
            agent.notice(f"{label} timing disabled: {exc!r}")
            return orig(*args, **kwargs)
        saved = saves.destination(args, kwargs) if kind == "checkpoint" else None
        try:
            return orig(*args, **kwargs)
        finally:
            try:
                regions.end(kind, label, saved=saved)
            except Exception as exc:
                agent.notice(f"{label} timing disabled: {exc!r}")

    wrapper.__whyidle_region__ = True
    try:
        patches.assign(owner, name, wrapper)
    except (AttributeError, TypeError):  # a read-only attribute (a C type): leave it alone
        pass


def watch_module_mode(module_cls, agent, on_step=None) -> None:
    """Times ``model.eval()`` … ``model.train()`` of PyTorch modules as ``evaluation`` regions.

    ``Module.train(mode)`` is wrapped (``eval()`` calls ``train(False)``); only the outermost call is
    considered (``train`` recurses into the children), and only a switch of the module's own
    ``training`` flag: True → False opens the region, False → True on the same module closes it.
    A region in which the program stepped an optimizer is dropped (:func:`optimizer_stepped`):
    that was training with frozen normalization layers, not evaluation — or a framework that puts
    the flags back by assignment (Lightning), whose own evaluation entry point is timed instead.
    """
    orig = module_cls.train
    if getattr(orig, "__whyidle_region__", False):
        return
    regions = get(agent)
    local = threading.local()
    get_ident = threading.get_ident

    @functools.wraps(orig)
    def train(self, mode: bool = True):
        if get_ident() != regions.tid or agent.disabled or getattr(local, "inside", False):
            return orig(self, mode)
        try:
            was = bool(getattr(self, "training", True))
            if was and not mode and regions.eval_module is None:
                regions.eval_module = id(self)
                regions.eval_device = _device_type(self)
                regions.begin("mode", sys._getframe(1))
            elif mode and not was and regions.eval_module == id(self):
                regions.eval_module = None
                regions.end("mode", "Module.eval")
        except Exception as exc:
            agent.notice(f"model.eval() timing disabled: {exc!r}")
        local.inside = True
        try:
            return orig(self, mode)
        finally:
            local.inside = False

    train.__whyidle_region__ = True
    patches.assign(module_cls, "train", train)


def _device_type(module) -> str | None:
    """``"cuda"``, ``"cpu"``, ... of a module's first parameter (None without parameters)."""
    try:
        p = next(module.parameters(), None)
        return p.device.type if p is not None else None
    except Exception:
        return None


def optimizer_stepped() -> None:
    """An optimizer stepped: an open ``model.eval()`` region was training, not evaluation (drop it)."""
    r = _REGIONS
    if r is not None and r.eval_module is not None:
        r.eval_module = None
        r.end("mode", "Module.eval", drop=True)
