"""The printed DataLoader fix pasted over the program's call runs and keeps the program's call.

A copy of an input-bound script (a dataset that sleeps per sample, ``num_workers`` 0) whose
``DataLoader(...)`` call passes a sampler, a collate_fn, a worker_init_fn, a generator and
variables runs under ``whyidle run``; every printed code change that writes a ``DataLoader(``
(``findings[].fix.code`` and ``fix.options[].code`` of the JSON report) is pasted over the call's
lines (``loader.call.lines``) in another copy, which runs as plain Python and shows the loader it
built: the sampler, collate_fn, worker_init_fn and generator are the program's objects, and the
variables are still in the call. Variants: the ImageNet example's multi-line keyword call, a
``**kwargs`` call and an all-positional call.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import observe

pytestmark = pytest.mark.slow

SCRIPT = '''
import argparse, json, os, time
import torch
import torch.utils.data
from torch.utils.data import DataLoader, Dataset, SubsetRandomSampler

parser = argparse.ArgumentParser()
parser.add_argument("-j", "--workers", default=0, type=int)
parser.add_argument("-b", "--batch-size", default=16, type=int)
parser.add_argument("--steps", default=30, type=int)


class Slow(Dataset):
    def __len__(self):
        return 2048

    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.randn(32), i % 2


def collate(batch):
    return torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch])


def seed_worker(worker_id):
    torch.manual_seed(worker_id)


def main():
    args = parser.parse_args()
    torch.set_num_threads(1)
    train_dataset = Slow()
    train_sampler = SubsetRandomSampler(range(1024))
    g = torch.Generator()
    g.manual_seed(0)
    loader_kwargs = dict(num_workers=args.workers, collate_fn=collate)
{call}
    if os.environ.get("SHOW_LOADER"):
        print("LOADER " + json.dumps({{
            "sampler": train_loader.sampler is train_sampler, "collate": train_loader.collate_fn is collate,
            "worker_init": train_loader.worker_init_fn is seed_worker, "generator": train_loader.generator is g,
            "num_workers": train_loader.num_workers, "batch_size": train_loader.batch_size,
            "persistent": train_loader.persistent_workers, "prefetch": train_loader.prefetch_factor}}))
    model = torch.nn.Linear(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    while step < args.steps:
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step >= args.steps:
                break
    print("trained", step)


if __name__ == "__main__":
    main()
'''

#: variant → (the call as the program writes it, the argument texts the pasted call must keep).
CALLS = {
    "multiline": ('''    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=False, sampler=train_sampler,
        collate_fn=collate, worker_init_fn=seed_worker, generator=g)''',
                  ["train_dataset", "args.batch_size", "(train_sampler is None)", "args.workers", "train_sampler",
                   "collate", "seed_worker", "g"]),
    "kwargs": ("    train_loader = DataLoader(train_dataset, args.batch_size, sampler=train_sampler, "
               "worker_init_fn=seed_worker, **loader_kwargs)",
               ["train_dataset", "args.batch_size", "train_sampler", "seed_worker", "loader_kwargs"]),
    "positional": ("    train_loader = DataLoader(train_dataset, args.batch_size, False, train_sampler, None, 0,\n"
                   "                              collate, False, False, 0, seed_worker)",
                   ["train_dataset", "args.batch_size", "train_sampler", "collate", "seed_worker"]),
}


def loader_codes(report: dict) -> list[str]:
    """Every printed code change that writes a DataLoader call: the fixes and all their options."""
    codes = []
    for f in report["findings"]:
        for code in [f["fix"]["code"]] + [o["code"] for o in f["fix"]["options"]]:
            if code and "DataLoader(" in code and code not in codes:
                codes.append(code)
    return codes


def paste(source: str, lines: list[int], code: str) -> str:
    """``source`` with its lines ``lines[0]``…``lines[1]`` (1-based) replaced by ``code`` at their indentation."""
    rows = source.splitlines()
    first = rows[lines[0] - 1]
    indent = first[:len(first) - len(first.lstrip())]
    pasted = [indent + line if line.strip() else line for line in code.splitlines()]
    return "\n".join(rows[:lines[0] - 1] + pasted + rows[lines[1]:]) + "\n"


def show(path: str, *args) -> dict:
    """Runs the script (plain Python) for 3 steps and returns the loader it built."""
    env = dict(os.environ, SHOW_LOADER="1")
    proc = subprocess.run([sys.executable, path, "--steps", "3", *args], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained 3" in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if x.startswith("LOADER "))
    return json.loads(line[len("LOADER "):])


def call_texts(source: str, line: int) -> list[str]:
    """The source texts of the arguments of the DataLoader call starting at ``line`` (``name=value`` for keywords)."""
    tree = ast.parse(source)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno >= line
                and getattr(n.func, "attr", getattr(n.func, "id", "")) == "DataLoader")
    return [ast.get_source_segment(source, a) for a in list(call.args) + list(call.keywords)]


@pytest.mark.parametrize("variant", sorted(CALLS))
def test_the_printed_loader_fix_pastes_over_the_call_and_runs(tmp_path, variant):
    call, kept = CALLS[variant]
    script = tmp_path / "train.py"
    source = SCRIPT.format(call=call)
    script.write_text(source)
    proc, report, _ = observe(tmp_path, [sys.executable, str(script)], name=variant)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["verdict"] == "input_bound"
    recorded = report["loader"]["call"]
    assert recorded["lead"] == "train_loader = "
    first = source.splitlines().index(call.splitlines()[0]) + 1
    assert recorded["lines"] == [first, first + len(call.splitlines()) - 1]
    codes = loader_codes(report)
    assert codes, [f["fix"] for f in report["findings"]]
    before = show(str(script))
    workers = next(f for f in report["findings"] if f["id"] == "input_bound")["evidence"]["suggested_num_workers"]
    for n, code in enumerate(codes):
        copy = tmp_path / f"pasted_{n}.py"
        pasted = paste(source, recorded["lines"], code)
        copy.write_text(pasted)
        texts = call_texts(pasted, first)
        for text in kept:  # the program's own arguments, as written
            assert any(text in t for t in texts), (text, code)
        got = show(str(copy))
        assert got["sampler"] and got["worker_init"] and got["collate"], (got, code)
        assert got["batch_size"] == before["batch_size"] == 16
        if variant == "multiline":
            assert got["generator"]
            # the expression stays: the comment names the option that sets it
            assert f"num_workers=args.workers,   # 0 here: make it {workers} (run with --workers {workers})" in code
            assert got["num_workers"] == 0 and not got["persistent"]  # as pasted, without the option: still runs
            with_option = show(str(copy), "--workers", str(workers))
            assert with_option["num_workers"] == workers and with_option["persistent"], code
        elif "num_workers" in code:  # a literal replaced in place, or merged into **loader_kwargs
            assert got["num_workers"] == workers and got["persistent"] and got["prefetch"] == 4, (got, code)
