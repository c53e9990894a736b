"""Per-step Python metrics logging that costs more than the training step itself.

Stages: a normal small training loop (S-CNN, batch 32, in-memory data in a ``TensorDataset``,
``num_workers=0``) that calls ``log_metrics(...)`` after ``optimizer.step()``. ``log_metrics`` does
typical hand-written metrics work in pure Python: ``.tolist()`` of the logits and of the input
batch, per-sample softmax / entropy / confidence / margin, per-sample per-channel image
statistics (mean, std, min, max, saturated-pixel count) in Python loops, batch percentiles via
``sorted``, a formatted status string, and one JSON line written to a log file and flushed. It
costs ~3x the compute step (T_c ~10 ms on the 2-core dev box); both are CPU work in the same
process, so the ratio does not depend much on machine load.

- faulty: ``log_metrics`` every step.
- fixed:  ``log_metrics`` every 50 steps.

Expected diagnosis (faulty): ``host_bound``, naming ``log_metrics`` (logging_loop.py) as the
function that holds the main thread between optimizer steps (phase other/idle, outside
forward/backward/optimizer and outside the data fetch). Data wait is small. Fix: log every N
steps, keep metrics as tensors and reduce them on the device, or log from a background thread.

Expected faulty -> fixed throughput ratio: ~3.5-4x; assert >= 2x.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import json
import math
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common import SCNN, StepMeter, make_parser, seed_everything


def log_metrics(step, loss, logits, targets, images, model, log_file):
    """Per-sample prediction and input statistics plus weight statistics, one JSON line per call."""
    rows = logits.detach().tolist()
    ys = targets.tolist()
    pix = images.tolist()

    confidences, entropies, margins, correct = [], [], [], 0
    for row, y in zip(rows, ys):
        m = max(row)
        exps = [math.exp(v - m) for v in row]
        z = sum(exps)
        probs = [e / z for e in exps]
        entropies.append(-sum(p * math.log(p + 1e-12) for p in probs))
        ranked = sorted(probs, reverse=True)
        confidences.append(ranked[0])
        margins.append(ranked[0] - ranked[1])
        correct += int(probs.index(ranked[0]) == y)

    channel_stats = []
    for sample in pix:
        per_channel = []
        for channel in sample:
            n = s = ss = 0.0
            lo, hi, saturated = math.inf, -math.inf, 0
            hist = [0] * 16
            for line in channel:
                for v in line:
                    n += 1
                    s += v
                    ss += v * v
                    if v < lo:
                        lo = v
                    if v > hi:
                        hi = v
                    if v > 2.0 or v < -2.0:
                        saturated += 1
                    hist[min(15, max(0, int((v + 4.0) * 2.0)))] += 1
            mean = s / n
            per_channel.append(
                {
                    "mean": mean,
                    "std": math.sqrt(max(ss / n - mean * mean, 0.0)),
                    "min": lo,
                    "max": hi,
                    "sat": saturated,
                    "hist": hist,
                }
            )
        channel_stats.append(per_channel)

    weights = {}
    for name, p in model.named_parameters():
        values = p.detach().flatten().tolist()
        grads = p.grad.flatten().tolist() if p.grad is not None else []
        mean = sum(values) / len(values)
        weights[name] = {
            "mean": mean,
            "std": math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)),
            "absmax": max(abs(v) for v in values),
            "grad_norm": math.sqrt(sum(g * g for g in grads)),
        }

    def pct(values, q):
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    record = {
        "step": step,
        "time": time.time(),
        "loss": loss.item(),
        "acc": correct / len(ys),
        "conf_p50": pct(confidences, 0.5),
        "conf_p90": pct(confidences, 0.9),
        "entropy_mean": sum(entropies) / len(entropies),
        "margin_p10": pct(margins, 0.1),
        "input_mean": [sum(c[k]["mean"] for c in channel_stats) / len(channel_stats) for k in range(3)],
        "input_std": [sum(c[k]["std"] for c in channel_stats) / len(channel_stats) for k in range(3)],
        "saturated": sum(c[k]["sat"] for c in channel_stats for k in range(3)),
        "per_sample_conf": [round(c, 4) for c in confidences],
        "input_hist": [sum(c[k]["hist"][b] for c in channel_stats for k in range(3)) for b in range(16)],
        "weights": weights,
    }
    status = (
        f"step {step:5d} | loss {record['loss']:.4f} | acc {record['acc']:.3f} | "
        f"conf p50 {record['conf_p50']:.3f} p90 {record['conf_p90']:.3f} | H {record['entropy_mean']:.3f} | "
        f"sat {record['saturated']}"
    )
    record["status"] = status
    log_file.write(json.dumps(record) + "\n")
    log_file.flush()
    return status


def main():
    args = make_parser(__doc__, steps=150).parse_args()
    torch.set_num_threads(1)
    seed_everything(args.seed)
    log_every = 1 if args.variant == "faulty" else 50

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(2048, 3, 32, 32, generator=g)
    labels = torch.randint(0, 10, (2048,), generator=g)
    loader = DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True, drop_last=True)

    model = SCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    with tempfile.TemporaryDirectory(prefix="logging_loop_") as log_dir:
        with open(os.path.join(log_dir, "metrics.jsonl"), "w") as log_file:
            meter = StepMeter()
            meter.start()
            step = 0
            while step < args.steps:
                for x, y in loader:
                    meter.got_batch()
                    optimizer.zero_grad(set_to_none=True)
                    logits = model(x)
                    loss = F.cross_entropy(logits, y)
                    loss.backward()
                    optimizer.step()
                    if step % log_every == 0:
                        log_metrics(step, loss, logits, y, x, model, log_file)
                    meter.step_done(x.shape[0])
                    step += 1
                    if step >= args.steps:
                        break
    meter.print_result(scenario="logging_loop", variant=args.variant, log_every=log_every, batch_size=32)


if __name__ == "__main__":
    main()
