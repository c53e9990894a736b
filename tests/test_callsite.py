"""instrument/callsite.py: the source text of a call's arguments, as the program wrote them."""

from __future__ import annotations

import sys

from whyidle.instrument.callsite import MAX_ARG_CHARS, call_arguments

SPEC = {"dataset": 0, "collate_fn": None}


def DataLoader(*args, **kwargs):  # noqa: N802  (stands in for torch's, seen from the callee)
    return call_arguments(sys._getframe(1), SPEC, "DataLoader")


class Holder:
    train_ds = [1, 2, 3]

    @staticmethod
    def collate(batch):
        return batch


def test_positional_and_keyword_arguments_across_lines():
    self = Holder()
    got = DataLoader(self.train_ds,  # the user's own name: pasting the fix works
                     batch_size=32,
                     collate_fn=self.collate)
    assert got == {"dataset": "self.train_ds", "collate_fn": "self.collate"}


def test_dataset_passed_by_keyword_and_nested_calls_on_the_line():
    datasets = {"train": [0] * 4}
    got = len(DataLoader(dataset=datasets["train"], batch_size=len("ab"))), DataLoader(dataset=datasets["train"])
    assert got[1] == {"dataset": 'datasets["train"]'}


def test_non_ascii_text_before_the_call_and_a_starred_argument():
    é = [1]
    got = [DataLoader(é, batch_size=1)][0]  # columns are UTF-8 byte offsets
    assert got == {"dataset": "é"}
    assert DataLoader(*[é]) == {}


def test_too_long_or_unavailable_source_gives_nothing():
    long_name = [0]
    assert DataLoader([long_name] * 1 + [long_name for _ in range(3) if MAX_ARG_CHARS > 1 and True]
                      + [long_name] * 2 + [long_name] * 3) == {}
    namespace = {"DataLoader": DataLoader}
    exec("out = DataLoader([1, 2])", namespace)  # no file behind <string>
    assert namespace["out"] == {}


def test_a_call_to_something_else_gives_nothing():
    def prepare(*args):  # e.g. accelerator.prepare(model, loader) building a new DataLoader inside
        return call_arguments(sys._getframe(1), SPEC, "DataLoader")

    assert prepare([1], [2]) == {}
