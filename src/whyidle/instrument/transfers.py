"""Host→device copy audit for a few training steps (stdlib only; ``torch`` is passed in).

While active, ``Tensor.to`` and ``Tensor.cuda`` are wrapped (class attributes on ``torch.Tensor``
that shadow the C methods, removed again when the audit ends) and every copy of a CPU tensor to
another device is recorded: the calling source line, bytes, whether the source was pinned,
``non_blocking``, whether the tensor came out of the DataLoader batch of this step, and the host
time the call took (a copy from pageable memory is staged synchronously by the driver, so its
host time is its cost; a pinned ``non_blocking`` copy returns at once and overlaps compute).

This answers two questions the device audit cannot: are batches copied from pageable memory
(``pageable_transfers``), and are tensors built on the CPU inside the step and copied every step
(``wrong_device``, per-step CPU tensors). It runs for a few steps only, so the cost of the
wrappers (~2 µs per call) does not stay in the loop.
"""

from __future__ import annotations

import sys
from time import monotonic_ns

#: Distinct (site, kind) rows kept per audited step.
MAX_ROWS = 64


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
        self.batch_ids: set[int] = set()
        self.rows: dict[tuple, list] = {}
        self.active = False
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
            if (not audit.active or audit.is_compiling() or self.device.type != "cpu"
                    or audit.get_ident() != audit.tid):
                return orig_to(self, *args, **kwargs)
            try:
                device, _, non_blocking, _ = parse_to(*args, **kwargs)
            except Exception:
                return orig_to(self, *args, **kwargs)
            if device is None or device.type == "cpu":
                return orig_to(self, *args, **kwargs)
            t0 = monotonic_ns()
            out = orig_to(self, *args, **kwargs)
            audit._record(self, device.type, bool(non_blocking), monotonic_ns() - t0)
            return out

        orig_cuda = tensor.cuda

        def cuda(self, device=None, non_blocking=False, **kwargs):
            if (not audit.active or audit.is_compiling() or self.device.type != "cpu"
                    or audit.get_ident() != audit.tid):
                return orig_cuda(self, device, non_blocking, **kwargs)
            t0 = monotonic_ns()
            out = orig_cuda(self, device, non_blocking, **kwargs)
            audit._record(self, "cuda", bool(non_blocking), monotonic_ns() - t0)
            return out

        for name, fn in (("to", to), ("cuda", cuda)):
            self._saved.append((name, tensor.__dict__.get(name)))
            fn.__name__ = name
            fn.__doc__ = getattr(getattr(tensor, name), "__doc__", None)
            setattr(tensor, name, fn)
        self.active = True

    def stop(self) -> None:
        """Puts ``Tensor.to`` / ``Tensor.cuda`` back as they were."""
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
        from_batch = id(t) in self.batch_ids
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
        from_batch, count, bytes, host_ns]``.
        """
        rows, self.rows = self.rows, {}
        self.batch_ids = set()
        items = [[*key, *vals] for key, vals in rows.items()]
        return {"k": "transfers", "t": t, "step": step, "items": items}
