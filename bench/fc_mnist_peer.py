#!/usr/bin/python3
"""PyTorch peer of bench/bench_fc_mnist.cpp: the same model, optimizer, data, modes and protocol.

784 -> hidden... -> 10 (ReLU between layers), SGD(lr, momentum), cross-entropy. A timed repeat
of N eager steps (forward, loss, backward, optimizer.step(), zero_grad(set_to_none=True)) ends
with loss.item(). Modes forward / forward_backward time the partial steps, as the cstorch side
does. Every mode has its own model built from the same seed and is warmed up with --warmup steps.

Standalone: --repeats repeats of --steps steps per mode; one JSON line per mode (median s/step).
--serve: prints {"ready": ...}, then answers "run MODE N", "info" and "quit" on stdin.
"""
import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

MODES = ("eager", "forward", "forward_backward")


class Runner:
    def __init__(self, mode, a, X, Y):
        if mode not in MODES:
            raise SystemExit(f"fc_mnist_peer.py: unknown mode {mode} ({', '.join(MODES)})")
        self.mode, self.X, self.Y = mode, X, Y
        torch.manual_seed(a.seed)
        layers, n_in = [], 784
        for h in a.hidden:
            layers += [torch.nn.Linear(n_in, h), torch.nn.ReLU()]
            n_in = h
        layers.append(torch.nn.Linear(n_in, 10))
        self.model = torch.nn.Sequential(*layers).to(a.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=a.lr, momentum=a.momentum)
        self.i = 0
        self.loss = None

    def step(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        if self.mode == "forward":
            return loss
        loss.backward()
        if self.mode == "eager":
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss

    def run(self, n):
        X, Y, k = self.X, self.Y, len(self.X)
        for _ in range(n):
            self.loss = self.step(X[self.i % k], Y[self.i % k])
            self.i += 1
        self.loss.item()

    def timed(self, n):
        t0 = time.perf_counter()
        self.run(n)
        return time.perf_counter() - t0

    def info(self):
        l = self.loss.item() if self.loss is not None else float("nan")
        return {"loss": l if math.isfinite(l) else str(l)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hidden", default="256,256")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where the model and batches live")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--flush-denormal", action="store_true", help="torch.set_flush_denormal(True)")
    a = ap.parse_args()
    a.hidden = [int(h) for h in a.hidden.split(",") if h]

    torch.set_num_threads(a.threads)
    if a.flush_denormal:
        torch.set_flush_denormal(True)
    x_all = torch.from_numpy(np.fromfile(a.data + ".x.f32", dtype="<f4").reshape(a.batches, a.batch, 784).copy())
    y_all = torch.from_numpy(np.fromfile(a.data + ".y.i64", dtype="<i8").reshape(a.batches, a.batch).copy())
    X = [x_all[b].to(a.device) for b in range(a.batches)]
    Y = [y_all[b].to(a.device) for b in range(a.batches)]

    runners, warm = {}, {}
    for mode in a.modes.split(","):
        runners[mode] = Runner(mode, a, X, Y)
        warm[mode] = runners[mode].timed(a.warmup)

    def emit(obj):
        print(json.dumps(obj), flush=True)

    if a.serve:
        emit({"ready": True, "side": "pytorch", "threads": a.threads, "torch_threads": torch.get_num_threads(),
              "torch_version": torch.__version__, "warmup_s": warm})
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "quit":
                break
            if cmd[0] == "run":
                n = int(cmd[2])
                emit({"mode": cmd[1], "steps": n, "sec": runners[cmd[1]].timed(n)})
            elif cmd[0] == "info":
                emit({"info": {m: r.info() for m, r in runners.items()}})
            else:
                raise SystemExit(f"fc_mnist_peer.py: unknown command {line!r}")
        return

    for mode, r in runners.items():
        per_step = [r.timed(a.steps) / a.steps for _ in range(a.repeats)]
        emit({"side": "pytorch", "mode": mode, "threads": a.threads, "batch": a.batch, "hidden": a.hidden,
              "warmup": a.warmup, "steps": a.steps, "repeats": a.repeats,
              "sec_per_step": statistics.median(per_step), "min_sec_per_step": min(per_step),
              "repeat_sec_per_step": per_step, "warmup_s": warm[mode], **r.info(),
              "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__})


if __name__ == "__main__":
    main()
