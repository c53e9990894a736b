"""A notebook executed headless under ``whyidle run`` (issue 33, part 4): the bottleneck is named by
the notebook's cell and line (``train_nb.ipynb cell 2, line 10``), not the kernel's temporary
``ipykernel_<pid>/<hash>.py``."""

from __future__ import annotations

import os
import sys

import pytest

from conftest import finding, needs, observe

pytestmark = [pytest.mark.slow]

#: The code cells of the notebook, executed in order (execution counts 1, 2, 3). Cell 2 defines the
#: per-sample augmentation that the DataLoader runs in the kernel process (num_workers=0).
SETUP = "import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader, Dataset\ntorch.set_num_threads(1)"
DATA = '''class Noisy(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        return augment(np.random.rand(48, 48).astype(np.float32)), i % 2

def augment(x):
    for _ in range(40):
        x = np.sqrt(np.abs(x) + 1.0) * 0.5
    return torch.from_numpy(x).flatten()[:64]'''
TRAIN = '''loader = DataLoader(Noisy(), batch_size=32, num_workers=0)
model = torch.nn.Linear(64, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step >= 80:
        break'''
#: The line of ``augment``'s loop body in its cell (1-based): where the time goes.
AUGMENT_LINE = DATA.splitlines().index("        x = np.sqrt(np.abs(x) + 1.0) * 0.5") + 1


@needs("nbconvert")
@needs("ipykernel")
def test_nbconvert_execute_names_the_cell_and_line(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# augmentation in the kernel"),
                nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(DATA), nbformat.v4.new_code_cell(TRAIN)]
    nbformat.write(nb, str(tmp_path / "train_nb.ipynb"))
    jupyter = os.path.join(os.path.dirname(sys.executable), "jupyter")
    proc, report, _ = observe(tmp_path, [jupyter, "nbconvert", "--to", "notebook", "--execute", "train_nb.ipynb",
                                         "--output", "out.ipynb"], cwd=str(tmp_path), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "input_bound"
    f = finding(report, "input_bound")
    focus = f["evidence"]["focus"]
    assert focus["site"] == f"train_nb.ipynb cell 2:{AUGMENT_LINE} augment", focus
    assert focus["code"] == "x = np.sqrt(np.abs(x) + 1.0) * 0.5"  # the cell's text, from the run's records
    assert f"train_nb.ipynb cell 2, line {AUGMENT_LINE}" in f["summary"]
    shown = repr(report)
    assert "ipykernel_" not in shown.replace("ipykernel_launcher", ""), "a temporary cell file is still named"
    created = report["loader"]["created"][0]
    assert created == "train_nb.ipynb cell 3:1 <module>"
