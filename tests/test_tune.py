"""``whyidle tune``'s parts in-process: the settings' parsing and application rules, the stop rule,
the search plan, the winner's code and the result's renderings."""

from __future__ import annotations

import json
import os

import pytest
from conftest import REPO

from whyidle.instrument import overrides
from whyidle.tune import guard, plan, trial
from whyidle.tune.plan import Candidate, Outcome

RUNS = os.path.join(REPO, "tests", "data", "runs")


class _Agent:
    def __init__(self):
        self.records, self.on_exit, self.notices = [], [], []

    def record(self, rec):
        self.records.append(rec)

    def start_background(self):
        pass

    def notice(self, msg):
        self.notices.append(msg)


def _ov(**settings) -> overrides.Overrides:
    return overrides.Overrides(_Agent(), settings)


def test_parse_keeps_known_settings_of_the_right_type():
    settings, problems = overrides.parse(json.dumps(
        {"num_workers": 2, "pin_memory": True, "batch_size": 0, "threads": True, "autocast": "fp8", "x": 1,
         "tfdata_prefetch": True}))
    assert settings == {"num_workers": 2, "pin_memory": True, "tfdata_prefetch": True}
    assert len(problems) == 4  # batch_size 0, threads as bool, autocast fp8, unknown x
    assert overrides.parse("{not json")[0] == {} and overrides.parse("[1]")[0] == {}
    assert overrides.parse(None) == ({}, [])


def test_loader_arguments_follow_pytorch_rules():
    ov = _ov(num_workers=2, persistent_workers=True, prefetch_factor=4, batch_size=64)
    out = overrides.loader_arguments(ov, {"dataset": list(range(1000)), "batch_size": 16}, "train.py:10")
    assert out == {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "batch_size": 64}
    recs = {r["name"]: r for r in ov.agent.records}
    assert recs["num_workers"]["was"] == 0 and recs["batch_size"]["was"] == 16
    assert all(r["applied"] and r["site"] == "train.py:10" for r in ov.agent.records)

    # without workers, worker options cannot apply (PyTorch raises for them): refused, not passed
    ov = _ov(persistent_workers=True, prefetch_factor=4)
    assert overrides.loader_arguments(ov, {"dataset": [1]}, None) == {}
    assert {r["why"] for r in ov.agent.records} == {"needs num_workers > 0"}
    # num_workers=0 takes away the program's worker-only options
    ov = _ov(num_workers=0)
    out = overrides.loader_arguments(ov, {"dataset": [1], "num_workers": 4, "persistent_workers": True,
                                          "prefetch_factor": 8}, None)
    assert out == {"num_workers": 0, "persistent_workers": False, "prefetch_factor": None}


@pytest.mark.parametrize("arguments, why", [
    ({"dataset": [1] * 100, "batch_sampler": object()}, "a batch_sampler gives the batches"),
    ({"dataset": [1] * 100, "batch_size": None}, "the dataset yields whole batches"),
    ({"dataset": [1] * 10, "batch_size": 4, "drop_last": True}, "drop_last=True"),
])
def test_batch_size_refusals_are_recorded(arguments, why):
    ov = _ov(batch_size=32)
    assert "batch_size" not in overrides.loader_arguments(ov, arguments, "t.py:3")
    rec = ov.agent.records[-1]
    assert rec["name"] == "batch_size" and rec["applied"] is False and why in rec["why"]


def test_unused_setting_is_recorded_as_not_applied():
    ov = _ov(tfdata_prefetch=True, num_workers=1)
    overrides.loader_arguments(ov, {"dataset": [1]}, None)
    ov.unused()
    unused = [r for r in ov.agent.records if not r["applied"]]
    assert [r["name"] for r in unused] == ["tfdata_prefetch"]
    assert "Model.fit" in unused[0]["why"]


def test_rel_halfwidth():
    assert trial.rel_halfwidth([0.1] * 40) == pytest.approx(0, abs=1e-12)
    assert trial.rel_halfwidth([0.1] * 10) == float("inf")
    noisy = [0.1 + 0.01 * ((i // 20) % 2) for i in range(80)]  # alternating slow and fast stretches
    assert 0.01 < trial.rel_halfwidth(noisy) < 0.1


def _steps_file(run_dir, times_ms, t0=10**12):
    os.makedirs(run_dir, exist_ok=True)
    t = t0
    with open(os.path.join(run_dir, "proc-1.jsonl"), "w") as f:
        for i, ms in enumerate(times_ms):
            f.write(json.dumps({"k": "step", "i": i, "t0": t, "t1": t + int(ms * 1e6), "by": "optimizer"},
                               separators=(",", ":")) + "\n")
            t += int(ms * 1e6)


def test_stop_rule(tmp_path):
    steady = str(tmp_path / "steady")
    _steps_file(steady, [500] + [100] * 60)  # 6 s of steady 100 ms steps after a slow first one
    rule = trial.StopRule(max_s=100, memory=lambda: (10, 10))
    assert rule(steady).startswith("measured")
    short = str(tmp_path / "short")
    _steps_file(short, [100] * 20)  # 2 s: too few steps
    assert trial.StopRule(max_s=100, memory=lambda: (10, 10))(short) is None
    assert trial.StopRule(max_s=0, memory=lambda: (10, 10))(short).startswith("time")
    assert trial.StopRule(max_s=100, memory=lambda: (5, 100))(short).startswith("memory")


@pytest.fixture(scope="module")
def _report(tmp_path_factory):
    """The report of a recorded run, built from a copy (report_run writes report.json and
    timeline.json beside the records)."""
    import shutil

    from whyidle.pipeline import report_run

    def build(name):
        copy = tmp_path_factory.mktemp("runs") / name
        shutil.copytree(os.path.join(RUNS, name), copy)
        return report_run(str(copy))

    return build


def test_candidates_follow_the_diagnosis(_report):
    rep = _report("image_decode_main")  # input_bound, loader in the main process, 2 cores
    cands = plan.candidates(rep, cores=2)
    fix = cands[0]
    assert fix.origin == fix.finding == "input_bound" and fix.predicted == pytest.approx(
        next(f for f in rep["findings"] if f["id"] == "input_bound")["est_speedup"])
    assert fix.settings["num_workers"] == 2 and fix.settings["persistent_workers"] is True
    assert fix.settings.get("threads") == 1  # the printed fix gives the trainer one thread
    # the input ceiling right after the printed fix (a measurement: never the winner), then the neighbour
    assert cands[1].settings == {"replay": plan.REPLAY_BATCHES} and cands[1].origin == plan.CEILING
    assert cands[1].finding == "input_bound" and cands[1].predicted is None
    assert {c.settings["num_workers"] for c in cands[2:]} == {1}  # the neighbour on 2 cores
    assert plan.ladder_start(rep) is None

    assert plan.candidates(_report("batch1"), cores=2) == []
    assert plan.ladder_start(_report("batch1")) == 1
    assert plan.ladder_start(_report("batch1"), {"batch_size": [8]}) is None  # the user's sizes instead

    keras = plan.candidates(_report("keras_sequential_map"), cores=2)
    assert keras[0].settings == {"tfdata_parallel_map": True, "tfdata_prefetch": True}
    assert plan.candidates(_report("compute_heavy"), cores=2, tries={"threads": [1]})[-1].settings == {"threads": 1}


def _out(settings, ratio, claim="faster", status="ok", origin="x", runs=1):
    return Outcome(Candidate(settings, origin), status, ratio, [ratio * 0.9, ratio * 1.1], claim,
                   [f"r{i}" for i in range(runs)])


def test_the_input_ceiling_is_never_the_winner_repeated_or_combined():
    ceiling = Outcome(Candidate({"replay": 16}, plan.CEILING, None, "", "input_bound"), "ok", 5.0, [4.5, 5.5],
                      "faster", ["r0"])
    workers = _out({"num_workers": 2}, 1.4, origin="input_bound")
    threads = _out({"threads": 1}, 1.2, origin="cpu_contention")
    assert plan.winner([ceiling, workers]) is workers
    assert plan.winner([ceiling]) is None
    assert ceiling not in plan.promising([ceiling, workers])
    assert "replay" not in plan.combination([ceiling, workers, threads]).settings


def test_batch_ladder_doubles_while_it_gains():
    assert plan.next_batch(4, []) == 8
    assert plan.next_batch(4, [_out({"batch_size": 8}, 1.5)]) == 16
    assert plan.next_batch(4, [_out({"batch_size": 8}, 1.5), _out({"batch_size": 16}, 1.52)]) is None  # < 3 %
    assert plan.next_batch(4, [_out({"batch_size": 8}, 0.9)]) is None
    assert plan.next_batch(4, [_out({"batch_size": 8}, 1.5, status="oom")]) is None
    assert plan.next_batch(1, [_out({"batch_size": 64}, 9.0)]) is None  # 64x the program's


def test_halving_combination_and_winner():
    a = _out({"num_workers": 2, "persistent_workers": True}, 2.0)
    b = _out({"num_workers": 1}, 1.3)
    c = _out({"threads": 1}, 1.2)
    d = _out({"pin_memory": True}, 0.8, claim="slower")
    assert plan.promising([a, b, c, d]) == [a, b]
    combo = plan.combination([a, b, c, d])
    assert combo.settings == {"threads": 1, "num_workers": 2, "persistent_workers": True}
    assert plan.winner([a, b, c, d]) is a
    assert plan.winner([d, _out({"threads": 1}, 1.04, claim="none")]) is None  # never a slower or unproven one
    assert plan.combination([a, d]) is None


def test_guard_names_changed_files(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "last.pt").write_bytes(b"1")
    (tmp_path / "whyidle-runs").mkdir()
    before = guard.snapshot(str(tmp_path))
    os.utime(tmp_path / "ckpt" / "last.pt", ns=(1, 1))
    (tmp_path / "out.txt").write_text("x")
    (tmp_path / "whyidle-runs" / "ignored").write_text("x")
    assert guard.changed(before, guard.snapshot(str(tmp_path))) == (["out.txt"], [os.path.join("ckpt", "last.pt")])


def test_winner_code_in_the_programs_api():
    import dataclasses

    from whyidle.pipeline import analyze_run
    from whyidle.tune.code import settings_code

    facts = analyze_run(os.path.join(RUNS, "image_decode_main")).facts
    code = settings_code(facts, {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "threads": 1},
                         {"num_workers": "image_decode_main.py:79"})
    assert code.startswith("torch.set_num_threads(1)   # was 2")
    assert "loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True,   # image_decode_main.py:79" in code
    assert "num_workers=2,   # was 0" in code and code.rstrip().endswith("prefetch_factor=4)")
    compile(code, "fix", "exec")
    hf = dataclasses.replace(facts, api={"name": "hf_trainer", "config": {"dataloader_num_workers": 0}})
    assert "dataloader_num_workers=2,   # was 0" in settings_code(hf, {"num_workers": 2})
    batch = settings_code(facts, {"batch_size": 128})
    assert "batch_size=128" in batch and "learning rate" in batch
    keras = analyze_run(os.path.join(RUNS, "keras_sequential_map")).facts
    code = settings_code(keras, {"tfdata_parallel_map": True, "tfdata_prefetch": True})
    assert "num_parallel_calls=tf.data.AUTOTUNE" in code and "prefetch(tf.data.AUTOTUNE)" in code


def test_html_escapes_and_charts():
    from whyidle.report.tune_html import render_html

    trial_row = {"label": "num_workers=2<script>", "ratio": 1.5, "ratio_ci": [1.4, 1.6], "claim": "faster",
                 "samples_per_s": 10.0, "ci": None, "data_wait_share": 0.1, "verdict": "input_bound",
                 "applied": {"num_workers": True}, "predicted": 1.3, "status": "ok", "detail": None}
    res = {"command": ["python", "t.py"], "trials": [trial_row], "elapsed_s": 10, "budget_s": 60, "tune_dir": "d",
           "baseline": {"samples_per_s": 5.0, "ci": None, "verdict": "input_bound"},
           "winner": {"label": "num_workers=2", "ratio": 1.5, "ci": [1.4, 1.6], "code": "loader = DataLoader(<x>)",
                      "statement": None}, "estimates": [], "notes": ["a & b"]}
    page = render_html(res)
    assert "<script>" not in page and "&lt;script&gt;" in page and "<rect" in page


def test_fit_batch_size_applies_to_arrays_only():
    import numpy as np

    ov = _ov(batch_size=64)
    args = {"x": np.zeros((100, 2)), "y": np.zeros(100), "batch_size": 32}
    overrides.fit_arguments(ov, args, "train.py:9")
    assert args["batch_size"] == 64 and ov.agent.records[-1]["was"] == 32
    gen = {"x": (i for i in range(3))}
    overrides.fit_arguments(ov, gen, "train.py:9")
    assert "batch_size" not in gen and ov.agent.records[-1]["applied"] is False


def test_rebuilt_loader_that_took_the_batch_size_is_not_a_refusal():
    """Accelerate's ``prepare`` rebuilds the DataLoader with a batch sampler made from the one the
    trial's batch size applied to: not a second loader refusing the setting."""
    class Sampler:
        batch_size = 32

    ov = _ov(batch_size=32)
    assert overrides.loader_arguments(ov, {"dataset": [1] * 100, "batch_sampler": Sampler()}, "t.py:3") == {}
    assert ov.agent.records == []


def test_an_inconclusive_trial_gets_a_second_run():
    unsure = Outcome(Candidate({"num_workers": 1}, "x"), "ok", 0.99, [0.92, 1.06], "none", ["r0"])
    settled = Outcome(Candidate({"num_workers": 2}, "x"), "ok", 0.8, [0.75, 0.85], "slower", ["r0"])
    assert plan.promising([unsure, settled]) == [unsure]


def test_input_fixes_are_held_against_the_measured_ceiling():
    from whyidle.tune.result import input_ceiling

    trials = [{"label": "replay=16", "origin": plan.CEILING, "finding": "input_bound", "ratio": 5.0,
               "ratio_ci": [4.5, 5.5], "claim": "faster", "status": "ok"},
              {"label": "num_workers=2", "origin": "input_bound", "finding": "input_bound", "ratio": 3.0,
               "ratio_ci": [2.8, 3.2], "claim": "faster", "status": "ok"},
              {"label": "threads=1", "origin": "cpu_contention", "finding": "cpu_contention", "ratio": 1.2,
               "ratio_ci": [1.1, 1.3], "claim": "faster", "status": "ok"}]
    report = {"findings": [{"id": "input_bound", "est_speedup_if_removed": 4.2}]}
    c = input_ceiling(trials, report)
    assert c["ratio"] == 5.0 and c["predicted"] == 4.2 and c["status"] == "ok"
    assert c["fixes"] == [{"label": "num_workers=2", "ratio": 3.0, "of_ceiling": 0.5}]
    assert input_ceiling(trials[1:], report) is None


def test_the_verdicts_fix_runs_first_then_the_users_tries(_report):
    rep = _report("image_decode_main")  # verdict input_bound: its worker fix first, the user's try after it
    cands = plan.candidates(rep, cores=2, tries={"threads": [1]})
    assert cands[0].origin == "input_bound" and cands[-1].origin == "user"
    # a verdict with no setting to try (here: renamed): the user's try before the side findings' trials
    other = dict(rep, verdict="host_bound")
    cands = plan.candidates(other, cores=2, tries={"threads": [1]})
    assert cands[0].origin == "user" and cands[0].settings == {"threads": 1}
    assert {c.finding or c.origin for c in cands[1:]} == {"input_bound"}
