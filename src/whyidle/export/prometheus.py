"""Prometheus metrics of a running job, served by the ``whyidle run`` parent process (never the
trainer): an HTTP endpoint for Prometheus to scrape (``--metrics-port [HOST:]PORT``) and/or a file
for node_exporter's textfile collector (``--metrics-file FILE.prom``, for batch systems where no
scraper can reach the job).

Names follow Prometheus's naming conventions (https://prometheus.io/docs/practices/naming/):
prefix ``whyidle_``, base units (seconds; shares as ``_ratio`` in 0–1), counters end in
``_total``. Every metric, its type, unit, labels and meaning is one entry of :data:`METRICS`; the
README's table is generated from it (``python -m whyidle.export.prometheus``).

Labels (low cardinality, by design): ``run`` (the run's name), ``host`` (the machine's name),
``rank`` (the trainer rank the figure describes; empty for a single-process job or a figure of the
whole job), and on a few metrics one bounded enum: ``phase``, ``kind``, ``verdict``, ``reason``.
Never a step number, a path or free text.

Where the figures come from: :meth:`JobMetrics.steps` (each rank's new steps since the last call),
:meth:`JobMetrics.live` (the last ~10–30 s, about once a second), :meth:`JobMetrics.window` (a
window record of ``RUN_DIR/windows.jsonl``, every ``--window`` seconds) and
:meth:`JobMetrics.trace` (each deep trace taken). A figure a window does not know (``null``) is
removed from the exposition rather than left at its last value.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server, write_to_textfile

from whyidle.report.windows import LOST_KINDS

#: Histogram buckets of step durations (seconds): 1 ms to 60 s, about 2.5× apart.
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Seconds between two writes of the textfile (node_exporter reads it at each scrape, typically
#: every 15–60 s; writing more often only costs disk writes). :meth:`JobMetrics.flush` with
#: ``force=True`` writes at once.
TEXTFILE_INTERVAL_S = 10.0

#: The labels every metric carries.
BASE_LABELS = ("run", "host", "rank")

#: A label value taken from a record (phase, lost-time kind, verdict, trace reason) must be a short
#: identifier; anything else becomes ``other`` (bounded cardinality whatever the record holds).
_IDENT = re.compile(r"[a-z][a-z0-9_]{0,39}\Z")


@dataclasses.dataclass(frozen=True)
class MetricSpec:
    """One exported metric: ``name`` as exposed (counters with ``_total``; a histogram's base
    name, exposed as ``_bucket``/``_sum``/``_count``), ``kind`` (counter, gauge, histogram, info),
    ``unit`` (``seconds``, ``ratio`` or empty), ``extra`` (labels beyond :data:`BASE_LABELS`),
    ``source`` (the :class:`JobMetrics` method that sets it) and ``help``."""

    name: str
    kind: str
    unit: str
    extra: tuple[str, ...]
    source: str
    help: str


#: Every metric :class:`JobMetrics` exports.
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("whyidle_step_duration_seconds", "histogram", "seconds", (), "steps",
               "Duration of each training step, seconds (buckets 1 ms to 60 s)."),
    MetricSpec("whyidle_steps_total", "counter", "", (), "steps", "Training steps completed."),
    MetricSpec("whyidle_samples_total", "counter", "", (), "steps",
               "Samples (examples) processed, where the batch size is known."),
    MetricSpec("whyidle_data_wait_seconds_total", "counter", "seconds", (), "steps",
               "Seconds the steps spent waiting for their next batch (the input pipeline)."),
    MetricSpec("whyidle_last_step_timestamp_seconds", "gauge", "seconds", (), "steps",
               "When the last step ended, Unix time in seconds."),
    MetricSpec("whyidle_samples_per_second", "gauge", "", (), "live",
               "Samples per second over the last 10-30 s."),
    MetricSpec("whyidle_data_wait_ratio", "gauge", "ratio", (), "live, window",
               "Share (0-1) of step time spent waiting for data: recent figure, and each window's."),
    MetricSpec("whyidle_step_share_ratio", "gauge", "ratio", ("phase",), "window",
               "Share (0-1) of the window's step time in each phase (data_wait, forward, backward, "
               "optimizer, eval, other_host)."),
    MetricSpec("whyidle_host_ratio", "gauge", "ratio", (), "window",
               "Share (0-1) of step time in host work other than data wait."),
    MetricSpec("whyidle_gpu_idle_ratio", "gauge", "ratio", (), "window",
               "Share (0-1) of the window the GPU sat idle."),
    MetricSpec("whyidle_gpu_utilization_ratio", "gauge", "ratio", (), "window",
               "Mean GPU utilization over the window, 0-1 (NVML's percent / 100)."),
    MetricSpec("whyidle_verdict_info", "info", "", ("verdict",), "window",
               "The last window's verdict (input_bound, device_bound, ...): one series, value 1."),
    MetricSpec("whyidle_goodput_ratio", "gauge", "ratio", (), "window",
               "Productive share (0-1) of the last window's wall time."),
    MetricSpec("whyidle_lost_seconds_total", "counter", "seconds", ("kind",), "window",
               "Wall seconds lost, by kind (startup, compile, data_wait, evaluation, checkpoint, idle), "
               "summed over the windows."),
    MetricSpec("whyidle_collective_wait_seconds", "gauge", "seconds", (), "window",
               "Seconds per step spent waiting in collectives (all-reduce, ...), last window."),
    MetricSpec("whyidle_culprit_rank", "gauge", "", (), "window",
               "The rank the others waited for in the last window."),
    MetricSpec("whyidle_window_slow_steps_ratio", "gauge", "ratio", (), "window",
               "Share (0-1) of the last window's steps slower than the run's baseline."),
    MetricSpec("whyidle_windows_total", "counter", "", (), "window", "Analysis windows closed."),
    MetricSpec("whyidle_deep_traces_total", "counter", "", ("reason",), "trace",
               "Deep (profiler) traces a trainer answered (taken, or declined with an error), by what "
               "triggered them: departure (a window left the baseline), request (whyidle trace-now), other."),
)


class _WithoutCreated:
    """A collector of another registry's metrics without their ``_created`` samples, which the
    classic text format would expose as extra gauges (``whyidle_steps_created``, ...): unitless
    names outside the conventions, doubling the exposition for nothing a dashboard of a job uses."""

    def __init__(self, inner: CollectorRegistry):
        self.inner = inner

    def describe(self):
        return []

    def collect(self):
        for family in self.inner.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class MetricsError(Exception):
    """The metrics endpoint or file cannot be set up or written; the message is one line."""


def metrics_table() -> str:
    """The README's table of :data:`METRICS` (Markdown)."""
    rows = ["| Metric | Type | Labels | Set by | Meaning |", "|---|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{x}`" for x in BASE_LABELS + m.extra)
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | `{m.source}` | {m.help} |")
    return "\n".join(rows)


def parse_listen(spec: str) -> tuple[str, int]:
    """``"[HOST:]PORT"`` → ``(host, port)``; the host defaults to ``0.0.0.0`` (every interface,
    like node_exporter); an IPv6 host goes in brackets (``[::1]:9464``). Port 0 picks a free port.
    Raises :class:`MetricsError` on anything else."""
    text = str(spec).strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host = ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or int(port) > 65535:
        raise MetricsError(f"metrics port {text!r}: expected [HOST:]PORT, e.g. 9464 or 127.0.0.1:9464")
    return host or "0.0.0.0", int(port)


def _number(x) -> float | None:
    """A finite float, or None (None, NaN, infinities, non-numbers)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _label(value, default: str = "other") -> str:
    """A record's string as a label value: itself when a short lowercase identifier, else ``default``."""
    return value if isinstance(value, str) and _IDENT.match(value) else default


class JobMetrics:
    """The metrics of one job, in a registry of their own, served over HTTP and/or written to a
    node_exporter textfile.

    ``run``: the run's name (label ``run``); ``host``: the machine's name (label ``host``);
    ``port``: ``"[HOST:]PORT"`` to serve ``/metrics`` on (see :func:`parse_listen`), None for no
    server; ``textfile``: the ``.prom`` file to write (atomically: a temporary file in the same
    folder, then a rename), None for none. Raises :class:`MetricsError` (one line) when the port
    cannot be bound (in use, no such address, no permission) or the file cannot be written (it is
    written once here, so a bad path fails at start). ``address``: the ``(host, port)`` actually
    served (the real port when 0 was asked), None without a server.
    """

    def __init__(self, run: str, host: str, port: str | None = None, textfile: str | None = None):
        self.run, self.host, self.textfile = str(run), str(host), textfile
        metrics = CollectorRegistry(auto_describe=True)
        self.registry = CollectorRegistry(auto_describe=False)  # what is served and written
        self.registry.register(_WithoutCreated(metrics))
        self._m = {}
        for spec in METRICS:
            labels = BASE_LABELS + spec.extra
            base = spec.name.removesuffix("_total") if spec.kind == "counter" else spec.name
            if spec.kind == "info":
                base = base.removesuffix("_info")
                # the info label (verdict) is the value set, not a label name of the metric
                self._m[spec.name] = Info(base, spec.help, BASE_LABELS, registry=metrics)
            elif spec.kind == "histogram":
                self._m[spec.name] = Histogram(base, spec.help, labels, unit=spec.unit, registry=metrics,
                                               buckets=STEP_BUCKETS_S)
            else:
                cls = Counter if spec.kind == "counter" else Gauge
                self._m[spec.name] = cls(base, spec.help, labels, unit=spec.unit, registry=metrics)
        self._server = self._thread = None
        self.address: tuple[str, int] | None = None
        self._last_write = -math.inf
        self._phases: dict[tuple[str, ...], set[str]] = {}
        # the job's window counters (a window record has no rank) exist at 0 from the start, so that
        # increase() counts the first window too: a series that appears above 0 loses its first value
        job = self._labels(None)
        self._m["whyidle_windows_total"].labels(*job)
        for kind in LOST_KINDS:
            self._m["whyidle_lost_seconds_total"].labels(*job, kind)
        if textfile is not None:
            self.flush(force=True)
        if port is not None:
            addr, number = parse_listen(port)
            try:
                self._server, self._thread = start_http_server(number, addr, registry=self.registry)
            except OSError as e:
                raise MetricsError(f"cannot serve metrics on {addr}:{number}: {e.strerror or e}") from None
            self.address = (addr, self._server.server_port)

    # -- setting ---------------------------------------------------------------------------------

    def _labels(self, rank) -> tuple[str, str, str]:
        return self.run, self.host, "" if rank is None else str(rank)

    def _set(self, name: str, labels: tuple[str, ...], value) -> None:
        """Sets gauge ``name`` to ``value``; removes the series when the value is unknown."""
        v = _number(value)
        if v is None:
            self._m[name].remove(*labels)
        else:
            self._m[name].labels(*labels).set(v)

    def _add(self, name: str, labels: tuple[str, ...], amount) -> None:
        """Adds ``amount`` (finite, >= 0; else nothing) to counter ``name``."""
        v = _number(amount)
        if v is not None and v >= 0:
            self._m[name].labels(*labels).inc(v)

    def steps(self, rank: int | None, durations_s: list[float], samples: int | None,
              last_end_unix_s: float | None, data_wait_s: float | None) -> None:
        """Records the new steps of one rank since the last call: ``durations_s`` (each step's
        duration, seconds) into the step-duration histogram and ``whyidle_steps_total``;
        ``samples`` (the samples those steps processed, None when unknown) into
        ``whyidle_samples_total``; ``data_wait_s`` (their total wait for data, seconds) into
        ``whyidle_data_wait_seconds_total``; ``last_end_unix_s`` (when the last of them ended,
        Unix seconds) into ``whyidle_last_step_timestamp_seconds``. Non-finite or negative values
        are left out."""
        labels = self._labels(rank)
        hist = self._m["whyidle_step_duration_seconds"].labels(*labels)
        n = 0
        for d in durations_s:
            v = _number(d)
            if v is not None and v >= 0:
                hist.observe(v)
                n += 1
        self._add("whyidle_steps_total", labels, n)
        self._add("whyidle_samples_total", labels, samples)
        self._add("whyidle_data_wait_seconds_total", labels, data_wait_s)
        if _number(last_end_unix_s) is not None:
            self._set("whyidle_last_step_timestamp_seconds", labels, last_end_unix_s)

    def live(self, rank: int | None, samples_per_s: float | None, data_wait_ratio: float | None) -> None:
        """Sets the recent figures of one rank (the last ~10–30 s, called about once a second):
        ``samples_per_s`` (samples per second) and ``data_wait_ratio`` (fraction 0–1 of step time
        waiting for data). None (unknown) removes the series."""
        labels = self._labels(rank)
        self._set("whyidle_samples_per_second", labels, samples_per_s)
        self._set("whyidle_data_wait_ratio", labels, data_wait_ratio)

    def window(self, rec: dict) -> None:
        """Sets the figures of a window record (``RUN_DIR/windows.jsonl``, described in
        ``docs/run-format.md``): phase shares and the other fractions as ``_ratio`` gauges (GPU
        utilization percent / 100), the verdict as ``whyidle_verdict_info`` (the previous verdict's
        series removed), goodput, each kind's lost seconds added to ``whyidle_lost_seconds_total``,
        collective wait per step (seconds) and the culprit rank. A figure the record lacks or has
        as null is removed; a record that is not a dict is ignored."""
        if not isinstance(rec, dict):
            return
        labels = self._labels(rec.get("rank") if isinstance(rec.get("rank"), int) else None)
        self._add("whyidle_windows_total", labels, 1)
        shares = rec.get("shares") if isinstance(rec.get("shares"), dict) else {}
        phases = {p for p in shares if isinstance(p, str) and _IDENT.match(p)}
        for phase in self._phases.get(labels, set()) - phases:  # of an earlier window, not this one
            self._m["whyidle_step_share_ratio"].remove(*labels, phase)
        self._phases[labels] = phases
        for phase in phases:
            self._set("whyidle_step_share_ratio", labels + (phase,), shares[phase])
        self._set("whyidle_data_wait_ratio", labels, shares.get("data_wait"))
        self._set("whyidle_host_ratio", labels, rec.get("host_ratio"))
        gpu = rec.get("gpu") if isinstance(rec.get("gpu"), dict) else {}
        util = _number(gpu.get("util_mean"))
        self._set("whyidle_gpu_utilization_ratio", labels, None if util is None else util / 100.0)
        self._set("whyidle_gpu_idle_ratio", labels, gpu.get("idle_share"))
        info = self._m["whyidle_verdict_info"]
        verdict = rec.get("verdict")
        if isinstance(verdict, str) and verdict:
            info.labels(*labels).info({"verdict": _label(verdict)})
        else:
            info.remove(*labels)
        goodput = rec.get("goodput") if isinstance(rec.get("goodput"), dict) else {}
        self._set("whyidle_goodput_ratio", labels, goodput.get("ratio"))
        lost = goodput.get("lost_s") if isinstance(goodput.get("lost_s"), dict) else {}
        for kind, s in lost.items():
            self._add("whyidle_lost_seconds_total", labels + (_label(kind),), s)
        coll = rec.get("collective") if isinstance(rec.get("collective"), dict) else {}
        self._set("whyidle_collective_wait_seconds", labels, coll.get("wait_s_per_step"))
        culprit = coll.get("culprit_rank")
        self._set("whyidle_culprit_rank", labels, culprit if isinstance(culprit, int) else None)
        self._set("whyidle_window_slow_steps_ratio", labels, rec.get("slow_share"))

    def trace(self, rec: dict) -> None:
        """Counts one deep trace a trainer answered (a ``deep_trace`` record of ``traces.jsonl``) in
        ``whyidle_deep_traces_total{reason}``: ``reason`` is the record's ``trigger`` (else its
        ``reason``) when a short lowercase identifier (``departure``, ``request``, ...), else
        ``other`` (a free-text reason never becomes a label value); ``rank`` is the record's rank."""
        if not isinstance(rec, dict):
            return
        rank = rec.get("rank") if isinstance(rec.get("rank"), int) else None
        reason = _label(rec.get("trigger") if rec.get("trigger") is not None else rec.get("reason"))
        self._add("whyidle_deep_traces_total", self._labels(rank) + (reason,), 1)

    # -- output ----------------------------------------------------------------------------------

    def flush(self, force: bool = False) -> None:
        """Writes the textfile (when one is configured) if :data:`TEXTFILE_INTERVAL_S` seconds have
        passed since the last write, or at once with ``force``. Raises :class:`MetricsError` when
        the file cannot be written (the temporary file is removed)."""
        if self.textfile is None:
            return
        now = time.monotonic()
        if not force and now - self._last_write < TEXTFILE_INTERVAL_S:
            return
        try:
            write_to_textfile(self.textfile, self.registry)
        except OSError as e:
            raise MetricsError(f"cannot write metrics file {self.textfile}: {e.strerror or e}") from None
        self._last_write = now

    def close(self) -> None:
        """Writes the textfile a last time and stops the HTTP server (waits for its thread). Safe
        to call twice. Raises :class:`MetricsError` when the final write fails (the server is
        stopped first)."""
        if self._server is not None:
            server, thread, self._server = self._server, self._thread, None
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        self.flush(force=True)


if __name__ == "__main__":
    print(metrics_table())
