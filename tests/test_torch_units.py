"""Small pure pieces of the PyTorch instrumentation: batch sizes and the non-synchronizing CUDA step
timer (with a fake event class; no GPU needed)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from whyidle.instrument.torch import batch_size_of

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
    ({"input_ids": [[1, 2, 3], [4, 5, 6]], "labels": [0, 1]}, 2),  # a field of per-sample lists: its rows
    ({"image": [[[0.0] * 4] * 3] * 5, "label": [0] * 5}, 5),  # nested-list images (lists_unpickle.py)
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
