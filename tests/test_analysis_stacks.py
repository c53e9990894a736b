"""Stack samples: the in-process sampler (whyidle.instrument.stacks) and the pure hotspot analysis
(whyidle.analysis.stacks). ``sample()`` is called directly on real frames of this file, which is
user code (not stdlib, not site-packages, not whyidle)."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

import pytest

from whyidle.analysis.stacks import FLUSH_SLACK_NS, focus, hotspots, split_site
from whyidle.instrument import stacks as stacks_mod
from whyidle.instrument.stacks import MAX_SITES_PER_FLUSH, FrameClassifier, StackSampler
from whyidle.record.writer import write_json_atomic

S = 1_000_000_000
THIS_FILE = os.path.realpath(__file__)
SITE_RE = re.compile(r"^(?P<path>.+):(?P<line>\d+) (?P<func>\S+)$")


# -- split_site ----------------------------------------------------------------------------------

def test_split_site():
    assert split_site("train.py:12 step") == ("train.py", 12, "step")
    assert split_site("/home/u/my project/train.py:7 <module>") == ("/home/u/my project/train.py", 7, "<module>")
    assert split_site("torch/nn/modules/module.py:1747 _call_impl") == ("torch/nn/modules/module.py", 1747, "_call_impl")
    assert split_site("C:\\code\\train.py:3 main") == ("C:\\code\\train.py", 3, "main")


def test_split_site_tolerates_odd_input():
    assert split_site("(overflow)") == ("(overflow)", None, "")
    assert split_site("") == ("", None, "")
    assert split_site("train.py:abc f") == ("train.py:abc", None, "f")
    assert split_site("nocolon f") == ("nocolon", None, "f")


# -- hotspots ------------------------------------------------------------------------------------

def rec(t_s, sites, hz=100, n=None):
    return {"k": "stacks", "t": int(t_s * S), "hz": hz, "n": n if n is not None else sum(s[3] for s in sites),
            "sites": sites}


RECORDS = [
    {"k": "step", "t": 0},
    rec(1, [["other", "train.py:40 log_metrics", "rich/console.py:100 print", 30],
            ["other", "train.py:41 log_metrics", "train.py:41 log_metrics", 10],
            ["other", "train.py:80 knn", "train.py:80 knn", 20],
            ["data", "data.py:10 __getitem__", "PIL/Image.py:200 open", 50],
            ["forward", "model.py:5 forward", "torch/nn/functional.py:10 conv2d", 5]]),
    rec(2, [["other", "train.py:41 log_metrics", "train.py:41 log_metrics", 25],
            ["other", None, "torch/optim/optimizer.py:50 zero_grad", 20],
            ["other", "train.py:81 knn", "train.py:81 knn", 5]], hz=50),
]


def test_hotspots_group_by_function_and_rank_by_seconds():
    out = hotspots(RECORDS, {"other"})
    # log_metrics: 0.3 + 0.1 + 0.5 s; zero_grad (library) 20 / 50 Hz = 0.4 s; knn 0.2 + 0.1 s
    assert [h["function"] for h in out][::2] == ["train.py log_metrics", "train.py knn"]
    assert out[1]["function"].endswith("optimizer.py zero_grad")
    top = out[0]
    assert top["seconds"] == pytest.approx(0.9)
    assert top["samples"] == 65
    # most-sampled line of the function (counts, not seconds): line 41 has 35 samples vs 30
    assert top["site"] == "train.py:41 log_metrics"
    assert top["leaf"] == "train.py:41 log_metrics"
    assert top["library"] is False
    total = 0.9 + 0.4 + 0.3
    assert top["share"] == pytest.approx(0.9 / total)  # share of the sampled phase time
    lib = out[1]
    assert lib["library"] is True
    assert lib["site"] == "torch/optim/optimizer.py:50 zero_grad"
    assert lib["seconds"] == pytest.approx(0.4) and lib["samples"] == 20
    assert out[2]["seconds"] == pytest.approx(0.3) and out[2]["samples"] == 25


def test_hotspots_share_against_total_step_time():
    out = hotspots(RECORDS, {"other"}, total_s=3.0)
    assert out[0]["share"] == pytest.approx(0.3)
    assert out[2]["share"] == pytest.approx(0.1)


def test_hotspots_phase_filter_limit_and_leaf():
    data = hotspots(RECORDS, {"data"})
    assert data == [{"function": "data.py __getitem__", "site": "data.py:10 __getitem__", "seconds": 0.5,
                     "share": 1.0, "samples": 50, "leaf": "PIL/Image.py:200 open", "library": False,
                     "framework": False, "code": None,
                     "lines": [{"site": "data.py:10 __getitem__", "seconds": 0.5, "share": 1.0,
                                "leaf": "PIL/Image.py:200 open", "code": None}]}]  # no source_root: no text read
    both = hotspots(RECORDS, {"data", "forward"}, limit=1)
    assert len(both) == 1 and both[0]["function"] == "data.py __getitem__"
    assert hotspots(RECORDS, {"backward"}) == []


def test_hotspots_window_with_flush_slack():
    # window [0, 1.5 s]: the record at 1 s counts, the one at 2 s is within the 1 s slack too
    assert FLUSH_SLACK_NS == 1 * S
    assert hotspots(RECORDS, {"other"}, window=(0, int(1.5 * S)))[0]["seconds"] == pytest.approx(0.9)
    # window [0, 0.5 s]: 1 s is inside the slack, 2 s is not
    out = hotspots(RECORDS, {"other"}, window=(0, int(0.5 * S)))
    assert [h["function"] for h in out] == ["train.py log_metrics", "train.py knn"]
    assert out[0]["seconds"] == pytest.approx(0.4)
    # window starting after the first record: only the second
    out = hotspots(RECORDS, {"other"}, window=(int(1.5 * S), 2 * S))
    assert [h["seconds"] for h in out] == pytest.approx([0.5, 0.4, 0.1])
    assert [h["library"] for h in out] == [False, True, False]


def test_hotspots_unknown_site_and_default_hz():
    recs = [{"k": "stacks", "t": 0, "n": 4, "sites": [["other", None, None, 4]]}]  # no hz: 100
    out = hotspots(recs, {"other"})
    assert out[0]["function"] == "(unknown)"
    assert out[0]["seconds"] == pytest.approx(0.04)
    assert out[0]["leaf"] is None and out[0]["library"] is True


def test_hotspots_no_records():
    assert hotspots([], {"other"}) == []
    assert hotspots([{"k": "step", "t": 0}], {"other"}, total_s=1.0) == []


def test_classifier_kinds_and_labels(monkeypatch, tmp_path):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(THIS_FILE)))
    c = FrameClassifier()
    # user code inside the working directory: relative path
    assert c.classify(__file__) == (0, os.path.join("tests", os.path.basename(THIS_FILE)))
    # stdlib: relative to its root
    assert c.classify(json.__file__) == (1, os.path.join("json", "__init__.py"))
    # site-packages (or dist-packages), whatever the prefix
    assert c.classify("/opt/x/lib/python3.11/site-packages/torch/nn/modules/conv.py") == (1, "torch/nn/modules/conv.py")
    assert c.classify("/usr/lib/python3/dist-packages/numpy/core/x.py") == (1, "numpy/core/x.py")
    # pseudo-files
    assert c.classify("<string>") == (1, "<string>")
    assert c.classify("<frozen importlib._bootstrap>") == (1, "<frozen importlib._bootstrap>")
    # whyidle itself
    kind, _ = c.classify(stacks_mod.__file__)
    assert kind == 2
    # cached
    assert c.classify(__file__) is c.classify(__file__)


def test_classifier_user_code_outside_cwd_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    c = FrameClassifier()
    assert c.classify(__file__) == (0, THIS_FILE)


# -- StackSampler.sample -------------------------------------------------------------------------

def make_sampler(max_sites=MAX_SITES_PER_FLUSH, hz=100):
    return StackSampler(threading.get_ident(), hz, lambda: "other", max_sites=max_sites)


def _sample_here(sampler, phase):
    here = sys._getframe(); sampler.sample(here, phase); return here.f_lineno  # noqa: E702


class _Hook:
    """Samples from inside the stdlib json encoder (str() of this object is called by it)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __str__(self):
        self.sampler.sample(sys._getframe(1), "data")  # the caller: json/encoder.py
        return "x"


def _through_library_and_whyidle(sampler, path):
    line = sys._getframe().f_lineno + 1
    write_json_atomic(path, {"v": _Hook(sampler)})  # whyidle → json (stdlib) → _Hook.__str__
    return line


def label_of(sampler, path=__file__):
    return sampler.classifier.classify(path)[1]


def test_sample_user_frame_site_format_and_drain(monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(THIS_FILE)))
    sampler = make_sampler(hz=50)
    line = _sample_here(sampler, "forward")
    _sample_here(sampler, "forward")
    line2 = _sample_here(sampler, "backward")
    site = f"{label_of(sampler)}:{line} _sample_here"
    assert site == f"tests/{os.path.basename(THIS_FILE)}:{line} _sample_here"
    assert SITE_RE.match(site)
    assert split_site(site) == (f"tests/{os.path.basename(THIS_FILE)}", line, "_sample_here")
    t_before = time.monotonic_ns()
    out = sampler.drain()
    assert len(out) == 1
    r = out[0]
    assert set(r) == {"k", "t", "hz", "n", "mode", "lost", "lost_s", "sites"}
    assert r["lost"] == 0 and r["lost_s"] == 0.0
    assert r["k"] == "stacks" and r["hz"] == 50 and r["n"] == 3 and r["mode"] is None  # never started
    assert isinstance(r["t"], int) and r["t"] >= t_before
    # innermost frame is user code: user site and leaf site are the same line; each sample
    # without an explicit weight stands for one period (20 ms at 50 Hz); callers are the
    # enclosing user frames (this test function, then pytest's frames are library code)
    rows: dict = {}
    for p, u, leaf, c, ms, _callers in r["sites"]:  # the same line called from two places: two keys
        c0, ms0 = rows.get((p, u, leaf), (0, 0.0))
        rows[(p, u, leaf)] = (c0 + c, ms0 + ms)
    assert rows == {("forward", site, site): (2, 40.0), ("backward", site, site): (1, 20.0)}
    callers = r["sites"][0][5]
    assert callers and callers[0].endswith(" test_sample_user_frame_site_format_and_drain")
    assert line2 == line
    assert sampler.drain() == []  # counts reset
    json.dumps(r)  # a JSON-serializable record


def test_sample_skips_whyidle_frames_and_keeps_library_leaf(tmp_path):
    sampler = make_sampler()
    line = _through_library_and_whyidle(sampler, str(tmp_path / "m.json"))
    (r,) = sampler.drain()
    assert r["n"] == 1
    ((phase, user, leaf, count, _ms, _callers),) = r["sites"]
    assert (phase, count) == ("data", 1)
    # the innermost user frame is this file's helper (the whyidle frame between is skipped)
    assert user == f"{label_of(sampler)}:{line} _through_library_and_whyidle"
    # the leaf is the innermost non-whyidle frame: the stdlib encoder
    m = SITE_RE.match(leaf)
    assert m and m.group("path") == os.path.join("json", "encoder.py")
    assert "whyidle" not in leaf and "record/writer.py" not in user


def test_sample_frame_without_user_code():
    # a thread whose whole Python stack is stdlib (threading → time.sleep, a C function)
    sampler = make_sampler()
    th = threading.Thread(target=time.sleep, args=(0.3,), daemon=True)
    th.start()
    deadline = time.monotonic() + 2.0
    frame = None
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(th.ident)
        if frame is not None and frame.f_code.co_name == "run":
            break
        time.sleep(0.005)
    assert frame is not None and frame.f_code.co_name == "run"
    sampler.sample(frame, "idle")
    th.join()
    (r,) = sampler.drain()
    ((phase, user, leaf, count, _ms, callers),) = r["sites"]
    assert (phase, user, count, callers) == ("idle", None, 1, [])
    m = SITE_RE.match(leaf)
    assert m and m.group("path") == "threading.py" and m.group("func") == "run"


def test_sample_none_frame_counts_unknown():
    sampler = make_sampler()
    sampler.sample(None, "other")
    (r,) = sampler.drain()
    assert r["sites"] == [["other", None, None, 1, 10.0, []]] and r["n"] == 1


def test_overflow_key_when_max_sites_exceeded():
    sampler = make_sampler(max_sites=2)
    # one call site, so keys differ only by phase: data, forward, then a third key → overflow;
    # an existing key (data) still counts normally; another phase gets its own overflow key
    for phase in ("data", "forward", "backward", "backward", "data", "optimizer"):
        _sample_here(sampler, phase)
    (r,) = sampler.drain()
    assert r["n"] == 6
    # overflow samples have no user site (so hotspots never name "(overflow)" as user code)
    by_key = {(p, "(overflow)" if leaf == "(overflow)" else "site"): c for p, u, leaf, c, _ms, _cl in r["sites"]}
    assert by_key == {("data", "site"): 2, ("forward", "site"): 1, ("backward", "(overflow)"): 2,
                      ("optimizer", "(overflow)"): 1}
    assert ["backward", None, "(overflow)", 2, 20.0, []] in r["sites"]
    # after a drain the budget is fresh
    _sample_here(sampler, "backward")
    (r,) = sampler.drain()
    assert r["sites"][0][2] != "(overflow)"


def test_drain_empty_before_any_sample():
    assert make_sampler().drain() == []


def _busy(seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(1000))


def test_sampler_thread_samples_a_busy_thread():
    """The fallback daemon thread (no native id given): it samples this thread and stops cleanly."""
    sampler = StackSampler(threading.get_ident(), 200, lambda: "forward")
    sampler.start()
    assert sampler.mode == "thread"
    # the sampling thread needs the GIL: on a loaded box it may get few turns in the first 0.3 s
    give_up = time.monotonic() + 10.0
    _busy(0.3)
    while sampler._n < 5 and time.monotonic() < give_up:
        _busy(0.1)
    sampler.stop()
    assert not sampler._thread.is_alive()
    out = sampler.drain()
    assert out and out[0]["n"] >= 5 and out[0]["mode"] == "thread"
    assert all(site[0] == "forward" for site in out[0]["sites"])
    assert any(site[1] and site[1].endswith(" _busy") for site in out[0]["sites"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread timer signals are Linux-only")
def test_signal_sampler_weights_gil_holding_and_sleeping_time_correctly():
    """The timer signal runs the sampler in this (main) thread: a GIL-holding busy loop and a
    sleep each get the wall time they took, at their own lines, with no sampling thread."""
    sampler = StackSampler(threading.get_ident(), 100, lambda: "other", native_id=threading.get_native_id())
    sampler.start()
    assert sampler.mode == "signal"
    _busy(0.4)
    time.sleep(0.4)
    sampler.stop()
    assert not sampler._thread.is_alive()
    (r,) = sampler.drain()
    assert r["mode"] == "signal"
    busy = sum(site[4] for site in r["sites"] if site[1] and site[1].endswith(" _busy")) / 1000
    slept = sum(site[4] for site in r["sites"] if site[1] and "test_signal_sampler" in site[1]) / 1000
    assert 0.3 <= busy <= 0.5
    assert 0.3 <= slept <= 0.5
    assert 60 <= r["n"] <= 100  # ~100 Hz over 0.8 s
    # SIGURG goes back to the state before us, its default action: ignore (never terminate)
    import signal as _signal
    assert sampler._timer_signum == _signal.SIGURG
    assert _signal.getsignal(_signal.SIGURG) == _signal.SIG_DFL
    assert r["lost"] == 0


def test_hotspot_code_is_read_from_the_source_root(tmp_path):
    (tmp_path / "data.py").write_text("\n" * 9 + "    image = Image.open(path)  # line 10\n")
    (data,) = hotspots(RECORDS, {"data"}, source_root=str(tmp_path))
    assert data["code"] == "image = Image.open(path)  # line 10"


def test_focus_is_the_deepest_function_holding_most_of_the_phase():
    # 60 % of data time in _wordpiece ← encode ← __getitem__, 40 % in _clean ← encode ← __getitem__
    recs = [{"k": "stacks", "t": 0, "hz": 100, "n": 100, "sites": [
        ["data", "tok.py:20 _wordpiece", "tok.py:20 _wordpiece", 60, 600.0, ["tok.py:50 encode", "ds.py:9 __getitem__"]],
        ["data", "tok.py:30 _clean", "tok.py:30 _clean", 40, 400.0, ["tok.py:48 encode", "ds.py:9 __getitem__"]],
        ["other", "train.py:5 main", "train.py:5 main", 10, 100.0, []],
    ]}]
    f = focus(recs, "data", phase_seconds=2.0)
    assert f["function"] == "tok.py _wordpiece"  # 60 % ≥ 50 %, and the deepest
    assert f["share_of_phase"] == pytest.approx(0.6)
    assert f["seconds"] == pytest.approx(1.2)  # scaled to the measured 2.0 s
    f = focus(recs, "data", min_share=0.7)
    assert f["function"] == "tok.py encode" and f["share_of_phase"] == pytest.approx(1.0)
    assert f["site"] == "tok.py:50 encode"  # its most-sampled line
    assert focus(recs, "backward") is None
    assert focus(recs, "data", min_share=1.01) is None


def test_focus_reads_nesting_from_the_chains_when_the_inner_function_has_two_callers():
    """A metric loop called from training_step (85 %) and validation_step (8 %) holds more time
    (93 %) than training_step itself (89 %): it is still the inner one (a CI run named training_step)."""
    recs = [{"k": "stacks", "t": 0, "hz": 100, "n": 100, "sites": [
        ["other", "m.py:69 stats_loop", "m.py:69 stats_loop", 85, 850.0, ["m.py:124 training_step", "m.py:219 <module>"]],
        ["other", "m.py:69 stats_loop", "m.py:69 stats_loop", 8, 80.0, ["m.py:133 validation_step", "m.py:219 <module>"]],
        ["other", "m.py:125 training_step", "m.py:125 training_step", 4, 40.0, ["m.py:219 <module>"]],
        ["other", "m.py:202 main", "m.py:202 main", 3, 30.0, ["m.py:219 <module>"]],
    ]}]
    f = focus(recs, "other")
    assert f["function"] == "m.py stats_loop" and f["callers"] == ["training_step", "<module>"]
    assert f["share_of_phase"] == pytest.approx(0.93)


def test_leaf_split_says_what_the_training_thread_did_in_its_data_wait():
    from whyidle.analysis.stacks import leaf_split

    records = [rec(1, [["data", "train.py:80 main", "selectors.py:415 select", 60],
                       ["data", "train.py:80 main", "multiprocessing/queues.py:122 get", 30],
                       ["data", "train.py:80 main", "torch/utils/data/dataloader.py:1400 _next_data", 5],
                       ["data", "train.py:80 main", "train.py:12 __iter__", 5],
                       ["forward", "model.py:5 forward", "selectors.py:415 select", 50]])]
    split = leaf_split(records, "data")
    assert split == pytest.approx({"waiting": 0.6, "receiving": 0.3, "snapshot": 0.0, "loader": 0.05, "other": 0.05})
    assert leaf_split(records, "backward") is None
