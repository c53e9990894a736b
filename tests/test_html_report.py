"""The HTML report: self-contained, escaped, capped for long runs, and actually drawn by a browser.

The browser tests load the page in headless Chromium (Debian's ``/usr/bin/chromium``, driven by the
``playwright`` package; no browser download) and check: no console error, uncaught exception or
failed request; every plot drawn (plotly's ``.main-svg``, traces with points); each plot area not
blank in the screenshot (coloured pixels inside the plot's drag rectangle); run strings shown as
text and never executed. They skip without Chromium (``WHYIDLE_CHROMIUM`` names another binary), except
under ``CI``, where they fail.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import sys
import threading

import pytest

from conftest import run_whyidle, write_script
from synthetic_run import write_run
from whyidle import pipeline
from whyidle.analysis.series import run_series
from whyidle.report import html, plots
from whyidle.report.build import build_report

INJECT_CMD = "</script><script>window.__pwned=1</script>"
INJECT_SITE = "<img src=x onerror=window.__pwned=2>"


def render(run_dir: str) -> tuple[str, dict]:
    a = pipeline.analyze_run(run_dir)
    report = build_report(a.facts, a.verdict, a.findings, a.run.problems)
    report["run"]["run_dir"] = run_dir
    return html.render_html(report, run_series(a.run, a.facts)), report


def figures(page: str) -> dict:
    """The figure JSON blocks of a page, parsed: id → {data, layout}."""
    blocks = re.findall(r'<script type="application/json" id="([^"]+)-json">(.*?)</script>', page, re.S)
    return {fid: json.loads(text) for fid, text in blocks}


# -- without a browser -----------------------------------------------------------------------------

def test_cpu_run_page_is_self_contained_and_says_why_gpu_plots_are_missing(tmp_path):
    page, _ = render(write_run(tmp_path / "run", steps=60))
    # nothing to fetch: no external script, stylesheet, image or font; plotly.js embedded once
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page, re.I)
    assert page.count(html._plotly_js()[:300]) == 1
    assert "default-src 'none'" in page
    figs = figures(page)
    assert sorted(k.split("-", 2)[2] for k in figs) == ["cpu", "phases", "steps", "time"]
    time_fig = next(v for k, v in figs.items() if k.endswith("-time"))
    assert {t["name"] for t in time_fig["data"]} >= {"start-up", "training steps"}
    # the GPU plots are replaced by one sentence each, never an empty axis
    assert 'data-missing="gpu_util"' in page and 'data-missing="idle"' in page
    assert "No GPU was observed: NVML not available: NVML Shared Library Not Found." in page
    # findings (with fix code) come before the plots
    assert page.index("Input-bound") < page.index('id="section-gpu_util"')
    assert "<pre><code>loader = DataLoader(" in page
    # host hotspots from the findings stand in for the GPU idle sites
    assert 'id="table-idle"' in page and "train.py:40 __getitem__" in page
    # warm-up and boundary steps are marked in the step plot
    names = [t.get("name") for t in figs[next(k for k in figs if k.endswith("steps"))]["data"]]
    assert "left out: warm-up" in names and "left out: boundary" in names


def test_gpu_run_page_draws_util_and_gpm_per_device(tmp_path):
    page, _ = render(write_run(tmp_path / "run", steps=60, gpu=True))
    figs = figures(page)
    util = figs[next(k for k in figs if k.endswith("gpu_util"))]
    names = [t["name"] for t in util["data"]]
    assert names == ["GPU 0 (NVIDIA H200) NVML util", "GPU 0 (NVIDIA H200) SM active (GPM)",
                     "GPU 0 (NVIDIA H200) tensor cores (GPM)"]
    assert all(0 <= y <= 100 for t in util["data"] for y in t["y"])
    # NVML saw the GPU but the model never reached CUDA: idle by cause was not measured, said so
    assert "GPU idle per cause was not measured" in page


def test_run_strings_are_escaped_everywhere(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=60, gpu=True, command=["python", INJECT_CMD + ".py"],
                        site=INJECT_SITE + ".py:40 load")
    page, report = render(run_dir)
    assert INJECT_SITE in json.dumps(report)  # the names did reach the report
    assert INJECT_CMD not in page and INJECT_SITE not in page
    assert "&lt;/script&gt;&lt;script&gt;window.__pwned=1&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=window.__pwned=2&gt;" in page
    # figure JSON blocks hold no raw '<' or '>' at all
    for _fid, text in re.findall(r'<script type="application/json" id="([^"]+)-json">(.*?)</script>', page, re.S):
        assert "<" not in text and ">" not in text and "&" not in text


def test_safe_json_round_trips():
    obj = {"a": "</script><!-- & \u2028 >", "b": [1, 2.5, None]}
    text = html.safe_json(obj)
    assert not set("<>&\u2028") & set(text)
    assert json.loads(text) == obj


def test_long_series_are_capped_and_keep_extremes():
    import numpy as np

    y = np.sin(np.arange(200_000) / 50.0)
    y[123_457] = 9.0
    keep = plots.minmax_indices(y)
    assert len(keep) <= plots.MAX_POINTS and 123_457 in keep and 0 in keep and len(y) - 1 in keep
    x, cols, k = plots.bin_reduce(list(range(20_001)), {"a": [1.0] * 20_001, "m": list(range(20_001))},
                                  how={"m": "max"})
    assert len(x) <= plots.MAX_POINTS + 1 and k == 5 and set(cols["a"]) == {1.0} and cols["m"][-1] == 20_000


def test_a_tall_warm_up_step_does_not_set_the_step_axis():
    steps = {"i": [0, 1, 2, 3, 4], "step_s": [0.400, 0.030, 0.020, 0.020, 0.021], "data_wait": [0.0] * 5,
             "has": ["data_wait"]}
    fig = plots.step_time_plot(steps, ["warm-up", "warm-up", None, None, None]).figure
    assert fig["layout"]["yaxis"]["range"] == [0, pytest.approx(21 * 1.15)]  # the tallest analyzed step
    fig = plots.step_time_plot(steps, ["warm-up", None, None, None, None]).figure  # 30 ms is analyzed: no cap
    assert fig["layout"]["yaxis"]["range"][1] == pytest.approx(30 * 1.15)
    steps["step_s"][0] = 0.040
    assert "range" not in plots.step_time_plot(steps, ["warm-up", None, None, None, None]).figure["layout"]["yaxis"]


def test_step_columns_of_step_table_rows_equal_those_of_records(tmp_path):
    """``series.step_columns`` reads ``StepView`` rows straight from the step table's columns; the
    values (and ``step_series``' lists, ``left_out_steps``) equal those of the same steps as dicts."""
    import numpy as np

    from whyidle.analysis import series

    a = pipeline.analyze_run(write_run(tmp_path / "run", steps=200, ph=True))
    facts = a.facts
    rows = facts.step_rows
    assert type(rows[0]).__name__ == "StepView"
    records = [dict(r) for r in rows]
    records[5]["samples"] = None
    rows_cols, rec_cols = series.step_columns(rows, 7), series.step_columns(records, 7)
    for key in series.STEP_COLUMNS:
        if key != "samples":
            assert np.array_equal(rows_cols[key], rec_cols[key], equal_nan=True), key
    assert rows_cols["has"] == rec_cols["has"] == ["data_wait", "forward", "backward", "optimizer", "eval"]
    listed = series.step_series(records, 7)
    assert listed["samples"][5] is None and listed["samples"][4] == 32 and listed["gpu_ms"][0] is None
    assert listed["step_s"] == rows_cols["step_s"].tolist() and series.step_series(rows, 7)["i"] == list(range(200))
    part = series.step_columns(rows[10:20], 0, ("i", "other_host"))
    assert set(part) == {"i", "other_host", "has"} and part["i"].tolist() == list(range(10, 20))
    analyzed = facts.analyzed_steps
    left = series.left_out_steps(rows, analyzed, 2)
    assert left == series.left_out_steps(records, [dict(r) for r in analyzed], 2)
    assert left[:2] == ["warm-up"] * 2 and left[25] == "boundary" and left[26] is None


@pytest.mark.slow
def test_100k_step_run_stays_small(tmp_path):
    """A long run: every trace ≤ MAX_POINTS, ≤ MAX_BARS bars, the page a few MB."""
    page, _ = render(write_run(tmp_path / "run", steps=100_000, gpu=True))
    assert len(page.encode()) < 8_000_000
    for fid, fig in figures(page).items():
        for trace in fig["data"]:
            n = len(trace.get("x") or [])
            assert n <= (plots.MAX_BARS if trace["type"] == "bar" and fid.endswith("phases") and n > 1
                         else plots.MAX_POINTS), (fid, trace.get("name"), n)


@pytest.mark.slow
def test_no_html_run_writes_the_timeline_but_no_page(tmp_path):
    script = write_script(tmp_path / "train.py", steps=20)
    proc = run_whyidle(["run", "-q", "--no-html", "--out", str(tmp_path / "run"), "--", sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "run"
    assert not (run_dir / "report.html").exists() and (run_dir / "timeline.json").exists()
    report = json.loads((run_dir / "report.json").read_text())
    assert "html" not in report["run"] and report["run"]["timeline"].endswith("timeline.json")
    assert "logged" not in proc.stdout
    proc = run_whyidle(["report", str(run_dir)])  # re-rendering keeps the run's choice
    assert proc.returncode == 0 and not (run_dir / "report.html").exists()
    proc = run_whyidle(["report", str(run_dir), "--html", str(tmp_path / "asked.html")])  # unless asked
    assert proc.returncode == 0 and (tmp_path / "asked.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.slow
def test_report_command_writes_html(tmp_path):
    run_dir = write_run(tmp_path / "run", steps=30)
    out = tmp_path / "r.html"
    proc = run_whyidle(["report", run_dir, "--html", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert 'id="section-phases"' in out.read_text()
    assert (tmp_path / "run" / "report.html").read_text() == out.read_text()  # the run's own page too
    proc = run_whyidle(["report", run_dir, "--html", str(tmp_path / "no" / "such" / "r.html")])
    assert proc.returncode == 2 and "--html" in proc.stderr and "no such directory" in proc.stderr


# -- in a browser ----------------------------------------------------------------------------------

#: Chromium to drive: ``WHYIDLE_CHROMIUM`` (a path) when set, else Debian's ``chromium`` on PATH.
CHROMIUM = (os.environ["WHYIDLE_CHROMIUM"] if os.environ.get("WHYIDLE_CHROMIUM")
            else shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium")
if not os.path.isfile(CHROMIUM):
    CHROMIUM = None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if CHROMIUM is None or sync_playwright is None:
        why = "chromium not installed" if CHROMIUM is None else "playwright not installed"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run the HTML report's browser tests")
        pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def check_in_browser(browser, path: str) -> dict:
    """Loads ``path``; asserts no console errors and every plot drawn and not blank."""
    import numpy as np
    from PIL import Image, ImageStat

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems = []
    page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto("file://" + path)
    n_figs = page.locator("div.fig").count()
    page.wait_for_function(f"document.querySelectorAll('div.fig .main-svg').length >= {n_figs}", timeout=10_000)
    info = page.evaluate("""() => Array.from(document.querySelectorAll('div.fig')).map(d => ({
        id: d.id, svgs: d.querySelectorAll('.main-svg').length,
        points: (d.data || []).map(t => (t.x || t.y || []).length),
        drawn: d.querySelectorAll('.scatterlayer .trace path.js-line, .scatterlayer .trace path.js-fill, '
                                  + '.scatterlayer .point, .barlayer .point').length}))""")
    shot = Image.open(io.BytesIO(page.screenshot(full_page=True))).convert("RGB")

    def plot_area(fig_id: str):  # the figure's largest drag rectangle = its main plot area
        drags = page.locator(f"#{fig_id} rect.nsewdrag")
        return max((drags.nth(k) for k in range(drags.count())),
                   key=lambda loc: loc.bounding_box()["width"] * loc.bounding_box()["height"])

    page.evaluate("() => window.scrollTo(0, 0)")  # boxes in page coordinates, as in the full-page shot
    for fig in info:
        assert fig["svgs"] >= 1 and fig["points"] and max(fig["points"]) > 0 and fig["drawn"] > 0, fig
        box = plot_area(fig["id"]).bounding_box()
        crop = shot.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
        hsv = np.asarray(crop.convert("HSV"))
        colourful = float(((hsv[..., 1] > 90) & (hsv[..., 2] > 40)).mean())
        assert colourful > 0.01 and max(ImageStat.Stat(crop).stddev) > 5, (fig["id"], colourful)
    for fig in info:  # interaction (hover labels, drag to zoom) raises nothing either, e.g. under the CSP
        area = plot_area(fig["id"])
        area.scroll_into_view_if_needed()
        box = area.bounding_box()
        cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(cx, cy)
        page.mouse.down()
        page.mouse.move(cx + box["width"] / 8, cy, steps=4)
        page.mouse.up()
        page.wait_for_timeout(50)
        assert page.evaluate(f"""() => {{ const l = document.getElementById('{fig["id"]}').layout;
            return Object.keys(l).some(k => k.startsWith('xaxis') && l[k].autorange === false); }}"""), fig["id"]
    text = page.inner_text("body")
    pwned = page.evaluate("() => window.__pwned")
    assert not [u for u in requests if not u.startswith(("file:", "data:", "about:"))], requests
    page.close()
    assert not problems, problems
    return {"figures": info, "text": text, "pwned": pwned}


@pytest.mark.slow
def test_cpu_report_in_browser(browser, tmp_path):
    page, _ = render(write_run(tmp_path / "run", steps=120))
    path = tmp_path / "report.html"
    path.write_text(page)
    got = check_in_browser(browser, str(path))
    assert [f["id"].split("-", 2)[2] for f in got["figures"]] == ["time", "cpu", "steps", "phases"]
    assert "No GPU was observed" in got["text"]




@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory):
    """A real ``whyidle run`` with a fake NVML driver (one H200: util samples, GPM windows) and the
    fake CUDA timeline, whose script file and command carry HTML/JS injection strings."""
    import pynvml

    from fake_nvml import FakeDevice, FakeNvml, now_us
    # the fake CUDA surface: events complete at once (an always starved GPU), two .item() per step
    from test_run_cuda_fake import IN_STEP, PRE
    from whyidle.run.session import RunOptions, observe

    tmp = tmp_path_factory.mktemp("gpu")
    device = FakeDevice(name="NVIDIA H200", util=(40, 5), gpm_values={2: 35.0, 5: 12.0})
    script = write_script(tmp / f"{INJECT_SITE}.py", steps=60, pre=PRE, in_step=IN_STEP)
    stop = threading.Event()

    def driver_samples():
        while not stop.wait(1 / 6):
            device.add_samples(pynvml.NVML_GPU_UTILIZATION_SAMPLES, [(now_us(), 40)])

    with pytest.MonkeyPatch.context() as mp:
        FakeNvml([device], cuda_driver_version=12040).install(mp)
        feeder = threading.Thread(target=driver_samples, daemon=True)
        feeder.start()
        try:
            report, status, run_dir = observe([sys.executable, script, INJECT_CMD],
                                              RunOptions(out=str(tmp / "run"), quiet=True), stream=io.StringIO())
        finally:
            stop.set()
            feeder.join()
    assert status.exit_code == 0
    return run_dir


@pytest.mark.slow
def test_gpu_report_in_browser_with_injection_strings(browser, gpu_run, tmp_path):
    page, report = render(gpu_run)
    gpu = report["metrics"]["gpu"]
    assert gpu["idle_s_by_cause"] and gpu["idle_sites"] and gpu["sm_active_mean"] is not None
    assert any(INJECT_SITE in s["site"] for s in gpu["idle_sites"])
    path = tmp_path / "report.html"
    path.write_text(page)
    got = check_in_browser(browser, str(path))
    assert [f["id"].split("-", 2)[2] for f in got["figures"]] == ["time", "gpu_util", "cpu", "steps", "phases", "idle"]
    # shown as text, never run
    assert got["pwned"] is None
    assert INJECT_CMD in got["text"] and INJECT_SITE in got["text"]
