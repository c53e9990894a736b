"""Notebook cells named ``cell N, line L`` (issue 33, part 4): the kernel's collector with a fake
IPython shell, the renaming of a run's records, the cells' source lines and the report's words."""

from __future__ import annotations

import json
import linecache
import os

import pytest

from whyidle.analysis import stacks
from whyidle.instrument import cells as collect
from whyidle.record import cells
from whyidle.record.reader import load_run
from whyidle.report import cell_sites

CELL_FILE = "/tmp/ipykernel_77/3184101233.py"


class FakeCompile:
    def __init__(self, names):
        self._filename_map = names


class FakeShell:
    def __init__(self, names, user_ns=None):
        self.compile = FakeCompile(names)
        self.user_ns = user_ns or {}


@pytest.fixture
def cached_cells(monkeypatch):
    """Two cells in :mod:`linecache` as IPython's ``CachingCompiler.cache`` leaves them."""
    def put(name, text):
        monkeypatch.setitem(linecache.cache, name, (len(text), None, text.splitlines(True), name))
    put("/tmp/ipykernel_77/1.py", "import numpy as np\n")
    put("/tmp/ipykernel_77/2.py", "def augment(x):\n    return x * 2\n")
    monkeypatch.delenv(collect.SESSION_ENV, raising=False)


def test_collector_writes_each_cell_once_with_its_text(cached_cells):
    shell = FakeShell({"/tmp/ipykernel_77/1.py": 1})
    c = collect.CellCollector(shell=shell, label=lambda f: f)
    first = c()
    assert first == [{"k": "cell", "t": first[0]["t"], "file": "/tmp/ipykernel_77/1.py", "cell": 1, "offset": 0,
                      "source": "import numpy as np\n"}]
    assert c() == []  # already written
    shell.compile._filename_map["/tmp/ipykernel_77/2.py"] = 2
    second = c()
    assert [(r["cell"], r["source"]) for r in second] == [(2, "def augment(x):\n    return x * 2\n")]


def test_collector_names_the_notebook_once(cached_cells, monkeypatch):
    shell = FakeShell({"/tmp/ipykernel_77/1.py": 1}, user_ns={"__vsc_ipynb_file__": "/home/u/train.ipynb"})
    c = collect.CellCollector(shell=shell, label=lambda f: f)
    kinds = [r["k"] for r in c()]
    assert kinds == ["cell", "notebook"]
    assert c() == []
    monkeypatch.setenv(collect.SESSION_ENV, "work/exp.ipynb")  # Jupyter Server's, first
    assert collect.notebook_path(shell) == "work/exp.ipynb"


def test_collector_caps_a_cells_text(monkeypatch):
    text = "x = 1\n" * 10_000
    monkeypatch.setitem(linecache.cache, "/tmp/ipykernel_77/9.py", (len(text), None, text.splitlines(True), "x"))
    c = collect.CellCollector(shell=FakeShell({"/tmp/ipykernel_77/9.py": 9}), label=lambda f: f)
    (rec,) = c()
    assert len(rec["source"]) == collect.MAX_SOURCE_CHARS


def test_noted_offset_wins_over_the_plain_record(cached_cells):
    shell = FakeShell({"/tmp/ipykernel_77/2.py": 4})
    c = collect.CellCollector(shell=shell, label=lambda f: "L:" + f)
    assert c()[0]["offset"] == 0
    c.note_offset("/tmp/ipykernel_77/2.py", 4, 1, "body\n")  # the %%whyidle magic, after the plain record
    (rec,) = c()
    assert (rec["file"], rec["cell"], rec["offset"], rec["source"]) == ("L:/tmp/ipykernel_77/2.py", 4, 1, "body\n")
    assert c() == []


def test_collector_is_silent_outside_ipython_and_on_a_changed_private_map(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "IPython", raising=False)
    assert collect.CellCollector()() == []

    class Broken:
        @property
        def _filename_map(self):
            raise AttributeError("gone in a newer IPython")

    shell = FakeShell({})
    shell.compile = Broken()
    assert collect.CellCollector(shell=shell, label=lambda f: f)() == []
    shell.compile = FakeCompile({"/tmp/x.py": "not a number", 3: 3})
    assert collect.CellCollector(shell=shell, label=lambda f: f)() == []


class FakeAgent:
    def __init__(self):
        self.collectors = []


def test_install_adds_one_collector_per_agent_and_notes_reach_all(cached_cells, monkeypatch):
    monkeypatch.setattr(collect, "_NOTES", {})
    agent = FakeAgent()
    first = collect.install(agent)
    assert collect.install(agent) is first and agent.collectors == [first]
    shell = FakeShell({"/tmp/ipykernel_77/1.py": 1})
    first._shell, first._label = shell, (lambda f: f)
    assert [r["cell"] for r in first()] == [1]
    # a second run in the same kernel (a second %%whyidle cell): its own agent names cell 1 again
    second = collect.install(FakeAgent())
    second._shell, second._label = shell, (lambda f: f)
    collect.note_offset("/tmp/ipykernel_77/2.py", 2, 1, "body\n")
    assert [(r["cell"], r["offset"]) for r in second()] == [(2, 1), (1, 0)]
    assert [(r["cell"], r["offset"]) for r in first()] == [(2, 1)]


def test_collector_labels_files_as_the_stack_sampler_does(tmp_path, monkeypatch):
    from whyidle.instrument.stacks import FrameClassifier

    name = str(tmp_path / "ipykernel_1" / "55.py")
    c = collect.CellCollector(shell=FakeShell({name: 2}))
    (rec,) = c()
    assert rec["file"] == FrameClassifier().classify(name)[1]
    assert rec["source"] is None  # not in linecache


# -- the records --------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd, nb", [
    (["jupyter", "nbconvert", "--to", "notebook", "--execute", "nb.ipynb", "--output", "out.ipynb"], "nb.ipynb"),
    (["/venv/bin/jupyter-nbconvert", "--execute", "--to=notebook", "dir/train.ipynb"], "dir/train.ipynb"),
    (["jupyter", "execute", "a.ipynb"], "a.ipynb"),
    (["jupyter", "execute", "a.ipynb", "b.ipynb"], None),  # two kernels: which is which is unknown
    (["papermill", "in.ipynb", "out.ipynb", "-p", "lr", "x.ipynb"], "in.ipynb"),
    (["papermill", "-k", "python3", "in.ipynb", "out.ipynb"], "in.ipynb"),
    (["python", "-m", "jupyter", "nbconvert", "--execute", "--ExecutePreprocessor.timeout", "60", "n.ipynb"],
     "n.ipynb"),
    (["python3", "-u", "-m", "nbconvert", "--execute", "n.ipynb"], "n.ipynb"),
    (["python", "train.py", "n.ipynb"], None),
    (["jupyter", "lab", "n.ipynb"], None),
    ([], None), (None, None), (["jupyter", 3], None),
])
def test_notebook_of_command(cmd, nb):
    assert cells.notebook_of_command(cmd) == nb


def _records(offset=0, notebook=None):
    recs = [
        {"k": "proc", "t": 1, "argv": ["/x/ipykernel_launcher.py", "-f", "/tmp/k.json"]},
        {"k": "cell", "t": 2, "file": CELL_FILE, "cell": 5, "offset": offset,
         "source": "import x\n\ndef f(a):\n    return a + 1\n"},
        {"k": "stacks", "t": 3, "hz": 100.0, "sites": [
            ["data", f"{CELL_FILE}:4 f", "numpy/core/x.py:9 g", 10, 100.0, [f"{CELL_FILE}:2 <module>"]],
            ["data", "train.py:4 f", "train.py:4 f", 1, 10.0, []],
        ]},
        {"k": "loader", "t": 4, "id": 1, "created": [f"{CELL_FILE}:12 <module>", f"{CELL_FILE}:12 <module>"],
         "call": {"lead": "x = ", "nested": {f"{CELL_FILE}:3 f": 2}}},
        {"k": "region", "t": 5, "t0": 1, "t1": 2, "kind": "checkpoint", "site": f"{CELL_FILE}:40 save",
         "path": CELL_FILE},  # a bare file name, no line: not a site
        {"k": "compile_frame", "t": 6, "fn": "f", "file": CELL_FILE, "line": 3},
    ]
    if notebook:
        recs.append({"k": "notebook", "t": 6, "path": notebook})
    return recs


def test_rename_rewrites_every_site_of_a_cell_file_and_nothing_else():
    recs = _records()
    n = cells.rename(recs, cells.cells_of(recs, "nb.ipynb"))
    stacks_rec, loader, region = recs[2], recs[3], recs[4]
    assert stacks_rec["sites"][0][1] == "nb.ipynb cell 5:4 f"
    assert stacks_rec["sites"][0][5] == ["nb.ipynb cell 5:2 <module>"]
    assert stacks_rec["sites"][1][1] == "train.py:4 f"
    assert loader["created"] == ["nb.ipynb cell 5:12 <module>"] * 2
    assert loader["call"]["nested"] == {"nb.ipynb cell 5:3 f": 2}
    assert region["site"] == "nb.ipynb cell 5:40 save" and region["path"] == CELL_FILE
    assert (recs[5]["file"], recs[5]["line"]) == ("nb.ipynb cell 5", 3)
    assert recs[0]["argv"][0] == "/x/ipykernel_launcher.py" and recs[1]["file"] == CELL_FILE
    assert n == 7


def test_the_notebook_record_names_the_notebook_before_the_command():
    recs = _records(notebook="/home/u/work/train.ipynb")
    assert cells.cells_of(recs, "nb.ipynb")[CELL_FILE].label == "train.ipynb cell 5"
    assert cells.cells_of(_records(), None)[CELL_FILE].label == "cell 5"


def test_offset_shifts_the_lines_and_the_text():
    recs = _records(offset=1)
    found = cells.cells_of(recs)
    cells.rename(recs, found)
    assert recs[2]["sites"][0][1] == "cell 5:5 f"
    cells.register("/w", found)
    assert cells.cell_line("cell 5", 5, "/w") == "return a + 1"
    assert cells.cell_line("cell 5", 1, "/w") == ""  # the magic's own line: not recorded
    assert cells.cell_line("cell 5", 99, "/w") is None
    assert cells.cell_line("cell 5", 5, "/elsewhere") is None


def test_source_line_reads_the_recorded_cell_not_a_file(tmp_path):
    recs = _records(notebook="exp.ipynb")
    meta = {"cwd": str(tmp_path), "command": ["python", "x.py"]}
    cells.name_cells(meta, {77: recs})
    site = recs[2]["sites"][0][1]
    assert site == "exp.ipynb cell 5:4 f"
    assert stacks.source_line(site, str(tmp_path)) == "return a + 1"
    assert stacks.source_line("exp.ipynb cell 5:1 <module>", str(tmp_path)) == "import x"
    assert stacks.source_line("exp.ipynb cell 5:2 <module>", str(tmp_path)) is None  # blank line


def test_a_run_without_cells_is_untouched():
    recs = [{"k": "stacks", "t": 3, "sites": [["data", f"{CELL_FILE}:4 f", None, 1, 1.0, []]]}]
    before = json.dumps(recs)
    cells.name_cells({"command": ["jupyter", "execute", "n.ipynb"]}, {1: recs})
    assert json.dumps(recs) == before


def test_bad_cell_records_are_skipped():
    recs = [{"k": "cell", "t": 1, "file": CELL_FILE, "cell": True},
            {"k": "cell", "t": 1, "file": "", "cell": 3},
            {"k": "cell", "t": 1, "file": CELL_FILE, "cell": 3, "offset": -1},
            {"k": "cell", "t": 1, "file": "/tmp/ok.py", "cell": 3, "source": 7}]
    assert cells.cells_of(recs) == {"/tmp/ok.py": cells.Cell("cell 3", 0, None)}


def test_load_run_names_the_cells_of_a_notebook_run(tmp_path):
    from synthetic_run import TRAINER, write_run

    path = write_run(tmp_path / "run", command=["jupyter", "nbconvert", "--execute", "--to", "notebook",
                                               "train.ipynb"], site=f"{CELL_FILE}:4 f")
    with open(os.path.join(path, f"proc-{TRAINER}.jsonl"), "a") as f:
        f.write(json.dumps(_records()[1]) + "\n")
    run = load_run(path)
    sites = {s[1] for r in run.procs[TRAINER] if r["k"] == "stacks" for s in r["sites"]}
    assert "train.ipynb cell 5:4 f" in sites and not any(s and s.startswith(CELL_FILE) for s in sites)
    root = run.meta.get("cwd")
    assert stacks.source_line("train.ipynb cell 5:4 f", root) == "return a + 1"


# -- the report's words --------------------------------------------------------------------------

def test_readable_cell_sites():
    assert cell_sites.readable("at nb.ipynb cell 5:28 augment (cell 12:3)") == \
        "at nb.ipynb cell 5, line 28 augment (cell 12, line 3)"
    assert cell_sites.readable("train.py:28 f, excel 5:3") == "train.py:28 f, excel 5:3"


def test_findings_texts_read_cell_lines_but_evidence_stays_parseable():
    f = {"id": "input_bound", "summary": "inside `cell 5 f` (cell 5:4 f)", "evidence": {"site": "cell 5:4 f"},
         "fix": {"text": "at cell 5:12 <module>", "code": "x = 1  # cell 5:12 <module>", "docs": [],
                 "options": [{"text": "cell 5:12", "code": None, "est_speedup": 2.0}]}}
    (g,) = cell_sites.readable_findings([f])
    assert g["summary"] == "inside `cell 5 f` (cell 5, line 4 f)"
    assert g["evidence"] == {"site": "cell 5:4 f"}
    assert g["fix"]["text"] == "at cell 5, line 12 <module>" and g["fix"]["code"].endswith("# cell 5, line 12 <module>")
    assert g["fix"]["options"][0]["text"] == "cell 5, line 12" and f["summary"].endswith("(cell 5:4 f)")
    report = {"findings": [f], "metrics": {"x": 1}}
    shown = cell_sites.for_display(report)
    assert shown["findings"][0]["evidence"]["site"] == "cell 5, line 4 f" and report["findings"][0] is f
    plain = {"findings": [{"summary": "train.py:3 f"}]}
    assert cell_sites.for_display(plain) is plain


def test_setup_block_reads_a_cells_recorded_text():
    from whyidle.analysis.setup_block import setup_block

    text = "import json\nrows = [json.loads(s) for s in open('d.jsonl')]\nX = build(rows)\ntrain(X)\n"
    cells.register("/nb-root", {"f": cells.Cell("prep.ipynb cell 7", 0, tuple(text.splitlines()))})
    block = setup_block({"prep.ipynb cell 7:2 <module>": 3.0, "prep.ipynb cell 7:3 <module>": 1.0}, "/nb-root")
    assert block["source"] == "rows = [json.loads(s) for s in open('d.jsonl')]\nX = build(rows)"
    assert block["names"] == ["X"]
