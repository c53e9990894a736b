"""The one verdict rule (whyidle.diagnose.verdict): chosen by measured time (`bound`), never by what
a fix can give on this machine. Regression tests for every flip issue 13 found, and a property
test over many synthetic facts: no `device_bound` while a warning/critical finding holds at least
``VERDICT_MIN_BOUND`` of the step."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_diagnose import assert_contract, make_facts, make_host, make_loader, make_step
from test_rules_keras import SEQUENTIAL_PY_MAP
from test_rules_keras import facts as keras_facts
from whyidle.diagnose import diagnose, rules, rules_batch
from whyidle.diagnose import thresholds as T
from whyidle.diagnose.trace_rules import diagnose_trace
from whyidle.diagnose.verdict import choose_verdict, limiting


def _lead(findings, verdict):
    assert findings[0]["id"] == verdict
    for f in findings:
        assert_contract(f)
    return findings[0]


@pytest.mark.parametrize("cores", [1, 2])
def test_input_bound_leads_whatever_its_fix_gains_here(cores):
    """93 % data wait with num_workers=0: on one core a worker gains ~1.05× (all of it is CPU work
    on that core), on two ~1.9×; either way the input pipeline holds the step. It was DEVICE-BOUND
    ("compute takes 6 %") when the verdict followed the fix's estimate."""
    facts = make_facts(make_step(data=0.93, fwd=0.03, bwd=0.02, opt=0.01, data_cpu_share=0.95),
                       make_host(cores=cores, cpu_busy=0.6), make_loader(nw=0))
    verdict, findings = diagnose(facts)
    f = _lead(findings, verdict)
    assert verdict == "input_bound" and f["severity"] == "critical"
    assert f["bound"] == pytest.approx(0.93)
    assert f["est_speedup_if_removed"] == pytest.approx(1 / 0.07, rel=1e-3)
    workers = next((o for o in f["fix"]["options"] if "worker process" in o["text"]), None)
    if cores == 1:  # no gain from workers: not offered beside the better fix, and the summary says so
        assert workers is None and "More workers would not help here (est. 1.0" in f["summary"]
    else:
        assert workers["est_speedup"] > 1.5 and f["fix"]["options"][0] is workers
    assert not any(g["id"] == "device_bound" for g in findings)


@pytest.mark.parametrize("busy", [0.89, 0.90])
def test_cpu_edge_gives_the_same_verdict_on_both_sides(busy):
    """At the CPU_SATURATED edge the cause may change (too_few_workers / cpu_preprocessing) but the
    verdict and the measured share do not."""
    facts = make_facts(make_step(data=0.6, fwd=0.2, bwd=0.1, opt=0.05, data_cpu_share=0.95),
                       make_host(cores=2, cpu_busy=busy, workers=1, worker_busy=0.95), make_loader(nw=1))
    verdict, findings = diagnose(facts)
    assert verdict == "input_bound" and findings[0]["bound"] == pytest.approx(0.6)


def test_keras_spinning_pools_do_not_hide_an_86_percent_input_wait():
    """TensorFlow's spinning thread pools raise the process's CPU floor, so the parallel-map fix is
    estimated low (~1.05×); 86 % of the step is still input wait."""
    facts = keras_facts(data_share=0.86, pipeline=SEQUENTIAL_PY_MAP, cores=2)
    facts.host["trainer_cores"] = 1.95
    facts = facts.replace(trainers=[1], proc={"framework": "tensorflow"}, hotspots={}, loader=None)
    verdict, findings = diagnose(facts)
    f = _lead(findings, verdict)
    assert verdict == "input_bound" and f["bound"] == pytest.approx(0.86)


def test_small_batch_counts_per_operation_overhead_as_fixed_cost():
    """Batch 2 where forward and backward are mostly per-op overhead (3,000 graph nodes at 5 µs in a
    40 ms step): the fixed share includes it, so small_batch is a warning with a bigger estimate."""
    step = make_step(data=0.0, fwd=0.35, bwd=0.45, opt=0.1, other=0.1, mean=0.04, batch=2.0)
    facts = make_facts(step, make_host(cores=2), make_loader(nw=0, batch=2))
    without = rules_batch.small_batch(facts)
    facts.graph_nodes = 3000
    f = rules_batch.small_batch(facts)
    assert_contract(f)
    assert without["bound"] == pytest.approx(0.2)
    assert f["bound"] == pytest.approx(0.2 + 3000 * T.DISPATCH_S_PER_NODE / 0.04)
    assert f["evidence"]["per_op_share"] == pytest.approx(0.375)
    assert f["est_speedup"] > without["est_speedup"] and f["severity"] == "warning"
    verdict, findings = diagnose(facts)
    assert verdict == "small_batch" and findings[0]["id"] == "small_batch"


def test_device_bound_text_agrees_with_the_shares():
    """Compute under half the step and no cause over the line: the summary says the time is spread,
    never that compute fills the step."""
    facts = make_facts(make_step(data=0.08, fwd=0.2, bwd=0.15, opt=0.05, other=0.52), make_host(cores=8),
                       make_loader(nw=4))
    facts.step["shares"]["other_host"] = 0.52
    facts.hotspots = {"other": []}
    verdict, findings = diagnose(facts)
    if verdict == "device_bound":
        assert "spread" in findings[0]["summary"]
    facts = make_facts(make_step(data=0.02, fwd=0.5, bwd=0.4, opt=0.05), make_host(cores=8), make_loader(nw=4))
    verdict, findings = diagnose(facts)
    assert verdict == "device_bound"
    assert "95%" in findings[0]["summary"] and findings[0]["bound"] == pytest.approx(0.95)


def test_placement_first_and_unknown_without_steps():
    crit = {"id": "wrong_device", "severity": "critical", "bound": None}
    big = {"id": "input_bound", "severity": "critical", "bound": 0.9}
    assert choose_verdict([big, crit]) == "wrong_device"
    assert choose_verdict([big], judged=False) == "unknown"
    assert choose_verdict([{"id": "sync_bound", "severity": "warning", "bound": 0.06}]) is None
    assert choose_verdict([{"id": "a", "severity": "info", "bound": 0.9}]) is None


def test_trace_verdict_by_measured_share():
    job = {"ranks": [{"metrics": {"has_gpu": True, "window_s": 10.0, "busy_share": 0.3,
                                  "steps": {"shares": {"dataloader": 0.5}, "dataloader_share": 0.6,
                                            "step_s": {"mean": 0.1}},
                                  "syncs": {"count": 40, "idle_after_s": 1.5, "events": []}}}]}
    verdict, findings = diagnose_trace(job, "single")
    assert verdict == "input_bound" and findings[0]["bound"] == pytest.approx(0.5)
    assert {f["id"] for f in findings} >= {"input_bound", "sync_bound"}


shares = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=shares, fwd=shares, bwd=shares, opt=shares, other=shares, cores=st.sampled_from([1, 2, 8, 64]),
       nw=st.sampled_from([0, 1, 4]), busy=shares, cpu_busy=shares, delay=st.floats(0.0, 0.6),
       batch=st.sampled_from([1.0, 2.0, 8.0, 64.0]), nodes=st.sampled_from([None, 50, 3000, 20000]),
       gpus=st.sampled_from([0, 1]), mean=st.sampled_from([0.002, 0.03, 0.4]))
def test_no_device_bound_while_a_finding_holds_the_step(data, fwd, bwd, opt, other, cores, nw, busy, cpu_busy,
                                                         delay, batch, nodes, gpus, mean):
    total = data + fwd + bwd + opt + other or 1.0
    data, fwd, bwd, opt, other = (x / total for x in (data, fwd, bwd, opt, other))
    step = make_step(data=data, fwd=fwd, bwd=bwd, opt=opt, other=other, mean=mean, batch=batch,
                     data_cpu_share=busy)
    host = make_host(cores=cores, cpu_busy=cpu_busy, workers=nw, worker_busy=busy if nw else None, run_delay=delay)
    facts = make_facts(step, host, make_loader(nw=nw, batch=int(batch)), gpus=gpus)
    facts.graph_nodes = nodes
    verdict, findings = diagnose(facts)
    for f in findings:
        assert_contract(f)
    assert findings[0]["id"] == verdict
    held = limiting([f for f in findings if f["id"] != "device_bound"])
    if held:
        assert verdict != "device_bound"
        assert findings[0]["bound"] == max(f["bound"] for f in held)
    else:
        assert verdict == "device_bound"


def test_fixed_run_is_not_told_to_undo_its_workers():
    """After the input fix (2 workers, 1 intra-op thread on 2 cores) the trainer waits for a core
    but the data wait is gone: cpu_contention must not advise fewer workers (the advice went in a
    circle); with 6 workers on 2 cores it names the count."""
    host = make_host(cores=2, cpu_busy=0.98, workers=2, worker_busy=0.6, run_delay=0.2)
    facts = make_facts(make_step(data=0.04, fwd=0.4, bwd=0.4, opt=0.1), host, make_loader(nw=2))
    facts.proc["threads"] = 1
    c = rules.cpu_contention(facts)
    assert c["evidence"]["cause"] == "oversubscription"
    assert "fewer of them would bring it back" in c["fix"]["text"] and "at most" not in c["fix"]["text"]
    assert c["est_speedup"] is None and c["bound"] == pytest.approx(0.2)  # advice only: no gain to promise
    # worker processes with no DataLoader record to plan from (the input model cannot say how many
    # this loader needs): at most one per core left by the trainers
    facts.host = make_host(cores=2, cpu_busy=0.98, workers=6, worker_busy=0.3, run_delay=0.2)
    facts.loader = None
    assert "use at most 1 loader worker per process" in rules.cpu_contention(facts)["fix"]["text"]


def test_contention_from_the_jobs_own_loading_promises_no_gain():
    """The fixed run of an input-bound job on 2 cores: 2 workers + 1 training thread keep both cores
    busy, the trainer waits for a core 23 % of the time and the step still waits for data 40 %.
    Fewer workers cannot remove that wait (they would lengthen the data wait): no gain, no
    "at most 1 worker", and the data wait is not re-attributed to contention (a fresh-user trial
    got "use at most 1 loader workers … ~2.19× faster" right after the advice to run 2)."""
    host = make_host(cores=2, cpu_busy=0.99, workers=2, worker_busy=0.8, run_delay=0.23)
    host["workers_run_delay_share"] = 0.3
    facts = make_facts(make_step(data=0.40, fwd=0.25, bwd=0.25, opt=0.05, data_cpu_share=0.1), host,
                       make_loader(nw=2))
    facts.proc["threads"] = 1
    verdict, findings = diagnose(facts)
    c = next(f for f in findings if f["id"] == "cpu_contention")
    assert c["est_speedup"] is None and "at most" not in c["fix"]["text"]
    assert "fewer workers would make that longer" in c["fix"]["text"]
    inp = next(f for f in findings if f["id"] == "input_bound")
    assert "see cpu_contention" not in inp["summary"] and "fix the CPU contention first" not in inp["fix"]["text"]
    assert verdict == "input_bound"  # 40 % of the step waits for data, 23 % for a core


def test_worker_model_uses_the_jobs_cpu_affinity():
    """A job pinned to 2 of 64 CPUs (taskset, a cpuset): the worker model plans for 2 cores."""
    step = make_step(data=0.9, fwd=0.05, bwd=0.05, opt=0.0, mean=1.0, data_cpu_share=0.95)
    wide = make_facts(step, make_host(cores=64), make_loader(nw=0))
    pinned = make_facts(step, make_host(cores=64), make_loader(nw=0))
    pinned.host["cpu_affinity"] = 2
    assert rules.loader_model(wide)["workers"] >= 8
    model = rules.loader_model(pinned)
    assert model["workers"] <= 2 and model["limit"] == "cores"
    assert model["usable_cores"] == pytest.approx(2 - 0.05)


finding_st = st.fixed_dictionaries({
    "id": st.sampled_from(["input_bound", "host_bound", "sync_bound", "small_batch", "cpu_contention", "imbalance",
                           "pageable_transfers", "wrong_device", "gpu_not_visible", "no_mixed_precision"]),
    "severity": st.sampled_from(["critical", "warning", "info"]),
    "bound": st.one_of(st.none(), st.floats(0.0, 1.0)),
    "est_speedup": st.one_of(st.none(), st.floats(1.0, 20.0)),
})


@settings(max_examples=500, deadline=None)
@given(st.lists(finding_st, max_size=6))
def test_choose_verdict_never_device_bound_while_a_finding_holds_the_step(findings):
    """The rule itself, as every caller (live, Keras, traces) uses it, over arbitrary findings."""
    verdict = choose_verdict(findings)
    placement = [f for f in findings if f["id"] in ("wrong_device", "gpu_not_visible") and f["severity"] == "critical"]
    held = limiting(findings)
    if placement:
        assert verdict == placement[0]["id"]
    elif held:
        assert verdict is not None
        top = max(f["bound"] for f in held)
        assert any(f["id"] == verdict and f["bound"] == top for f in held)
    else:
        assert verdict is None  # device_bound
