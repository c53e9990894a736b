"""``%load_ext whyidle`` and ``%%whyidle`` in a real notebook executed by nbclient (issue 33): each
cell's own report in its output (the terminal view as rich text, the HTML report inline), the
cells and lines of the notebook named, nothing of whyidle's left in the kernel, and the inline
report drawn by Chromium."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import finding
from test_html_report import browser  # noqa: F401 - the Chromium fixture, used by name

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(TESTS, "notebooks"))

from make import SETUP, magic_notebook  # noqa: E402

pytestmark = [pytest.mark.slow]

#: Steps of each observed cell (the notebook's loops): one report per cell, never another's.
STEPS = {"torch": 32, "lightning": 32, "keras": 128, "healthy": 20}
#: Findings that are about the machine, not the program (as in the scenario tests).
NOT_THE_PROGRAMS = {"cpu_contention", "small_workload"}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat
    from nbclient import NotebookClient

    tmp = tmp_path_factory.mktemp("nb")
    path = tmp / "train.ipynb"
    magic_notebook(str(path), str(tmp / "runs"), TESTS)
    nb = nbformat.read(str(path), as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp)}}).execute()
    return tmp, nb


def _outputs(nb, out_dir: str) -> list[dict]:
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"/{out_dir}" in c.source.splitlines()[0])
    return cell.outputs


def _report(tmp, name: str) -> dict:
    return json.loads((tmp / "runs" / name / "report.json").read_text())


def test_each_cell_shows_its_own_report(executed):
    tmp, nb = executed
    for name, steps in STEPS.items():
        report = _report(tmp, name)
        assert report["metrics"]["steps"] == steps, (name, report["metrics"]["steps"])
        outs = _outputs(nb, name)
        views = [o for o in outs if o.output_type == "display_data" and "Verdict" in o.data.get("text/plain", "")]
        assert len(views) == 1, (name, [o.output_type for o in outs])
        assert "Verdict" in views[0].data["text/html"] and "<pre" in views[0].data["text/html"]
        assert report["verdict"].replace("_", "-").upper() in views[0].data["text/plain"].upper()
        pages = [o for o in outs if o.output_type == "display_data" and "<iframe" in o.data.get("text/html", "")]
        assert len(pages) == 1 and "report.html" in pages[0].data["text/plain"], name
        assert "[whyidle] starting" not in views[0].data["text/plain"]  # the live line was replaced
    torch_cell = _outputs(nb, "torch")
    assert [o for o in torch_cell if o.output_type == "execute_result"], "the cell's last value is its result"


def test_watch_in_a_cell_shows_its_report_in_the_cell(executed):
    """``whyidle.watch()`` in a kernel: the report in one output of the cell (as ``%%whyidle``), not
    line by line on stderr; the block's value is the cell's."""
    tmp, nb = executed
    cell = next(c for c in nb.cells if c.cell_type == "code" and "whyidle.watch(" in c.source)
    kinds = [o.output_type for o in cell.outputs]
    assert kinds == ["display_data", "execute_result"], [(o.output_type, str(o.get("text", ""))[:80]) for o in cell.outputs]
    assert "Verdict" in cell.outputs[0].data["text/plain"] and "\x1b[" not in cell.outputs[0].data["text/plain"]
    assert _report(tmp, "watched")["metrics"]["steps"] == 16
    assert json.loads((tmp / "runs" / "watched" / "meta.json").read_text())["command"] == ["whyidle.watch()"]


def test_the_bottleneck_is_named_by_cell_and_line(executed):
    tmp, nb = executed
    report = _report(tmp, "torch")
    assert report["verdict"] == "input_bound", report["verdict"]
    setup_cell = next(c for c in nb.cells if c.cell_type == "code" and c.source == SETUP)
    line = SETUP.splitlines().index("        img = img.flip(-1)") + 1
    where = f"cell {setup_cell.execution_count}, line {line}"
    f = finding(report, "input_bound")
    assert where in f["summary"], f["summary"]
    assert f["evidence"]["focus"]["code"] == "img = img.flip(-1)"
    view = next(o for o in _outputs(nb, "torch") if "Verdict" in o.get("data", {}).get("text/plain", ""))
    assert where in view.data["text/plain"]
    assert "ipykernel_" not in json.dumps(report)
    # the loop's own line in the %%whyidle cell: cell lines, the magic's line counted
    torch_cell = next(c for c in nb.cells if c.source.startswith("%%whyidle --out") and "/torch" in c.source)
    assert report["loader"], report.get("loader")
    loop_line = torch_cell.source.splitlines().index("for x, y in DataLoader(Images(), batch_size=8):") + 1
    assert f"cell {torch_cell.execution_count}:{loop_line}" in json.dumps(report["loader"])


def test_frameworks_in_the_kernel(executed):
    tmp, _ = executed
    lightning = _report(tmp, "lightning")
    assert lightning["api"]["name"] == "lightning" and lightning["verdict"] == "input_bound"
    keras = _report(tmp, "keras")
    assert keras["framework"] == "keras"


def test_the_kernel_is_left_as_it_was(executed):
    tmp, nb = executed
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    assert "LEFTOVERS []" in text, text
    interrupted = _report(tmp, "interrupted")
    assert any("KeyboardInterrupt" in n for n in interrupted["notes"]), interrupted["notes"]
    errors = [o for o in _outputs(nb, "interrupted") if o.output_type == "error"]
    assert errors and errors[0].ename == "KeyboardInterrupt"
    assert any("Verdict" in o.get("data", {}).get("text/plain", "") for o in _outputs(nb, "interrupted"))
    setup_cell = next(c for c in nb.cells if c.cell_type == "code" and c.source == SETUP)
    line = SETUP.splitlines().index("held_out = DataLoader(Images(), batch_size=8)  # built here, iterated in a "
                                    "later %%whyidle cell") + 1
    assert interrupted["loader"]["created"][0] == f"cell {setup_cell.execution_count}:{line} <module>"
    bad = next(c for c in nb.cells if c.source.startswith("%%whyidle --bogus"))
    assert [(o.output_type, o.get("ename")) for o in bad.outputs] == [("error", "UsageError")], bad.outputs
    assert "%%whyidle: unrecognized arguments: --bogus" in bad.outputs[0].evalue


@pytest.mark.timing
def test_a_healthy_cell_raises_no_alarm(executed):
    tmp, _ = executed
    report = _report(tmp, "healthy")
    alarms = [(f["id"], f["severity"]) for f in report["findings"]
              if f["severity"] != "info" and f["id"] not in NOT_THE_PROGRAMS]
    assert not alarms and report["verdict"] in {"device_bound"} | NOT_THE_PROGRAMS, alarms


def test_the_inline_report_renders_in_chromium(executed, browser, tmp_path):  # noqa: F811
    _, nb = executed
    frame_html = next(o.data["text/html"] for o in _outputs(nb, "torch")
                      if "<iframe" in o.get("data", {}).get("text/html", ""))
    host = tmp_path / "notebook.html"  # the output as a notebook front end places it: inside its page
    host.write_text(f"<!doctype html><html><body><h1>train.ipynb</h1>{frame_html}</body></html>")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"uncaught: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto("file://" + str(host))
    page.wait_for_selector("iframe")
    frame = page.frames[1]  # sandboxed without allow-same-origin: read from inside the frame itself
    frame.wait_for_function("() => document.querySelectorAll('div.fig').length > 0 && Array.from("
                            "document.querySelectorAll('div.fig')).every(d => d.querySelector('.main-svg'))",
                            timeout=20_000)
    figs = frame.evaluate("""() => Array.from(document.querySelectorAll('div.fig')).map(d => ({
        id: d.id, points: (d.data || []).map(t => (t.x || t.y || []).length),
        drawn: d.querySelectorAll('.scatterlayer .trace path.js-line, .scatterlayer .trace path.js-fill, '
                                  + '.scatterlayer .point, .barlayer .point').length}))""")
    text = frame.inner_text("body")
    page.close()
    assert len(figs) >= 3 and all(f["drawn"] > 0 and max(f["points"] or [0]) > 0 for f in figs), figs
    assert "Input-bound" in text or "INPUT-BOUND" in text.upper()
    assert not problems, problems
    assert not [u for u in requests if not u.startswith(("file:", "data:", "about:", "blob:"))], requests
