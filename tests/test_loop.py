"""What a step of the loop is (analysis/loop.py, diagnose/rules_loop.py): training or not, the
optimizers of a GAN-like step, gradient accumulation by batches or backward calls (issue 30)."""

from __future__ import annotations

import pytest
from test_diagnose import make_facts, make_host, make_step

from whyidle.analysis import loop
from whyidle.analysis.steps import steps_of
from whyidle.diagnose import diagnose
from whyidle.diagnose.rules_loop import no_training
from whyidle.report.build import build_report
from whyidle.report.terminal import loop_text


def rows(by, n=10, mb=None, batches=None, fc=None):
    return [{"k": "step", "i": i, "t0": i * 10**7, "t1": (i + 1) * 10**7, "by": by, "mb": mb, "batches": batches,
             "fc": fc} for i in range(n)]


GAN = {"k": "optimizers", "t": 1, "primary": 1, "parts": [
    {"id": 1, "name": "Discriminator", "class": "Adam", "params": 2_800_000, "steps": 60, "backward": 120},
    {"id": 2, "name": "Generator", "class": "Adam", "params": 3_500_000, "steps": 60, "backward": 60},
    {"id": 3, "name": "Linear", "class": "SGD", "params": 10, "steps": 1, "backward": 1},  # once: no part
]}


def test_two_optimizers_are_parts_of_one_step_never_accumulation():
    facts = loop.loop_facts(rows("optimizer", mb=3, batches=0), GAN)
    assert [p["name"] for p in facts["parts"]] == ["Discriminator", "Generator"]
    assert facts["parts"][0]["backward_per_step"] == 2.0 and facts["parts"][1]["steps_per_step"] == 1.0
    assert facts["backward_per_step"] == 3 and facts["micro_batches_per_step"] == 1.0
    assert facts["trains"]
    assert loop_text({**facts, "parts": [dict(p, **{"class": p["cls"]}) for p in facts["parts"]]}) == (
        "a step runs 2 optimizers: Discriminator (Adam) 2 backward + 1 step · Generator (Adam) 1 backward + 1 step")


def test_a_wgan_critic_stepping_five_times_is_the_primary_and_the_generator_a_part():
    rec = {"primary": 1, "parts": [{"id": 1, "name": "Critic", "class": "RMSprop", "steps": 500, "backward": 500},
                                   {"id": 2, "name": "Generator", "class": "RMSprop", "steps": 100, "backward": 100}]}
    parts = loop.parts(rec)
    assert [(p["name"], p["steps_per_step"]) for p in parts] == [("Critic", 1.0), ("Generator", 0.2)]


@pytest.mark.parametrize("batches, mb, micro", [
    (4, 4, 4),  # accumulation over 4 DataLoader batches (HF, Lightning, a plain loop)
    (1, 2, 1),  # two losses of one batch, two backward calls: no accumulation
    (0, 4, 4),  # no DataLoader: 4 backward calls of slices per optimizer step
    (None, None, None),
])
def test_micro_batches_count_batches_where_there_are_some(batches, mb, micro):
    assert loop.loop_facts(rows("optimizer", mb=mb, batches=batches), None)["micro_batches_per_step"] == micro


def test_what_trains():
    assert loop.trains(rows("backward", mb=1))
    assert loop.trains(rows("loader", mb=1, batches=1))  # manual SGD over a DataLoader
    assert not loop.trains(rows("loader", mb=0, batches=1))
    assert not loop.trains(rows("forward", mb=0))
    assert loop.trains(rows("keras"))


def test_step_markers_prefer_training_ones():
    mixed = rows("forward", 3) + rows("loader", 4) + rows("backward", 5)
    assert {s["by"] for s in steps_of(mixed)} == {"backward"}
    assert {s["by"] for s in steps_of(rows("forward", 3) + rows("loader", 4))} == {"loader"}
    assert {s["by"] for s in steps_of(rows("backward", 3) + rows("optimizer", 4))} == {"optimizer"}


def inference_facts(marker, data=0.0):
    step = make_step(data=data, fwd=0.0, bwd=0.0, opt=0.0, ev=0.3, mean=0.02, batch=32.0 if marker == "loader" else None)
    facts = make_facts(step, make_host(cores=2))
    facts.step_rows = rows(marker, mb=0, fc=1, batches=1 if marker == "loader" else 0)
    facts.loop = loop.loop_facts(facts.step_rows, None)
    return facts


def test_inference_gets_no_training_and_a_diagnosis_of_its_loop():
    facts = inference_facts("loader", data=0.6)
    f = no_training(facts)
    assert f["id"] == "no_training" and f["severity"] == "info" and f["est_speedup"] is None
    assert f["evidence"]["forward_calls_per_s"] == pytest.approx(50.0)
    assert "No training here" in f["summary"] and "waited for data 60%" in f["summary"]
    verdict, findings = diagnose(facts)
    assert "no_training" in [x["id"] for x in findings]
    assert all(x["id"] != "no_steps" for x in findings)
    report = build_report(facts, verdict, findings)
    assert report["metrics"]["loop"]["trains"] is False
    assert loop_text(report["metrics"]["loop"]).startswith("no training (no backward, no optimizer step): a step per "
                                                           "DataLoader batch")
    tensors = inference_facts("forward")
    assert "called its model 50.0 times per second" in no_training(tensors)["summary"]


def test_training_loops_get_no_no_training():
    facts = make_facts(make_step(), make_host())
    facts.step_rows = rows("backward", mb=1, fc=2)
    facts.loop = loop.loop_facts(facts.step_rows, None)
    assert no_training(facts) is None
    assert loop_text(build_report(facts, "device_bound", [])["metrics"]["loop"]) == (
        "a step per backward() (weights updated without torch.optim)")
