"""PyTorch peer of bench_checkpoint: torch.save (with fsync) and torch.load of the same
GPT-2-small-shaped state dict, cold (file evicted from the page cache) and warm. One JSON line."""
import argparse
import json
import os
import time

import torch


def gpt2_state():
    shapes = [("wte.weight", (50257, 768)), ("wpe.weight", (1024, 768))]
    for l in range(12):
        p = f"h.{l}."
        shapes += [(p + "ln_1.weight", (768,)), (p + "ln_1.bias", (768,)),
                   (p + "attn.c_attn.weight", (768, 2304)), (p + "attn.c_attn.bias", (2304,)),
                   (p + "attn.c_proj.weight", (768, 768)), (p + "attn.c_proj.bias", (768,)),
                   (p + "ln_2.weight", (768,)), (p + "ln_2.bias", (768,)),
                   (p + "mlp.c_fc.weight", (768, 3072)), (p + "mlp.c_fc.bias", (3072,)),
                   (p + "mlp.c_proj.weight", (3072, 768)), (p + "mlp.c_proj.bias", (768,))]
    shapes += [("ln_f.weight", (768,)), ("ln_f.bias", (768,))]
    g = torch.Generator().manual_seed(0)
    return {k: torch.rand(s, generator=g) - 0.5 for k, s in shapes}


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    sd = gpt2_state()
    path = os.path.join(a.dir, "torch.pt")
    out = {"bytes": sum(t.numel() * 4 for t in sd.values()), "torch_version": torch.__version__}
    res = {"save": [], "load_cold": [], "load_warm": []}
    for _ in range(a.repeats):
        t = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        res["save"].append(time.perf_counter() - t)
        evict(path)
        t = time.perf_counter()
        torch.load(path)
        res["load_cold"].append(time.perf_counter() - t)
        t = time.perf_counter()
        torch.load(path)
        res["load_warm"].append(time.perf_counter() - t)
    out.update(res)
    out["file_bytes"] = os.path.getsize(path)
    os.remove(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
