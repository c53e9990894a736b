"""A training script that does with its objects what real programs do after (and during) training:
saves the whole model (``torch.save(model, f)``, as the ImageNet and word-language-model examples
and many tutorials do), pickles it (multiprocessing evaluation, Ray), deep-copies it (an EMA or
teacher copy), scripts, traces, FX-traces and compiles it, round-trips its state_dict; the same for
its optimizer and DataLoader. Issue 30: under whyidle, ``torch.save(model)`` failed with
"Can't pickle local object '_forward_hooks.<locals>.post'" and ``deepcopy`` copied whyidle's hooks
onto the copy.

The model carries hooks of its own (a scriptable forward hook, a gradient hook on a parameter,
module-level functions, as a program registers them) and each step lasts >= 30 ms (whyidle's
per-step work switches modes at ~20 ms steps). Every check prints one line of plain facts (no
timings, no addresses), so stdout is the same with and without whyidle; any failure exits 1.

``--ddp``: the model trains wrapped in ``DistributedDataParallel`` (a one-process gloo group; whyidle
times its gradient all-reduce through a communication hook) and the DDP module is pickled,
``torch.save``d and deep-copied too.

``--ema-forward`` (the shares check): from step 5 on, a deep copy made after training started (past
whyidle's learning steps) is called in every step with grad enabled (a teacher forward); its
forward stalls ``--copy-ms`` (40 ms, standing for a big model's compute) while the model's own
forward is a few µs. The copy carries no hook of whyidle's; its calls are the step's model work
(forward), timed as its own calls, never host work. ``--teacher new``: the copy is a new ``Net``
loaded with the model's state_dict instead of a deep copy. ``RESULT`` reports ``copy_s_per_step``
(seconds).
"""

import argparse
import copy
import io
import json
import os
import pickle
import socket
import sys
import time
from typing import Tuple

import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.sleep_s = 0.0  # a deep copy's forward is made slow in --ema-forward

    @torch.jit.unused
    def stall(self) -> None:
        time.sleep(self.sleep_s)

    def forward(self, x):
        if self.sleep_s > 0:
            self.stall()
        return self.body(x)


def clip_output(module: nn.Module, args: Tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
    """A forward hook of the program's own (TorchScript-compatible, module-level)."""
    return output.clamp(-100.0, 100.0)


def scale_grad(grad: torch.Tensor) -> torch.Tensor:
    """A gradient hook of the program's own."""
    return grad * 1.0


class Squares(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64 * 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), i % 4


def same(a, b) -> bool:
    return bool(torch.allclose(a, b))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-ms", type=float, default=35.0)
    ap.add_argument("--ema-forward", action="store_true")
    ap.add_argument("--copy-ms", type=float, default=40.0)
    ap.add_argument("--teacher", choices=("deepcopy", "new"), default="deepcopy")
    ap.add_argument("--ddp", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    model.register_forward_hook(clip_output)
    model.body[0].weight.register_hook(scale_grad)
    trained = model
    if args.ddp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        trained = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    ema = None
    copy_s = 0.0
    step = 0
    t_loop = time.perf_counter()
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(trained(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if args.ema_forward and step == 4:
                if args.teacher == "deepcopy":
                    ema = copy.deepcopy(model)
                else:
                    ema = Net()
                    ema.load_state_dict(model.state_dict())
                ema.sleep_s = args.copy_ms / 1000
            if ema is not None:
                t0 = time.perf_counter()
                ema(x)  # a teacher forward with grad enabled, as programs write it
                copy_s += time.perf_counter() - t0
            time.sleep(args.step_ms / 1000)
            step += 1
            if step >= args.steps:
                break
    wall = time.perf_counter() - t_loop
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(x)
    checks: list[tuple[str, object]] = []

    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    checks.append(("torch.save whole model", same(loaded(x), ref)))
    checks.append(("loaded hooks", [h.__name__ for h in loaded._forward_hooks.values()]))
    clone = pickle.loads(pickle.dumps(model))
    checks.append(("pickle", same(clone(x), ref)))
    dup = copy.deepcopy(model)
    checks.append(("deepcopy hooks", [h.__name__ for h in dup._forward_hooks.values()]
                   + [h.__name__ for h in dup._forward_pre_hooks.values()]))
    checks.append(("deepcopy forward", same(dup(x), ref)))
    checks.append(("deepcopy is a function hook", all(type(h).__name__ == "function" for h in dup._forward_hooks.values())))
    fresh = Net()
    fresh.load_state_dict(copy.deepcopy(model.state_dict()))
    checks.append(("state_dict round trip", same(fresh.body(x), model.body(x))))
    scripted = torch.jit.script(model)
    checks.append(("torch.jit.script", same(scripted(x), ref)))
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    buf.seek(0)
    checks.append(("torch.jit.save/load", same(torch.jit.load(buf)(x), ref)))
    traced = torch.jit.trace(model, x)
    checks.append(("torch.jit.trace", same(traced(x), ref)))
    fx = torch.fx.symbolic_trace(model.body)
    checks.append(("torch.fx.symbolic_trace", same(fx(x), model.body(x))))
    compiled = torch.compile(model, backend="eager")
    checks.append(("torch.compile", same(compiled(x), ref)))
    checks.append(("repr", repr(model).splitlines()[0]))
    # the optimizer and the DataLoader
    buf = io.BytesIO()
    torch.save(opt, buf)
    checks.append(("torch.save optimizer", buf.tell() > 0))
    opt2 = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    checks.append(("optimizer state_dict round trip", len(opt2.state) == len(opt.state)))
    checks.append(("pickle optimizer", len(pickle.loads(pickle.dumps(opt)).param_groups)))
    checks.append(("deepcopy optimizer", len(copy.deepcopy(opt).state)))
    checks.append(("pickle DataLoader", len(pickle.loads(pickle.dumps(loader)))))
    checks.append(("deepcopy DataLoader", len(copy.deepcopy(loader))))
    checks.append(("torch.save DataLoader", torch.save(loader, io.BytesIO()) is None))
    if args.ddp:
        checks.append(("pickle DDP", same(pickle.loads(pickle.dumps(trained)).module(x), ref)))
        buf = io.BytesIO()
        torch.save(trained, buf)
        checks.append(("torch.save DDP", buf.tell() > 0))
        checks.append(("deepcopy DDP", same(copy.deepcopy(trained).module(x), ref)))
        torch.distributed.destroy_process_group()
    for name, value in checks:
        print(f"{name}: {value}")
    failed = [name for name, value in checks if value is False]
    print("RESULT " + json.dumps({"steps": step, "wall_s": round(wall, 3), "failed": failed,
                                  "copy_s_per_step": round(copy_s / max(1, step - 5), 4)}), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
