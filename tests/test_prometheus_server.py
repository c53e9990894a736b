"""A real Prometheus server (Debian's ``prometheus`` package) scrapes whyidle's metrics endpoint
every second, and its query API returns what was fed: the names, types and label sets work in
PromQL, not only in prometheus_client's parser.

:func:`prometheus_against` starts a throw-away Prometheus against any ``HOST:PORT`` target and
returns a PromQL query function; the ``whyidle run --metrics-port`` variant reuses it. Skipped
where ``prometheus`` is not installed, except under ``CI``, where it fails (``.ci/run`` installs it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from whyidle.export.prometheus import JobMetrics

pytestmark = pytest.mark.slow

#: ``WHYIDLE_PROMETHEUS`` (a path) when set, else Debian's ``prometheus`` on PATH.
PROMETHEUS = os.environ.get("WHYIDLE_PROMETHEUS") or shutil.which("prometheus")


def need_prometheus() -> str:
    """The ``prometheus`` binary; skips the test without one, fails it under ``CI``."""
    if not PROMETHEUS or not os.path.isfile(PROMETHEUS):
        if os.environ.get("CI"):
            pytest.fail("prometheus not installed: CI must run the Prometheus server tests (.ci/run installs it)")
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus)")
    return PROMETHEUS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def prometheus_against(target: str, folder, timeout_s: float = 60.0) -> Iterator[Callable[[str], list]]:
    """Runs a Prometheus server on 127.0.0.1 (a free port, TSDB and logs under ``folder``) that
    scrapes ``target`` (``HOST:PORT`` serving ``/metrics``) every second; waits until the target is
    up (at most ``timeout_s`` seconds, else fails with Prometheus's log and the target's last
    error) and yields ``query(promql) -> [(labels dict, value float), ...]``, an instant query
    of the HTTP API (``/api/v1/query``) at the current time. Stops the server on exit."""
    binary = need_prometheus()
    folder = str(folder)
    config = os.path.join(folder, "prometheus.yml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                f"scrape_configs:\n  - job_name: whyidle\n    static_configs:\n      - targets: ['{target}']\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = os.path.join(folder, "prometheus.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=folder)

    def failure(why: str) -> str:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            return f"{why}; prometheus log:\n{f.read()[-3000:]}"

    try:
        deadline = time.monotonic() + timeout_s
        last = "not started"
        while True:
            if proc.poll() is not None:
                pytest.fail(failure(f"prometheus exited with {proc.returncode}"))
            if time.monotonic() > deadline:
                pytest.fail(failure(f"target {target} not up after {timeout_s:.0f} s ({last})"))
            try:
                active = _get(f"{base}/api/v1/targets")["data"]["activeTargets"]
                mine = [t for t in active if t["labels"].get("instance") == target]
                if mine and mine[0]["health"] == "up":
                    break
                last = f"health {mine[0]['health']}: {mine[0]['lastError']}" if mine else "no such target yet"
            except (urllib.error.URLError, ConnectionError, OSError, ValueError, KeyError) as e:
                last = f"API not ready: {e}"
            time.sleep(0.25)

        def query(promql: str) -> list:
            url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            body = _get(url)
            assert body["status"] == "success", body
            return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

        yield query
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class SteadyJob(threading.Thread):
    """Feeds a :class:`JobMetrics` like a steady trainer: ``rate`` steps per second of ``step_s``
    seconds, ``batch`` samples each, ``wait`` of each step waiting for data, every 0.1 s by the
    clock (so the counters follow the wall time exactly, however late the thread wakes)."""

    def __init__(self, metrics: JobMetrics, rate=100, step_s=0.010, batch=32, wait=0.3):
        super().__init__(daemon=True)
        self.m, self.rate, self.step_s, self.batch, self.wait = metrics, rate, step_s, batch, wait
        self.stop = threading.Event()

    def run(self):
        t0, done = time.monotonic(), 0
        while not self.stop.wait(0.1):
            due = int((time.monotonic() - t0) * self.rate) - done
            if due <= 0:
                continue
            self.m.steps(0, [self.step_s] * due, due * self.batch, time.time(), due * self.step_s * self.wait)
            self.m.live(0, self.rate * self.batch, self.wait)
            done += due


def test_prometheus_scrapes_and_queries_what_was_fed(tmp_path):
    need_prometheus()
    metrics = JobMetrics("steady", "testhost", port="127.0.0.1:0")
    job = SteadyJob(metrics)
    job.start()
    try:
        host, port = metrics.address
        with prometheus_against(f"{host}:{port}", tmp_path) as query:
            metrics.window({"verdict": "input_bound", "shares": {"data_wait": 0.3, "forward": 0.7},
                            "goodput": {"ratio": 0.7, "lost_s": {"data_wait": 54.0}}})
            # rate() over [10s] wants the window full of 1 s scrapes
            time.sleep(12)
            [(labels, rate)] = query('rate(whyidle_samples_total{run="steady"}[10s])')
            assert labels["rank"] == "0" and labels["host"] == "testhost" and labels["job"] == "whyidle"
            assert rate == pytest.approx(100 * 32, rel=0.10)
            [(_, ratio)] = query('whyidle_data_wait_ratio{rank="0"}')  # live, rank 0's last seconds
            assert ratio == pytest.approx(0.3, rel=0.10)
            [(labels, ratio)] = query("whyidle_data_wait_ratio unless on (rank) whyidle_steps_total")
            assert "rank" not in labels and ratio == 0.3  # the window's, of the job (rank "" = no label)
            # the data-wait share from the counters, as a dashboard would compute it
            [(_, share)] = query("rate(whyidle_data_wait_seconds_total[10s]) / "
                                 "rate(whyidle_step_duration_seconds_sum[10s])")
            assert share == pytest.approx(0.3, rel=0.10)
            [(_, p50)] = query("histogram_quantile(0.5, rate(whyidle_step_duration_seconds_bucket[10s]))")
            assert 0.005 <= p50 <= 0.010  # the 10 ms steps sit in the (5 ms, 10 ms] bucket
            [(labels, one)] = query("whyidle_verdict_info")
            assert labels["verdict"] == "input_bound" and one == 1
            [(_, lost)] = query('whyidle_lost_seconds_total{kind="data_wait"}')
            assert lost == 54.0
            [(_, age)] = query("time() - whyidle_last_step_timestamp_seconds")
            assert age < 5  # the stuck-job alert of the README stays quiet
    finally:
        job.stop.set()
        job.join()
        metrics.close()
