"""Whole-job time accounting (analysis/accounting.py), the regions that feed it
(instrument/regions.py) and the verdict's comparison in seconds (diagnose/verdict.py)."""

from __future__ import annotations

import os
import threading

import pytest

from whyidle.analysis.accounting import time_accounting
from whyidle.diagnose.verdict import choose_verdict, held_seconds
from whyidle.instrument import regions

S = 1_000_000_000


def steps(t0: float, t1: float, n: int) -> list[dict]:
    d = (t1 - t0) / n
    return [{"t0": int((t0 + i * d) * S), "t1": int((t0 + (i + 1) * d) * S)} for i in range(n)]


def region(kind, t0, t1, site="train.py:10 main"):
    return {"k": "region", "kind": kind, "t0": int(t0 * S), "t1": int(t1 * S), "site": site}


def test_parts_add_up_and_overlaps_go_to_the_more_specific_part():
    iters = [{"t0": int(10 * S), "t1": int(10.5 * S), "loader": 1},   # first iterator: start-up (step 0)
             {"t0": int(50 * S), "t1": int(51 * S), "loader": 1},     # a restart: epoch boundary
             {"t0": int(22 * S), "t1": int(23 * S), "loader": 2}]     # validation loader: evaluation
    firsts = [{"t0": int(51 * S), "t1": int(53 * S), "loader": 1}]  # its first batch took 2 s
    loader = {"k": "loader", "id": 1, "created": ["train.py:4 main", "torch/utils/data/dataloader.py:1 __init__"]}
    t = time_accounting((0, 100 * S), steps(10, 90, 80),
                        [region("evaluation", 20, 30), region("checkpoint", 25, 26), region("checkpoint", 60, 62)],
                        iters, firsts, steady_fetch_s=0.5, records=[loader])
    p = {k: v["s"] for k, v in t["parts"].items()}
    assert sum(p.values()) == pytest.approx(100.0)
    assert p["startup"] == pytest.approx(11.0)         # to the first step's end (10 → 11 s)
    assert p["evaluation"] == pytest.approx(9.0)       # 10 s less the checkpoint saved inside it
    assert p["checkpoint"] == pytest.approx(3.0)
    assert p["epoch_boundary"] == pytest.approx(2.5)   # 1 s iter() + (2 s first batch − 0.5 s steady)
    assert p["teardown"] == pytest.approx(10.0)
    assert p["training"] == pytest.approx(79 - 9 - 3 - 2.5)
    assert t["parts"]["checkpoint"]["count"] == 2 and t["parts"]["evaluation"]["count"] == 1
    assert t["parts"]["epoch_boundary"]["count"] == 1
    assert [c["site"] for c in t["parts"]["epoch_boundary"]["callers"]] == ["train.py:4 main"]  # where it was made
    assert t["parts"]["checkpoint"]["every_steps"] == 35.0  # saves in steps 15 and 50
    assert t["parts"]["evaluation"]["every_steps"] is None
    assert t["parts"]["checkpoint"]["callers"] == [{"site": "train.py:10 main", "count": 2, "seconds": 3.0,
                                                        "code": None}]
    assert t["training_span_s"] == pytest.approx(79.0)
    assert t["parts"]["evaluation"]["share"] == pytest.approx(0.09)


def test_an_epoch_boundary_holds_the_old_workers_stopping_and_the_new_workers_first_batches():
    # 1 s steps, data 0.1 s each; epoch 2 starts at 20 s: the old workers stop (19.2-19.9 s), iter()
    # (20.0-20.1 s), its first batch (20.1-21.0 s); the next step waits 0.4 s for the second worker's
    # first batch, the one after is steady again
    rows = [{"t0": (10 + i) * S, "t1": (11 + i) * S, "data": int(0.1 * S)} for i in range(20)]
    rows[11]["data"] = int(0.4 * S)  # the step at 21 s
    iters = [{"t0": int(10 * S), "t1": int(10.1 * S), "loader": 1}, {"t0": int(20 * S), "t1": int(20.1 * S), "loader": 1}]
    firsts = [{"t0": int(20.1 * S), "t1": int(21 * S), "loader": 1}]
    ends = [{"t0": int(19.2 * S), "t1": int(19.9 * S), "loader": 1}]
    t = time_accounting((0, 40 * S), rows, [], iters, firsts, steady_fetch_s=0.1, ends=ends)
    assert t["parts"]["epoch_boundary"]["s"] == pytest.approx(0.7 + 0.9 + 0.3)  # stop + iter/first + ramp
    assert t["parts"]["epoch_boundary"]["count"] == 1
    # without the old iterator's stop record (persistent workers, or an older run): iter, first batch, ramp
    t = time_accounting((0, 40 * S), rows, [], iters, firsts, steady_fetch_s=0.1)
    assert t["parts"]["epoch_boundary"]["s"] == pytest.approx(0.9 + 0.3)


def test_no_steps_is_all_start_up_and_regions_are_clipped_to_the_window():
    t = time_accounting((10 * S, 20 * S), [], [region("checkpoint", 5, 12)], [], [])
    p = {k: v["s"] for k, v in t["parts"].items()}
    assert p["checkpoint"] == pytest.approx(2.0) and p["startup"] == pytest.approx(8.0)
    assert sum(p.values()) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        time_accounting((5, 5), [], [], [], [])


def test_region_samples_name_the_lines_and_the_mix():
    recs = [{"k": "stacks", "t": 1, "sites": [
        ["evaluation:eval", "train.py:40 evaluate", "torch/nn/modules/linear.py:125 forward", 10, 1000.0, []],
        ["evaluation:other", "train.py:44 metric", "train.py:44 metric", 30, 3000.0, []],
        ["other", "train.py:12 main", "train.py:12 main", 5, 500.0, []]]}]
    t = time_accounting((0, 20 * S), steps(2, 18, 16), [region("evaluation", 5, 9)], [], [], records=recs)
    ev = t["parts"]["evaluation"]
    assert ev["mix"] == pytest.approx({"model": 1.0, "data": 0.0, "host": 3.0})  # 4 s, sampled 1 + 3
    assert ev["sites"][0]["function"] == "train.py metric"
    assert [h["function"] for h in ev["host_sites"]] == ["train.py metric"]


def test_verdict_compares_seconds_when_the_run_has_time_accounting():
    eval_f = {"id": "eval_bound", "severity": "critical", "bound": 0.5, "evidence": {"part_s": 50.0}}
    input_f = {"id": "input_bound", "severity": "critical", "bound": 0.8, "evidence": {}}
    assert held_seconds(input_f, 20.0) == pytest.approx(16.0)
    assert choose_verdict([input_f, eval_f], training_s=20.0) == "eval_bound"
    assert choose_verdict([input_f, eval_f], training_s=80.0) == "input_bound"  # 64 s of input wait
    assert choose_verdict([input_f, eval_f]) == "input_bound"  # no accounting: bounds only


class _Agent:
    disabled = False

    def __init__(self):
        self.recs, self.on_exit = [], []

    def record(self, rec):
        self.recs.append(rec)

    def notice(self, msg):
        self.recs.append({"k": "notice", "msg": msg})


class _Param:
    def __init__(self, device):
        self.device = type("Device", (), {"type": device})()


class _Module:
    def __init__(self, device=None):
        self.training = True
        self.params = [_Param(device)] if device else []
        self.children = []

    def parameters(self):
        return iter(self.params)

    def train(self, mode=True):
        self.training = mode
        for c in self.children:
            c.train(mode)
        return self

    def eval(self):
        return self.train(False)


@pytest.fixture
def agent(monkeypatch):
    monkeypatch.setattr(regions, "_REGIONS", None)
    return _Agent()


def test_wrapped_calls_and_eval_mode_become_region_records(agent):
    class Lib:
        @staticmethod
        def save(obj, path):
            Lib.saved = (obj, path)
            return "ok"

    regions.wrap(Lib, "save", "checkpoint", agent, "torch.save")
    regions.wrap(Lib, "save", "checkpoint", agent, "torch.save")  # idempotent
    assert Lib.save({"w": 1}, "x.pt") == "ok" and Lib.saved == ({"w": 1}, "x.pt")
    regions.watch_module_mode(_Module, agent)
    model = _Module()
    model.children = [_Module()]
    model.eval()   # opens (the child's train(False) is inside the same call)
    model.eval()   # already in eval mode: nothing new
    model.train()  # closes
    model.eval()
    regions.optimizer_stepped()  # training with frozen layers: dropped, not evaluation
    model.train()
    got = [(r["kind"], r["entry"]) for r in agent.recs if r["k"] == "region"]
    assert got == [("checkpoint", "torch.save"), ("evaluation", "Module.eval")]
    assert all(r["t1"] >= r["t0"] for r in agent.recs if r["k"] == "region")
    # an evaluated model's region says where its weights are (an EMA copy kept on the CPU: C19)
    ema = _Module("cpu")
    ema.eval()
    ema.train()
    assert [r.get("device") for r in agent.recs if r["k"] == "region"] == [None, None, "cpu"]


def test_a_saves_record_names_its_file_its_size_and_its_file_system(agent, tmp_path, monkeypatch):
    """A checkpoint region records where the save went (path, bytes, the mount's file system
    type); a folder (``save_pretrained``) counts the files written; a buffer records nothing."""
    import io

    from whyidle.env import fs
    from whyidle.instrument import saves

    class Lib:
        @staticmethod
        def save(obj, f):
            if isinstance(f, str):
                with open(f, "wb") as fh:
                    fh.write(b"x" * 3000)
            else:
                f.write(b"y" * 500)

        @staticmethod
        def save_pretrained(model, save_directory):
            os.makedirs(os.path.join(save_directory, "sub"), exist_ok=True)
            for name in ("model.safetensors", "sub/config.json"):
                with open(os.path.join(save_directory, name), "wb") as fh:
                    fh.write(b"z" * 1000)

    table = f"36 1 0:40 / {tmp_path} rw - nfs4 server:/export rw\n25 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    monkeypatch.setattr(saves, "_mounts", fs.parse_mountinfo(table))
    regions.wrap(Lib, "save", "checkpoint", agent, "torch.save")
    regions.wrap(Lib, "save_pretrained", "checkpoint", agent, "save_pretrained")
    Lib.save({"w": 1}, str(tmp_path / "ckpt.pt"))
    with open(tmp_path / "open.pt", "wb") as fh:
        Lib.save({"w": 1}, fh)
    Lib.save({"w": 1}, io.BytesIO())
    Lib.save_pretrained(object(), save_directory=str(tmp_path / "hf"))
    recs = [r for r in agent.recs if r["k"] == "region"]
    assert [(r.get("path"), r.get("bytes"), r.get("fs")) for r in recs] == [
        (str(tmp_path / "ckpt.pt"), 3000, "nfs4"), (str(tmp_path / "open.pt"), 500, "nfs4"), (None, None, None),
        (str(tmp_path / "hf"), 2000, "nfs4")]
    assert saves.destination((object(),), {}) is None


def test_other_threads_and_exceptions_pass_through(agent):
    class Lib:
        @staticmethod
        def log(x):
            if x < 0:
                raise ValueError("negative")
            return x

    regions.wrap(Lib, "log", "logging", agent)
    with pytest.raises(ValueError):
        Lib.log(-1)
    out = []
    th = threading.Thread(target=lambda: out.append(Lib.log(3)))
    th.start()
    th.join()
    assert out == [3]
    kinds = [r["kind"] for r in agent.recs if r["k"] == "region"]
    assert kinds == ["logging"]  # the failing call still counts; the other thread's call does not
    r = regions.get(agent)
    r.begin("evaluation")
    r.close_all()  # at exit: an evaluation never followed by model.train()
    assert [x["entry"] for x in agent.recs if x["k"] == "region"][-1] == "exit"


def test_checkpoint_and_logging_inside_steps_are_left_out_of_the_shares():
    from whyidle.analysis.steps import step_metrics

    rows = [{"t0": i * S, "t1": (i + 1) * S, "data": int(0.1 * S), "fwd": int(0.2 * S), "bwd": int(0.2 * S),
             "opt": 0, "eval": 0, "samples": 32, "batches": 1} for i in range(10)]
    plain = step_metrics(rows)
    assert plain["shares"]["other_host"] == pytest.approx(0.5)
    # a 0.4 s tracker call in every step: it is the logging part's, not host work
    m = step_metrics(rows, [(int((i + 0.5) * S), int((i + 0.9) * S)) for i in range(10)])
    assert m["outside_share"] == pytest.approx(0.4)
    assert m["shares"]["other_host"] == pytest.approx(0.1 / 0.6)
    assert m["shares"]["forward"] == pytest.approx(0.2 / 0.6)
    assert m["step_time_s"]["p50"] == pytest.approx(1.0)  # step times stay wall time


def test_logging_inside_the_forward_phase_is_left_out_of_forward():
    """A tracker logging from a forward hook: its time is inside ``fwd``; with the steps' phase
    spans it comes out of ``forward`` (not out of ``other_host``), and no share passes 1."""
    from whyidle.analysis.steps import step_metrics

    us = S // 1000  # ph offsets are µs after t0: data 0-0.1 s, forward 0.1-0.8 s, backward 0.8-1.0 s
    rows = [{"t0": i * S, "t1": (i + 1) * S, "data": int(0.1 * S), "fwd": int(0.7 * S), "bwd": int(0.2 * S),
             "opt": 0, "eval": 0, "samples": 32, "batches": 1, "ph": [1, 0, 2, int(0.1 * us), 3, int(0.8 * us)]}
            for i in range(10)]
    logging = [(int((i + 0.2) * S), int((i + 0.7) * S)) for i in range(10)]  # 0.5 s inside forward
    m = step_metrics(rows, logging)
    assert m["outside_share"] == pytest.approx(0.5)
    assert m["shares"]["forward"] == pytest.approx(0.2 / 0.5)
    assert m["shares"]["data_wait"] == pytest.approx(0.1 / 0.5)
    assert m["shares"]["backward"] == pytest.approx(0.2 / 0.5)
    assert m["shares"]["other_host"] == pytest.approx(0.0, abs=1e-9)
    # steps recorded without phase spans: the shares are scaled back to the step, never above 1
    bare = step_metrics([{k: v for k, v in r.items() if k != "ph"} for r in rows], logging)
    assert sum(bare["shares"].values()) == pytest.approx(1.0)
    assert bare["shares"]["forward"] == pytest.approx(0.7)


def job_facts(parts: dict, wall: float = 100.0, steps: int = 100, api: str = "torch", loader=None, config=None):
    """RunFacts of a training run whose wall time has these parts (name → (seconds, count) or
    (seconds, count, steps between two))."""
    from whyidle.analysis.facts import RunFacts

    if "training" not in parts:  # the rest of the wall time trains (the loop the estimates are over)
        parts = dict(parts, training=(max(0.0, wall - sum(p[0] for p in parts.values())), 1))
    full = {name: {"s": p[0], "share": p[0] / wall, "count": p[1], "every_steps": p[2] if len(p) > 2 else None,
                   "sites": [], "host_sites": [], "mix": None, "callers": []} for name, p in parts.items()}
    return RunFacts(framework="torch", api={"name": api, "config": config or {}},
                    time={"wall_s": wall, "window": [0, int(wall * S)], "parts": full, "training_span_s": wall},
                    step={"steps": steps}, step_rows=[{"by": "optimizer"}] * steps, loader=loader)


def test_job_rules_thresholds_and_fixes():
    from whyidle.diagnose import rules_job

    # one final evaluation is a warning only when it holds the critical share
    assert rules_job.eval_bound(job_facts({"evaluation": (30.0, 1), "training": (70.0, 1)})) is None
    f = rules_job.eval_bound(job_facts({"evaluation": (45.0, 1), "training": (55.0, 1)}))
    assert f["severity"] == "critical" and f["est_speedup"] is None  # nothing to do less often
    f = rules_job.eval_bound(job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)}))
    assert f["evidence"]["cause"] == "too_often" and "EVAL_EVERY = 40" in f["fix"]["code"]  # every 10 steps
    assert f["est_speedup"] == pytest.approx(100 / (100 - 45), rel=1e-3)  # 3/4 of the evaluations removed
    f = rules_job.eval_bound(job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)}, api="lightning",
                                       config={"val_check_interval": 10}))
    assert "val_check_interval=40" in f["fix"]["code"] and "limit_val_batches=0.25)" in f["fix"]["code"]
    assert f["est_speedup"] == pytest.approx(100 / (100 - 60 * (1 - 0.25 / 4)), rel=1e-3)  # the code's two changes
    f = rules_job.eval_bound(job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)}, api="lightning",
                                       config={"val_check_interval": 10, "limit_val_batches": 0.5}))
    assert f["fix"]["code"] == "trainer = Trainer(..., val_check_interval=40)   # was 10"  # already a subset
    assert f["est_speedup"] == pytest.approx(100 / (100 - 45), rel=1e-3)
    # a non-training job (no optimizer steps) is never eval-bound: inference is all evaluation
    facts = job_facts({"evaluation": (90.0, 5)}).replace(step_rows=[{"by": "loader"}] * 10)
    assert rules_job.eval_bound(facts) is None

    assert rules_job.checkpoint_bound(job_facts({"checkpoint": (5.0, 20)})) is None  # 5 % of the wall time
    f = rules_job.checkpoint_bound(job_facts({"checkpoint": (20.0, 20, 5)}))
    assert f["severity"] == "warning" and "SAVE_EVERY = 50" in f["fix"]["code"]  # k = ⌈0.20 / 0.02⌉ = 10
    assert f["est_speedup"] == pytest.approx(100 / (100 - 18), rel=1e-3)

    assert f["evidence"]["cause"] == "too_often" and f["evidence"]["storage"] is None

    loader = {"num_workers": 4, "persistent_workers": False, "mp_context": "spawn"}
    f = rules_job.epoch_boundary(job_facts({"epoch_boundary": (30.0, 9)}, loader=loader))
    assert f["severity"] == "critical" and "persistent_workers=True" in f["fix"]["code"]
    assert f["est_speedup"] == pytest.approx(100 / 70, rel=1e-3)
    assert rules_job.epoch_boundary(job_facts({"epoch_boundary": (5.0, 9)}, loader=loader)) is None
    # the HF Trainer's fix is code that runs
    f = rules_job.eval_bound(job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)}, api="hf_trainer",
                                       config={"eval_steps": 10}))
    assert "eval_steps=40," in f["fix"]["code"]
    compile(f["fix"]["code"].replace("...,", ""), "fix", "exec")


def test_checkpoints_written_to_a_network_mount_or_slowly_name_the_storage():
    """Where the saves went (accounting.save_storage) and what checkpoint_bound makes of it: a
    network mount, or a rate below CHECKPOINT_SLOW_BPS for large saves, is cause
    ``slow_storage`` with a local-disk option; a fast local disk keeps ``too_often``."""
    from whyidle.analysis.accounting import save_storage
    from whyidle.diagnose import rules_job

    def saves_to(fs_type, mb, seconds, n=20):
        recs = [{"k": "region", "kind": "checkpoint", "t0": int((10 + 3 * i) * S), "t1": int((10 + 3 * i + seconds) * S),
                 "path": f"/mnt/ckpt/step{i}.pt", "bytes": int(mb * 1e6), "fs": fs_type} for i in range(n)]
        return save_storage(recs, 0, 100 * S)

    nfs = saves_to("nfs4", 400, 1.0)
    assert nfs == {"saves": 20, "bytes": 8_000_000_000, "mean_bytes": 400e6, "bytes_per_s": pytest.approx(400e6),
                   "fs_type": "nfs4", "fs_class": "network", "folder": "/mnt/ckpt"}
    assert save_storage([{"kind": "checkpoint", "t0": 0, "t1": S, "bytes": None}], 0, S) is None

    def checkpoint(storage):
        facts = job_facts({"checkpoint": (20.0, 20, 5)})
        facts.time["parts"]["checkpoint"]["storage"] = storage
        return rules_job.checkpoint_bound(facts)

    f = checkpoint(nfs)
    assert f["evidence"]["cause"] == "slow_storage" and f["evidence"]["storage"]["fs_type"] == "nfs4"
    assert "nfs4" in f["summary"] and "/mnt/ckpt" in f["summary"]
    assert [o["est_speedup"] for o in f["fix"]["options"]] == [f["est_speedup"], None, None]
    assert "local disk" in f["fix"]["options"][1]["text"] and "network" in f["fix"]["options"][1]["text"]
    slow = checkpoint(saves_to("ext4", 400, 8.0))  # 50 MB/s on a local disk
    assert slow["evidence"]["cause"] == "slow_storage" and "50 MB/s" in slow["fix"]["options"][1]["text"]
    assert checkpoint(saves_to("ext4", 400, 0.5))["evidence"]["cause"] == "too_often"  # 800 MB/s
    assert checkpoint(saves_to("ext4", 1, 0.5))["evidence"]["cause"] == "too_often"  # small: rate not judged


def test_background_threads_cpu_is_kept_after_they_end():
    """thread_cpu.ThreadCPU: a busy background thread's CPU seconds, attributed to the module that
    runs it, survive the thread's end (a writer thread stops at ``writer.close()``, before exit)."""
    import time

    from whyidle.instrument.thread_cpu import ThreadCPU

    def spin(stop):
        t = time.thread_time()
        while time.thread_time() - t < 0.1:
            pass
        stop.wait(5)

    stop = threading.Event()
    worker = threading.Thread(target=spin, args=(stop,), name="writer")
    tc = ThreadCPU()
    worker.start()
    time.sleep(0.3)
    tc.poll()
    stop.set()
    worker.join()
    tc.poll()  # the thread is gone: its last reading stays
    rec = tc.record(1)
    row = next(r for r in rec["threads"] if r["name"] == "writer")
    assert row["module"] == __name__ and 0.09 <= row["cpu_s"] < 1.0


def test_a_trackers_writer_thread_counts_in_the_logging_estimate():
    from whyidle.diagnose import rules_job

    facts = job_facts({"logging": (20.0, 200)}, steps=100)
    plain = rules_job.logging_bound(facts)
    facts.threads = [{"name": "Thread-1", "module": "tensorboard.summary.writer.event_file_writer", "cpu_s": 10.0},
                     {"name": "prefetch", "module": "mylib.prefetch", "cpu_s": 30.0}]
    f = rules_job.logging_bound(facts)
    assert plain["est_speedup"] == pytest.approx(100 / (100 - 20 * 49 / 50), rel=1e-3)
    assert f["est_speedup"] == pytest.approx(100 / (100 - 30 * 49 / 50), rel=1e-3)  # the program's own thread: not
    assert f["evidence"]["writer_threads_cpu_s"] == 10.0 and "another 10.0 s of CPU" in f["summary"]


def test_a_long_teardown_names_the_lines_after_the_last_step():
    """Stack samples flushed after the last step (any phase) name where a long teardown went; the
    flush right after the step, which mixes in samples from before it, is left out."""
    steps = [{"t0": i * S, "t1": (i + 1) * S} for i in range(10)]
    stacks = [{"k": "stacks", "t": int(10.2 * S), "sites": [["other", "train.py:20 main", "torch/x.py:1 f", 20, 200.0, []]]},
              {"k": "stacks", "t": int(14 * S), "sites": [["setup", "train.py:51 <module>", "keras/u.py:117 error_handler",
                                                           300, 3000.0, []]]},
              {"k": "stacks", "t": int(18 * S), "sites": [["setup", "train.py:51 <module>", "keras/u.py:117 error_handler",
                                                           300, 3000.0, []],
                                                          ["setup", "train.py:60 save_results", "json/x.py:3 dump", 100, 1000.0, []]]}]
    t = time_accounting((0, 20 * S), steps, [], [], [], records=stacks)
    down = t["parts"]["teardown"]
    assert down["s"] == pytest.approx(10.0)
    assert [x["site"] for x in down["sites"]] == ["train.py:51 <module>", "train.py:60 save_results"]
    assert down["sites"][0]["seconds"] == pytest.approx(10.0 * 6 / 7)
    short = time_accounting((0, 11 * S), steps, [], [], [], records=stacks)  # 1 s: interpreter shutdown
    assert short["parts"]["teardown"]["sites"] == []


def test_evaluation_on_the_cpu_while_training_on_the_gpu_is_the_cause_and_moving_it_the_fix():
    from whyidle.diagnose import rules_job

    facts = job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)})
    ev = facts.time["parts"]["evaluation"]
    ev["mix"] = {"model": 50.0, "data": 5.0, "host": 5.0}
    facts.devices = {"params": {"cuda": 1_000_000}}
    ev["devices"] = {"cpu": 10}   # the model put in eval mode: its weights on the CPU
    f = rules_job.eval_bound(facts)
    assert f["evidence"]["cause"] == "on_cpu" and "eval_model.to(device)" in f["fix"]["code"]
    assert f["est_speedup"] == pytest.approx(100 / (100 - 0.9 * 50), rel=1e-3)
    assert [o["text"].split(":")[0] for o in f["fix"]["options"]][1] == "Evaluate 4x less often."
    ev["devices"] = {"cuda": 10}
    assert rules_job.eval_bound(facts)["evidence"]["cause"] == "too_often"
    # Keras (no weights seen): the GPU idle during the evaluation, busy during training
    keras = job_facts({"evaluation": (60.0, 10, 10), "training": (40.0, 1)}, api="keras")
    keras.time["parts"]["evaluation"].update(mix={"model": 50.0, "data": 5.0, "host": 5.0}, gpu_util_pct=1.0)
    keras.time["parts"]["training"]["gpu_util_pct"] = 85.0
    f = rules_job.eval_bound(keras)
    assert f["evidence"]["cause"] == "on_cpu" and "tf.device" in f["fix"]["code"]
    assert f["evidence"]["gpu_util_pct"] == 1.0 and f["evidence"]["training_gpu_util_pct"] == 85.0
    keras.time["parts"]["training"]["gpu_util_pct"] = 12.0  # the training barely uses the GPU either
    assert rules_job.eval_bound(keras)["evidence"]["cause"] == "too_often"
    keras.time["parts"]["training"]["gpu_util_pct"] = 85.0
    keras.time["parts"]["evaluation"]["mix"] = {"model": 5.0, "data": 5.0, "host": 50.0}  # Python NMS idles it
    assert rules_job.eval_bound(keras)["evidence"]["cause"] == "host_work"
