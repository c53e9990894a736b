"""torch.compile in a live run: the compiler's callbacks, metrics, counters and recompile-limit
warning (whyidle.instrument.compile) over both callback signatures and on real compilations in this
process (backend="eager", no ``whyidle run``), the facts built from those records
(whyidle.analysis.compile, steps, accounting, startup), the findings (diagnose/rules_compile.py) and
the report's ``metrics.compile`` and wall-time line."""

from __future__ import annotations

import inspect
import logging
import threading
import types
from collections import Counter

import pytest
from test_accounting import steps as even_steps
from test_diagnose import assert_contract
from test_report_build import TRAINER, proc_records, run_data

from whyidle.analysis.accounting import time_accounting
from whyidle.analysis.compile import compile_facts, compile_number, intervals, training_intervals
from whyidle.analysis.facts import RunFacts
from whyidle.analysis.run import analyze
from whyidle.analysis.steps import select_steps
from whyidle.diagnose import diagnose, rules_compile
from whyidle.diagnose import thresholds as T
from whyidle.instrument import compile as cw
from whyidle.report.build import build_report
from whyidle.report.terminal import _startup_split, render

S = 1_000_000_000
NS = types.SimpleNamespace


def watch(recs, metrics=None, counters=None, sampler=None):
    main = threading.get_ident()
    return cw.CompileWatch(recs.append, lambda: main, metrics, counters, (lambda: sampler) if sampler else None)


def in_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


# -- the callbacks, the metrics, the counters, the limit warning (stand-ins) ----------------------

def test_callbacks_of_both_signatures_and_threads():
    recs, sampler = [], NS(phase="setup")
    w = watch(recs, sampler=sampler)
    w.end()                                     # an end without a start writes nothing
    assert recs == []
    w.start()                                   # torch <= 2.7: no arguments
    assert sampler.phase == "compile"           # start-up samples meanwhile are compile time
    w.end()
    assert sampler.phase == "setup"
    args = [NS(callback_trigger=NS(name="LAZY_BACKWARD"), compile_id="0/1")]  # a stand-in CallbackArgs
    try:
        from torch._dynamo.callback import CallbackArgs, CallbackTrigger
        args.append(CallbackArgs(CallbackTrigger.DYNAMO, "0/1"))
    except ImportError:  # torch <= 2.7
        pass
    for a in args:
        w.start(a)
        w.end(a)
    in_thread(lambda: (w.start(args[0]), w.end(args[0])))  # not the training thread
    got = [(r["k"], r["id"], r["trig"], r["main"]) for r in recs]
    assert got[0] == ("compile", None, None, True)
    assert got[1] == ("compile", "0/1", "LAZY_BACKWARD", True)
    assert got[2:-1] == [("compile", "0/1", "DYNAMO", True)] * (len(args) - 1)
    assert got[-1] == ("compile", "0/1", "LAZY_BACKWARD", False)
    assert all(r["t0"] <= r["t1"] == r["t"] for r in recs)
    # Dynamo runs the end callbacks on the thread that leaves last: the start's span is closed
    recs.clear()
    w.start()
    in_thread(w.end)
    assert [(r["id"], r["main"]) for r in recs] == [(None, True)] and not w.open
    assert sampler.phase == "setup"


def metric(cid, start, fn="forward", forward=True, reason=None, s=0.5, line=11):
    return NS(compile_id=cid, is_forward=forward, start_time=start, co_name=fn if forward else None,
              co_filename="/p/train.py", co_firstlineno=line, entire_frame_compile_time_s=s,
              recompile_reason=reason, fail_type=None, fail_reason=None, num_graph_breaks=None)


def test_read_metrics_records_each_forward_entry_once():
    recs = []
    ms = [metric("0/0", 1.0), metric("0/0", 1.5, forward=False),
          metric("0/1", 2.0, reason="0/0: tensor 'x' size mismatch at index 1. expected 3, actual 5")]
    w = watch(recs, metrics=lambda: ms)
    w.read_metrics()
    assert [(r["k"], r["id"], r["fn"], r["line"], r["s"]) for r in recs] == [
        ("compile_frame", "0/0", "forward", 11, 0.5), ("compile_frame", "0/1", "forward", 11, 0.5)]
    assert recs[1]["reason"].startswith("0/0: tensor 'x' size mismatch") and recs[0]["reason"] is None
    w.read_metrics()
    assert len(recs) == 2                       # nothing twice
    ms.append(metric("1/0", 3.0, fn="torch_dynamo_resume_in_forward_at_14", line=14))
    w.start()                                   # the callbacks read the new entries too
    assert recs[-1]["fn"] == "torch_dynamo_resume_in_forward_at_14" and len(recs) == 3
    watch(recs := [], metrics=lambda: None).read_metrics()
    assert recs == []


def test_summary_reads_the_counters():
    counters = {"graph_break": Counter({"Tensor.item() at line 14": 3, "data-dependent branch": 5}),
                "unimplemented": Counter({"Dynamo recompile limit exceeded": 1}),
                "resumes": Counter({"torch_dynamo_resume_in_forward_at_14": 12}),
                "frames": Counter({"total": 4, "ok": 4})}
    w = watch([], counters=lambda: counters)
    w.limits = 1
    s = w.summary()
    assert s["k"] == "compile_summary" and s["limit_hits"] == 1
    assert s["breaks"] == [{"reason": "data-dependent branch", "count": 5},
                           {"reason": "Tensor.item() at line 14", "count": 3}]  # most frequent first
    assert s["unsupported"] == [{"reason": "Dynamo recompile limit exceeded", "count": 1}]
    assert s["resumes"] == {"torch_dynamo_resume_in_forward_at_14": 12} and s["frames"] == {"total": 4, "ok": 4}
    bare = watch([]).summary()
    assert set(bare) == {"k", "t", "limit_hits"}


LIMIT_2_6 = ("torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s\n"
             'To log all recompilation reasons, use TORCH_LOGS="recompiles".\nTo diagnose recompilation issues, see %s')
LIMIT_OLD = ("torch._dynamo hit config.cache_size_limit (%s)\n   function: %s\n   last reason: %s\n"
             "To diagnose recompilation issues, see %s.")


def test_the_limit_warning_is_recorded_and_still_logged():
    recs, seen = [], []
    w = watch(recs)
    log = logging.getLogger(cw.CONVERT_LOGGER)
    handler = logging.Handler()
    handler.emit = seen.append
    flt = cw._LimitFilter(w)
    level, propagate = log.level, log.propagate
    log.addFilter(flt)
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False
    try:
        fn = "'forward' (/p/train.py:11)"
        log.warning(LIMIT_2_6, "recompile_limit", 8, fn, "0/7: tensor 'x' size mismatch at index 1", "https://x")
        log.warning(LIMIT_OLD, 8, fn, "tensor 'L['x']' size mismatch at index 1", "https://x")
        log.warning("something else %s", 1)
    finally:
        log.removeFilter(flt)
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    assert len(seen) == 3 and seen[0].getMessage().startswith("torch._dynamo hit config.recompile_limit (8)")
    assert [(r["k"], r["what"], r["limit"], r["fn"]) for r in recs] == [
        ("compile_limit", "recompile_limit", "8", fn), ("compile_limit", "cache_size_limit", "8", fn)]
    assert recs[0]["reason"].startswith("0/7: tensor 'x'") and recs[1]["reason"].startswith("tensor 'L['x']'")
    assert w.limits == 2


# -- real compilations in this process ------------------------------------------------------------

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")


class Net(torch.nn.Module):
    def __init__(self, item=False):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.item = item

    def forward(self, x):
        h = self.lin(x).relu()
        if self.item:
            h = h * h.abs().mean().item()  # a graph break
        return h.sum(dim=1)


@pytest.fixture
def fresh():
    from torch._dynamo.utils import counters
    dynamo.reset()
    counters.clear()
    yield
    dynamo.reset()
    counters.clear()


def compiled_run(model, lengths, **kw):
    """The records of a CompileWatch registered on Dynamo's callbacks while ``model`` runs on
    batches of these sequence lengths, then its summary."""
    from torch._dynamo.callback import callback_handler
    from torch._dynamo.utils import counters, get_compilation_metrics
    recs = []
    w = watch(recs, get_compilation_metrics, lambda: counters)
    callback_handler.register_start_callback(w.start)
    callback_handler.register_end_callback(w.end)
    try:
        m = torch.compile(model, backend="eager", **kw)
        for n in lengths:
            m(torch.randn(2, n, 8))
    finally:
        callback_handler.remove_start_callback(w.start)
        callback_handler.remove_end_callback(w.end)
    recs.append(w.summary())
    return recs


def test_a_real_recompilation_on_a_new_length(fresh):
    recs = compiled_run(Net(), (3, 5, 7))       # dynamic=None: 5 recompiles, dimension 1 dynamic since
    comps = [r for r in recs if r["k"] == "compile"]
    assert [c["id"] for c in comps] == ["0/0", "0/1"] and all(c["main"] for c in comps)
    assert all(c["trig"] == "DYNAMO" for c in comps) and all(c["t1"] > c["t0"] for c in comps)
    frames = {r["id"]: r for r in recs if r["k"] == "compile_frame"}
    assert frames["0/0"]["fn"] == "forward" and frames["0/0"]["file"] == __file__
    assert "size mismatch at index 1" in frames["0/1"]["reason"]
    c = compile_facts(recs, [])
    assert c["recompilations"] == 1 and c["recompiles"][0]["frame"] == "forward"
    (reason,) = c["recompiles"][0]["reasons"]
    assert (reason["tensor"], reason["dim"], reason["count"]) == ("x", 1, 1)
    assert c["recompile_s"] == pytest.approx((comps[1]["t1"] - comps[1]["t0"]) / 1e9)


def test_a_real_graph_break(fresh):
    recs = compiled_run(Net(item=True), (4, 4, 4))
    resumes = [r for r in recs if r["k"] == "compile_frame" and r["fn"].startswith("torch_dynamo_resume_in_")]
    assert resumes and resumes[0]["fn"].startswith("torch_dynamo_resume_in_forward_at_")
    summary = recs[-1]
    assert summary["breaks"] or summary["unsupported"]
    assert summary["resumes"]
    src, first = inspect.getsourcelines(Net.forward)
    line = first + next(i for i, s in enumerate(src) if ".item()" in s)
    (b,) = compile_facts(recs, [])["breaks"]
    assert (b["function"], b["line"], b["file"]) == ("forward", line, __file__)
    assert b["resumes"] == 1 and "item()" in b["reasons"][0]  # one compilation broke there


def test_install_sees_the_recompile_limit_and_survives_reset(fresh):
    from torch._dynamo.callback import callback_handler
    recs, notices = [], []
    agent = NS(record=recs.append, notice=notices.append, on_exit=[], disabled=False, startup=None)
    before = (list(callback_handler.start_callbacks), list(callback_handler.end_callbacks))
    log = logging.getLogger(cw.CONVERT_LOGGER)
    name = "recompile_limit" if hasattr(dynamo.config, "recompile_limit") else "cache_size_limit"
    try:
        w = cw.install(agent, dynamo)
        dynamo.reset()                          # the program resets Dynamo: the callbacks stay
        with dynamo.config.patch(**{name: 2}):
            m = torch.compile(Net(), backend="eager", dynamic=False)
            for n in (3, 4, 5, 6):
                m(torch.randn(2, n, 8))
        agent.on_exit[0]()
    finally:
        for cb in callback_handler.start_callbacks[len(before[0]):]:
            callback_handler.remove_start_callback(cb)
        for cb in callback_handler.end_callbacks[len(before[1]):]:
            callback_handler.remove_end_callback(cb)
        vars(callback_handler).pop("clear", None)
        for f in [f for f in log.filters if isinstance(f, cw._LimitFilter)]:
            log.removeFilter(f)
    assert not notices and w.limits == 1
    assert [r["id"] for r in recs if r["k"] == "compile"][:2] == ["0/0", "0/1"]
    (hit,) = [r for r in recs if r["k"] == "compile_limit"]
    assert hit["what"] == name and hit["limit"] == "2" and "forward" in hit["fn"]
    c = compile_facts(recs, [])
    assert c["limit"]["frame"] == "forward" and c["limit"]["limit"] == "2"
    assert recs[-1]["k"] == "compile_summary" and recs[-1]["limit_hits"] == 1


# -- the facts ------------------------------------------------------------------------------------

def rec(cid, t0, t1, trig="DYNAMO"):
    return {"k": "compile", "t": int(t1 * S), "t0": int(t0 * S), "t1": int(t1 * S), "id": cid, "trig": trig,
            "main": True}


def frame(cid, fn="forward", line=11, reason=None, s=0.05):
    return {"k": "compile_frame", "t": 0, "id": cid, "fn": fn, "file": "/p/train.py", "line": line, "s": s,
            "reason": reason, "fail": None, "fail_reason": None, "graph_breaks": None}


def job_steps():
    """15 compiled steps of 0.1 s from 1 s, one holding the limit hit (2.55 s), 5 eager ones of 0.2 s."""
    out = [(1.0 + 0.1 * i, 1.1 + 0.1 * i) for i in range(16)] + [(2.6 + 0.2 * i, 2.8 + 0.2 * i) for i in range(5)]
    return [{"i": i, "t0": int(a * S), "t1": int(b * S)} for i, (a, b) in enumerate(out)]


def job_records(dynamic=None):
    return [
        {"k": "compile_call", "t": 0, "site": "/p/train.py:30 main", "dynamic": dynamic, "mode": None,
         "backend": "inductor", "fullgraph": False},
        rec("0/0", 1.01, 1.05), frame("0/0"),                                   # start-up, in the first step
        rec("0/1", 1.51, 1.58), rec("0/1", 1.585, 1.595, "LAZY_BACKWARD"),      # a recompilation and its backward
        frame("0/1", reason="0/0: tensor 'L['x']' size mismatch at index 1. expected 3, actual 5"),  # torch < 2.6
        rec("0/2", 2.01, 2.03), frame("0/2", reason="0/1: tensor 'x' size mismatch at index 1. expected 5, actual 7"),
        rec("1/0", 2.21, 2.25), frame("1/0", fn="torch_dynamo_resume_in_forward_at_14", line=14),
        {"k": "compile_limit", "t": int(2.55 * S), "what": "recompile_limit", "limit": "8",
         "fn": "'forward' (/p/train.py:11)", "reason": "0/7: tensor 'x' size mismatch at index 1"},
        {"k": "compile_summary", "t": int(4 * S), "limit_hits": 1,
         "breaks": [{"reason": "Unsupported Tensor.item() call\n at line 14", "count": 2}],
         "unsupported": [{"reason": "Dynamo recompile limit exceeded", "count": 1}],
         "resumes": {"torch_dynamo_resume_in_forward_at_14": 12}, "frames": {"total": 4, "ok": 4}},
    ]


def test_compile_ids_and_intervals():
    assert compile_number("0/1") == ("0", 1) and compile_number("3/0_1") == ("3", 0)
    assert compile_number("!0/2/1") == ("2", 1) and compile_number("0/a") == ("0", None)
    assert compile_number(None) == (None, None) and compile_number("7") == (None, None)
    comps = intervals(job_records())
    assert [(c["id"], c["n"]) for c in comps][:3] == [("0/0", 0), ("0/1", 1), ("0/1", 1)]
    assert training_intervals(comps, None) == []           # no steps: all start-up
    assert training_intervals(comps, int(1.1 * S))[0] == (int(1.51 * S), int(1.58 * S))
    assert len(training_intervals(comps, int(1.1 * S))) == 4  # 0/0 ends in the first step: start-up


def test_compile_facts():
    c = compile_facts(job_records(), job_steps())
    assert c["compilations"] == 4 and c["observed"]
    assert c["total_s"] == pytest.approx(0.18) and c["startup_s"] == pytest.approx(0.04)
    assert c["training_s"] == pytest.approx(0.14)          # the recompilations and the resume's first compile
    assert c["recompilations"] == 2 and c["recompile_s"] == pytest.approx(0.10)
    (f,) = c["recompiles"]
    assert (f["frame"], f["site"], f["count"]) == ("forward", "/p/train.py:11 forward", 2)
    (r,) = f["reasons"]                                     # both forms of the guard text: one group
    assert (r["tensor"], r["dim"], r["count"]) == ("x", 1, 2) and r["text"] == "size of tensor 'x' changed at dimension 1"
    lim = c["limit"]
    assert (lim["frame"], lim["limit"], lim["hits"], lim["steps_after"]) == ("forward", "8", 1, 5)
    assert lim["compiled_step_s"] == pytest.approx(0.1) and lim["eager_step_s"] == pytest.approx(0.2)
    (b,) = c["breaks"]
    assert (b["site"], b["line"], b["resumes"]) == ("/p/train.py:14 forward", 14, 12)
    assert b["reasons"] == ["Unsupported Tensor.item() call"]  # the limit's counter is not a break reason
    assert c["compile_steps"] == 4 and c["call"]["dynamic"] is None
    assert compile_facts([{"k": "step"}], job_steps()) is None
    # without callbacks (no compile records): the metrics' seconds, recompilations grouped by frame
    old = compile_facts([r for r in job_records() if r["k"] != "compile"], job_steps())
    assert not old["observed"] and old["recompilations"] == 2 and old["recompile_s"] == pytest.approx(0.10)
    assert old["recompiles"][0]["count"] == 2 and old["recompiles"][0]["reasons"][0]["count"] == 2


def test_steps_holding_a_compilation_are_left_out():
    rows = even_steps(1, 3, 20)                             # 0.1 s steps
    spans = [(int(1.05 * S), int(1.08 * S)), (int(2.01 * S), int(2.02 * S))]  # warm-up step 0, step 10
    analyzed, info = select_steps(rows, spans)
    assert info["compile_excluded"] == 1 and len(analyzed) == 17 and rows[10] not in analyzed
    assert select_steps(rows)[1]["compile_excluded"] == 0
    _, info = select_steps(rows[:5], [(rows[2]["t0"], rows[4]["t1"])])  # 2 would remain: kept
    assert info["compile_excluded"] == 0


def test_compile_is_its_own_part_of_the_wall_time():
    rows = even_steps(1, 9, 8)
    ckpt = {"k": "region", "kind": "checkpoint", "t0": int(4.5 * S), "t1": int(5.0 * S), "site": "train.py:9 main"}
    compiles = ([(int(4.2 * S), int(4.7 * S))], [(int(0.2 * S), int(0.5 * S)), (int(1.2 * S), int(1.8 * S))])
    t = time_accounting((0, 10 * S), rows, [ckpt], [], [], records=[{"k": "proc", "t": 0}], compiles=compiles)
    p = t["parts"]
    assert sum(v["s"] for v in p.values()) == pytest.approx(10.0)
    assert p["compile"]["s"] == pytest.approx(0.5) and p["compile"]["count"] == 1
    assert p["checkpoint"]["s"] == pytest.approx(0.3)      # compile first where they overlap
    assert p["startup"]["s"] == pytest.approx(2.0) and p["training"]["s"] == pytest.approx(7 - 0.8)
    split = p["startup"]["split"]
    assert split["compile_s"] == pytest.approx(0.9) and split["first_step_s"] == pytest.approx(0.4)
    plain = time_accounting((0, 10 * S), rows, [ckpt], [], [], records=[{"k": "proc", "t": 0}])
    assert plain["parts"]["compile"]["s"] == 0 and plain["parts"]["startup"]["split"]["compile_s"] == 0
    assert plain["parts"]["startup"]["split"]["first_step_s"] == pytest.approx(1.0)


# -- the findings ---------------------------------------------------------------------------------

def facts_of(wall, dynamic=None, hotspots=None):
    c = compile_facts(job_records(dynamic), job_steps())
    rows = job_steps()
    return RunFacts(framework="torch", compile=c, compiled=True, time={"wall_s": wall}, hotspots=hotspots or {},
                    step={"step_time_s": {"mean": 0.1}}, analyzed_steps=rows[2:12])


def test_recompiles_severity_by_wall_share_and_fix():
    sev = {}
    for wall in (10.0, 1.0, 0.3):                           # 1 %, 10 %, 33 %
        f = rules_compile.recompiles(facts_of(wall))
        assert_contract(f)
        sev[wall] = f["severity"]
        assert f["bound"] == pytest.approx(0.10 / wall, abs=1e-3)
        assert f["est_speedup"] == pytest.approx(wall / (wall - 0.10), rel=1e-3)
    assert sev == {10.0: "info", 1.0: "warning", 0.3: "critical"}
    assert 0.10 / 1.0 >= T.COMPILE_WARN_SHARE and 0.10 / 0.3 >= T.COMPILE_CRITICAL_SHARE > 0.10
    f = rules_compile.recompiles(facts_of(1.0))
    assert "`forward`" in f["summary"] and "size of tensor 'x' changed at dimension 1 (2×)" in f["summary"]
    assert f["fix"]["code"].startswith("torch._dynamo.mark_dynamic(x, 1)")
    assert [o["text"].split(" ")[0] for o in f["fix"]["options"]] == ["Mark", "Compile", "Pad"]
    f = rules_compile.recompiles(facts_of(1.0, dynamic=False))
    assert f["fix"]["text"].startswith("Remove dynamic=False") and "train.py:30" in f["fix"]["text"]
    assert rules_compile.recompiles(RunFacts(compile=None, time={"wall_s": 1.0})) is None


def test_recompile_limit_finding():
    f = rules_compile.recompile_limit(facts_of(10.0))      # 5 steps × 0.1 s lost: 5 % of the wall
    assert_contract(f)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.05)
    assert f["evidence"]["part_s"] == pytest.approx(0.5) and f["evidence"]["steps_after"] == 5
    assert "`forward` hit torch._dynamo's recompile limit (8)" in f["summary"] and "2.00×" in f["summary"]
    assert rules_compile.recompile_limit(facts_of(1.0))["severity"] == "critical"  # 50 %


def test_graph_breaks_finding():
    hot = {"forward": [{"site": "/p/train.py:14 forward", "seconds": 0.3}]}  # the breaking line
    f = rules_compile.graph_breaks(facts_of(10.0, hotspots=hot))
    assert_contract(f)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.3)  # of 1 s of analyzed steps
    assert 0.3 >= T.BREAK_WARN_SHARE
    assert "train.py:14" in f["summary"] and "capture_scalar_outputs" in f["fix"]["code"]
    quiet = rules_compile.graph_breaks(facts_of(10.0))
    assert quiet["severity"] == "info" and quiet["bound"] == 0.0


# -- the report -----------------------------------------------------------------------------------

def test_report_has_the_compile_metrics_and_time_part():
    recs = proc_records()                                   # steps of 0.1 s from 0.5 s
    recs += [rec("0/0", 0.52, 0.58), frame("0/0"), rec("0/1", 1.51, 1.59),
             frame("0/1", reason="0/0: tensor 'x' size mismatch at index 1. expected 3, actual 5")]
    facts = analyze(run_data(procs={TRAINER: recs}))
    assert facts.steps_info["compile_excluded"] == 1
    verdict, findings = diagnose(facts)
    assert "recompiles" in {f["id"] for f in findings}
    rep = build_report(facts, verdict, findings)
    m = rep["metrics"]["compile"]
    assert {"compilations", "compile_s", "startup_compile_s", "later_compile_s", "recompilations", "recompile_s",
            "recompile_limit_hit", "graph_breaks", "compile_steps", "observed", "call"} <= set(m)
    assert m["recompilations"] == 1 and m["later_compile_s"] == pytest.approx(0.08)
    assert m["startup_compile_s"] == pytest.approx(0.06)
    assert rep["metrics"]["time"]["parts"]["compile"]["s"] == pytest.approx(0.08)
    import io
    out = io.StringIO()
    render(rep, file=out, width=200)
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("wall time"))
    assert "compiling 0.1 s" in line
    split = {"sampled": True, "framework_import_s": 1.0, "imports_s": 0.0, "program_s": 0.5, "framework_s": 0.0,
             "compile_s": 2.0, "first_step_s": 0.2}
    assert _startup_split({"split": split}) == ": imports 1.0 s, set-up 0.5 s, compile 2.0 s, first step 0.2 s"


def test_tune_tries_dynamic_shapes_for_a_recompile_finding(monkeypatch):
    from whyidle.instrument import overrides
    from whyidle.tune import plan

    fix = {"text": "t", "code": "torch._dynamo.mark_dynamic(x, 1)", "docs": [], "options": [
        {"text": "d", "code": "model = torch.compile(model, dynamic=True)", "est_speedup": 1.4, "condition": None,
         "assumed": False}]}
    report = {"framework": "torch", "findings": [{"id": "recompiles", "severity": "warning", "evidence": {},
                                                  "est_speedup": 1.4, "fix": fix}]}
    cand = [c for c in plan.candidates(report, cores=2) if c.origin == "recompiles"]
    assert [c.settings for c in cand] == [{"compile_dynamic": True}] and cand[0].predicted == 1.4
    assert cand[0].family == "compile"
    report["findings"][0]["severity"] = "info"  # an info finding makes no trial
    assert not [c for c in plan.candidates(report, cores=2) if c.origin == "recompiles"]

    settings, problems = overrides.parse('{"compile_dynamic": true}')
    assert settings == {"compile_dynamic": True} and not problems

    # the trial's torch.compile gets dynamic=True, and says what the program had
    seen, records = {}, []
    fake_torch = types.SimpleNamespace(compile=lambda model, **kw: seen.update(kw) or model)
    ov = types.SimpleNamespace(settings={"compile_dynamic": True},
                               note=lambda name, applied, **kw: records.append((name, applied, kw.get("was"))))
    overrides._wrap_compile(ov, fake_torch)
    assert fake_torch.compile("m", dynamic=False, mode="max-autotune") == "m"
    assert seen == {"dynamic": True, "mode": "max-autotune"} and records == [("compile_dynamic", True, False)]


def test_fix_code_keeps_the_programs_own_compile_call():
    call = rules_compile._compile_call
    line = 'cmodel = model if args.fast else torch.compile(model, backend="aot_eager", dynamic=dyn)'
    assert call(line, "True") == ('cmodel = model if args.fast else torch.compile(model, backend="aot_eager", '
                                  'dynamic=True)   # was dynamic=dyn')
    assert call(line, "") == 'cmodel = model if args.fast else torch.compile(model, backend="aot_eager")   # was dynamic=dyn'
    assert call("model = torch.compile(model, dynamic=False, mode=m)", "") == \
        "model = torch.compile(model, mode=m)   # was dynamic=False"
    assert call("net.compile()", "True") == "net.compile(dynamic=True)"
    assert call("model = torch.compile(model,", "True") is None and call("model = build()", "True") is None


def test_a_recompile_on_a_value_is_not_told_to_use_dynamic_shapes():
    c = {"call": None, "recompiles": [{"frame": "forward", "site": "m.py:3 forward"}]}
    reasons = [{"text": "1/0: ___stack0 == 2.03", "tensor": None, "dim": None, "example": "1/0: ___stack0 == 2.03",
                "count": 1}]
    text, code, opts = rules_compile._dim_fix(c, reasons, 1.2, 0.5)
    assert [o[0] for o in opts] == ["value"] and "keep it a tensor" in text and code is None
