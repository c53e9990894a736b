"""A short TensorFlow profiler window around a few Keras training steps, and the reading of its
trace (runs inside the trainer; TensorFlow is already imported there).

Why: Keras fetches the next batch inside its compiled train function (``IteratorGetNext`` is an
op of the ``tf.function``), so host-side timing cannot split input wait from compute. The
TensorFlow profiler records the ``IteratorGetNextOp::DoCompute`` span of every step on its
``tf_data_iterator_get_next`` threads: that span is the time the step waited for tf.data (it is
short when the prefetch buffer holds a batch). This is the same signal TensorFlow's own input
pipeline analyzer uses for "input-bound" (TensorBoard Profile, *Input pipeline analysis*).

The trace (an ``XSpace`` protobuf, ``*.xplane.pb``) is parsed with TensorFlow's own generated
``xplane_pb2`` module and reduced to one ``tf_window`` record (docs/run-format.md); the file
stays in the run directory (``tfprof-<pid>/``) for TensorBoard.
"""

from __future__ import annotations

import glob
import os
from time import monotonic_ns

#: Event names of the iterator's get-next kernels in the host trace (TensorFlow's TraceMe names
#: of ``IteratorGetNextOp`` and its ``Optional`` / multi-device variants).
GET_NEXT_PREFIXES = ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard")
#: Most frequent tf.data ``Iterator::...`` stages kept in the record.
MAX_ITERATOR_STAGES = 12


def _profiler():
    from tensorflow.python.profiler import profiler_v2

    return profiler_v2


def start_profiler(logdir: str) -> None:
    """Starts TensorFlow's profiler session into ``logdir`` (TensorBoard's layout:
    ``plugins/profile/<run>/<host>.xplane.pb`` once saved) with TensorFlow's default options (host
    tracer level 2, device tracer level 1, no Python tracer), through the original
    ``profiler_v2.start``, not the wrapper :mod:`whyidle.instrument.keras` puts in to see the
    program's own starts. Errors: TensorFlow's (``AlreadyExistsError`` when a session runs)."""
    prof = _profiler()
    start = getattr(prof.start, "_whyidle_orig", prof.start)
    # passing the default options explicitly makes TF 2.21 log "expects an i value" warnings
    start(logdir)


def session_running() -> bool:
    """Whether a profiler session started through ``tf.profiler.experimental.start`` (the
    program's, TensorBoard's, or whyidle's) is running: ``profiler_v2``'s module-level session."""
    return getattr(_profiler(), "_profiler", None) is not None


def xplane_files(logdir: str) -> list[str]:
    """The ``*.xplane.pb`` files a profiler session saved under ``logdir``, oldest first."""
    return sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")), key=os.path.getmtime)


class ProfilerWindow:
    """Opens the TensorFlow profiler before train-function call ``after_calls`` and closes it
    after ``calls`` calls or ``max_s`` seconds (checked at batch begins), once per process.

    ``fail(where, exc)`` is called on unexpected errors. The profiler runs with TensorFlow's
    default options: host tracer level 2 (op-level host events), device tracer level 1 (kernels
    on GPUs), no Python tracer.
    """

    def __init__(self, agent, logdir: str, after_calls: int, calls: int, max_s: float, fail) -> None:
        self.agent = agent
        self.logdir = logdir
        self.after_calls = after_calls
        self.calls = calls
        self.max_s = max_s
        self.fail = fail
        self.state = "waiting"  # waiting → active → stopped → done; or failed / abandoned
        self.first_call = 0
        self.t_start = 0
        self.t_stop = 0

    @property
    def active(self) -> bool:
        return self.state == "active"

    def before_call(self, calls_seen: int, now: int) -> bool:
        """Called at each training batch begin with the train-function calls seen so far; True
        when it started or stopped the profiler (which takes a few to tens of ms)."""
        if self.state == "waiting" and calls_seen >= self.after_calls:
            self._start(calls_seen, now)
            return True
        if self.state == "active" and (calls_seen - self.first_call >= self.calls
                                       or now - self.t_start >= self.max_s * 1e9):
            self._stop(now)
            return True
        return False

    def close(self, now: int) -> None:
        """Training ended: a window still open is closed and kept."""
        if self.state == "active":
            self._stop(now)

    def abandon(self) -> None:
        """Stops an open window and discards it (the program's own profiler takes over)."""
        if self.state == "active":
            try:
                _profiler().stop(save=False)
            except Exception:
                pass
        if self.state in ("waiting", "active"):
            self.state = "abandoned"

    def _start(self, calls_seen: int, now: int) -> None:
        try:
            start_profiler(self.logdir)
        except Exception as exc:  # e.g. a profiler session the program opened is running
            self.state = "failed"
            self.agent.notice(f"TensorFlow profiler window not opened ({exc!r}): the input wait inside the train "
                              "step is not measured")
            return
        self.state = "active"
        self.first_call = calls_seen
        self.t_start = now
        self.agent.collectors.append(self.drain)

    def _stop(self, now: int) -> None:
        try:
            _profiler().stop(save=True)
        except Exception as exc:
            self.state = "failed"
            self.agent.notice(f"TensorFlow profiler window could not be saved: {exc!r}")
            return
        self.state = "stopped"
        self.t_stop = now

    def drain(self) -> list[dict]:
        """Collector (flusher thread): once the window is saved, parses it into one record."""
        if self.state != "stopped":
            return []
        self.state = "done"
        t0 = monotonic_ns()
        files = xplane_files(self.logdir)
        rec = {"k": "tf_window", "t": monotonic_ns(), "method": "tf_profiler", "t0": self.t_start,
               "t1": self.t_stop, "first_call": self.first_call}
        if not files:
            rec["error"] = "no .xplane.pb file was written"
            return [rec]
        try:
            rec.update(summarize_xspace(files[-1]))
        except Exception as exc:
            rec["error"] = repr(exc)
        rec["file"] = os.path.relpath(files[-1], self.agent.run_dir)
        rec["parse_s"] = round((monotonic_ns() - t0) / 1e9, 4)
        return [rec]


def _xplane_pb2():
    try:
        from tensorflow.tsl.profiler.protobuf import xplane_pb2
    except ImportError:  # older layouts
        from tsl.profiler.protobuf import xplane_pb2
    return xplane_pb2


def summarize_xspace(path: str) -> dict:
    """Reduces a TensorFlow profiler ``XSpace`` file to the input wait of each train-function call.

    Returns ``{"fn_name", "calls": [[duration_ns, get_next_ns], ...] in call order, "iterators":
    [[stage, count, total_ms], ...], "gpu_planes": n, "gpu_busy": [[plane, share], ...]}`` where
    ``share`` is :func:`gpu_busy_share` from the first call's start to the last call's end. A train-function call is an event that
    carries the ``tf_function_call`` stat on the host plane (Keras's ``multi_step_on_iterator`` /
    ``one_step_on_iterator``; when several functions ran, the most frequent name containing
    ``step``); ``get_next_ns`` is the summed ``IteratorGetNext*`` span inside it (clipped to it).
    Errors: ``OSError`` for an unreadable file, ``google.protobuf.message.DecodeError`` for a
    corrupt one, ``ValueError`` when the file holds no host plane.
    """
    xspace = _xplane_pb2().XSpace()
    with open(path, "rb") as f:
        xspace.ParseFromString(f.read())
    host = next((p for p in xspace.planes if p.name == "/host:CPU"), None)
    if host is None:
        raise ValueError("no /host:CPU plane in the profile")
    names = {k: v.name for k, v in host.event_metadata.items()}
    fn_stat = next((k for k, v in host.stat_metadata.items() if v.name == "tf_function_call"), None)
    calls: dict[str, list] = {}
    get_next: list[tuple[int, int]] = []
    stages: dict[str, list] = {}
    for line in host.lines:
        base_ps = line.timestamp_ns * 1000
        for ev in line.events:
            name = names.get(ev.metadata_id, "")
            start = base_ps + ev.offset_ps
            if name.startswith(GET_NEXT_PREFIXES):
                get_next.append((start, start + ev.duration_ps))
            elif name.startswith("Iterator::"):
                agg = stages.setdefault(name, [0, 0])
                agg[0] += 1
                agg[1] += ev.duration_ps
            elif fn_stat is not None and any(s.metadata_id == fn_stat for s in ev.stats):
                calls.setdefault(name, []).append((start, start + ev.duration_ps))
    fn_name = None
    if calls:
        stepped = [n for n in calls if "step" in n] or list(calls)
        fn_name = max(stepped, key=lambda n: len(calls[n]))
    out_calls = []
    get_next.sort()
    for s, e in sorted(calls.get(fn_name, [])):
        waited = sum(max(0, min(e, ge) - max(s, gs)) for gs, ge in get_next if gs < e and ge > s)
        out_calls.append([(e - s) // 1000, waited // 1000])
    top = sorted(stages.items(), key=lambda kv: -kv[1][1])[:MAX_ITERATOR_STAGES]
    spans = sorted(calls.get(fn_name, []))
    gpu_planes = [p for p in xspace.planes if p.name.startswith("/device:GPU")]
    return {
        "fn_name": fn_name, "calls": out_calls,
        "iterators": [[name, n, round(ps / 1e9, 3)] for name, (n, ps) in top],
        "gpu_planes": len(gpu_planes),
        "gpu_busy": [[p.name, gpu_busy_share(p, spans[0][0], spans[-1][1])] for p in gpu_planes] if spans else [],
    }


def gpu_busy_share(plane, t0_ps: int, t1_ps: int) -> float | None:
    """Fraction (0–1) of [t0_ps, t1_ps] (picoseconds on the trace's clock) in which a GPU plane ran
    any activity on its ``Stream #...`` lines (kernels, memcpy, memset as CUPTI records them):
    the union of their spans, so overlapping streams count once. Other lines of the plane (derived
    step / op / module lines, which span whole steps) are not counted. None for an empty window.
    Unverified on hardware so far: the line naming follows TensorFlow's CUPTI collector."""
    if t1_ps <= t0_ps:
        return None
    spans = []
    for line in plane.lines:
        if not line.name.startswith("Stream"):
            continue
        base = line.timestamp_ns * 1000
        for ev in line.events:
            s, e = max(t0_ps, base + ev.offset_ps), min(t1_ps, base + ev.offset_ps + ev.duration_ps)
            if e > s:
                spans.append((s, e))
    busy, end = 0, t0_ps
    for s, e in sorted(spans):
        if e > end:
            busy += e - max(s, end)
            end = e
    return round(busy / (t1_ps - t0_ps), 4)
