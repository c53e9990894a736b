"""GPU starvation from scripted CUDA timelines: the instrument's marks → the analysis → exact seconds.

Each scenario drives :class:`CudaTimeline` with a :class:`ScriptedGPU` the way the PyTorch hooks
do (a mark at every phase boundary, probes from stack samples, a mark after each sync) and checks
the analysis against the simulator's true idle time.
"""

from __future__ import annotations

import pytest

from fake_cuda import ScriptedGPU
from whyidle.analysis.gpu_idle import LAG_EMPTY_NS, gpu_idle, lags
from whyidle.instrument.cuda import MAX_PENDING_MARKS, CudaTimeline

MS = 1_000_000
US = 1_000


class Loop:
    """A training loop on the scripted GPU, marked like the PyTorch instrumentation marks it."""

    def __init__(self, **gpu_kwargs) -> None:
        self.gpu = ScriptedGPU(**gpu_kwargs)
        self.tl = CudaTimeline(self.gpu.event, clock=self.gpu.clock)
        self.records: list[dict] = []
        self.steps: list[dict] = []
        self.step_i = 0
        self._t0 = None

    def begin_step(self) -> None:
        self.tl.mark("other", "step", self.step_i)
        self._t0 = self.gpu.now

    def end_step(self) -> None:
        self.steps.append({"i": self.step_i, "t0": self._t0, "t1": self.gpu.now})
        self.step_i += 1

    def phase(self, name: str) -> None:
        self.tl.mark(name, "phase", self.step_i)

    def data(self, host_ns: int) -> None:
        self.phase("data")
        self.gpu.host(host_ns)
        self.phase("other")

    def compute(self, name: str, work_ns: int, host_ns: int) -> None:
        self.phase(name)
        self.gpu.launch(work_ns, host_ns)
        self.phase("other")

    def sync(self, site: str, phase: str = "other") -> None:
        self.gpu.sync()
        self.tl.mark(phase, "sync", self.step_i, [site, site, None])

    def probe(self, site: str, weight_ns: int, phase: str = "other") -> None:
        self.tl.mark(phase, "probe", self.step_i, [site, site, weight_ns / MS])

    def finish(self) -> dict:
        self.tl.mark("other", "step", self.step_i)  # the boundary after the last step
        self.gpu.sync()  # let every event complete (the test's own wait, not the timeline's)
        out = self.tl.poll()
        self.records.extend(out)
        gpu_ms = {r["i"]: r["gpu_ms"] for r in out if r["k"] == "gpu_step"}
        for s in self.steps:
            s["gpu_ms"] = gpu_ms.get(s["i"])
        return self.analyze(skip=0)

    def analyze(self, skip: int = 2) -> dict:
        steps = self.steps[skip:]
        window = (steps[0]["t0"], steps[-1]["t1"])
        return gpu_idle(self.records, window, steps)

    def true_idle_s(self, skip: int = 2) -> float:
        steps = self.steps[skip:]
        return self.gpu.idle_between(steps[0]["t0"], steps[-1]["t1"]) / 1e9


def run(n_steps: int, body, **gpu_kwargs) -> Loop:
    loop = Loop(**gpu_kwargs)
    for _ in range(n_steps):
        loop.begin_step()
        body(loop)
        loop.end_step()
    loop.finish()
    return loop


# -- the five timelines of the issue ---------------------------------------------------------------

def healthy(loop: Loop) -> None:
    loop.data(100 * US)
    loop.compute("forward", 10 * MS, 300 * US)
    loop.compute("backward", 20 * MS, 300 * US)
    loop.compute("optimizer", 2 * MS, 200 * US)
    loop.gpu.host(200 * US)


def test_healthy_timeline_has_no_starved_time():
    loop = run(30, healthy, max_queue_ns=60 * MS)
    out = loop.analyze()
    assert loop.true_idle_s() == 0.0
    assert out["starved_s"] == pytest.approx(0.0, abs=1e-9)
    assert out["starved_share"] == pytest.approx(0.0, abs=1e-9)
    assert out["syncs"]["count"] == 0
    assert out["idle_sites"] == []
    # each step's GPU span is its 32 ms of work (the queue never ran dry)
    assert out["per_step"]["gpu_span_s"]["p50"] == pytest.approx(0.032, abs=1e-9)


def data_starved(loop: Loop) -> None:
    loop.data(30 * MS)
    loop.compute("forward", 5 * MS, 100 * US)
    loop.compute("backward", 10 * MS, 100 * US)
    loop.compute("optimizer", 1 * MS, 100 * US)
    loop.gpu.host(200 * US)


def test_data_starved_timeline_idle_is_exact_and_charged_to_data():
    loop = run(20, data_starved)
    out = loop.analyze()
    # per step: 30.5 ms of host time; the GPU works 16 ms of it. The work is queued 30.1–30.3 ms
    # into the step, so 15.6 ms of it are still queued when the next data wait starts: the GPU
    # starves 14.4 ms of the 30 ms wait, plus 0.1 ms before the forward launch.
    step_s = 0.0305
    assert out["covered_s"] == pytest.approx(18 * step_s, rel=1e-9)
    assert out["starved_s"] == pytest.approx(loop.true_idle_s(), abs=1e-9)
    by = out["idle_s_by_cause"]
    assert by["data"] == pytest.approx(18 * (0.030 - 0.0156), abs=1e-9)
    assert by["launch"] == pytest.approx(18 * 0.0001, abs=1e-9)
    assert by["sync"] == by["host"] == 0.0
    assert out["idle_share_by_cause"]["data"] == pytest.approx(by["data"] / out["covered_s"])
    assert out["per_step"]["starved_s"]["p50"] == pytest.approx(0.0145, abs=1e-9)
    assert out["per_step"]["idle_s_by_cause"]["data"] == pytest.approx(0.0144, abs=1e-9)
    # the GPU span of a step = its 16 ms of work + 14.5 ms idle (in GPU time between step marks)
    assert out["per_step"]["gpu_span_s"]["p50"] == pytest.approx(0.0305, abs=1e-9)


def sync_heavy(loop: Loop) -> None:
    # C09: three host reads per step after backward, then logging, then the optimizer
    loop.data(50 * US)
    loop.compute("forward", 3 * MS, 200 * US)
    loop.compute("backward", 6 * MS, 200 * US)
    loop.sync("train.py:40 train_step")  # loss.item()
    loop.gpu.host(500 * US)
    loop.sync("train.py:41 train_step")  # acc.item()
    loop.gpu.host(500 * US)
    loop.sync("train.py:42 train_step")  # logits.cpu().numpy()
    loop.gpu.host(1 * MS)
    loop.compute("optimizer", 1 * MS, 100 * US)


def test_sync_heavy_timeline_prices_each_sync():
    loop = run(20, sync_heavy)
    out = loop.analyze()
    assert out["starved_s"] == pytest.approx(loop.true_idle_s(), abs=1e-9)
    syncs = out["syncs"]
    assert syncs["count"] == 3 * 18
    assert syncs["per_step"] == pytest.approx(3.0)
    sites = {s["site"]: s for s in syncs["sites"]}
    assert set(sites) == {"train.py:40 train_step", "train.py:41 train_step", "train.py:42 train_step"}
    # after each sync the queue is empty until the host's next phase boundary
    assert sites["train.py:40 train_step"]["idle_s"] == pytest.approx(18 * 0.0005, abs=1e-9)
    assert sites["train.py:41 train_step"]["idle_s"] == pytest.approx(18 * 0.0005, abs=1e-9)
    # ... the last one until the queue holds work again: through the optimizer's 0.1 ms of Python
    # before its launch, which a queue kept full would have hidden
    assert sites["train.py:42 train_step"]["idle_s"] == pytest.approx(18 * 0.0011, abs=1e-9)
    assert all(s["per_step"] == pytest.approx(1.0) for s in sites.values())
    assert out["idle_s_by_cause"]["sync"] == pytest.approx(syncs["idle_s"], abs=1e-12)
    assert syncs["idle_s"] == pytest.approx(18 * 0.0021, abs=1e-9)
    assert out["idle_s_by_cause"]["launch"] == 0.0


def host_heavy(loop: Loop) -> None:
    loop.data(50 * US)
    loop.compute("forward", 4 * MS, 200 * US)
    loop.compute("backward", 8 * MS, 200 * US)
    loop.compute("optimizer", 1 * MS, 100 * US)
    for _ in range(4):  # 20 ms of per-step logging, sampled every 5 ms
        loop.gpu.host(5 * MS)
        loop.probe("train.py:77 log_metrics", 5 * MS)


def test_host_heavy_timeline_idle_sites_name_the_logging_line():
    loop = run(20, host_heavy)
    out = loop.analyze()
    assert out["starved_s"] == pytest.approx(loop.true_idle_s(), abs=1e-9)
    by = out["idle_s_by_cause"]
    # 13 ms of GPU work, queued 0.25–0.55 ms into the step, still holds 12.7 ms when the logging
    # starts 0.55 ms in: the GPU starves for the other 7.3 ms of it
    assert by["host"] == pytest.approx(18 * (0.020 - 0.0127), abs=1e-9)
    top = out["idle_sites"][0]
    assert top["site"] == "train.py:77 log_metrics"
    assert top["phase"] == "other"
    assert top["seconds"] == pytest.approx(by["host"], abs=1e-9)
    assert out["probe_s"] == pytest.approx(by["host"], abs=1e-9)


def launch_bound(loop: Loop) -> None:
    loop.data(20 * US)
    loop.phase("forward")
    for k in range(200):  # 200 tiny kernels: 50 µs of Python each, 10 µs on the GPU
        loop.gpu.launch(10 * US, 50 * US)
        if k % 20 == 19:
            loop.probe("model.py:12 forward", 1200 * US, "forward")
    loop.phase("other")
    loop.compute("optimizer", 200 * US, 100 * US)


def test_launch_bound_timeline_is_charged_to_launch():
    loop = run(20, launch_bound)
    out = loop.analyze()
    truth = loop.true_idle_s()
    by = out["idle_s_by_cause"]
    assert by["launch"] / out["starved_s"] > 0.99
    assert out["starved_share"] > 0.8
    # the model is an upper bound inside intervals with launches: each of the 10 probe intervals
    # per step holds 20 launches whose 10 µs each count as starved (the last one's spills into
    # the next interval, below LAG_EMPTY_NS)
    assert out["starved_s"] == pytest.approx(truth + 18 * 10 * 20 * 10 * US / 1e9, abs=1e-9)
    assert out["idle_sites"][0]["site"] == "model.py:12 forward"


def launch_bound_with_a_read(loop: Loop) -> None:
    # in-memory batches indexed directly (no DataLoader phase), 200 tiny kernels, one read
    loop.phase("forward")
    for k in range(200):
        loop.gpu.launch(10 * US, 50 * US)
        if k % 20 == 19:
            loop.probe("model.py:12 forward", 1200 * US, "forward")
    loop.phase("other")
    loop.sync("train.py:60 train")  # loss.item() for the progress bar
    loop.gpu.host(300 * US)


def test_a_sync_in_a_launch_bound_loop_is_charged_only_until_the_next_phase():
    loop = run(20, launch_bound_with_a_read)
    out = loop.analyze()
    # the queue never builds up, sync or not: the sync exposes only the 0.3 ms after it
    assert out["syncs"]["idle_s"] == pytest.approx(18 * 0.0003, abs=1e-9)
    assert out["idle_s_by_cause"]["launch"] / out["starved_s"] > 0.9


# -- robustness --------------------------------------------------------------------------------------

def test_no_marks_gives_none():
    assert gpu_idle([{"k": "step", "t": 1}], None) is None
    assert gpu_idle([], (0, 10)) is None


def test_lags_find_the_clock_offset_and_floor_jitter():
    h = [0, 10 * MS, 20 * MS, 30 * MS]
    offset = 5_000_000_000.0
    g = [offset + 0, offset + 10 * MS + 3 * MS, offset + 20 * MS + 5 * US, offset + 30 * MS]
    import numpy as np

    out = lags(np.asarray(h, dtype=np.int64), np.asarray(g))
    assert out.tolist() == [0.0, 3 * MS, 0.0, 0.0]  # 5 µs < LAG_EMPTY_NS reads as empty
    assert LAG_EMPTY_NS == 20 * US


def test_dropped_marks_leave_a_gap_that_is_not_analyzed():
    gpu = ScriptedGPU()
    tl = CudaTimeline(gpu.event, clock=gpu.clock)
    tl.mark("other", "step", 0)
    gpu.host(1 * MS)
    assert tl.poll()[0]["kind"] == ["step"]
    # fill the queue of pending marks: the GPU never completes them (far behind)
    gpu.launch(10_000 * MS)
    for _ in range(MAX_PENDING_MARKS):
        tl.mark("data")
    assert tl.dropped == 0
    tl.mark("data")
    assert tl.dropped == 1
    gpu.sync()
    tl.poll()
    tl.mark("other")
    gpu.sync()
    rec = tl.poll()[0]
    assert rec["kind"][-1] == "gap"


def test_timeline_never_blocks_and_reports_in_order():
    gpu = ScriptedGPU()
    tl = CudaTimeline(gpu.event, clock=gpu.clock)
    tl.mark("other", "step", 0)
    gpu.launch(5 * MS)
    tl.mark("data")
    gpu.host(1 * MS)
    # the first mark completed, the second waits behind 5 ms of work: only the first is read
    first = tl.poll()
    assert [r["k"] for r in first] == ["gpu_marks"]
    assert first[0]["kind"] == ["step"] and first[0]["g"] == [0]
    gpu.host(10 * MS)
    tl.mark("other", "step", 1)
    gpu.sync()
    out = tl.poll()
    marks, steps = out[0], out[1:]
    assert marks["kind"] == ["phase", "step"]
    assert marks["g"] == [5 * MS, 11 * MS]  # GPU time since the first mark
    assert [(s["i"], s["gpu_ms"]) for s in steps] == [(0, pytest.approx(11.0))]
    assert gpu.events == 3


def test_events_are_recycled():
    gpu = ScriptedGPU()
    tl = CudaTimeline(gpu.event, clock=gpu.clock)
    for i in range(10):
        tl.mark("other", "step", i)
        gpu.host(1 * MS)
        tl.poll()
    assert gpu.events <= 3  # one kept for chaining, the others reused


def test_no_mark_while_a_cuda_graph_is_captured():
    gpu = ScriptedGPU()
    capturing = [False]
    tl = CudaTimeline(gpu.event, clock=gpu.clock, capturing=lambda: capturing[0])
    tl.mark("other", "step", 0)
    capturing[0] = True
    tl.mark("forward")
    capturing[0] = False
    tl.mark("other")
    gpu.sync()
    rec = tl.poll()[0]
    assert rec["kind"] == ["step", "gap"]
    assert gpu.events == 2


def test_a_probe_inside_a_mark_is_skipped():
    gpu = ScriptedGPU()
    tl = CudaTimeline(gpu.event, clock=gpu.clock)
    tl._busy = True  # a signal handler interrupting mark()
    tl.mark("other", "probe", 0, ["a", "a", 1.0])
    tl._busy = False
    assert len(tl._pending) == 0
