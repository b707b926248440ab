"""PyTorch side of the data-loader benchmarks (bench/run cases data_loader, data_wait_fc_mnist).

  --mode loader: torch.utils.data.DataLoader over a map-style Dataset reading the same
    synthetic-digits IDX files (train split; each sample scaled to [0, 1] and normalised with
    the MNIST mean and std, flattened to 784 floats, label as int64), batch --batch, shuffle,
    drop_last, num_workers=--workers (worker processes), persistent workers. After --warmup
    batches, --repeats timed repeats of --batches batches. Prints one JSON line.
  --mode fc: the FC-MNIST training loop (784 -> 256 -> 256 -> 10, SGD(0.01, 0.9)) fed by that
    DataLoader; reports the step time and the time spent waiting in next() for a batch.
"""
import argparse
import json
import os
import statistics
import time

import numpy as np
import torch


def read_idx(path):
    with open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


class Mnist(torch.utils.data.Dataset):
    def __init__(self, d):
        self.images = read_idx(os.path.join(d, "train-images-idx3-ubyte"))
        self.labels = read_idx(os.path.join(d, "train-labels-idx1-ubyte"))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = torch.from_numpy(self.images[i].astype(np.float32).reshape(784))
        x = (x / 255.0 - 0.1307) / 0.3081
        return x, int(self.labels[i])


def make_loader(a):
    g = torch.Generator()
    g.manual_seed(1)
    return torch.utils.data.DataLoader(Mnist(a.data), batch_size=a.batch, shuffle=True, drop_last=True,
                                       num_workers=a.workers, persistent_workers=a.workers > 0,
                                       generator=g)


class Batches:
    """Endless batches, re-iterating the loader at the end of an epoch."""

    def __init__(self, loader):
        self.loader = loader
        self.it = iter(loader)

    def next(self):
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="loader")
    ap.add_argument("--data", required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    batches = Batches(make_loader(a))
    if a.mode == "loader":
        for _ in range(a.warmup):
            batches.next()
        per = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            for _ in range(a.batches):
                x, y = batches.next()
            per.append((time.perf_counter() - t0) / a.batches)
        print(json.dumps({"sec_per_batch": statistics.median(per), "per_repeat": per, "batches": a.batches,
                          "workers": a.workers, "torch_version": torch.__version__}))
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    wait = waits = 0
    t0 = None
    for i in range(a.warmup + a.steps):
        if i == a.warmup:
            t0 = time.perf_counter()
            wait = 0.0
        w0 = time.perf_counter()
        x, y = batches.next()
        w = time.perf_counter() - w0
        wait += w
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i % 100 == 0:
            last = loss.item()
    total = time.perf_counter() - t0
    print(json.dumps({"sec_per_step": total / a.steps, "data_wait_s": wait, "steps": a.steps, "loss": last,
                      "workers": a.workers, "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
