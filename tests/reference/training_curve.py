#!/usr/bin/env python3
"""PyTorch reference for tests/reference/test_training_curve.cpp.

usage: training_curve.py IN.json OUT.json

Trains torch.nn.Sequential(Linear(784, 64), ReLU, Linear(64, 32), ReLU, Linear(32, 10)) in
float32 from the initial weights in IN.json over its batches, once per optimizer (SGD and
AdamW with the given settings), and writes {optimizer: [loss at every step]} to OUT.json.
"""
import json
import sys

import torch
import torch.nn.functional as F


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    batches = [(torch.tensor(b["x"], dtype=torch.float32).reshape(cfg["batch"], cfg["in"]),
                torch.tensor([int(v) for v in b["y"]], dtype=torch.int64)) for b in cfg["batches"]]
    out = {}
    for name, opts in cfg["optimizers"].items():
        model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                                    torch.nn.ReLU(), torch.nn.Linear(32, 10))
        state = {k: torch.tensor(v["data"], dtype=torch.float32).reshape(v["shape"]) for k, v in cfg["weights"].items()}
        model.load_state_dict(state)
        if name == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=opts["lr"], momentum=opts["momentum"])
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=opts["lr"], weight_decay=opts["weight_decay"])
        losses = []
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
        out[name] = losses
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
