"""The reader's fast type tests (record/schema._compile, whole lists of numbers at once) decide as
the reference check (schema.check, which names what is wrong) on every value."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from whyidle.record import schema
from whyidle.record.schema import INT, NUM, TEXT, list_of, map_of, opt, row

LIMIT = 2**63
number = st.one_of(st.integers(-10**6, 10**12), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([LIMIT, LIMIT - 1, -LIMIT, -LIMIT + 1, 2**70, float(LIMIT), -float(LIMIT),
                                    9.2e18, 0.0, -0.0, 1e308]))
item = st.one_of(number, st.none(), st.booleans(), st.text(max_size=2), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=1), st.integers(), max_size=1))
mostly_numbers = st.lists(st.one_of(number, number, number, item), max_size=14)
SPECS = [list_of(NUM), map_of(NUM), opt(list_of(NUM)),
         schema.SCHEMAS["host"]["procs"],
         row(INT, opt(INT), NUM, NUM, NUM, opt(NUM), opt(NUM), min_len=5),
         row(NUM, NUM, min_len=2), row(INT, INT), row(NUM, NUM, NUM, exact=True),
         list_of(row(TEXT, NUM, NUM, NUM, exact=True)), schema.SCHEMAS["stacks"]["sites"],
         row(TEXT, opt(TEXT), schema.ANY, NUM, min_len=2)]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(SPECS))),
       st.one_of(mostly_numbers, st.lists(mostly_numbers, max_size=3), item,
                 st.dictionaries(st.text(max_size=2), st.one_of(number, item), max_size=5)))
def test_the_fast_test_decides_as_the_reference_check(which, value):
    spec = SPECS[which]
    fast = schema._compile(spec)
    assert fast(value) == (schema.check(value, spec) is None), (spec, value)


def test_a_host_tick_with_one_bad_number_is_left_out():
    tick = {"k": "host", "t": 5, "cpu": {"user": 1.0, "idle": 2}, "percpu_busy_s": [1.0, 2.5],
            "procs": [[10, 1, 0.5, 100, 2, 1, 1, 0, 0, 0, 0, 0.0]]}
    assert schema.problem(tick) is None
    for path, bad in ((("cpu", "idle"), math.nan), (("percpu_busy_s", 1), math.inf), (("procs", 0, 0), 1.5),
                      (("procs", 0, 2), True), (("procs", 0, 3), None), (("cpu", "user"), 2.0**64)):
        t = json.loads(json.dumps(tick))
        box = t
        for key in path[:-1]:
            box = box[key]
        box[path[-1]] = bad
        assert schema.problem(t), (path, bad)
    t = json.loads(json.dumps(tick))
    t["procs"][0][1] = None  # a ppid may be unknown
    assert schema.problem(t) is None
