"""The start-up: its sampler (instrument/startup.py), its split (analysis/startup.py) and the
``startup_bound`` finding (diagnose/rules_job.py)."""

from __future__ import annotations

import builtins
import importlib
import sys
import threading
import time

import pytest

from test_accounting import job_facts
from whyidle.analysis.startup import startup_split
from whyidle.diagnose import rules_startup
from whyidle.instrument import startup
from whyidle.instrument.stacks import StackSampler

S = 1_000_000_000


def test_samples_taken_while_a_library_is_imported_get_the_import_phase(tmp_path, monkeypatch):
    sampler = StackSampler(threading.get_ident(), 20, lambda: "setup", import_phase="import")
    lib, user = tmp_path / "fakelib_mod.py", tmp_path / "fakeuser_mod.py"
    for path in (lib, user):  # each module's body takes one sample of itself
        path.write_text("import builtins, sys\nbuiltins._whyidle_take(sys._getframe())\n")
    monkeypatch.setattr(builtins, "_whyidle_take", lambda frame: sampler.sample(frame, "setup"), raising=False)
    classify = sampler.classifier.classify
    monkeypatch.setattr(sampler.classifier, "classify",
                        lambda name: (1, "fakelib_mod.py") if name == str(lib) else classify(name))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("fakelib_mod")   # a library's body, imported from this (user) function
    importlib.import_module("fakeuser_mod")  # the program's own module: its body is set-up work
    (rec,) = sampler.drain()
    phases = {leaf.split(":")[0].rsplit("/", 1)[-1]: phase for phase, _user, leaf, *_ in rec["sites"]}
    assert phases["fakelib_mod.py"] == "import"
    assert phases["fakeuser_mod.py"] == "setup"
    sys.modules.pop("fakelib_mod", None)
    sys.modules.pop("fakeuser_mod", None)


def test_until_ends_the_sampling_thread():
    done = threading.Event()
    sampler = StackSampler(threading.get_ident(), 200, lambda: "setup", until=done.is_set)
    sampler.start()
    time.sleep(0.05)
    done.set()
    sampler._thread.join(timeout=5)
    assert not sampler._thread.is_alive()
    sampler.stop()


class _Agent:
    stack_hz = 100.0

    def __init__(self):
        self.records, self.on_exit = [], []

    def record(self, rec):
        self.records.append(rec)

    def notice(self, msg):
        pass


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(500))


def test_hand_over_records_the_start_up_once_and_a_helper_records_nothing():
    agent = _Agent()
    sampler = startup.start(agent)
    assert startup.start(agent) is sampler  # one per process
    _spin(0.4)
    startup.hand_over(agent)
    startup.hand_over(agent)
    recs = [r for r in agent.records if r["k"] == "stacks"]
    assert len(recs) == 1 and recs[0]["startup"] and recs[0]["hz"] == startup.STARTUP_HZ
    assert {s[0] for s in recs[0]["sites"]} <= {"setup", "import"}
    assert any(s[1] and s[1].endswith(" _spin") for s in recs[0]["sites"])
    assert not sampler.sampler._thread.is_alive()
    helper = _Agent()
    startup.start(helper, until=lambda: True)
    for stop in helper.on_exit:  # a process that never trains: its exit stops the sampler, no record
        stop()
    assert helper.records == []
    off = _Agent()
    off.stack_hz = 0
    assert startup.start(off) is None


def _stacks(*sites):
    return {"k": "stacks", "t": 0, "hz": 20, "n": len(sites), "sites": [list(s) for s in sites]}


def test_split_puts_imports_set_up_and_the_first_step_apart(tmp_path):
    (tmp_path / "train.py").write_text("import torch\n"
                                       "def main():\n"
                                       "    ids, labels = tokenize_corpus(docs)\n"
                                       "    for x in loader: use(ids, labels)\n"
                                       "main()\n")
    recs = [{"k": "proc", "t": 3 * S},
            _stacks(("import", "train.py:3 main", "<frozen importlib._bootstrap>:241 f", 10, 1000.0, []),
                    ("setup", "train.py:1 <module>", "torch/_ops.py:10 load", 5, 500.0, []),  # an import statement
                    ("setup", "tok.py:9 encode", "tok.py:9 encode", 30, 3000.0,
                     ["train.py:3 main", "train.py:5 <module>"]),
                    ("setup", "tok.py:4 split", "re.py:1 findall", 10, 1000.0, ["tok.py:9 encode", "train.py:3 main"]),
                    ("framework", "train.py:4 main", "lightning/x.py:1 f", 10, 1000.0, []),  # inside Trainer.fit
                    ("forward", "train.py:4 main", "torch/nn/x.py:1 f", 99, 9900.0, []))]  # a training sample
    steps = [{"t0": 10 * S, "t1": 12 * S}, {"t0": 12 * S, "t1": 12.5 * S}]
    split = startup_split(recs, (0, 20 * S), steps, 12.0, str(tmp_path))
    # the framework imported at 3 s; 7 s sampled to the first step (6.5 s of samples, scaled)
    assert split["framework_import_s"] == pytest.approx(3.0)
    assert split["imports_s"] == pytest.approx(7 * 1.5 / 6.5)
    assert split["program_s"] == pytest.approx(7 * 4.0 / 6.5)
    assert split["framework_s"] == pytest.approx(7 * 1.0 / 6.5)
    assert split["first_step_s"] == pytest.approx(2.0)
    parts = ("framework_import_s", "imports_s", "program_s", "framework_s", "first_step_s")
    assert sum(split[k] for k in parts) == pytest.approx(12.0)
    assert [s["site"] for s in split["program_sites"]] == ["tok.py:9 encode", "tok.py:4 split"]
    # what a cache goes around: main()'s statement (the body's bare main() call is stepped into)
    block = split["block"]
    assert block["site"] == "train.py:3 main" and block["names"] == ["ids", "labels"]
    assert block["source"] == "    ids, labels = tokenize_corpus(docs)"
    assert block["seconds"] == pytest.approx(split["program_s"])
    assert split["sampled"] and split["program_model_share"] == 0.0
    # an evaluation before the first step took part of the start-up: the last pieces shrink first
    short = startup_split(recs, (0, 20 * S), steps, 6.0, str(tmp_path))
    assert short["framework_import_s"] == 3.0 and short["first_step_s"] == 0.0
    assert short["imports_s"] + short["program_s"] == pytest.approx(3.0)
    # no samples: nothing is made up
    bare = startup_split([{"k": "proc", "t": 3 * S}], (0, 20 * S), steps, 12.0)
    assert not bare["sampled"] and bare["program_s"] == 0 and bare["block"] is None
    assert startup_split(recs, (0, 20 * S), [], 12.0) is None


def job(program_s: float, wall: float = 20.0, model_share: float = 0.0, api: str = "torch", leaf: str = "tok.py:9 f",
        source: str | None = "ids, labels = tokenize_corpus(docs)", names=("ids", "labels")):
    facts = job_facts({"startup": (program_s + 4.0, 1), "training": (wall - program_s - 4.0, 1)}, wall=wall, api=api)
    facts.time["parts"]["startup"]["split"] = {
        "framework_import_s": 3.0, "imports_s": 0.5, "program_s": program_s, "first_step_s": 0.5, "sampled": True,
        "program_model_share": model_share, "program_sites": [{"site": "tok.py:9 f", "leaf": leaf, "seconds": program_s}],
        "block": {"site": "train.py:3 main", "seconds": program_s, "source": source, "names": list(names),
                  "definitions": None}}
    return facts


def test_startup_bound_thresholds_cause_and_fix_in_the_programs_api():
    assert rules_startup.startup_bound(job(3.0, wall=20.0)) is None    # 15 % of the wall time
    assert rules_startup.startup_bound(job(1.5, wall=5.0)) is None     # 30 %, but 1.5 s: nothing to fix
    f = rules_startup.startup_bound(job(6.0, wall=20.0))
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.3)
    assert f["evidence"]["part_s"] == 6.0 and f["evidence"]["cause"] == "data_preparation"
    assert f["est_speedup"] == pytest.approx(20 / (20 - 0.9 * 6), rel=1e-3)
    code = f["fix"]["code"]
    assert "ids, labels = torch.load(CACHE, weights_only=False)" in code and "torch.save((ids, labels), CACHE)" in code
    assert "    ids, labels = tokenize_corpus(docs)" in code and "train.py:3 main" in code
    compile(code, "fix", "exec")  # the printed code parses
    assert rules_startup.startup_bound(job(12.0, wall=20.0))["severity"] == "critical"
    keras = rules_startup.startup_bound(job(6.0, api="keras"))
    assert "pickle.dump((ids, labels), f" in keras["fix"]["code"] and "tf.data" in keras["fix"]["text"]
    assert "Dataset's __getitem__" not in keras["fix"]["text"]
    hf = rules_startup.startup_bound(job(6.0, leaf="datasets/arrow_dataset.py:3 map", names=("ds",),
                                         source="ds = ds.map(tokenize)"))["fix"]["code"]
    assert "ds = datasets.load_from_disk(CACHE)" in hf and "ds.save_to_disk(CACHE)" in hf and "batched=True" in hf
    compile(hf, "fix", "exec")
    one = rules_startup.startup_bound(job(6.0, names=("X",), source="X = featurize(rows)"))["fix"]["code"]
    assert "X = torch.load(" in one and "torch.save(X, CACHE)" in one
    bare = rules_startup.startup_bound(job(6.0, source=None, names=()))["fix"]["code"]
    assert "data = prepare_data()" in bare
    # the estimate is what the block holds, when it names what to keep
    half = job(6.0)
    half.time["parts"]["startup"]["split"]["block"]["seconds"] = 3.0
    assert rules_startup.startup_bound(half)["est_speedup"] == pytest.approx(20 / (20 - 0.9 * 3), rel=1e-3)
    model = rules_startup.startup_bound(job(6.0, model_share=0.8, leaf="torch/nn/init.py:1 kaiming_uniform_"))
    assert model["evidence"]["cause"] == "model_init" and model["est_speedup"] is None
    assert "meta" in model["fix"]["code"] and "assign=True" in model["fix"]["code"]
    inference = job(6.0)
    inference.step_rows = []
    assert rules_startup.startup_bound(inference) is None  # an inference script's set-up is its job
