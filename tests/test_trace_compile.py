"""torch.compile in profiler traces (whyidle.analysis.trace_compile, diagnose/trace_compile_rules):
exact values on small synthetic traces in the forms PyTorch 2.1-2.13 write, the real traces in
../shared/traces when that folder exists, and traces that torch.profiler writes here around a
torch.compile'd model on the CPU (slow: a real process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import finding, invoke
from test_trace_analysis import SHARED_TRACES, US, Builder, needs_shared
from whyidle.analysis.trace import rank_metrics
from whyidle.analysis.trace_compile import REGION_AFTER_COMPILE_US, parse_compile_id
from whyidle.diagnose.trace_compile_rules import SETTLED_STEPS, compile_findings, graph_breaks, recompiles

STEP = 10_000  # µs


def compile_at(b: Builder, ts, dur, cid=None, tid=1, old=False, backward=False):
    """A compilation as torch 2.13 writes it (``dynamo`` > ``entire_frame_compile`` > ``..._data:
    compile_id=``), or as 2.1-2.5 did (``old``: ``(dynamo_timed)`` sections, no id annotation)."""
    if backward:
        b.op(ts, dur, "entire_backward_compile", tid=tid)
        if cid:
            b.op(ts + 1, 0, f"entire_backward_compile_data: fn_name=backward._backward_impl, compile_id={cid}",
                 tid=tid, cat="user_annotation")
        return
    if old:
        b.op(ts, dur, "_compile.<locals>.compile_inner (dynamo_timed)", tid=tid, cat="user_annotation")
        b.op(ts + 10, dur - 20, "OutputGraph.call_user_compiler (dynamo_timed)", tid=tid, cat="user_annotation")
        b.op(ts + 20, dur - 40, "compile_fx.<locals>.bw_compiler (dynamo_timed)", tid=tid, cat="user_annotation")
        return
    b.op(ts, dur, "dynamo", tid=tid)
    b.op(ts + 1, 0, f"dynamo_data: compile_id={cid}", tid=tid, cat="user_annotation")
    b.op(ts + 5, dur - 10, "_compile.compile_inner (dynamo_timed)", tid=tid)


def region(b: Builder, ts, dur, cid="0/0", graph=True, tid=1):
    b.op(ts - 50, 40, "TorchDynamo Cache Lookup", tid=tid)
    b.op(ts, dur, "Torch-Compiled Region" + (f": {cid}" if cid else ""), tid=tid)
    if graph:
        b.op(ts + 10, dur - 20, "CompiledFunction", tid=tid)


def recompiling_trace(steps=6, recompile_in=(1, 2, 3), compile_us=4000) -> Builder:
    """Frame 0 compiled in step 0 (0/0) and again in each step of ``recompile_in`` (0/1, 0/2, ...);
    each step runs the newest graph."""
    b = Builder()
    cid = 0
    for i in range(steps):
        s = i * STEP
        b.step(i, s, STEP)
        if i == 0 or i in recompile_in:
            cid = 0 if i == 0 else cid + 1
            compile_at(b, s + 100, compile_us, f"0/{cid}")
        region(b, s + 100 + compile_us + 150, 1000, f"0/{cid}")
    return b


def test_compile_ids_of_every_form():
    assert parse_compile_id("0/3") == ("0", 3)
    assert parse_compile_id("12/0") == ("12", 0)
    assert parse_compile_id("!1/0/3") == ("!1/0", 3)  # compiled autograd
    assert parse_compile_id("!1") == ("!1", None)
    assert parse_compile_id("Unknown") == (None, None)
    assert parse_compile_id(None) == (None, None)


def test_recompilations_in_later_steps_are_counted_and_timed():
    m = rank_metrics(recompiling_trace().build())
    c = m["compile"]
    assert c["basis"] == "steps" and c["basis_s"] == pytest.approx(6 * STEP * US)
    assert c["compile_count"] == 4 and c["recompile_count"] == 3
    assert c["recompile_s"] == pytest.approx(3 * 4000 * US)
    assert c["recompile_share"] == pytest.approx(0.2)
    assert c["compile_share"] == pytest.approx(4 * 4000 / (6 * STEP))
    assert c["last_recompile_step"] == 3 and c["steps_after_last_recompile"] == 2
    assert [x["compile_id"] for x in c["compiles"]] == ["0/0", "0/1", "0/2", "0/3"]
    assert [x["step"] for x in c["compiles"]] == [0, 1, 2, 3]
    assert c["frames"] == [{"frame": "0", "compile_ids": [0, 1, 2, 3], "calls": 6, "calls_per_step": 1.0,
                            "compiled_ids": [0, 1, 2, 3], "never_ran": []}]
    assert c["regions"] == 6 and c["cache_lookups"] == 6 and c["graph_calls"]["CompiledFunction"] == 6
    assert c["region_share"] == pytest.approx(6 * 1000 / (6 * STEP))
    assert c["graph_breaks"] is None
    f = recompiles(m)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.2)
    assert f["est_speedup"] == pytest.approx(1.25)
    assert "0/1 in ProfilerStep#1" in f["summary"] and "TORCH_LOGS=recompiles" in f["summary"]
    assert "mark_dynamic" in f["fix"]["text"] and "dynamic=True" in f["fix"]["code"]
    assert graph_breaks(m) is None


def test_recompilations_that_stopped_long_before_the_end_are_info():
    m = rank_metrics(recompiling_trace(steps=2 + SETTLED_STEPS, recompile_in=(1,)).build())
    f = recompiles(m)
    assert f["severity"] == "info" and f["evidence"]["settled"] and f["est_speedup"] is None
    assert "None after ProfilerStep#1" in f["summary"]


def test_first_compilation_alone_is_no_recompilation():
    m = rank_metrics(recompiling_trace(recompile_in=()).build())
    c = m["compile"]
    assert c["compile_count"] == 1 and c["recompile_count"] == 0 and c["recompile_s"] == 0
    assert c["compile_in_basis_s"] == pytest.approx(4000 * US)
    assert compile_findings(m) == []


def test_lazy_backward_compilation_joins_its_compile_id():
    b = recompiling_trace(steps=3, recompile_in=(1,))
    compile_at(b, STEP + 7000, 1000, "0/1", backward=True)
    c = rank_metrics(b.build())["compile"]
    assert [x["compile_id"] for x in c["compiles"]] == ["0/0", "0/1"]  # frame compilations only
    assert c["compile_work"] == {"frame": 2, "backward": 1, "other": 0}
    assert c["recompile_count"] == 1  # the backward compilation counts in time, not as another
    assert c["recompile_s"] == pytest.approx(5000 * US) and c["recompile_work_s"] == pytest.approx(1000 * US)


def test_autotuning_after_a_compilation_keeps_its_id_and_its_syncs_are_the_compilers():
    """Inductor benchmarks its kernels at a new graph's first run (torch 2.11 on an H200:
    ``CachingAutotuner.benchmark_all_configs (dynamo_timed)`` inside the region, with syncs)."""
    b = recompiling_trace(steps=3, recompile_in=(1,))
    b.op(STEP + 4300, 400, "CachingAutotuner.benchmark_all_configs (dynamo_timed)")
    b.launch(STEP + 4400, 50, -1, name="cudaStreamSynchronize")
    b.launch(2 * STEP + 6000, 50, -1, name="cudaStreamSynchronize")  # the loop's own
    m = rank_metrics(b.build())
    c = m["compile"]
    assert c["compile_work"] == {"frame": 2, "backward": 0, "other": 1}
    assert c["compile_count"] == 2 and c["recompile_count"] == 1
    assert c["recompile_s"] == pytest.approx(4400 * US)
    assert m["syncs"]["count"] == 1 and m["syncs"]["in_compile"] == 1


def test_older_torch_compile_id_comes_from_the_region_that_follows():
    """2.1-2.5 wrote no ``compile_id`` annotation; old AOTAutograd compiled the backward inside the
    frame's compilation (``bw_compiler``): still a forward compilation."""
    b = Builder()
    for i in range(4):
        s = i * STEP
        b.step(i, s, STEP)
        cid = f"0/{min(i, 2)}"
        if i <= 2:
            compile_at(b, s + 100, 3000, old=True)
        region(b, s + 3100 + 150, 1000, cid)
    c = rank_metrics(b.build())["compile"]
    assert [x["compile_id"] for x in c["compiles"]] == ["0/0", "0/1", "0/2"]
    assert c["compile_work"] == {"frame": 3, "backward": 0, "other": 0}
    assert c["recompile_count"] == 2


def test_a_region_too_long_after_a_compilation_gives_it_no_id():
    b = Builder()
    b.step(0, 0, STEP)
    b.step(1, STEP, STEP)
    compile_at(b, STEP + 100, 3000, old=True)
    region(b, STEP + 3100 + REGION_AFTER_COMPILE_US + 100, 500, "0/0")
    c = rank_metrics(b.build())["compile"]
    assert c["compiles"][0]["compile_id"] is None
    assert c["compiles"][0]["recompile"]  # no id, in a step after the first


def test_bare_regions_of_torch_2_1_name_no_frame():
    b = Builder()
    for i in range(3):
        b.step(i, i * STEP, STEP)
        region(b, i * STEP + 5000, 1000, cid=None)
    compile_at(b, 2 * STEP + 100, 3000, old=True)
    c = rank_metrics(b.build())["compile"]
    assert c["regions"] == 3 and c["frames"] == []
    assert c["recompile_count"] == 1 and c["compiles"][0]["compile_id"] is None
    f = recompiles(rank_metrics(b.build()))
    assert "id not recorded in ProfilerStep#2" in f["summary"]


def test_a_frame_running_several_graphs_without_compilations_in_the_trace_is_info():
    b = Builder()
    for i in range(4):
        b.step(i, i * STEP, STEP)
        region(b, i * STEP + 500, 1000, f"0/{i % 2 + 3}")
    m = rank_metrics(b.build())
    assert m["compile"]["compile_s"] == 0 and m["compile"]["frames"][0]["compile_ids"] == [3, 4]
    f = recompiles(m)
    assert f["severity"] == "info" and f["bound"] is None and f["est_speedup"] is None
    assert "before the trace began" in f["summary"]


def test_a_compilation_that_never_ran_at_the_limit_is_named():
    b = recompiling_trace(steps=10, recompile_in=range(1, 8), compile_us=2000)
    compile_at(b, 9 * STEP + 9000, 500, "0/8")  # dynamo gives up: no region 0/8 follows
    m = rank_metrics(b.build())
    assert m["compile"]["frames"][0]["never_ran"] == [8]
    f = recompiles(m)
    assert f["evidence"]["recompile_limit_frames"] == ["0"] and "recompile_limit" in f["summary"]


def broken_trace(steps=4, graph=True) -> Builder:
    """Each step: frame 0's region holds a graph, an eager ``aten::item`` (1 ms), then frame 1's
    region (the resume function) with its own graph."""
    b = Builder()
    for i in range(steps):
        s = i * STEP
        b.step(i, s, STEP)
        b.op(s + 100, 5000, "Torch-Compiled Region: 0/0")
        if graph:
            b.op(s + 200, 1000, "CompiledFunction")
        b.op(s + 1300, 1000, "aten::item")
        b.op(s + 1310, 900, "aten::_local_scalar_dense")
        b.op(s + 2400, 50, "TorchDynamo Cache Lookup")
        b.op(s + 2500, 2500, "Torch-Compiled Region: 1/0")
        if graph:
            b.op(s + 2600, 2300, "CompiledFunction")
            b.op(s + 2700, 100, "aten::mm")  # inside the graph: not eager
    return b


def test_nested_regions_are_graph_breaks_and_their_eager_islands_are_timed():
    m = rank_metrics(broken_trace().build())
    gb = m["compile"]["graph_breaks"]
    assert gb["nested"] == 4 and gb["outer"] == 4 and gb["broken_share"] == 1.0
    assert gb["per_step"] == 1.0 and gb["steps_with_breaks"] == 4 and gb["frames"] == {"0": ["1"]}
    assert gb["island_s"] == pytest.approx(4 * (5000 - 1000 - 2500) * US)
    assert gb["island_share"] == pytest.approx(4 * 1500 / (4 * STEP))
    ops = sorted((o["op"], o["count"]) for o in gb["eager_ops"])
    assert ops == [("aten::_local_scalar_dense", 4), ("aten::item", 4)]
    f = graph_breaks(m)
    assert f["severity"] == "warning" and f["bound"] == pytest.approx(0.15)
    assert "once per ProfilerStep" in f["summary"] and "frame 0 → 1" in f["summary"]
    assert ".item()" in f["fix"]["text"] and "fullgraph=True" in f["fix"]["code"]
    assert recompiles(m) is None


def test_graph_breaks_without_graph_calls_have_no_island_time():
    f = graph_breaks(rank_metrics(broken_trace(graph=False).build()))
    assert f["severity"] == "info" and f["bound"] is None
    assert "cannot be told apart" in f["summary"]


def test_regions_side_by_side_or_a_single_nesting_are_no_graph_break():
    b = Builder()
    for i in range(3):
        s = i * STEP
        b.step(i, s, STEP)
        region(b, s + 500, 1000, "0/0")
        b.op(s + 1600, 2000, "aten::add")
        region(b, s + 4000, 1000, "1/0")
    m = rank_metrics(b.build())
    assert m["compile"]["graph_breaks"] is None and compile_findings(m) == []
    one = broken_trace(steps=1).build()
    assert graph_breaks(rank_metrics(one)) is None  # seen once: not "clearly"


def test_no_torch_compile_gives_no_compile_metrics():
    b = Builder()
    b.step(0, 0, STEP)
    b.op(10, 100, "aten::mm")
    m = rank_metrics(b.build())
    assert m["compile"] is None and compile_findings(m) == []


def test_compiled_function_only_as_torch_2_0_wrote():
    b = Builder()
    for i in range(2):
        b.step(i, i * STEP, STEP)
        for k in range(3):
            b.op(i * STEP + 100 + k * 2000, 1000, "CompiledFunction")
            b.op(i * STEP + 7000 + k * 500, 400, "CompiledFunctionBackward", tid=2)
    c = rank_metrics(b.build())["compile"]
    assert c["regions"] == 0 and c["frames"] == [] and c["graph_calls_per_step"] == 3.0
    assert c["graph_calls"]["CompiledFunctionBackward"] == 6
    assert c["region_share"] == pytest.approx((6 * 1000 + 6 * 400) / (2 * STEP))


def test_without_steps_the_basis_is_the_trace_span():
    b = Builder()
    compile_at(b, 0, 4000, "0/1")
    region(b, 4150, 5850, "0/1")
    c = rank_metrics(b.build())["compile"]
    assert c["basis"] == "trace" and c["steps"] == 0
    assert c["basis_s"] == pytest.approx(10_000 * US) and c["recompile_share"] == pytest.approx(0.4)


# -- end to end -------------------------------------------------------------------------------


def gpu_recompiling_trace(steps=8) -> dict:
    """A GPU job whose steps launch one 1.2 ms kernel each, back to back, and that recompiles in
    steps 1-4: each compilation leaves the GPU idle for 6 ms."""
    ev, corr = [], 1

    def x(name, ts, dur, cat="cpu_op", tid=1, **args):
        e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
        if args:
            e["args"] = args
        ev.append(e)

    t = 1_000_000.0
    for i in range(steps):
        compiles = i <= 4
        dur = (6150 if compiles else 0) + 1300
        x(f"ProfilerStep#{i}", t, dur, cat="user_annotation")
        pos = t + 50
        if compiles:
            x("dynamo", pos, 6000)
            x(f"dynamo_data: compile_id=0/{i}", pos + 1, 0, cat="user_annotation")
            pos += 6100
        x("TorchDynamo Cache Lookup", pos - 45, 40)
        x(f"Torch-Compiled Region: 0/{min(i, 4)}", pos, 1200)
        x("CompiledFunction", pos + 10, 1180)
        x("cudaLaunchKernel", pos + 20, 10, cat="cuda_runtime", correlation=corr)
        ev.append({"ph": "X", "cat": "kernel", "name": "triton_fused", "pid": 0, "tid": 7, "ts": pos + 40,
                   "dur": 1250, "args": {"device": 0, "stream": 7, "correlation": corr}})
        corr += 1
        t += dur
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": ev}


def test_trace_report_names_recompiles_not_host_work(tmp_path):
    path = tmp_path / "compiled.json"
    path.write_text(json.dumps(gpu_recompiling_trace()))
    proc = invoke(["trace", str(path), "--json", "-"])
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["verdict"] == "recompiles"
    f = finding(rep, "recompiles")
    assert f["severity"] == "critical" and f["evidence"]["count"] == 4
    assert finding(rep, "host_bound") is None  # the compilations' GPU idle is not the loop's host work
    assert rep["metrics"]["compile"]["recompile_count"] == 4
    assert any("torch.compile compilations" in n for n in rep["notes"])


@needs_shared
def test_shared_traces_with_compiled_regions():
    from whyidle.record.kineto import read_trace

    tri = rank_metrics(read_trace(os.path.join(SHARED_TRACES, "hta_triton_a100", "triton_example.json.gz")))
    c = tri["compile"]
    assert c["regions"] == 1 and c["cache_lookups"] == 1
    assert c["frames"] == [{"frame": "0", "compile_ids": [0], "calls": 1, "calls_per_step": 1.0,
                            "compiled_ids": [], "never_ran": []}]
    assert c["compile_s"] == 0 and compile_findings(tri) == []
    big = rank_metrics(read_trace(os.path.join(SHARED_TRACES, "hta_a100_16rank_job_rank0", "rank0.json.gz")))
    c = big["compile"]
    assert c["regions"] == 0 and c["graph_calls"]["CompiledFunction"] == 35 and c["graph_calls_per_step"] == 7.0
    assert 0 < c["region_share"] < 1 and compile_findings(big) == []
    plain = rank_metrics(read_trace(os.path.join(SHARED_TRACES, "hta_cuda_event_sync", "event_sync_trace.json.gz")))
    assert plain["compile"] is None


PROFILED = textwrap.dedent('''
    import sys, torch, torch.nn as nn
    from torch.profiler import ProfilerActivity, profile, schedule

    class Net(nn.Module):
        def __init__(self, breaks):
            super().__init__()
            self.a, self.b, self.breaks = nn.Linear(16, 32), nn.Linear(32, 2), breaks
        def forward(self, x):
            h = torch.relu(self.a(x))
            if self.breaks and h.sum().item() > 0:  # a graph break every call
                h = h * 2
            return self.b(h.mean(1))

    def traced(out, breaks, lengths, dynamic):
        torch._dynamo.reset()
        net = Net(breaks)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        model = torch.compile(net, backend="aot_eager", dynamic=dynamic)
        sched = schedule(wait=0, warmup=0, active=len(lengths), repeat=1)
        with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                     on_trace_ready=lambda p: p.export_chrome_trace(out)) as prof:
            for n in lengths:
                x, y = torch.randn(4, n, 16), torch.randint(0, 2, (4,))
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                prof.step()

    traced(sys.argv[1], False, list(range(8, 18)), False)  # a new length each step, dynamic=False
    traced(sys.argv[2], True, [8] * 8, None)                # one length, a break in every call
''')


@pytest.mark.slow
def test_traces_torch_profiler_writes_around_torch_compile(tmp_path):
    """Real traces of this machine's torch: recompilations up to the recompile limit, and a graph
    break per step (``.item()``) with its eager island."""
    script = tmp_path / "profiled.py"
    script.write_text(PROFILED)
    recompiling, broken = tmp_path / "recompiling.json", tmp_path / "broken.json"
    proc = subprocess.run([sys.executable, str(script), str(recompiling), str(broken)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    assert proc.returncode == 0, proc.stderr[-2000:]

    rep = json.loads(invoke(["trace", str(recompiling), "--json", "-"]).stdout)
    c = rep["metrics"]["compile"]
    assert c["frames"][0]["frame"] == "0" and c["frames"][0]["compile_ids"] == list(range(8))
    assert c["frames"][0]["never_ran"] == [8]  # the 9th: dynamo's default recompile_limit is 8
    assert c["recompile_count"] == 8
    f = finding(rep, "recompiles")
    assert f["severity"] != "info" and f["evidence"]["recompile_limit_frames"] == ["0"]

    rep = json.loads(invoke(["trace", str(broken), "--json", "-"]).stdout)
    gb = rep["metrics"]["compile"]["graph_breaks"]
    assert gb["per_step"] == 1.0 and gb["broken_share"] == 1.0 and len(gb["frames"]["0"]) == 1
    assert "aten::item" in [o["op"] for o in gb["eager_ops"]] and gb["island_s"] > 0
    assert finding(rep, "graph_breaks") is not None
    again = finding(rep, "recompiles")  # the resume function specializes on the .item() value once, then not
    assert again is None or again["severity"] == "info"


def test_a_compilation_in_the_idle_after_a_sync_is_not_that_syncs_idle():
    """``.item()`` then a recompilation of the resume function (torch 2.11, H200): the GPU waits
    for the compilation, not for the sync."""
    b = Builder()
    b.step(0, 0, 20_000)
    b.kernel(100, 900, launch_at=50)
    b.launch(1000, 20, -1, name="cudaStreamSynchronize")  # returns at 1020
    compile_at(b, 1100, 5000, "1/1")
    b.kernel(7020, 500, launch_at=7000)
    m = rank_metrics(b.build())
    assert m["syncs"]["count"] == 1 and m["syncs"]["idle_after_s"] == pytest.approx((7020 - 1020 - 5000) * US)
