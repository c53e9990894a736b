"""The ``replay`` trial setting: the DataLoader taken out of the step (the input pipeline's ceiling).

With ``WHYIDLE_OVERRIDES={"replay": N}`` each DataLoader keeps the first ``N`` batches it yields
in memory; from then on every batch it hands the program is one of those, in turn, at the cost of
a list lookup: no sampler, no ``__getitem__``, no collation, no workers (an iterator's workers are
shut down as soon as its ``N`` batches are kept). The training step then runs with an ideal
loader, so a trial measures the step time every input fix is held against (NVIDIA DALI's
``LoaderEvaluator`` replays its own loader the same way).

Epochs keep their length (``len(loader)`` batches, or without one, batches until the program
stops); the batches are the same objects each time, so a program that changes a batch in place
trains on the changed values (the step time stays what it measures). Batches stay where the
loader put them (CPU, pinned or not): the copy to the device stays in the step.

It works below whyidle's own DataLoader instrumentation (installed first, from
:func:`whyidle.instrument.overrides.install_torch`): the data wait of a replayed batch is still
timed, so the trial's report shows it near zero. Standard library only, beside PyTorch.
"""

from __future__ import annotations

import functools

#: The attribute a DataLoader's replay state is kept in.
STATE = "_whyidle_replay"


class _State:
    """One DataLoader's kept batches: ``want`` (how many to keep), ``batches``, ``served``."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.batches: list = []
        self.served = 0

    @property
    def full(self) -> bool:
        return len(self.batches) >= self.want

    def next_batch(self):
        batch = self.batches[self.served % len(self.batches)]
        self.served += 1
        return batch


def _length(it) -> int | None:
    """Batches per epoch of an iterator (None: not known, e.g. an IterableDataset without ``__len__``)."""
    try:
        return len(it)
    except TypeError:
        return None


def _replaying(it, state: _State):
    """Makes iterator ``it`` serve kept batches until its epoch's length, with its workers stopped."""
    length = _length(it)

    def next_data():
        if length is not None and it._num_yielded >= length:
            raise StopIteration
        return state.next_batch()

    it._next_data = next_data  # the instance's own: __next__ calls self._next_data()
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def install(ov, torch) -> None:
    """Wraps ``DataLoader.__iter__`` and ``_BaseDataLoaderIter.__next__`` for the trial's ``replay``
    (``ov.settings["replay"]`` batches kept per DataLoader); records one ``override`` note when the
    first DataLoader starts replaying (``applied``) and, at exit, one refusal if none ever did
    (:meth:`whyidle.instrument.overrides.Overrides.unused`). Errors: patching errors propagate."""
    import torch.utils.data.dataloader as dl

    want = int(ov.settings["replay"])
    orig_iter = dl.DataLoader.__iter__
    orig_next = dl._BaseDataLoaderIter.__next__
    noted = []

    @functools.wraps(orig_iter)
    def __iter__(self):
        state = self.__dict__.get(STATE)
        if state is None:
            state = _State(want)
            self.__dict__[STATE] = state
        it = orig_iter(self)
        it.__dict__[STATE] = state
        if state.full:  # a later epoch: only the kept batches (persistent workers stay idle)
            _replaying(it, state)
        return it

    @functools.wraps(orig_next)
    def __next__(self):
        batch = orig_next(self)
        state = self.__dict__.get(STATE)
        if state is not None and not state.full:
            state.batches.append(batch)
            if state.full:
                _replaying(self, state)
                if not noted:
                    noted.append(True)
                    ov.note("replay", True, was=None, site=None)
        return batch

    dl.DataLoader.__iter__ = __iter__
    dl._BaseDataLoaderIter.__next__ = __next__
