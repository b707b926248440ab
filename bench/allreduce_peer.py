"""PyTorch peer of bench_allreduce --mode step: the same MLP and global batch with
DistributedDataParallel (gloo) over N local processes; rank 0 prints one JSON object."""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as td
import torch.multiprocessing as mp


def worker(rank, n, a, init_file, q):
    torch.set_num_threads(1)
    td.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n)
    torch.manual_seed(1)
    h = a.hidden
    model = torch.nn.Sequential(torch.nn.Linear(784, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
                                torch.nn.ReLU(), torch.nn.Linear(h, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model) if n > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    b = a.batch // n + (1 if rank < a.batch % n else 0)
    x = torch.rand(b, 784)
    y = torch.full((b,), 3, dtype=torch.long)

    def step():
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    td.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    sec = (time.perf_counter() - t0) / a.steps
    if rank == 0:
        q.put({"replicas": n, "sec_per_step": sec, "torch_version": torch.__version__})
    td.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        mp.spawn(worker, args=(a.replicas, a, init, q), nprocs=a.replicas, join=True)
    print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
