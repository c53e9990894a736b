"""Writes the notebooks the notebook tests execute (nbformat), from the cells below."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

SETUP = """import sys, time
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
torch.manual_seed(0)
torch.set_num_threads(1)


def augment(img):
    # a per-sample augmentation written in Python, in the kernel process
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.004:
        img = img.flip(-1)
    return img


class Images(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return augment(torch.rand(3, 32, 32)), i % 10


held_out = DataLoader(Images(), batch_size=8)  # built here, iterated in a later %%whyidle cell


def small_cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4),
                               torch.nn.Flatten(), torch.nn.Linear(128, 10))
"""

TORCH_LOOP = """%%whyidle --out {out}/torch
model = small_cnn()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Images(), batch_size=8):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
float(loss)"""

LIGHTNING = """import lightning as L


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = small_cnn()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)"""

LIGHTNING_FIT = """%%whyidle --out {out}/lightning
trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Classifier(), DataLoader(Images(), batch_size=8))"""

KERAS = """%%whyidle --out {out}/keras
import keras
x = np.random.rand(4096, 64).astype("float32")
y = np.random.randint(0, 10, 4096)
net = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = net.fit(x, y, batch_size=64, epochs=2, verbose=0)"""

HEALTHY = """%%whyidle --out {out}/healthy
data = TensorDataset(torch.rand(640, 3, 32, 32), torch.randint(0, 10, (640,)))
net = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1),
                          torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(net.parameters(), lr=0.01)
for x, y in DataLoader(data, batch_size=32):
    loss = torch.nn.functional.cross_entropy(net(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()"""

WATCHED = """import whyidle

with whyidle.watch(out="{out}/watched", html=False) as w:
    for x, y in DataLoader(Images(), batch_size=16):
        model(x)
w.run_dir"""

INTERRUPTED = """%%whyidle --out {out}/interrupted
for i, (x, y) in enumerate(held_out):
    model(x)
    if i == 6:
        raise KeyboardInterrupt"""

BAD_OPTIONS = """%%whyidle --bogus
print("RAN")"""

CHECK = """sys.path.insert(0, {tests!r})
from leftovers import leftovers
print("LEFTOVERS", leftovers([model, net]))"""


def magic_notebook(path: str, out: str, tests: str) -> None:
    """The notebook of the ``%%whyidle`` test: a main-process image pipeline, a Lightning fit, a
    Keras fit, a healthy loop, ``whyidle.watch()`` in a cell, a cell interrupted (``KeyboardInterrupt``), a cell with a bad option (not run), then a check that nothing
    of whyidle's is left in the kernel."""
    cells = [new_markdown_cell("# whyidle in a notebook"), new_code_cell("%load_ext whyidle"), new_code_cell(SETUP),
             new_code_cell(TORCH_LOOP.format(out=out)), new_code_cell(LIGHTNING),
             new_code_cell(LIGHTNING_FIT.format(out=out)), new_code_cell(KERAS.format(out=out)),
             new_code_cell(HEALTHY.format(out=out)), new_code_cell(WATCHED.format(out=out)),
             new_code_cell(INTERRUPTED.format(out=out), metadata={"tags": ["raises-exception"]}),
             new_code_cell(BAD_OPTIONS, metadata={"tags": ["raises-exception"]}),
             new_code_cell(CHECK.format(tests=tests))]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
