"""Reading a TensorFlow profiler XSpace (whyidle.instrument.tfprof.summarize_xspace) on a file
built with TensorFlow's own xplane_pb2, where every duration is known."""

from __future__ import annotations

import pytest

from conftest import needs
from whyidle.instrument import tfprof

pytestmark = needs("tensorflow")

PS_PER_MS = 1_000_000_000


def write_xspace(path, with_host=True):
    pb = tfprof._xplane_pb2()
    space = pb.XSpace()
    if not with_host:
        space.planes.add(name="/device:GPU:0")
        path.write_bytes(space.SerializeToString())
        return
    plane = space.planes.add(name="/host:CPU")
    for mid, name in {1: "multi_step_on_iterator", 2: "IteratorGetNextOp::DoCompute",
                      3: "Iterator::Root::Prefetch::Map", 4: "EagerExecute", 5: "__inference_other_fn"}.items():
        plane.event_metadata[mid].id = mid
        plane.event_metadata[mid].name = name
    plane.stat_metadata[7].id = 7
    plane.stat_metadata[7].name = "tf_function_call"
    py = plane.lines.add(id=1, name="python", timestamp_ns=1000)  # lines have their own base time
    getnext = plane.lines.add(id=2, name="tf_data_iterator_get_next", timestamp_ns=1000)
    worker = plane.lines.add(id=3, name="tf_data_iterator_resource", timestamp_ns=2000)
    # three train-function calls of 80 ms, 100 ms apart; get-next spans of 50, 10 and 70 ms inside
    for k, wait_ms in enumerate((50, 10, 70)):
        start = k * 100 * PS_PER_MS
        ev = py.events.add(metadata_id=1, offset_ps=start, duration_ps=80 * PS_PER_MS)
        ev.stats.add(metadata_id=7, int64_value=9)
        getnext.events.add(metadata_id=2, offset_ps=start + 2 * PS_PER_MS, duration_ps=wait_ms * PS_PER_MS)
        worker.events.add(metadata_id=3, offset_ps=start, duration_ps=30 * PS_PER_MS)
    # a get-next before the first call (not inside any call) and one straddling the end of call 3
    getnext.events.add(metadata_id=2, offset_ps=0, duration_ps=1)
    getnext.events.add(metadata_id=2, offset_ps=275 * PS_PER_MS, duration_ps=10 * PS_PER_MS)
    # an eager op without the stat, and another tf.function called once
    py.events.add(metadata_id=4, offset_ps=90 * PS_PER_MS, duration_ps=PS_PER_MS)
    other = py.events.add(metadata_id=5, offset_ps=400 * PS_PER_MS, duration_ps=PS_PER_MS)
    other.stats.add(metadata_id=7, int64_value=1)
    gpu = space.planes.add(name="/device:GPU:0")
    gpu.event_metadata[1].id = 1
    gpu.event_metadata[1].name = "volta_sgemm"
    a = gpu.lines.add(id=1, name="Stream #7(Compute)", timestamp_ns=1000)
    b = gpu.lines.add(id=2, name="Stream #9(MemcpyH2D)", timestamp_ns=1000)
    steps = gpu.lines.add(id=3, name="Steps", timestamp_ns=1000)  # derived: spans the whole window
    steps.events.add(metadata_id=1, offset_ps=0, duration_ps=300 * PS_PER_MS)
    a.events.add(metadata_id=1, offset_ps=10 * PS_PER_MS, duration_ps=40 * PS_PER_MS)  # 10–50 ms
    b.events.add(metadata_id=1, offset_ps=30 * PS_PER_MS, duration_ps=40 * PS_PER_MS)  # 30–70: 20 ms new
    a.events.add(metadata_id=1, offset_ps=270 * PS_PER_MS, duration_ps=40 * PS_PER_MS)  # clipped at 280
    path.write_bytes(space.SerializeToString())


def test_calls_and_their_get_next_time(tmp_path):
    path = tmp_path / "host.xplane.pb"
    write_xspace(path)
    out = tfprof.summarize_xspace(str(path))
    ms = 1_000_000
    assert out["fn_name"] == "multi_step_on_iterator"
    # call 3 ends at 280 ms: its 70 ms span (202–272) plus 5 ms of the straddling one (275–280)
    assert out["calls"] == [[80 * ms, 50 * ms + 0], [80 * ms, 10 * ms], [80 * ms, 75 * ms]]
    assert out["iterators"] == [["Iterator::Root::Prefetch::Map", 3, 90.0]]
    assert out["gpu_planes"] == 1
    # window = first call start (0) → last call end (280 ms): (60 + 10) ms busy on the streams
    assert out["gpu_busy"] == [["/device:GPU:0", round(70 / 280, 4)]]


def test_bad_files(tmp_path):
    no_host = tmp_path / "gpu.xplane.pb"
    write_xspace(no_host, with_host=False)
    with pytest.raises(ValueError, match="no /host:CPU plane"):
        tfprof.summarize_xspace(str(no_host))
    junk = tmp_path / "junk.xplane.pb"
    junk.write_bytes(b"\xff\xff\xff\xff not a protobuf")
    with pytest.raises(Exception):
        tfprof.summarize_xspace(str(junk))
