"""Small pure pieces of the PyTorch instrumentation: batch sizes and the non-synchronizing CUDA step
timer (with a fake event class; no GPU needed)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from whyidle.instrument.torch import MAX_PENDING_GPU_STEPS, CudaStepTimer, batch_size_of

# -- batch_size_of -------------------------------------------------------------------------------


@pytest.mark.parametrize("batch, expected", [
    (torch.zeros(16, 3, 8, 8), 16),
    (torch.zeros(5), 5),
    (torch.tensor(3.0), None),  # scalar tensor: no leading dimension
    (np.zeros((7, 2)), 7),
    (np.float32(1.0), None),  # numpy scalar has shape ()
    ((torch.zeros(8, 3), torch.zeros(8)), 8),
    ([torch.zeros(4, 2), torch.zeros(4)], 4),
    ({"input_ids": torch.zeros(12, 128, dtype=torch.long), "labels": torch.zeros(12)}, 12),
    (collections.OrderedDict(x=torch.zeros(6, 1)), 6),
    (["a cat", "a dog", "a bird"], 3),  # list of strings: its length
    (("txt",), 1),
    ([1, 2, 3, 4], 4),
    (([torch.zeros(9, 1), torch.zeros(9)], torch.zeros(9)), 9),  # nested
    ({"image": (torch.zeros(2, 3),), "meta": ["x", "y"]}, 2),  # mapping → tuple → tensor
    ({"text": ["a", "b", "c", "d", "e"], "label": torch.zeros(5)}, 5),  # first value: list of strings
    ([], None),
    ((), None),
    ({}, None),
    (None, None),
    (42, None),
    ("a string", None),  # not a list: no batch dimension to read
    ([[[]]], 1),  # a list holding one (empty) per-sample item
])
def test_batch_size_of(batch, expected):
    assert batch_size_of(batch) == expected


def test_batch_size_of_depth_limit():
    t = torch.zeros(3, 1)
    assert batch_size_of({"a": {"b": {"c": t}}}) == 3  # three levels of mappings
    assert batch_size_of({"a": {"b": {"c": {"d": {"e": {"f": t}}}}}}) is None  # deeper than the walker goes


def test_batch_size_of_uncollated_detection_batch():
    images = (torch.zeros(3, 480, 640), torch.zeros(3, 320, 500))
    targets = ({"boxes": torch.zeros(4, 4)}, {"boxes": torch.zeros(1, 4)})
    assert batch_size_of((images, targets)) == 2


def test_batch_size_of_returns_int():
    n = batch_size_of(torch.zeros(10, 2))
    assert type(n) is int


# -- CudaStepTimer -------------------------------------------------------------------------------

class FakeGPU:
    """A stream: events are recorded in order and complete in order up to ``done``."""

    def __init__(self):
        self.seq = 0
        self.done = -1  # sequence number of the last completed event
        self.clock_ms = 0.0
        self.created = 0

    def finish_all(self):
        self.done = self.seq - 1


class FakeEvent:
    def __init__(self, gpu: FakeGPU):
        self.gpu = gpu
        self.seq = None
        self.ms = None
        gpu.created += 1

    def record(self):
        self.seq = self.gpu.seq
        self.gpu.seq += 1
        self.ms = self.gpu.clock_ms

    def query(self):
        return self.seq is not None and self.seq <= self.gpu.done

    def elapsed_time(self, end):
        # like CUDA: both events must have completed, else it is an error (it never waits)
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time on an event that has not completed")
        return end.ms - self.ms

    def synchronize(self):
        raise AssertionError("CudaStepTimer must never synchronize")

    def wait(self, stream=None):
        raise AssertionError("CudaStepTimer must never make a stream wait")


def make_timer():
    gpu = FakeGPU()
    return gpu, CudaStepTimer(lambda: FakeEvent(gpu))


def run_step(gpu, timer, i, gpu_ms):
    timer.start()
    gpu.clock_ms += gpu_ms
    timer.end(i)


def test_gpu_steps_are_reported_only_once_complete():
    gpu, timer = make_timer()
    run_step(gpu, timer, 0, 5.0)
    run_step(gpu, timer, 1, 7.5)
    run_step(gpu, timer, 2, 2.0)
    assert timer.poll() == []  # nothing has completed: no waiting, nothing reported
    gpu.done = 3  # events 0..3: steps 0 and 1 done, step 2 not yet
    out = timer.poll()
    assert [(r["k"], r["i"], r["gpu_ms"]) for r in out] == [("gpu_step", 0, 5.0), ("gpu_step", 1, 7.5)]
    assert all(set(r) == {"k", "t", "i", "gpu_ms"} for r in out)
    assert all(isinstance(r["t"], int) and isinstance(r["gpu_ms"], float) for r in out)
    assert timer.poll() == []  # reported once
    gpu.done = 4  # step 2's start only
    assert timer.poll() == []
    gpu.finish_all()
    assert [(r["i"], r["gpu_ms"]) for r in timer.poll()] == [(2, 2.0)]


def test_poll_stops_at_the_first_incomplete_step():
    gpu, timer = make_timer()
    for i in range(3):
        run_step(gpu, timer, i, 1.0)
    # make step 1's end event report done while step 0's is not: poll reports in step order and
    # must not skip step 0 (nor wait for it)
    early = FakeGPU()
    early.done = 10**9
    timer._pending[1][2].gpu = early
    assert timer.poll() == []
    gpu.finish_all()
    assert [r["i"] for r in timer.poll()] == [0, 1, 2]


def test_events_are_recycled():
    gpu, timer = make_timer()
    for i in range(3):
        run_step(gpu, timer, i, 1.0)
    assert gpu.created == 6
    gpu.finish_all()
    assert len(timer.poll()) == 3
    for i in range(3, 6):
        run_step(gpu, timer, i, 1.0)
    assert gpu.created == 6  # no new events: the completed ones were reused
    gpu.finish_all()
    assert [r["i"] for r in timer.poll()] == [3, 4, 5]


def test_end_without_start_is_ignored():
    gpu, timer = make_timer()
    timer.end(0)
    gpu.finish_all()
    assert timer.poll() == []
    assert gpu.created == 0


def test_pending_steps_are_bounded():
    assert MAX_PENDING_GPU_STEPS == 64
    gpu, timer = make_timer()
    for i in range(MAX_PENDING_GPU_STEPS + 10):  # the GPU lags far behind: nothing completes
        run_step(gpu, timer, i, 1.0)
    assert len(timer._pending) == MAX_PENDING_GPU_STEPS
    assert gpu.created == 2 * MAX_PENDING_GPU_STEPS  # untimed steps record no events
    gpu.finish_all()
    out = timer.poll()
    assert [r["i"] for r in out] == list(range(MAX_PENDING_GPU_STEPS))
    # once the GPU has caught up, steps are timed again
    run_step(gpu, timer, 200, 3.0)
    gpu.finish_all()
    assert [(r["i"], r["gpu_ms"]) for r in timer.poll()] == [(200, 3.0)]
