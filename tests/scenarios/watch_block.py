"""``whyidle.watch()`` around the training loop of a running program (issue 33): C09's ``.item()``
every step on the device, observed from inside the process, then a check that nothing of whyidle's
is left in it.

    python tests/scenarios/watch_block.py --device cuda --out RUN_DIR --json REPORT.json

Prints ``RESULT {...}`` (the watch's verdict, its GPU metrics and what was left); exit 1 when the
watch made no report, left something behind, or observed no GPU although the loop ran on CUDA.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: leftovers

import torch

import whyidle
from leftovers import leftovers

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--out", required=True)
parser.add_argument("--json", default=None)
parser.add_argument("--steps", type=int, default=80)
args = parser.parse_args()

model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(args.device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024, device=args.device)
y = torch.randint(0, 10, (256,), device=args.device)
with whyidle.watch(name="watch-block", out=args.out, json_path=args.json, html=False, quiet=True) as w:
    for step in range(args.steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()  # a sync every step
        if step % 20 == 0:
            print(f"step {step} loss {value:.4f}")
left = leftovers([model])
report = w.report or {}
gpu = (report.get("metrics") or {}).get("gpu")
print("RESULT " + json.dumps({"verdict": report.get("verdict"), "left": left, "gpu": gpu is not None,
                              "findings": [f["id"] for f in report.get("findings") or []],
                              "problem": w.problem}))
sys.exit(1 if not report or left or (args.device == "cuda" and gpu is None) else 0)
