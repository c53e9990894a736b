"""A scripted GPU for testing the CUDA timeline without CUDA.

:class:`ScriptedGPU` keeps a host clock (ns) and one stream: ``launch(d)`` queues ``d`` ns of GPU
work, ``host(d)`` advances the host clock, ``sync()`` blocks the host until the queue is empty.
Its events behave like ``torch.cuda.Event(enable_timing=True)``: ``record()`` is asynchronous,
``query()`` tells whether the stream has reached the event by now, ``elapsed_time()`` raises
unless both events completed and returns milliseconds of GPU time; ``synchronize()`` and
``wait()`` fail the test (the instrumentation must never block the host).

The GPU clock is the host clock shifted by an arbitrary offset, so the analysis has to find it.
The simulator also keeps the true idle intervals of the GPU, to check the analysis against.
"""

from __future__ import annotations

GPU_CLOCK_OFFSET_NS = 987_654_321


class ScriptedGPU:
    def __init__(self, start_ns: int = 1_000_000_000, max_queue_ns: int | None = None) -> None:
        self.max_queue_ns = max_queue_ns  # a full launch queue blocks the host (not a sync)
        self.now = start_ns
        self.free_at = start_ns  # host time at which all queued work is done
        self.idle: list[tuple[int, int]] = []  # true idle intervals (host clock)
        self.events = 0
        self.syncs = 0

    def clock(self) -> int:
        return self.now

    def _advance(self, to: int) -> None:
        """Moves the host clock to ``to``, noting GPU idle time on the way."""
        if to <= self.now:
            return
        idle_from = max(self.now, self.free_at)
        if to > idle_from:
            self.idle.append((idle_from, to))
        self.now = to

    def launch(self, work_ns: int, host_ns: int = 0) -> None:
        """``host_ns`` of host time (Python, dispatch), then ``work_ns`` of GPU work is queued."""
        self._advance(self.now + host_ns)
        if self.max_queue_ns is not None and self.free_at - self.now > self.max_queue_ns:
            self._advance(self.free_at - self.max_queue_ns)
        self.free_at = max(self.free_at, self.now) + work_ns

    def host(self, ns: int) -> None:
        self._advance(self.now + ns)

    def sync(self) -> None:
        """The host waits until the queue is empty (like ``.item()``)."""
        self.syncs += 1
        self._advance(max(self.now, self.free_at))

    def idle_between(self, t0: int, t1: int) -> int:
        return sum(max(0, min(b, t1) - max(a, t0)) for a, b in self.idle)

    def event(self) -> ScriptedEvent:
        self.events += 1
        return ScriptedEvent(self)


class ScriptedEvent:
    def __init__(self, gpu: ScriptedGPU) -> None:
        self.gpu = gpu
        self.done_at: int | None = None

    def record(self) -> None:
        self.done_at = max(self.gpu.now, self.gpu.free_at)

    def query(self) -> bool:
        return self.done_at is not None and self.gpu.now >= self.done_at

    def elapsed_time(self, end: ScriptedEvent) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("elapsed_time on an event that has not completed")
        return ((end.done_at + GPU_CLOCK_OFFSET_NS) - (self.done_at + GPU_CLOCK_OFFSET_NS)) / 1e6

    def synchronize(self) -> None:
        raise AssertionError("the instrumentation must never synchronize")

    def wait(self, stream=None) -> None:
        raise AssertionError("the instrumentation must never make a stream wait")
