"""Copy and read audit for a few training steps (stdlib only; ``torch`` is passed in).

While active, ``Tensor.to``/``cuda`` and the value reads ``item``/``tolist``/``cpu``/``numpy``/
``__bool__`` are wrapped (class attributes on ``torch.Tensor`` that shadow the C methods, removed
again when the audit ends) and recorded per step with the calling source line:

- every ``.to(device)``/``.cuda()`` of a CPU tensor: target device type, bytes, whether the source
  was pinned, ``non_blocking``, whether the tensor came out of the DataLoader batch of this step,
  and the host time the call took (a copy from pageable memory is staged synchronously by the
  driver, so its host time is its cost; a pinned ``non_blocking`` copy returns at once and
  overlaps compute). Moves of batch tensors to the CPU itself are kept too (``.to(device)`` with
  ``device="cpu"``): they show the script's intent to move data;
- every read of a tensor's value on the host made directly by the user's code (outermost call
  only; printing or formatting a tensor counts once): on a GPU each one is a synchronization; on a
  CPU-only run they are the syncs the same loop would make on a GPU.

This answers questions the device audit cannot: are batches copied from pageable memory
(``pageable_transfers``), are tensors built on the CPU inside the step and copied every step
(``wrong_device``, per-step CPU tensors), how many host reads a step makes (``sync_bound``). It
runs for a few steps only, so the cost of the wrappers (~2 µs per call) does not stay in the loop.
"""

from __future__ import annotations

import os
import sys
import weakref
from time import monotonic_ns

from whyidle.instrument import patches

#: Distinct (site, kind) rows kept per audited step.
MAX_ROWS = 64

#: Tensor methods that read a value to the host (a sync when the tensor is on a GPU).
READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__repr__", "__format__")


#: The live audits, weakly: after a fork (a DataLoader worker) each goes inert. One at-fork callback
#: per process (``os.register_at_fork`` has no way back: ``whyidle.watch()`` makes a new audit each time).
_AUDITS: "weakref.WeakSet" = weakref.WeakSet()


def _forked() -> None:
    for audit in list(_AUDITS):
        audit.active = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


class TransferAudit:
    """Records host→device copies made by one thread while active.

    Args:
        torch: the ``torch`` module.
        tid: ``threading.get_ident()`` of the training thread (other threads are not audited).
        site_of: ``site_of(frame) -> (user_site, leaf_site)`` for the calling frame.
        get_ident: ``threading.get_ident``.
        is_compiling: ``torch.compiler.is_compiling`` (while Dynamo traces, the wrappers step
            aside so compiled graphs do not change).
    """

    def __init__(self, torch, tid: int, site_of, get_ident, is_compiling=lambda: False) -> None:
        self.torch = torch
        self.is_compiling = is_compiling
        self.tid = tid
        self.site_of = site_of
        self.get_ident = get_ident
        # id -> weak reference of this step's batch tensors: an id alone is reused once a batch
        # tensor is freed (under gradient accumulation, by the next micro-batch's tensors)
        self.batch_ids: dict[int, object] = {}
        self.rows: dict[tuple, list] = {}
        self.reads: dict[tuple, int] = {}
        self._reading = False
        self.active = False
        _AUDITS.add(self)  # a forked DataLoader worker inherits the wrappers: inert there (_forked)
        self._saved: list[tuple[str, object]] = []

    def start(self) -> None:
        """Wraps ``Tensor.to`` / ``Tensor.cuda`` (idempotent)."""
        if self.active:
            return
        tensor = self.torch.Tensor
        parse_to = self.torch._C._nn._parse_to
        audit = self

        orig_to = tensor.to

        def to(self, *args, **kwargs):
            if (audit.is_compiling() or not audit.active or self.device.type != "cpu"
                    or audit.get_ident() != audit.tid):
                return orig_to(self, *args, **kwargs)
            try:
                device, _, non_blocking, _ = parse_to(*args, **kwargs)
            except Exception:
                return orig_to(self, *args, **kwargs)
            if device is None or (device.type == "cpu" and not audit.from_batch(self)):
                return orig_to(self, *args, **kwargs)
            t0 = monotonic_ns()
            out = orig_to(self, *args, **kwargs)
            audit._record(self, device.type, bool(non_blocking), monotonic_ns() - t0)
            return out

        orig_cuda = tensor.cuda

        def cuda(self, device=None, non_blocking=False, **kwargs):
            if (audit.is_compiling() or not audit.active or self.device.type != "cpu"
                    or audit.get_ident() != audit.tid):
                return orig_cuda(self, device, non_blocking, **kwargs)
            t0 = monotonic_ns()
            out = orig_cuda(self, device, non_blocking, **kwargs)
            audit._record(self, "cuda", bool(non_blocking), monotonic_ns() - t0)
            return out

        wrappers = [("to", to), ("cuda", cuda)] + [(name, self._read_wrapper(getattr(tensor, name), name))
                                                   for name in READS]
        for name, fn in wrappers:
            self._saved.append((name, tensor.__dict__.get(name)))
            fn.__name__ = name
            fn.__doc__ = getattr(getattr(tensor, name), "__doc__", None)
            setattr(tensor, name, fn)
        self.active = True


    def _read_wrapper(self, orig, op: str):
        audit = self

        def read(self, *args, **kwargs):
            if (audit.is_compiling() or not audit.active or audit._reading
                    or audit.get_ident() != audit.tid):
                return orig(self, *args, **kwargs)
            audit._reading = True  # reads inside this one (printing a tensor) are not counted again
            try:
                return orig(self, *args, **kwargs)
            finally:
                audit._reading = False
                try:
                    user, leaf = audit.site_of(sys._getframe(1))
                    # only reads the user's own code makes: a library's reads of CPU-side state
                    # (Adam's step counter) are no syncs, and the user cannot change them anyway
                    key = (user, leaf, op)
                    if user is not None and user == leaf and (key in audit.reads or len(audit.reads) < MAX_ROWS):
                        audit.reads[key] = audit.reads.get(key, 0) + 1
                except Exception:
                    pass

        return read

    def add_batch(self, t) -> None:
        """Marks ``t`` as a tensor of this step's DataLoader batch."""
        try:
            self.batch_ids[id(t)] = weakref.ref(t)
        except TypeError:  # not weakly referenceable: never counted as from the batch
            pass

    def from_batch(self, t) -> bool:
        """``t`` is one of this step's batch tensors (the very object, not a reuse of its id)."""
        ref = self.batch_ids.get(id(t))
        return ref is not None and ref() is t

    def stop(self) -> None:
        """Puts the wrapped ``torch.Tensor`` methods back as they were."""
        self.active = False
        tensor = self.torch.Tensor
        for name, orig in reversed(self._saved):
            if orig is None:
                try:
                    delattr(tensor, name)
                except AttributeError:
                    pass
            else:
                setattr(tensor, name, orig)
        self._saved = []

    def _record(self, t, device_type: str, non_blocking: bool, host_ns: int) -> None:
        try:
            pinned = bool(t.is_pinned())
        except Exception:
            pinned = None
        user, leaf = self.site_of(sys._getframe(2))
        from_batch = self.from_batch(t)
        key = (user, leaf, device_type, pinned, non_blocking, from_batch)
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= MAX_ROWS:
                key = (None, "(overflow)", device_type, pinned, non_blocking, from_batch)
            row = self.rows.setdefault(key, [0, 0, 0])
        row[0] += 1
        row[1] += int(t.numel()) * int(t.element_size())
        row[2] += host_ns

    def drain(self, step: int, t: int) -> dict:
        """The ``transfers`` record of one audited step (``items`` empty without copies); resets
        the rows. Each item: ``[user_site, leaf_site, device_type, pinned, non_blocking,
        from_batch, count, bytes, host_ns]``; each read: ``[user_site, leaf_site, op, count]``.
        """
        rows, self.rows = self.rows, {}
        reads, self.reads = self.reads, {}
        self.batch_ids = {}
        items = [[*key, *vals] for key, vals in rows.items()]
        return {"k": "transfers", "t": t, "step": step, "items": items,
                "reads": [[*key, n] for key, n in reads.items()]}


#: Placement calls recorded per process at most (``Module.to``/``cuda`` and CUDA queries happen at
#: set-up; a program calling them in its loop has shown its pattern after a few).
MAX_PLACEMENT_RECORDS = 16


def watch_placement(torch, record, site_of) -> None:
    """Records where the program places its model and asks for CUDA (for the whole run).

    Wraps ``torch.nn.Module.to``/``cuda`` (``module_to`` records: class, target device type, source
    line) and ``torch.cuda.is_available`` called from the user's code (``cuda_query`` records:
    result, source line), up to :data:`MAX_PLACEMENT_RECORDS` each. These calls happen at set-up,
    so the wrappers cost nothing in the loop.

    Args:
        torch: the ``torch`` module. record: callable taking one record dict.
        site_of: ``site_of(frame) -> (user_site, leaf_site)``.
    """
    module_cls = torch.nn.Module
    parse_to = torch._C._nn._parse_to
    counts = {"module_to": 0, "cuda_query": 0}

    def note(kind: str, rec: dict) -> None:
        if counts[kind] < MAX_PLACEMENT_RECORDS:
            counts[kind] += 1
            user, leaf = site_of(sys._getframe(2))
            record({"k": kind, "t": monotonic_ns(), "site": user, "leaf": leaf, **rec})

    orig_to = module_cls.to

    def to(self, *args, **kwargs):
        out = orig_to(self, *args, **kwargs)
        try:
            device = parse_to(*args, **kwargs)[0]
            if device is not None:
                note("module_to", {"cls": type(self).__name__, "device": device.type})
        except Exception:
            pass
        return out

    orig_cuda = module_cls.cuda

    def cuda(self, device=None):
        out = orig_cuda(self, device)
        try:
            note("module_to", {"cls": type(self).__name__, "device": "cuda"})
        except Exception:
            pass
        return out

    orig_available = torch.cuda.is_available

    def is_available():
        result = orig_available()
        try:
            user, leaf = site_of(sys._getframe(1))
            if user is not None and user == leaf:  # asked by the user's code, not by a library
                note("cuda_query", {"result": bool(result)})
        except Exception:
            pass
        return result

    for owner, name, fn, orig in ((module_cls, "to", to, orig_to), (module_cls, "cuda", cuda, orig_cuda),
                                  (torch.cuda, "is_available", is_available, orig_available)):
        fn.__name__ = name
        fn.__doc__ = orig.__doc__
        fn.__wrapped__ = orig
        patches.assign(owner, name, fn)
