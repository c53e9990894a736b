"""The measured "make each sample cheaper" estimate (whyidle.diagnose.sample_cost and its use in
``input_bound``): synthetic data-phase hotspots, no process run."""

from __future__ import annotations

import pytest

from test_diagnose import assert_contract, make_facts, make_host, make_loader, make_step
from whyidle.diagnose import rules, sample_cost


def line(site, share, leaf, code=None):
    return {"site": site, "seconds": share * 10, "share": share, "leaf": leaf, "code": code}


def func(name, share, lines, library=False):
    return {"function": name, "site": lines[0]["site"] if lines else name, "seconds": share * 10, "share": share,
            "samples": 100, "leaf": lines[0]["leaf"] if lines else None, "library": library, "framework": False,
            "code": None, "lines": lines}


#: 0.8 of the step is data wait: the pandas lookups (0.5 + 0.2 of the step) are the program's own work;
#: the loop line's collation (0.05) and a library's own time (0.05) stay.
PANDAS = [
    func("ds.py <listcomp>", 0.5, [line("ds.py:51 <listcomp>", 0.5, "pandas/core/common.py:384 f", "values = [...]")]),
    func("ds.py __getitem__", 0.2, [line("ds.py:50 __getitem__", 0.2, "pandas/core/indexing.py:1 iloc", "row = df.iloc[i]")]),
    func("train.py main", 0.05, [line("train.py:85 main", 0.05, "torch/utils/data/_utils/fetch.py:54 <listcomp>")]),
    func("torch/x.py f", 0.05, [], library=True),
]


def test_the_programs_own_lines_count_and_the_loaders_collation_stays():
    cost = sample_cost.measured_cost(PANDAS, 0.8, 0)
    assert cost.removed == pytest.approx(0.7 / 0.8)
    assert cost.cost == pytest.approx(0.1 / 0.8)
    assert [h.site for h in cost.lines] == ["ds.py:51 <listcomp>", "ds.py:50 __getitem__"]
    assert cost.lines[0].share == pytest.approx(0.625)
    assert "88% of the loading time" in sample_cost.describe(cost) and "`values = [...]` (ds.py:51) 62%" in sample_cost.describe(cost)


def test_no_measurement_with_workers_or_without_the_programs_lines():
    assert sample_cost.measured_cost(PANDAS, 0.8, 2) is None  # the workers' stacks are not sampled
    assert sample_cost.measured_cost(PANDAS[2:], 0.8, 0) is None  # only collation and library time
    assert sample_cost.measured_cost([], 0.8, 0) is None
    assert sample_cost.measured_cost(PANDAS, 0.0, 0) is None


def test_decoding_lines_stay_and_unlisted_lines_of_a_decoding_function_do_not_count():
    # __getitem__ holds 0.6 of the step: its decode line 0.3 stays, its augment line 0.2 counts, and
    # the 0.1 on lines not listed may be more decoding (Image.open(...).convert under the top lines):
    # not counted. Without decoding the unlisted lines count (a function counts whole).
    funcs = [func("ds.py __getitem__", 0.6, [line("ds.py:20 __getitem__", 0.3, "PIL/ImageFile.py:300 load"),
                                              line("ds.py:22 __getitem__", 0.2, "PIL/ImageOps.py:181 autocontrast")])]
    cost = sample_cost.measured_cost(funcs, 0.6, None)
    assert cost.removed == pytest.approx(0.2 / 0.6)
    plain = [func("ds.py __getitem__", 0.6, [line("ds.py:21 __getitem__", 0.3, "numpy/core/fromnumeric.py:59 _wrapfunc"),
                                              line("ds.py:22 __getitem__", 0.2, "PIL/ImageOps.py:181 autocontrast")])]
    assert sample_cost.measured_cost(plain, 0.6, None).removed == pytest.approx(1.0)
    assert [h.site for h in cost.lines] == ["ds.py:22 __getitem__"]
    assert sample_cost.decodes("PIL/Image.py:3300 open") and not sample_cost.decodes("PIL/Image.py:2440 resize")
    # ImageEnhance.Color converts each in-memory sample: a conversion, not decoding (which runs under
    # ImageFile.load); the randaugment scenario's estimate once ranked as assumed by this leaf
    assert not sample_cost.decodes("PIL/Image.py:1100 convert") and sample_cost.decodes("PIL/ImageFile.py:300 load")
    # a line that opens the image decodes even when its most-sampled frame is the resize after it
    opened = [func("ds.py __getitem__", 0.8, [line("ds.py:63 __getitem__", 0.75, "PIL/Image.py:2440 resize"),
                                               line("ds.py:60 __getitem__", 0.02, "ds.py:60 __getitem__")])]
    assert not sample_cost.decoding(opened)
    opened[0]["lines"][1]["code"] = "img = Image.open(io.BytesIO(self.blobs[idx]))"
    assert sample_cost.decoding(opened) and not sample_cost.decoding(funcs[:0])


def test_input_bound_prints_the_measured_cheaper_sample_first_when_it_gains_most():
    # data 0.8 of a 0.1 s step in the main process on 2 cores: the pandas lines removed leave
    # 0.1 of the step's loading: 0.1 / (0.1 − 0.08 × 0.875) = 3.33×; workers are capped by the cores
    facts = make_facts(make_step(data=0.8, fwd=0.08, bwd=0.08, opt=0.04, mean=0.1, data_cpu_share=0.95),
                       make_host(cores=2, cpu_busy=0.6), make_loader(nw=0), hotspots={"data": PANDAS})
    f = rules.input_bound(facts)
    assert_contract(f)
    first = f["fix"]["options"][0]
    assert first["text"].startswith("Make each sample cheaper") and not first["assumed"]
    assert first["est_speedup"] == f["est_speedup"] == pytest.approx(1 / (1 - 0.7), rel=1e-3)
    assert "88% of the loading time" in first["text"]
    assert f["est_speedup_if_removed"] == pytest.approx(5.0) and f["evidence"]["est_terms"] == "step"
    sc = f["evidence"]["sample_cost"]
    assert sc["removed_share_of_loading"] == pytest.approx(0.875) and sc["est_speedup"] == pytest.approx(3.333, rel=1e-3)
    assert sc["est_speedup_with_workers"] >= sc["est_speedup"]
    workers = next(o for o in f["fix"]["options"] if "worker process" in o["text"])
    assert workers["est_speedup"] < first["est_speedup"]


def test_a_small_measured_gain_does_not_go_before_the_workers():
    # only 0.1 of the step is the program's own work: ≈1.14×; 2 workers on 8 cores gain more
    funcs = [func("ds.py __getitem__", 0.1, [line("ds.py:50 __getitem__", 0.1, "numpy/core/x.py:1 f")]),
             func("train.py main", 0.5, [line("train.py:85 main", 0.5, "torch/utils/data/_utils/fetch.py:54 <listcomp>")])]
    facts = make_facts(make_step(data=0.6, fwd=0.2, bwd=0.15, opt=0.05, mean=0.1, data_cpu_share=0.95),
                       make_host(cores=8), make_loader(nw=0), hotspots={"data": funcs})
    f = rules.input_bound(facts)
    cheaper = next(o for o in f["fix"]["options"] if o["text"].startswith("Make each sample cheaper"))
    assert cheaper["est_speedup"] == pytest.approx(1 / (1 - 0.1), rel=1e-3) and not cheaper["assumed"]
    assert f["fix"]["options"][0]["est_speedup"] > cheaper["est_speedup"]
    assert "worker process" in f["fix"]["options"][0]["text"]


def test_without_a_measurement_the_cheaper_sample_stays_an_assumption():
    facts = make_facts(make_step(data=0.8, fwd=0.08, bwd=0.08, opt=0.04, mean=0.1, data_cpu_share=0.95),
                       make_host(cores=2), make_loader(nw=2), hotspots={"data": PANDAS})
    f = rules.input_bound(facts)
    assert f["evidence"]["sample_cost"] is None
    assert all(o["assumed"] for o in f["fix"]["options"] if o["text"].startswith(("Make each", "All cores")))
    assert f["est_speedup"] is not None


def test_loader_model_scales_the_wait_by_the_measured_cost():
    facts = make_facts(make_step(data=0.5, mean=0.1, data_cpu_share=0.95), make_host(cores=2), make_loader(nw=0))
    assert rules.loader_model(facts, 0.2)["est_speedup_cheaper"] == pytest.approx(0.1 / (0.1 - 0.05 * 0.8))
    assert rules.loader_model(facts)["est_speedup_cheaper"] == pytest.approx(0.1 / 0.075)  # the assumed 2×


def test_the_steps_that_began_an_epoch_count_in_the_meter_figure():
    # 20 analyzed steps waiting 0.06 s each, 2 epoch-starting steps left out holding 0.9 s of data wait
    facts = make_facts(make_step(data=0.6, mean=0.1, steps=20, data_cpu_share=0.1), make_host(cores=2, worker_busy=0.9,
                       workers=4), make_loader(nw=4))
    facts.steps_info = {"total": 24, "warmup": 2, "boundary_excluded": 2, "boundary_s": 1.0, "boundary_data_s": 0.9}
    assert rules.data_wait_with_boundaries(facts) == pytest.approx((0.06 * 20 + 0.9) / 22)
    f = rules.input_bound(facts)
    assert f["evidence"]["data_wait_s_per_step_with_boundaries"] == pytest.approx(0.0955, abs=1e-4)
    assert "Counting the 2 steps that began an epoch" in f["summary"] and "95.5 ms a step" in f["summary"]
    facts.steps_info = {"total": 22, "warmup": 2, "boundary_excluded": 0, "boundary_s": 0.0, "boundary_data_s": 0.0}
    assert rules.data_wait_with_boundaries(facts) is None


def _contended(workers_cores, delay):
    host = make_host(cores=2, cpu_busy=1.0, workers=4, worker_busy=workers_cores / 4)
    host["trainer_run_delay_share"] = delay
    return make_facts(make_step(data=0.1, mean=0.1, data_cpu_share=0.05), host, make_loader(nw=4),
                      devices={"threads": 2})


def test_cpu_contention_advises_no_workers_when_loading_in_the_trainer_is_faster():
    # 4 workers use 0.3 cores (30 ms of CPU a 100 ms step) and the trainer waits for a core 60 % of
    # the time: its 90 ms of compute would take 45 ms alone, + 30 ms of loading = 75 ms: 1.33×
    f = rules.cpu_contention(_contended(0.3, 0.6))
    assert f["evidence"]["cause"] == "oversubscription"
    assert f["est_speedup"] == pytest.approx(0.1 / 0.075, rel=1e-3)
    assert "num_workers=0" in f["fix"]["text"] and "num_workers=0" in f["fix"]["code"]
    assert "would bring it back" not in f["fix"]["text"]
    assert f["evidence"]["no_workers"]["predicted_step_s"] == pytest.approx(0.075)


def test_cpu_contention_keeps_the_workers_when_their_loading_costs_more_than_the_wait():
    # 1.2 cores of loading (120 ms a step): in the trainer the step would be 165 ms, slower
    f = rules.cpu_contention(_contended(1.2, 0.5))
    assert f["est_speedup"] is None and "num_workers=0" not in f["fix"]["text"] and f["evidence"]["no_workers"] is None
    assert rules.loading_in_trainer(_contended(1.2, 0.5))["est_speedup"] < 1


@pytest.mark.parametrize("cores, nw, cpu, per_sample, data", [
    (1, 0, 0.95, None, 0.93),        # one core: workers gain nothing, the cheaper sample (assumed) leads
    (2, 0, 0.1, 2_000_000, 0.7),     # storage
    (8, 2, 0.95, None, 0.6),         # too few workers
    (1, 0, 0.95, None, 0.3),         # a small wait on one core
])
def test_every_warning_input_bound_carries_both_estimates(cores, nw, cpu, per_sample, data):
    host = make_host(cores=cores, workers=nw, worker_busy=cpu if nw else None, per_sample=per_sample)
    facts = make_facts(make_step(data=data, fwd=(1 - data) / 2, bwd=(1 - data) / 2 - 0.01, opt=0.01,
                                 data_cpu_share=cpu), host, make_loader(nw=nw))
    f = rules.input_bound(facts)
    assert f["severity"] in ("warning", "critical")
    assert f["est_speedup"] is not None and f["est_speedup_if_removed"] is not None
    assert f["est_speedup"] <= f["est_speedup_if_removed"] + 1e-9 and f["evidence"]["est_terms"] == "step"


def test_the_focus_function_floors_what_many_small_helpers_hold():
    # a tokenizer spread over helpers: the listed ones hold 60 % of the loading, the function
    # holding them all 98 % inclusively; the DataLoader's collation (5 % of the loading) stays
    spots = [{"function": f"tok.py h{i}", "share": 0.12, "library": False, "framework": False,
              "lines": [{"site": f"tok.py:{i} h{i}", "share": 0.12, "leaf": f"tok.py:{i} h{i}"}]} for i in range(3)]
    spots.append({"function": "train.py main", "share": 0.03, "library": False, "framework": False,
                  "lines": [{"site": "train.py:9 main", "share": 0.03, "leaf": "torch/utils/data/_utils/collate.py:1 f"}]})
    from whyidle.diagnose.sample_cost import measured_cost

    alone = measured_cost(spots, 0.6, 0)
    floored = measured_cost(spots, 0.6, 0, {"share_of_phase": 0.98})
    assert alone.removed == pytest.approx(0.6)
    assert floored.removed == pytest.approx(0.98 - 0.05)
    # with image decoding in the loading, no floor: the decoding stays and may not all be listed
    spots[0]["lines"][0]["leaf"] = "PIL/JpegImagePlugin.py:400 load_read"
    assert measured_cost(spots, 0.6, 0, {"share_of_phase": 0.98}).removed < 0.5
