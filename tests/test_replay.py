"""The ``replay`` trial setting (whyidle.instrument.replay): the first N batches kept, then only
those handed out, epochs keeping their length, the Dataset no longer called. In-process, no run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.utils.data.dataloader as dl  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from whyidle.instrument import overrides, replay  # noqa: E402


class Counting(Dataset):
    def __init__(self, n):
        self.n, self.calls = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls += 1
        return torch.tensor([float(i)])


class FakeOv:
    def __init__(self, n):
        self.settings = {"replay": n}
        self.notes = []

    def note(self, name, applied, **kw):
        self.notes.append((name, applied))


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.setattr(dl.DataLoader, "__iter__", dl.DataLoader.__iter__)
    monkeypatch.setattr(dl._BaseDataLoaderIter, "__next__", dl._BaseDataLoaderIter.__next__)
    return monkeypatch


def test_the_first_batches_are_replayed_and_the_dataset_left_alone(patched):
    ov = FakeOv(3)
    replay.install(ov, torch)
    ds = Counting(20)
    loader = DataLoader(ds, batch_size=4)
    first = [b for b in loader]
    assert len(first) == 5 and ds.calls == 12  # 3 batches of 4 loaded, the other 2 replayed
    assert first[3] is first[0] and first[4] is first[1]
    assert ov.notes == [("replay", True)]
    second = list(loader)
    assert len(second) == 5 and ds.calls == 12  # no sample loaded in a later epoch
    assert second[0] is first[2] and all(any(b is k for k in first[:3]) for b in second)


def test_workers_stop_once_the_batches_are_kept(patched):
    replay.install(FakeOv(2), torch)
    loader = DataLoader(Counting(16), batch_size=4, num_workers=1)
    it = iter(loader)
    batches = [next(it) for _ in range(3)]
    assert it._shutdown and batches[2] is batches[0]
    assert len(list(it)) == 1  # the epoch's 4th batch, then its end


def test_replay_is_a_knob_with_a_positive_count():
    assert overrides.parse('{"replay": 8}') == ({"replay": 8}, [])
    assert overrides.parse('{"replay": 0}')[0] == {} and overrides.parse('{"replay": true}')[0] == {}
