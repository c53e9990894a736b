"""Fixes that work in a notebook (issue 33, part 5): DataLoader workers started with spawn or
forkserver cannot import a Dataset class defined in a cell (the fix moves it to a module beside the
notebook), persistent workers want the DataLoader in a cell of its own, torch.set_num_threads
outlives the cell. Fast tests on synthetic facts and records; one slow check executes a real
notebook with nbclient."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from test_diagnose import make_facts, make_host, make_loader, make_step
from test_fixes_api import LIGHTNING, TORCH, input_facts

from conftest import finding
from whyidle.analysis.notebook import default_start_method, notebook_facts, worker_start
from whyidle.diagnose import notebook, rules, rules_job
from whyidle.instrument.dataset_code import dataset_code
from whyidle.record.cells import name_cells

TESTS = os.path.dirname(os.path.abspath(__file__))

#: A notebook whose training loader's Dataset class, ``Images``, is defined in cell 3.
NB = {"path": None, "dataset": {"class": "Images", "site": "cell 3:18 Images.__getitem__", "cell": "cell 3",
                                "calls": ["augment"]}}
SPAWN_MAC = {"method": "spawn", "source": "default", "platform": "darwin", "python": "3.12.1"}
FORKSERVER = {"method": "forkserver", "source": "default", "platform": "linux", "python": "3.14.0"}
FORK = {"method": "fork", "source": "default", "platform": "linux", "python": "3.11.7"}
MOVE = "from images_data import Images"


def _worker_option(f: dict) -> dict:
    return next(o for o in f["fix"]["options"] if "num_workers" in (o["code"] or ""))


# -- analysis: the start method, never fixed by reading it ------------------------------------------

@pytest.mark.parametrize("platform, python, method", [
    ("darwin", "3.12.1", "spawn"), ("win32", "3.11.7", "spawn"), ("linux", "3.11.7", "fork"),
    ("linux", "3.13.2", "fork"), ("linux", "3.14.0", "forkserver"), ("freebsd14", "3.14.1", "forkserver"),
    ("linux", None, None), (None, "3.12.0", None)])
def test_the_platforms_default_start_method(platform, python, method):
    assert default_start_method(platform, python) == method


def test_what_decides_the_start_method():
    proc = {"python": "3.11.7"}
    assert worker_start(None, proc) is None
    assert worker_start({"mp_context": "spawn", "start_method_set": "fork", "platform": "linux"}, proc)["source"] == "loader"
    got = worker_start({"mp_context": None, "start_method_set": "forkserver", "platform": "linux"}, proc)
    assert (got["method"], got["source"]) == ("forkserver", "program")
    got = worker_start({"mp_context": None, "start_method_set": None, "platform": "darwin"}, proc)
    assert (got["method"], got["source"]) == ("spawn", "default")
    assert worker_start({"num_workers": 0}, proc)["method"] is None  # recorded before `platform`


def test_reading_the_start_method_does_not_fix_it():
    code = ("import multiprocessing, types\n"
            "from whyidle.instrument.dataset_code import start_method\n"
            "got = start_method(types.SimpleNamespace(multiprocessing_context=None))\n"
            "assert got['mp_context'] is None and got['start_method_set'] is None, got\n"
            "assert multiprocessing.get_start_method(allow_none=True) is None\n"
            "ctx = multiprocessing.get_context('spawn')\n"
            "assert start_method(types.SimpleNamespace(multiprocessing_context=ctx))['mp_context'] == 'spawn'\n"
            "multiprocessing.set_start_method('forkserver')\n"
            "assert start_method(types.SimpleNamespace(multiprocessing_context=None))['start_method_set'] == 'forkserver'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- instrument + record + analysis: where the Dataset class is defined ------------------------------

CELL_FILE = "/tmp/ipykernel_4242/1234.py"
CELL = '''import numpy as np
TABLE = np.zeros(3)          # an unhashable global the class refers to


def augment(img):
    return flip(img)


def flip(img):
    return img[::-1]


class Images:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return augment([i, TABLE.shape[0]]), len
'''


def _cell_namespace() -> dict:
    ns = {"__name__": "__main__"}
    exec(compile(CELL, CELL_FILE, "exec"), ns)
    return ns


def _classify(filename: str):
    return (0, filename) if filename == CELL_FILE else (1, os.path.basename(filename))


def test_dataset_code_names_the_class_its_line_and_what_it_calls():
    ns = _cell_namespace()
    got = dataset_code(ns["Images"](), _classify)
    line = CELL.splitlines().index("    def __getitem__(self, i):") + 1
    assert got == {"class": "Images", "module": "__main__", "site": f"{CELL_FILE}:{line} Images.__getitem__",
                   "calls": ["augment", "flip"]}
    wrapped = types.SimpleNamespace(dataset=types.SimpleNamespace(dataset=ns["Images"]()))  # Subset(Subset(ds))
    assert dataset_code(wrapped, _classify)["class"] == "Images"
    assert dataset_code([1, 2, 3], _classify) is None  # a library's class: nothing of the program's
    assert dataset_code(None, _classify) is None


def test_a_kernels_records_say_notebook_and_the_cell_of_the_dataset():
    ns = _cell_namespace()
    code = dataset_code(ns["Images"](), _classify)
    loader = {"k": "loader", "t": 5, "id": 1, "num_workers": 0, "dataset_code": code, "platform": "linux"}
    recs = [{"k": "proc", "t": 0, "python": "3.11.7"}, loader,
            {"k": "cell", "t": 9, "file": CELL_FILE, "cell": 3, "offset": 0, "source": CELL}]
    meta = {"command": ["jupyter", "nbconvert", "--to", "notebook", "--execute", "train.ipynb"], "cwd": "/nowhere"}
    name_cells(meta, {1: recs})
    facts = notebook_facts(recs, meta, loader)
    line = CELL.splitlines().index("    def __getitem__(self, i):") + 1
    assert facts == {"path": "train.ipynb", "dataset": {"class": "Images", "site": f"train.ipynb cell 3:{line} Images.__getitem__",
                                                         "cell": "train.ipynb cell 3", "calls": ["augment", "flip"]}}
    assert notebook_facts([r for r in recs if r["k"] != "cell"], meta, loader) is None  # not a kernel
    script = dict(loader, dataset_code=dict(code, module="images_data"))  # imported from a module: nothing to move
    assert notebook_facts(recs, {"command": ["%%whyidle"]}, script) == {"path": None, "dataset": None}


# -- the fixes --------------------------------------------------------------------------------------

def test_spawn_and_forkserver_workers_get_the_module_move():
    base = rules.input_bound(input_facts(TORCH))
    for start, said in ((SPAWN_MAC, "spawn (the default on macOS)"),
                        (FORKSERVER, "forkserver (the default on Linux from Python 3.14)")):
        f = rules.input_bound(input_facts(TORCH).replace(notebook=NB, worker_start=start))
        text, code = f["fix"]["text"], f["fix"]["code"]
        assert text.startswith(base["fix"]["text"])  # the fix itself first, the notebook's words after it
        assert said in text and "cannot import a Dataset class defined in a notebook cell" in text
        assert "move `Images` (defined in cell 3) and `augment` into images_data.py" in text
        lines = code.splitlines()
        assert MOVE in lines and lines.index(MOVE) < next(i for i, x in enumerate(lines) if "DataLoader(" in x)
        assert "# images_data.py, beside the notebook: class Images (defined in cell 3), augment" in code
        assert base["fix"]["code"] in code
    loader_set = dict(SPAWN_MAC, source="loader", platform="linux")
    f = rules.input_bound(input_facts(TORCH).replace(notebook=NB, worker_start=loader_set))
    assert "spawn (the DataLoader's multiprocessing_context)" in f["fix"]["text"]


def test_fork_and_scripts_need_no_move():
    base = rules.input_bound(input_facts(TORCH))
    f = rules.input_bound(input_facts(TORCH).replace(notebook=NB, worker_start=FORK))
    assert "images_data" not in json.dumps(f) and "cannot import" not in f["fix"]["text"]
    # not a notebook: every text as before, whatever the start method
    for start in (SPAWN_MAC, FORKSERVER, FORK, None):
        assert rules.input_bound(input_facts(TORCH).replace(worker_start=start)) == base
    # a notebook whose Dataset comes from a module: nothing to move
    f = rules.input_bound(input_facts(TORCH).replace(notebook={"path": None, "dataset": None}, worker_start=SPAWN_MAC))
    assert "images_data" not in json.dumps(f)


def test_persistent_workers_in_a_notebook_want_the_loader_in_its_own_cell():
    f = rules.input_bound(input_facts(TORCH).replace(notebook={"path": "train.ipynb", "dataset": None}, worker_start=FORK))
    assert "build the DataLoader in a cell of its own and run that cell once" in f["fix"]["text"]
    assert "the Out history" in f["fix"]["text"]
    assert f["fix"]["code"].splitlines()[-2].startswith("# notebook: this DataLoader in a cell of its own")
    assert "cell of its own" not in json.dumps(rules.input_bound(input_facts(TORCH)))
    # the epoch-boundary fix (persistent_workers=True) says it too
    from test_accounting import job_facts

    loader = {"num_workers": 4, "persistent_workers": False, "mp_context": None}
    plain = rules_job.epoch_boundary(job_facts({"epoch_boundary": (30.0, 9)}, loader=loader))
    nb = rules_job.epoch_boundary(job_facts({"epoch_boundary": (30.0, 9)}, loader=loader).replace(
        notebook={"path": None, "dataset": None}))
    assert nb["fix"]["text"].startswith(plain["fix"]["text"]) and "cell of its own" in nb["fix"]["text"]
    assert "cell of its own" not in plain["fix"]["text"]


def test_lightning_hook_gets_the_move_but_not_the_own_cell():
    f = rules.input_bound(input_facts(LIGHTNING).replace(notebook=NB, worker_start=SPAWN_MAC))
    code = f["fix"]["code"]
    lines = code.splitlines()
    assert lines.index(MOVE) < lines.index("def train_dataloader(self):")
    assert "# ImageData.train_dataloader" in code and "cell of its own" not in f["fix"]["text"]  # fit calls the hook


def _threads_facts(**extra):
    host = make_host(cores=4, cpu_busy=0.5)
    host["trainer_cores"] = 2.0  # the model's 8 intra-op threads keep 2 cores busy: a worker takes one
    facts = make_facts(make_step(data=0.6, fwd=0.15, bwd=0.15, opt=0.05, data_cpu_share=0.95), host, make_loader(nw=0))
    return facts.replace(**extra)


def test_set_num_threads_in_a_notebook_is_set_back_after_training():
    plain = rules.input_bound(_threads_facts())
    assert plain["evidence"]["suggested_threads"] == 3  # the fix calls torch.set_num_threads(3)
    f = rules.input_bound(_threads_facts(notebook={"path": None, "dataset": None}, worker_start=FORK))
    assert f["fix"]["text"].startswith(plain["fix"]["text"])
    assert "holds for the whole kernel" in f["fix"]["text"] and "torch.set_num_threads(8)" in f["fix"]["text"]
    lines = f["fix"]["code"].splitlines()
    assert lines[0] == plain["fix"]["code"].splitlines()[0] == "torch.set_num_threads(3)   # leave cores to the workers"
    assert lines[-1].startswith("torch.set_num_threads(8)   # after training")  # the proc record's threads
    unknown = _threads_facts(notebook={"path": None, "dataset": None}, worker_start=FORK)
    unknown = unknown.replace(proc=dict(unknown.proc, threads=None), devices={"threads": 8})  # audit only
    code = rules.input_bound(unknown)["fix"]["code"]
    assert code.startswith("kernel_threads = torch.get_num_threads()")
    assert code.endswith("torch.set_num_threads(kernel_threads)   # after training")


def test_cpu_contention_in_a_notebook():
    facts = make_facts(make_step(), make_host(cores=8, run_delay=0.15, others=0.2, workers=4, worker_busy=0.5),
                       trainers=[100, 101])
    facts.devices = {"params": {"cpu": 10}, "threads": 8}
    plain = rules.cpu_contention(facts)
    f = rules.cpu_contention(facts.replace(notebook={"path": None, "dataset": None}, worker_start=SPAWN_MAC))
    assert f["fix"]["text"].startswith(plain["fix"]["text"]) and "holds for the whole kernel" in f["fix"]["text"]
    assert "from loader_fns import one_thread" in f["fix"]["code"]  # its worker_init_fn, for spawned workers
    assert f["fix"]["code"].endswith("torch.set_num_threads(8)   # after training: the kernel's threads before "
                                     "(the setting outlives the cell)")
    own = rules.cpu_contention(make_facts(make_step(), make_host(run_delay=0.13)).replace(
        notebook={"path": None, "dataset": None}))
    assert own["evidence"]["cause"] == "own_threads" and "holds for the whole kernel" in own["fix"]["text"]


def test_tune_code_in_a_notebook():
    from whyidle.tune.code import settings_code

    facts = input_facts(TORCH)
    settings = {"num_workers": 2, "persistent_workers": True, "threads": 1}
    plain = settings_code(facts, settings)
    code = settings_code(facts.replace(notebook=NB, worker_start=SPAWN_MAC), settings)
    assert plain in code and MOVE in code and "torch.set_num_threads(8)   # after training" in code
    assert "cell of its own" in code
    assert settings_code(facts.replace(notebook=NB, worker_start=SPAWN_MAC), {"batch_size": 64}) == \
        settings_code(facts, {"batch_size": 64})  # no workers, no threads: nothing to add


def test_module_names():
    assert notebook.module_name("Images") == "images_data"
    assert notebook.module_name("ImageFolderDataset") == "image_folder_dataset"
    assert notebook.module_name("CIFARData") == "cifar_data"


# -- a real notebook ----------------------------------------------------------------------------------

#: The notebook's data: samples that wait off the CPU (a slow store), so that workers help even on
#: a machine whose cores are busy (a CPU-bound loader's worker fix is dropped there: est. 1.00×).
DATA = """import time
import torch
from torch.utils.data import DataLoader, Dataset
torch.manual_seed(0)


def load(i):
    time.sleep(0.004)  # waits on a slow store
    return torch.rand(3, 32, 32)


class Images(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return load(i), i % 10


def small_cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                               torch.nn.Flatten(), torch.nn.Linear(128, 10))
"""

LOOP = """%%whyidle --out {out}
model = small_cnn()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Images(), batch_size=8):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()"""


@pytest.mark.slow
def test_a_notebooks_spawn_fix_moves_its_dataset(tmp_path):
    """A notebook whose Dataset is defined in a cell, trained in the kernel (num_workers=0) under
    the Linux default (fork: no move) and then with the start method set to spawn (the move to
    images_data.py, named from the class, with the cell that defines it)."""
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [new_code_cell("%load_ext whyidle"), new_code_cell(DATA),
             new_code_cell(LOOP.format(out=tmp_path / "runs" / "default")),
             new_code_cell("import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)"),
             new_code_cell(LOOP.format(out=tmp_path / "runs" / "spawn"))]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    setup = nb.cells[1].execution_count
    reports = {name: json.loads((tmp_path / "runs" / name / "report.json").read_text()) for name in ("default", "spawn")}
    for name, report in reports.items():
        f = finding(report, "input_bound")
        assert f is not None and report["loader"]["num_workers"] == 0, (name, report["verdict"])
    if sys.platform == "linux" and sys.version_info < (3, 14):  # the default is fork: nothing to move
        assert "images_data" not in json.dumps(reports["default"]["findings"])
    option = _worker_option(finding(reports["spawn"], "input_bound"))
    assert f"cell {setup}) and `load` into images_data.py" in option["text"], option["text"]
    assert "move `Images` (defined in " in option["text"]
    assert "spawn (the start method the program set)" in option["text"]
    lines = option["code"].splitlines()
    assert MOVE in lines and lines.index(MOVE) < next(i for i, x in enumerate(lines) if "DataLoader(" in x)
    assert "build the DataLoader in a cell of its own" in option["text"]  # the kernel outlives the cell
