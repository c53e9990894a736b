"""``small_batch``'s step-time model (whyidle.diagnose.batch_model), ``emulated_precision``'s decision
at the model's own shapes (whyidle.diagnose.rules_precision), both on synthetic facts, and the
agent's layer-shape probe (whyidle.instrument.shape_probe) on a real model."""

from __future__ import annotations

import pytest
from test_rules_precision import cpu_audit, cpu_facts
from test_rules_work import make_facts, make_step

from whyidle.diagnose import batch_model, rules_batch
from whyidle.diagnose.rules_precision import emulated_precision, native_units


def rows(sizes_times):
    out, t = [], 0
    for samples, seconds in sizes_times:
        out.append({"t0": t, "t1": t + int(seconds * 1e9), "samples": samples, "batches": 1})
        t += int(seconds * 1e9)
    return out


def test_fit_through_two_batch_sizes():
    # T(b) = 2 ms + 0.5 ms × b: 30 steps of 4 samples, 5 last partial batches of 1
    fit = batch_model.fit_batches(rows([(4, 0.004)] * 30 + [(1, 0.0025)] * 5))
    assert fit["a_s"] == pytest.approx(0.002) and fit["c_s"] == pytest.approx(0.0005)
    assert fit["sizes"] == [1, 4] and fit["steps"] == [5, 30]


@pytest.mark.parametrize("steps", [
    [(4, 0.004)] * 30,  # one size
    [(4, 0.004)] * 30 + [(1, 0.0025)] * 2,  # the other size too rare
    [(8, 0.006)] * 30 + [(7, 0.0055)] * 5,  # sizes too close
    [(4, 0.004)] * 30 + [(1, 0.005)] * 5,  # the smaller batch slower: no physical fit
])
def test_no_fit_without_two_clear_sizes(steps):
    assert batch_model.fit_batches(rows(steps)) is None


SHARES = {"data_wait": 0.0, "forward": 0.3, "backward": 0.3, "optimizer": 0.3, "other_host": 0.1}


def test_the_fit_basis_wins():
    fit = {"a_s": 0.002, "c_s": 0.0005, "sizes": [1, 4], "steps": [5, 30]}
    m = batch_model.step_at(SHARES, 0.004, 4, 32, 0.0, None, fit)
    assert m["basis"] == "batch_sizes" and m["step_s_at_target"] == pytest.approx(0.018)
    # (32 / 18 ms) / (4 / 4 ms)
    assert m["est"] == pytest.approx(32 / 0.018 / 1000, rel=1e-6)


def probe_record(batch=2, target=32, at_b=0.001, at_t=0.004, dtype=None, covered=1.0):
    low = dtype is not None
    return {"dtype": dtype, "batch": batch, "target": target, "covered": covered,
            "shapes": [{"kind": "linear", "in": [batch, 64], "w": [64, 64], "float32_s": at_b,
                        "lowp_s": at_b if low else None, "float32_target_s": at_t,
                        "lowp_target_s": at_t if low else None}]}


def test_the_layer_probe_grows_forward_and_backward_by_three_times_the_layers():
    # step 10 ms: host 4 ms, forward+backward 6 ms; the layers' forward 1 ms → 4 ms at 32; the 3 ms
    # outside the layers' products all per-step overhead (the graph's nodes cost that much)
    m = batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, probe_record(), None, node_fixed_s=1.0)
    assert m["basis"] == "layer_probe"
    assert m["step_s_at_target"] == pytest.approx(0.004 + 0.006 + 3 * 0.003)
    assert m["est"] == pytest.approx(16 * 0.010 / 0.019)
    # fixed: host + forward/backward beyond the layers' three passes (6 − 3 ms)
    assert m["fixed_s"] == pytest.approx(0.007)
    # half the layers' time probed: the growth counts twice
    half = batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, probe_record(covered=0.5), None, node_fixed_s=1.0)
    assert half["step_s_at_target"] == pytest.approx(0.010 + 3 * 0.006)
    # a layer called twice per step (two encoder layers of one shape) counts twice
    twice = probe_record()
    twice["shapes"][0]["calls"] = 2
    m2 = batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, twice, None, node_fixed_s=1.0)
    assert m2["step_s_at_target"] == pytest.approx(0.010 + 3 * 0.006)


def test_what_the_graph_nodes_do_not_explain_grows_with_the_batch():
    # 3 ms outside the layers' products, of which the nodes' overhead explains 1 ms: 2 ms per-sample
    m = batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, probe_record(), None, node_fixed_s=0.001)
    assert m["step_s_at_target"] == pytest.approx(0.004 + 0.003 + 3 * 0.003 + 0.001 + 0.002 * 16)
    assert m["fixed_s"] == pytest.approx(0.004 + 0.001)


def test_data_wait_grows_with_the_samples_and_other_probes_are_ignored():
    shares = {**SHARES, "data_wait": 0.1, "optimizer": 0.2}
    m = batch_model.step_at(shares, 0.010, 2, 32, 0.0, probe_record(), None, node_fixed_s=1.0)
    assert m["step_s_at_target"] == pytest.approx(0.003 + 0.001 * 16 + 0.006 + 0.009)
    # a probe of another batch size (or target) is not this step's: the shares basis
    assert batch_model.step_at(SHARES, 0.010, 4, 32, 0.0, probe_record(), None)["basis"] == "shares"
    assert batch_model.step_at(SHARES, 0.010, 2, 16, 0.0, probe_record(), None)["basis"] == "shares"


def test_the_shares_basis_is_the_old_amdahl_form():
    m = batch_model.step_at(SHARES, 0.010, 4, 32, 0.001, None, None)
    fixed = 0.4 + 0.1  # optimizer + other host, and 1 ms of the 10 ms step per-operation overhead
    assert m["basis"] == "shares" and m["est"] == pytest.approx(8 / (fixed + (1 - fixed) * 8))


def test_small_batch_reads_the_probe_and_says_so():
    step = make_step(data=0.0, fwd=0.3, bwd=0.3, opt=0.3, mean=0.010, batch=2.0)
    facts = make_facts(kind="cpu", step=step, devices={"params": {"cpu": 1}, "shape_probe": probe_record()})
    facts = facts.replace(graph_nodes=1000)  # 1000 × 15 µs: the 3 ms outside the products are per-step
    f = rules_batch.small_batch(facts)
    assert f["evidence"]["basis"] == "layer_probe"
    assert f["est_speedup"] == pytest.approx(16 * 0.010 / 0.019, rel=1e-2)
    assert "the model's own layers timed at both batch sizes" in f["summary"]
    assert f["evidence"]["step_time_s_at_target"] == pytest.approx(0.019, rel=1e-2)


def test_small_batch_fits_the_runs_own_batch_sizes():
    step = make_step(data=0.0, fwd=0.3, bwd=0.3, opt=0.3, mean=0.004, batch=4.0)
    facts = make_facts(kind="cpu", step=step).replace(
        analyzed_steps=rows([(4, 0.004)] * 30 + [(1, 0.0025)] * 5))
    f = rules_batch.small_batch(facts)
    assert f["evidence"]["basis"] == "batch_sizes" and "steps of 1 and 4 samples" in f["summary"]
    assert f["est_speedup"] == pytest.approx(32 / 0.018 / 1000, rel=1e-2)


# -- emulated_precision at the model's own shapes ---------------------------------------------------

def shape_audit(slowdown, flags, target=None, native=False):
    audit = cpu_audit(slowdown=6.0, native=native)
    audit["shape_probe"] = {"dtype": "bfloat16", "slowdown": slowdown, "slowdown_target": target,
                            "cpu_flags": flags, "shapes": [{}, {}, {}]}
    return audit


def test_native_units_from_the_cpu_flags_or_onednn():
    assert native_units("bfloat16", {}, {"cpu_flags": ["avx512_bf16"]}) is True
    assert native_units("bfloat16", {"native": True}, {"cpu_flags": []}) is True
    assert native_units("bfloat16", {"native": None}, {"cpu_flags": ["avx512_fp16"]}) is False
    assert native_units("float16", {}, {"cpu_flags": ["avx512_fp16"]}) is True
    assert native_units("bfloat16", {}, {}) is None


def test_a_dtype_faster_at_the_models_shapes_is_never_advised_against():
    # the 32×32 matmul is 6× slower, but the model's own shapes run faster in bfloat16
    assert emulated_precision(cpu_facts(shape_audit(0.8, []))) is None
    # slower at batch 2 by 1.5× without native units, but faster at the batch small_batch advises
    assert emulated_precision(cpu_facts(shape_audit(1.5, [], target=0.6))) is None


def test_native_units_and_a_slower_small_product_are_inconclusive():
    f = emulated_precision(cpu_facts(shape_audit(1.6, ["avx512_bf16"])))
    assert f["severity"] == "info" and f["est_speedup"] is None
    assert f["evidence"]["native"] is True and f["evidence"]["basis"] == "model_shapes"
    assert "inconclusive" in f["summary"] and "whyidle tune" in f["summary"]
    # native per the flags even where oneDNN was not asked; never critical
    f = emulated_precision(cpu_facts(shape_audit(5.0, ["amx_bf16"])))
    assert f["severity"] == "info"


def test_emulated_at_the_models_shapes_is_critical_with_that_slowdown():
    f = emulated_precision(cpu_facts(shape_audit(10.0, ["avx2"][:0])))
    assert f["severity"] == "critical" and f["evidence"]["matmul_slowdown"] == 10.0
    # forward + backward 0.9 slowed 10×: 0.9 × 0.9 = 0.81 of the step → 1 / 0.19
    assert f["est_speedup"] == pytest.approx(1 / 0.19, rel=1e-2)
    assert "the model's own 3 layer shapes" in f["summary"]


def test_the_probe_times_the_models_layers_without_touching_its_state():
    torch = pytest.importorskip("torch")
    from whyidle.instrument.shape_probe import layer_of, probe

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(8 * 64, 10))
    attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.ones(2, 3, 8, 8)
    layers = layer_of(model[0], (x,)) + layer_of(model[2], (torch.ones(2, 8 * 64),))
    layers += layer_of(attn, (torch.ones(2, 5, 16),) * 3)
    assert [la["kind"] for la in layers] == ["conv", "linear", "linear", "linear"]
    assert layer_of(torch.nn.ReLU(), (x,)) == [] and layer_of(model[2], ("text",)) == []
    state = torch.random.get_rng_state()
    before = [p.detach().clone() for p in model.parameters()]
    got = probe(torch, [(la, 1000, 1) for la in layers], "bfloat16", 2, budget_s=30.0)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert got["batch"] == 2 and got["target"] == 32 and len(got["shapes"]) == 4 and got["covered"] == 1.0
    assert got["float32_s"] > 0 and got["float32_target_s"] > 0 and got["slowdown"] > 0
    conv = got["shapes"][0]
    assert conv["in"] == [2, 3, 8, 8] and conv["float32_target_s"] is not None
    # no autocast and a big batch: nothing to probe
    assert probe(torch, [(la, 1, 1) for la in layers], None, 64)["target"] is None


def test_a_busy_host_stretches_the_layers_growth_into_the_steps_terms():
    # the training thread waited half the time for a core: the probe's 3 ms of growth cost 6 ms of steps
    m = batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, probe_record(), None, run_delay=0.5, node_fixed_s=1.0)
    assert m["step_s_at_target"] == pytest.approx(0.010 + 2 * 3 * 0.003)


def test_the_layer_probe_splits_the_median_step():
    # a busy host: mean 20 ms, median 10 ms; the split is of the median step (in the same shares)
    m = batch_model.step_at(SHARES, 0.020, 2, 32, 0.0, probe_record(), None, node_fixed_s=1.0, typical_s=0.010)
    assert m["step_s"] == pytest.approx(0.010) and m["step_s_at_target"] == pytest.approx(0.019)


def test_a_probe_longer_than_the_step_itself_is_not_used():
    # the layers' forward 3 ms × 3 > the step's 6 ms forward + backward: a busy host stretched the probe
    slow = probe_record(at_b=0.003, at_t=0.012)
    assert batch_model.step_at(SHARES, 0.010, 2, 32, 0.0, slow, None, node_fixed_s=1.0)["basis"] == "shares"


def test_the_first_steps_keep_each_layers_shape_and_calls():
    torch = pytest.importorskip("torch")
    import sys

    from whyidle.instrument.module_calls import ModuleCalls

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(3, 8)
            self.block = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.block(self.block(self.inp(x)))  # one layer called twice a step

    calls = ModuleCalls(lambda frame: ("train.py:1 main", None))
    net = Net()
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: calls.pre(m, a, sys._getframe(1)))
    post = torch.nn.modules.module.register_module_forward_hook(lambda m, a, out: calls.post())
    try:
        net(torch.ones(4, 3))
    finally:
        pre.remove()
        post.remove()
    got = calls.layer_times()
    assert [(la["in"], list(la["w"].shape), n) for la, _, n in got] == [([4, 3], [8, 3], 1), ([4, 8], [8, 8], 2)]
