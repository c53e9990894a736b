"""The Prometheus exporter of a running job (whyidle.export.prometheus): the exposition parsed back
with prometheus_client's own parsers, from the textfile and from the HTTP endpoint."""

from __future__ import annotations

import math
import os
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from whyidle.export import prometheus as P
from whyidle.export.prometheus import METRICS, JobMetrics, MetricsError

README = os.path.join(os.path.dirname(__file__), "..", "README.md")

WINDOW = {
    "k": "window", "i": 0, "t": 5, "t0": 1, "t1": 5, "start_s": 0.0, "end_s": 180.0, "steps": 900,
    "samples_per_s": 160.0, "step_s": {"p50": 0.2, "p90": 0.25, "mean": 0.2},
    "shares": {"data_wait": 0.42, "forward": 0.2, "backward": 0.25, "optimizer": 0.05, "eval": 0.0,
               "other_host": 0.08},
    "host_ratio": 0.08, "gpu": {"util_mean": 37.5, "idle_share": 0.55}, "verdict": "input_bound",
    "title": "Input-bound: the GPU waits for data", "bound": 0.42,
    "goodput": {"ratio": 0.5, "wall_s": 180.0, "productive_s": 90.0,
                "lost_s": {"startup": 10.0, "compile": 0.0, "data_wait": 75.0, "evaluation": 5.0,
                           "checkpoint": 0.0, "idle": 0.0}},
    "collective": {"wait_s_per_step": 0.012, "culprit_rank": 3}, "rank": None, "slow_share": 0.1,
    "departed": ["step_s"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of a classic text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def lab(rank="", **extra) -> tuple:
    return tuple(sorted({"run": "train-7", "host": "node1", "rank": rank, **extra}.items()))


def fed(m: JobMetrics) -> JobMetrics:
    m.steps(0, [0.0005, 0.01, 0.2, 90.0, math.nan, -1.0], 128, 1_700_000_123.5, 0.05)
    m.steps(0, [0.02], 32, 1_700_000_124.0, 0.01)
    m.steps(1, [0.03], None, None, None)
    m.live(0, 640.0, 0.3)
    m.live(1, None, 0.1)
    m.window(WINDOW)
    m.trace({"id": "t1", "rank": 0, "reason": "departure"})
    m.trace({"id": "t2", "rank": 0, "trigger": "request", "reason": "whyidle trace-now at 12:00"})
    m.trace({"id": "t3", "rank": 0, "reason": "step time 2.1x the baseline of /data/run 7"})
    return m


def test_names_units_and_labels_follow_the_prometheus_conventions():
    names = [m.name for m in METRICS]
    assert len(set(names)) == len(names)
    for m in METRICS:
        assert m.name.startswith("whyidle_") and m.name == m.name.lower(), m.name
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert m.name.endswith("_info") == (m.kind == "info"), m.name
        base = m.name.removesuffix("_total")
        assert m.unit in ("", "seconds", "ratio")
        if m.unit:
            assert base.endswith("_" + m.unit), m.name
        assert not base.endswith(("_ms", "_milliseconds", "_percent", "_bytes_total")), m.name
        assert set(m.extra) <= {"phase", "kind", "verdict", "reason"}, m.name
        assert m.help and m.source


def test_textfile_holds_every_metric_with_its_values(tmp_path):
    path = tmp_path / "whyidle.prom"
    m = fed(JobMetrics("train-7", "node1", textfile=str(path)))
    m.flush(force=True)
    text = path.read_text()
    got = samples(text)

    # steps: non-finite and negative durations left out; the 90 s step lands in the 60 s bucket
    assert got[("whyidle_steps_total", lab("0"))] == 5
    assert got[("whyidle_steps_total", lab("1"))] == 1
    assert got[("whyidle_samples_total", lab("0"))] == 160
    assert ("whyidle_samples_total", lab("1")) not in got
    assert got[("whyidle_data_wait_seconds_total", lab("0"))] == pytest.approx(0.06)
    assert got[("whyidle_step_duration_seconds_count", lab("0"))] == 5
    assert got[("whyidle_step_duration_seconds_sum", lab("0"))] == pytest.approx(90.2305)
    bucket = {float(dict(k[1])["le"]): v for k, v in got.items()
              if k[0] == "whyidle_step_duration_seconds_bucket" and dict(k[1])["rank"] == "0"}
    assert min(bucket) == 0.001 and max(b for b in bucket if b != math.inf) == 60.0
    assert bucket[0.001] == 1 and bucket[0.01] == 2 and bucket[0.025] == 3 and bucket[30.0] == 4
    assert bucket[60.0] == 4 and bucket[math.inf] == 5
    assert got[("whyidle_last_step_timestamp_seconds", lab("0"))] == 1_700_000_124.0
    assert ("whyidle_last_step_timestamp_seconds", lab("1")) not in got

    # live
    assert got[("whyidle_samples_per_second", lab("0"))] == 640.0
    assert ("whyidle_samples_per_second", lab("1")) not in got
    assert got[("whyidle_data_wait_ratio", lab("0"))] == 0.3
    assert got[("whyidle_data_wait_ratio", lab("1"))] == 0.1

    # the window (rank null: the job as a whole)
    for phase, share in WINDOW["shares"].items():
        assert got[("whyidle_step_share_ratio", lab(phase=phase))] == share
    assert got[("whyidle_data_wait_ratio", lab())] == 0.42
    assert got[("whyidle_host_ratio", lab())] == 0.08
    assert got[("whyidle_gpu_utilization_ratio", lab())] == 0.375
    assert got[("whyidle_gpu_idle_ratio", lab())] == 0.55
    assert got[("whyidle_verdict_info", lab(verdict="input_bound"))] == 1
    assert got[("whyidle_goodput_ratio", lab())] == 0.5
    for kind, s in WINDOW["goodput"]["lost_s"].items():
        assert got[("whyidle_lost_seconds_total", lab(kind=kind))] == s
    assert got[("whyidle_collective_wait_seconds", lab())] == 0.012
    assert got[("whyidle_culprit_rank", lab())] == 3
    assert got[("whyidle_window_slow_steps_ratio", lab())] == 0.1
    assert got[("whyidle_windows_total", lab())] == 1

    # traces: a free-text reason never becomes a label value
    assert got[("whyidle_deep_traces_total", lab("0", reason="departure"))] == 1
    assert got[("whyidle_deep_traces_total", lab("0", reason="request"))] == 1
    assert got[("whyidle_deep_traces_total", lab("0", reason="other"))] == 1

    # every metric of the list is there, under its name, with its unit (OpenMetrics exposes units)
    families = {f.name for f in text_string_to_metric_families(text)}
    for spec in METRICS:
        assert spec.name.removesuffix("_total") in families, spec.name
    assert not [n for n in families if not n.startswith("whyidle_") or n.endswith("_created")]
    from prometheus_client.openmetrics.exposition import generate_latest
    units = {f.name: f.unit for f in openmetrics_families(generate_latest(m.registry).decode())}
    for spec in METRICS:
        assert units[spec.name.removesuffix("_total").removesuffix("_info")] == spec.unit, spec.name
    labels = {k for (_, ls) in got for k, _ in ls}
    assert labels == {"run", "host", "rank", "le", "phase", "kind", "verdict", "reason"}
    assert os.listdir(tmp_path) == ["whyidle.prom"]  # written through a temporary file, renamed


def test_a_new_window_replaces_verdict_and_unknown_figures_and_adds_lost_seconds(tmp_path):
    m = JobMetrics("train-7", "node1")
    m.window(WINDOW)
    m.window({**WINDOW, "verdict": "device_bound", "shares": {"data_wait": 0.01, "forward": 0.9},
              "gpu": None, "collective": {"wait_s_per_step": None, "culprit_rank": None}, "slow_share": None,
              "goodput": {**WINDOW["goodput"], "lost_s": {"data_wait": 1.5, "idle": 2.0}}})
    from prometheus_client import generate_latest
    got = samples(generate_latest(m.registry).decode())
    verdicts = [dict(k[1])["verdict"] for k in got if k[0] == "whyidle_verdict_info"]
    assert verdicts == ["device_bound"]
    assert got[("whyidle_data_wait_ratio", lab())] == 0.01
    phases = sorted(dict(k[1])["phase"] for k in got if k[0] == "whyidle_step_share_ratio")
    assert phases == ["data_wait", "forward"]
    for gone in ("whyidle_gpu_utilization_ratio", "whyidle_gpu_idle_ratio", "whyidle_collective_wait_seconds",
                 "whyidle_culprit_rank", "whyidle_window_slow_steps_ratio"):
        assert (gone, lab()) not in got, gone
    assert got[("whyidle_lost_seconds_total", lab(kind="data_wait"))] == 76.5
    assert got[("whyidle_lost_seconds_total", lab(kind="idle"))] == 2.0
    assert got[("whyidle_lost_seconds_total", lab(kind="startup"))] == 10.0
    assert got[("whyidle_windows_total", lab())] == 2
    m.window({"verdict": None, "rank": None})
    got = samples(generate_latest(m.registry).decode())
    assert not [k for k in got if k[0] == "whyidle_verdict_info"]
    assert not [k for k in got if k[0] == "whyidle_step_share_ratio"]


def test_the_textfile_is_rewritten_at_most_every_interval_unless_forced(tmp_path, monkeypatch):
    path = tmp_path / "job.prom"
    m = JobMetrics("r", "h", textfile=str(path))
    # written at start (a bad path fails early), with the job's window counters at 0
    zero = {k: v for k, v in samples(path.read_text()).items()}
    assert {k[0] for k in zero} == {"whyidle_windows_total", "whyidle_lost_seconds_total"}
    assert len(zero) == 1 + len(P.LOST_KINDS) and set(zero.values()) == {0.0}
    m.steps(None, [0.1], 8, 1.0, 0.0)
    m.flush()
    assert samples(path.read_text()) == zero
    monkeypatch.setattr(P, "TEXTFILE_INTERVAL_S", 0.0)
    m.flush()
    assert samples(path.read_text())[("whyidle_steps_total", (("host", "h"), ("rank", ""), ("run", "r")))] == 1
    monkeypatch.setattr(P, "TEXTFILE_INTERVAL_S", 3600.0)
    m.steps(None, [0.1], 8, 2.0, 0.0)
    m.close()
    m.close()
    assert samples(path.read_text())[("whyidle_steps_total", (("host", "h"), ("rank", ""), ("run", "r")))] == 2


def test_the_http_endpoint_serves_the_same_exposition_and_stops_on_close():
    port = free_port()
    m = fed(JobMetrics("train-7", "node1", port=f"127.0.0.1:{port}"))
    try:
        assert m.address == ("127.0.0.1", port)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            got = samples(r.read().decode())
        assert got[("whyidle_samples_total", lab("0"))] == 160
        assert got[("whyidle_verdict_info", lab(verdict="input_bound"))] == 1
    finally:
        m.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_port_zero_serves_on_a_free_port():
    m = JobMetrics("r", "h", port="127.0.0.1:0")
    try:
        host, port = m.address
        assert host == "127.0.0.1" and port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert b"# TYPE whyidle_steps_total counter" in r.read()
    finally:
        m.close()


def test_a_port_in_use_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        for spec in (f"127.0.0.1:{port}", str(port)):  # 0.0.0.0 covers 127.0.0.1
            with pytest.raises(MetricsError) as e:
                JobMetrics("r", "h", port=spec)
            msg = str(e.value)
            assert "\n" not in msg and str(port) in msg and "in use" in msg.lower(), msg


@pytest.mark.parametrize("spec", ["abc", "70000", "127.0.0.1:", "host:port", "-1"])
def test_a_malformed_port_is_one_line(spec):
    with pytest.raises(MetricsError, match=r"expected \[HOST:\]PORT") as e:
        JobMetrics("r", "h", port=spec)
    assert "\n" not in str(e.value)


def test_listen_specs():
    assert P.parse_listen("9464") == ("0.0.0.0", 9464)
    assert P.parse_listen(":9464") == ("0.0.0.0", 9464)
    assert P.parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert P.parse_listen("[::1]:9464") == ("::1", 9464)


def test_an_unknown_host_is_one_line():
    with pytest.raises(MetricsError, match="cannot serve metrics on no-such-host.invalid:") as e:
        JobMetrics("r", "h", port="no-such-host.invalid:9464")
    assert "\n" not in str(e.value)


def test_an_unwritable_textfile_is_one_line(tmp_path):
    for path in (tmp_path / "missing" / "job.prom", tmp_path):  # no such folder; a folder
        with pytest.raises(MetricsError, match=f"cannot write metrics file {path}") as e:
            JobMetrics("r", "h", textfile=str(path))
        assert "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []  # no temporary file left behind
    # a file that becomes unwritable mid-run: the error comes from flush
    folder = tmp_path / "later"
    folder.mkdir()
    m = JobMetrics("r", "h", textfile=str(folder / "job.prom"))
    os.remove(folder / "job.prom")
    os.rmdir(folder)
    with pytest.raises(MetricsError, match="No such file or directory"):
        m.flush(force=True)


def test_readme_lists_every_metric():
    with open(README, encoding="utf-8") as f:
        readme = f.read()
    missing = [m.name for m in METRICS if f"`{m.name}`" not in readme]
    assert not missing, "README's metrics table (python -m whyidle.export.prometheus) lacks " + ", ".join(missing)
