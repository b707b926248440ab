#!/usr/bin/env python3
"""PyTorch peer of bench_transformer.cpp: the same GPT-2 / BERT training step (torch.nn layers,
AdamW) on the same shapes, eager or (--compile) through torch.compile, on the CPU or (--device
cuda) a GPU. Prints one JSON line like the cstorch side."""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class GPT2(nn.Module):
    def __init__(self, V, E, L, H, T):
        super().__init__()
        self.wte = nn.Embedding(V, E)
        self.wpe = nn.Embedding(T, E)
        self.h = nn.ModuleList([nn.TransformerEncoderLayer(E, H, 4 * E, dropout=0.0,
                                                           activation=lambda x: F.gelu(x, approximate="tanh"),
                                                           batch_first=True, norm_first=True) for _ in range(L)])
        self.ln_f = nn.LayerNorm(E)
        nn.init.normal_(self.wte.weight, std=0.02)  # as the Model Zoo GPT-2 (a sane initial loss)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.register_buffer("causal", torch.full((T, T), float("-inf")).triu(1))

    def loss(self, ids, mask, labels):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe.weight[:T]
        for layer in self.h:
            x = layer(x, src_mask=self.causal)
        logits = self.ln_f(x) @ self.wte.weight.t()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        m = mask.reshape(-1).float()
        return (ce * m).sum() / m.sum()


class Bert(nn.Module):
    def __init__(self, V, E, L, H, T):
        super().__init__()
        self.word = nn.Embedding(V, E)
        self.pos = nn.Embedding(T, E)
        self.typ = nn.Embedding(2, E)
        self.ln = nn.LayerNorm(E, eps=1e-12)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(E, H, 4 * E, dropout=0.0, activation="gelu",
                                                                layer_norm_eps=1e-12, batch_first=True)
                                     for _ in range(L)])
        self.pool = nn.Linear(E, E)
        self.dense = nn.Linear(E, E)
        self.ln2 = nn.LayerNorm(E, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(V))
        self.nsp = nn.Linear(E, 2)
        for emb in (self.word, self.pos, self.typ):
            nn.init.normal_(emb.weight, std=0.02)

    def loss(self, ids, mask, types, mlm, nsl):
        T = ids.shape[1]
        x = self.ln(self.word(ids) + self.pos.weight[:T] + self.typ(types))
        pad = mask == 0
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=pad)
        logits = self.ln2(F.gelu(self.dense(x))) @ self.word.weight.t() + self.bias
        l = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), mlm.reshape(-1), ignore_index=-100)
        return l + F.cross_entropy(self.nsp(torch.tanh(self.pool(x[:, 0]))), nsl)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2")
    for k, v in (("threads", 1), ("steps", 10), ("warmup", 3), ("repeats", 3), ("layers", 4), ("width", 256),
                 ("heads", 4), ("seq", 128), ("vocab", 8192), ("batch", 8)):
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--precision", choices=["f32", "bf16"], default="f32",
                   help="bf16: the forward under torch.autocast (bfloat16), f32 master weights")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--compile", action="store_true", help="the loss through torch.compile")
    a = p.parse_args()
    dev = torch.device(a.device)
    if a.device == "cuda":
        # fp32 products as fp32 (cstorch's default: TF32 only when asked for).
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, T, V = a.batch, a.seq, a.vocab
    # The batch bench_transformer trains on: its 64-bit LCG, ids from bits 33-63, labels from 13-63.
    seq, st = [], 12345
    for _ in range(B * T):
        st = (st * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        seq.append(((st >> 33) % V, (st >> 13) % V))
    ids = torch.tensor([i for i, _ in seq], dtype=torch.int64).view(B, T)
    labels = torch.tensor([l for _, l in seq], dtype=torch.int64).view(B, T)
    mask = torch.ones(B, T, dtype=torch.int64)
    if a.model == "gpt2":
        m = GPT2(V, a.width, a.layers, a.heads, T)
        args = (ids, mask, labels)
    else:
        m = Bert(V, a.width, a.layers, a.heads, T)
        mlm = torch.full((B, T), -100, dtype=torch.int64)
        mlm.view(-1)[::7] = labels.view(-1)[::7]
        args = (ids, mask, torch.zeros(B, T, dtype=torch.int64), mlm, torch.ones(B, dtype=torch.int64))
    m.to(dev)
    args = tuple(x.to(dev) for x in args)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    loss_fn = torch.compile(m.loss) if a.compile else m.loss

    def sync():
        if a.device == "cuda":
            torch.cuda.synchronize()

    def step():
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            l = loss_fn(*args)
        l.backward()
        opt.step()
        opt.zero_grad()
        return l

    t = time.perf_counter()
    float(step())  # the first step (torch.compile compiles here)
    first = time.perf_counter() - t
    for _ in range(a.warmup - 1):
        step()
    sync()
    per = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        for _ in range(a.steps):
            l = step()
        loss = float(l)  # waits for the device, as the cstorch side's item()
        per.append((time.perf_counter() - t) / a.steps)
    sec = statistics.median(per)
    print(json.dumps({"model": a.model, "threads": a.threads, "sec_per_step": sec, "min_sec_per_step": min(per),
                      "tokens_per_s": B * T / sec, "loss": loss, "precision": a.precision,
                      "device": a.device, "compiled": a.compile, "first_step_s": first,
                      "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
