"""Step records → step metrics (whyidle.analysis.steps), on synthetic step records."""

from __future__ import annotations

import pytest

from whyidle.analysis import steps as S
from whyidle.analysis.steps import percentile, select_steps, step_metrics, steps_of

MS = 1_000_000  # ns per millisecond


def step(i, t0_ms, t1_ms, data=0, fwd=0, bwd=0, opt=0, ev=0, batches=1, samples=32, cpu=0, data_cpu=0,
         by="optimizer", boundary=False):
    return {"k": "step", "t": t1_ms * MS, "i": i, "t0": t0_ms * MS, "t1": t1_ms * MS, "by": by,
            "data": data * MS, "fwd": fwd * MS, "bwd": bwd * MS, "opt": opt * MS, "eval": ev * MS,
            "batches": batches, "samples": samples, "cpu": cpu * MS, "data_cpu": data_cpu * MS,
            "boundary": boundary}


def uniform(n, ms=100, **kw):
    return [step(i, i * ms, (i + 1) * ms, **kw) for i in range(n)]


# -- steps_of ------------------------------------------------------------------------------------

def test_steps_of_keeps_only_step_records():
    recs = [{"k": "proc", "t": 0}, step(0, 0, 10, by="loader"), {"k": "notice", "t": 5, "msg": "x"},
            step(1, 10, 20, by="loader"), {"k": "stacks", "t": 30, "sites": []}]
    out = steps_of(recs)
    assert [s["i"] for s in out] == [0, 1]
    assert all("gpu_ms" not in s for s in out)  # no gpu_step records: nothing merged


def test_optimizer_steps_win_over_loader_steps():
    recs = [step(0, 0, 10, by="loader"), step(1, 10, 20, by="loader"),
            step(2, 20, 30, by="optimizer"), step(3, 30, 40, by="optimizer"), step(4, 40, 50, by="loader")]
    assert [s["i"] for s in steps_of(recs)] == [2, 3]


def test_gpu_step_merge_by_index():
    recs = [step(0, 0, 10), step(1, 10, 20), step(2, 20, 30),
            {"k": "gpu_step", "t": 25, "i": 0, "gpu_ms": 4.5},
            {"k": "gpu_step", "t": 35, "i": 2, "gpu_ms": 6.25},
            {"k": "gpu_step", "t": 36, "i": 99, "gpu_ms": 1.0}]  # a step not kept: ignored
    out = steps_of(recs)
    assert [s.get("gpu_ms") for s in out] == [4.5, None, 6.25]
    assert "gpu_ms" not in recs[0]  # input records are not mutated


def test_gpu_merge_uses_kept_steps_only():
    recs = [step(0, 0, 10, by="loader"), step(1, 10, 20, by="optimizer"),
            {"k": "gpu_step", "t": 25, "i": 0, "gpu_ms": 1.0}, {"k": "gpu_step", "t": 26, "i": 1, "gpu_ms": 2.0}]
    out = steps_of(recs)
    assert [(s["i"], s["gpu_ms"]) for s in out] == [(1, 2.0)]


def test_steps_of_empty():
    assert steps_of([]) == []
    assert steps_of([{"k": "proc", "t": 0}]) == []


# -- select_steps --------------------------------------------------------------------------------

@pytest.mark.parametrize("n, warmup", [(0, 0), (1, 0), (2, 0), (3, 1), (9, 1), (10, 2), (50, 2)])
def test_warmup_counts(n, warmup):
    steps = uniform(n)
    analyzed, info = select_steps(steps)
    assert info == {"total": n, "warmup": warmup, "boundary_excluded": 0, "boundary_s": 0.0, "boundary_data_s": 0.0,
                    "profiled_excluded": 0, "compile_excluded": 0}
    assert analyzed == steps[warmup:]


def test_warmup_constants():
    assert (S.WARMUP_STEPS_LONG, S.WARMUP_STEPS_SHORT, S.MIN_STEPS_FOR_LONG_WARMUP) == (2, 1, 10)
    assert S.MAX_BOUNDARY_FRACTION_TO_EXCLUDE == 0.3


def test_rare_boundary_steps_are_excluded():
    # 20 steps, 2 warm-up → 18 considered; 5 boundary steps (5 ≤ 0.3 × 18 = 5.4) are left out
    steps = uniform(20)
    for i in (0, 5, 9, 13, 17, 19):  # step 0 is warm-up: not counted as a boundary
        steps[i]["boundary"] = True
    steps[5]["t1"] = steps[5]["t0"] + 400 * MS  # a 0.4 s boundary step
    steps[5]["data"] = 300 * MS  # 0.3 s of it waiting for the new epoch's first batch
    analyzed, info = select_steps(steps)
    assert info["warmup"] == 2
    assert info["boundary_excluded"] == 5
    assert info["boundary_s"] == pytest.approx(0.4 + 4 * 0.1)
    assert info["boundary_data_s"] == pytest.approx(0.3 + sum((steps[i].get("data") or 0) / 1e9 for i in (9, 13, 17, 19)))
    assert [s["i"] for s in analyzed] == [i for i in range(2, 20) if i not in (5, 9, 13, 17, 19)]


def test_common_boundary_steps_are_the_steady_state():
    # 6 of 18 = 33 % > 30 %: kept
    steps = uniform(20)
    for i in (2, 5, 8, 11, 14, 17):
        steps[i]["boundary"] = True
    analyzed, info = select_steps(steps)
    assert info["boundary_excluded"] == 0 and info["boundary_s"] == 0.0
    assert len(analyzed) == 18


def test_boundary_limit_at_exactly_30_percent():
    # 12 steps → 2 warm-up, 10 left; 3 boundary steps = 30 % exactly → excluded
    steps = uniform(12)
    for i in (3, 6, 9):
        steps[i]["boundary"] = True
    analyzed, info = select_steps(steps)
    assert info["boundary_excluded"] == 3
    assert len(analyzed) == 7
    # one more boundary step (4 of 10 = 40 %) → all kept
    steps[10]["boundary"] = True
    analyzed, info = select_steps(steps)
    assert info["boundary_excluded"] == 0
    assert len(analyzed) == 10


def test_boundary_in_short_run():
    # 5 steps → 1 warm-up, 4 left, 1 boundary (25 %) leaving 3 → excluded
    steps = uniform(5)
    steps[2]["boundary"] = True
    analyzed, info = select_steps(steps)
    assert info["boundary_excluded"] == 1
    assert [s["i"] for s in analyzed] == [1, 3, 4]
    # 4 steps → 1 warm-up, 3 left, 1 boundary (33 %) → kept
    steps = uniform(4)
    steps[2]["boundary"] = True
    analyzed, info = select_steps(steps)
    assert info["boundary_excluded"] == 0
    assert len(analyzed) == 3


# -- percentile ----------------------------------------------------------------------------------

def test_percentile_linear_interpolation():
    assert percentile([5.0], 90) == 5.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0


# -- step_metrics --------------------------------------------------------------------------------

def four_steps():
    """Step times 0.1, 0.2, 0.1, 0.3 s (total 0.7 s) with known phase times (ms)."""
    return [
        step(0, 0, 100, data=20, fwd=30, bwd=30, opt=10, batches=1, samples=32, cpu=80, data_cpu=10),
        step(1, 100, 300, data=100, fwd=40, bwd=40, opt=10, batches=1, samples=32, cpu=150, data_cpu=20),
        step(2, 300, 400, data=10, fwd=30, bwd=30, opt=10, batches=1, samples=16, cpu=90, data_cpu=5),
        step(3, 400, 700, data=70, fwd=40, bwd=40, opt=10, ev=20, batches=2, samples=48, cpu=160, data_cpu=5),
    ]


def test_step_metrics_exact_values():
    m = step_metrics(four_steps())
    assert m["steps"] == 4
    assert m["window"] == [0, 700 * MS]
    assert m["wall_s"] == pytest.approx(0.7)
    sh = m["shares"]
    assert set(sh) == {"data_wait", "forward", "backward", "optimizer", "eval", "other_host"}
    assert sh["data_wait"] == pytest.approx(200 / 700)
    assert sh["forward"] == pytest.approx(140 / 700)
    assert sh["backward"] == pytest.approx(140 / 700)
    assert sh["optimizer"] == pytest.approx(40 / 700)
    assert sh["eval"] == pytest.approx(20 / 700)
    assert sh["other_host"] == pytest.approx(160 / 700)
    assert sum(sh.values()) == pytest.approx(1.0)
    assert m["samples_per_s"] == pytest.approx(128 / 0.7)
    assert m["steps_per_s"] == pytest.approx(4 / 0.7)
    # samples per batch: 32, 32, 16, 24 → median 28
    assert m["batch_size"] == pytest.approx(28.0)
    assert m["batches_per_step"] == 1.0
    st = m["step_time_s"]
    assert st["p50"] == pytest.approx(0.15)
    assert st["p90"] == pytest.approx(0.27)  # sorted .1 .1 .2 .3, position 2.7
    assert st["mean"] == pytest.approx(0.175)
    assert st["min"] == pytest.approx(0.1) and st["max"] == pytest.approx(0.3)
    assert m["data_wait_s_per_step"] == pytest.approx(0.05)
    assert m["compute_s_per_step"] == pytest.approx(0.125)
    assert m["data_cpu_share"] == pytest.approx(40 / 200)
    assert m["main_cpu_share"] == pytest.approx(480 / 700)
    assert m["gpu_ms"] is None


def test_samples_per_s_uses_steps_with_known_samples_only():
    steps = four_steps()
    steps[2]["samples"] = None
    m = step_metrics(steps)
    assert m["samples_per_s"] == pytest.approx((32 + 32 + 48) / 0.6)
    assert m["batch_size"] == pytest.approx(32.0)  # median of 32, 32, 24


def test_no_samples_known():
    steps = uniform(4, samples=None)
    m = step_metrics(steps)
    assert m["samples_per_s"] is None
    assert m["batch_size"] is None


def test_data_cpu_share_none_without_data_wait():
    m = step_metrics(uniform(3, fwd=50, bwd=40))
    assert m["data_cpu_share"] is None
    assert m["shares"]["data_wait"] == 0.0
    assert m["shares"]["other_host"] == pytest.approx(0.1)


def test_other_host_never_negative():
    # overlapping accounting (phases summing above the step time) clamps other_host at 0
    m = step_metrics([step(0, 0, 100, data=60, fwd=30, bwd=30)])
    assert m["shares"]["other_host"] == 0.0


def test_gpu_ms_percentiles():
    steps = uniform(4)
    for s, g in zip(steps, (5.0, None, 7.0, 9.0)):
        s["gpu_ms"] = g
    m = step_metrics(steps)
    assert m["gpu_ms"] == {"p50": 7.0, "mean": 7.0}


def test_missing_eval_key_counts_as_zero():
    steps = uniform(3, fwd=50)
    for s in steps:
        del s["eval"]
    m = step_metrics(steps)
    assert m["shares"]["eval"] == 0.0
    assert m["shares"]["forward"] == pytest.approx(0.5)


def test_single_step():
    m = step_metrics([step(0, 1000, 1250, data=50, fwd=100, samples=8)])
    assert m["step_time_s"] == {"p50": 0.25, "p90": 0.25, "mean": 0.25, "min": 0.25, "max": 0.25}
    assert m["samples_per_s"] == pytest.approx(32.0)
    assert m["batch_size"] == 8
    assert m["window"] == [1000 * MS, 1250 * MS]


def test_step_metrics_empty_raises():
    with pytest.raises(ValueError):
        step_metrics([])


# -- rows of the columnar step table (what load_run builds) --------------------------------------

def table_of(records):
    from whyidle.record.steptable import StepTable

    table = StepTable()
    for r in records:
        (table.add if r["k"] == "step" else table.add_gpu)(r)
    return table


def test_step_table_rows_give_the_same_metrics_as_dicts():
    recs = four_steps() + [{"k": "gpu_step", "t": 1, "i": 1, "gpu_ms": 3.0}]
    rows = steps_of(table_of(recs))
    assert [s["i"] for s in rows] == [0, 1, 2, 3]
    assert [s["gpu_ms"] for s in rows] == [None, 3.0, None, None]
    m_rows, m_dicts = step_metrics(rows), step_metrics(steps_of(recs))
    assert m_rows == m_dicts
    assert m_rows["gpu_ms"] == {"p50": 3.0, "mean": 3.0}


def test_step_table_optimizer_steps_win():
    recs = [step(0, 0, 10, by="loader"), step(1, 10, 20, by="optimizer"), step(2, 20, 30, by="optimizer")]
    assert [s["i"] for s in steps_of(table_of(recs))] == [1, 2]


def test_step_table_rows_without_eval_field():
    recs = four_steps()
    for r in recs:
        del r["eval"]
        del r["boundary"]
    m = step_metrics(steps_of(table_of(recs)))
    assert m["shares"]["eval"] == 0.0
    assert m["shares"]["data_wait"] == pytest.approx(200 / 700)


def test_whyidle_boundary_work_is_left_out_of_the_shares():
    """A 10 ms step holding 1 ms of whyidle's own boundary work ("wi") and 2 ms of the program's
    host work: other_host is 2/9 of the program's step, never 3/10."""
    steps = []
    for i in range(4):
        s = step(i, 10 * i, 10 * (i + 1), data=1, fwd=3, bwd=2, opt=1)
        s["wi"] = 1 * MS
        steps.append(s)
    m = step_metrics(steps)
    assert m["shares"]["other_host"] == pytest.approx(2 / 9)
    assert m["shares"]["forward"] == pytest.approx(3 / 9)
    assert m["whyidle_share"] == pytest.approx(0.1)
    assert m["step_time_s"]["mean"] == pytest.approx(0.010)  # step times stay wall time
