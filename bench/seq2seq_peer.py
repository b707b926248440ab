"""PyTorch peer of bench/bench_seq2seq.cpp (bench/run cases transformer_tiny, t5_tiny).

The same models as tests/reference/seq2seq_reference.py (torch.nn only), the same
configuration (--config, printed by bench_seq2seq --print_config), the same batches; a step is
forward + loss, backward, AdamW step, zero_grad, in eager mode.

--serve: prints {"ready": ...}, then answers "run MODE N", "info" and "quit" on stdin.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import seq2seq_reference as ref  # noqa: E402


def make_batch(k, B, S, T, vocab):
    """Batch of step k, as bench_seq2seq.cpp's make_batch."""
    ids = torch.zeros(B, S, dtype=torch.int64)
    am = torch.zeros(B, S, dtype=torch.int64)
    dids = torch.zeros(B, T, dtype=torch.int64)
    dam = torch.zeros(B, T, dtype=torch.int64)
    labels = torch.full((B, T), -100, dtype=torch.int64)
    for r in range(B):
        for i in range(S - 4 * r):
            ids[r, i] = 1 + (k * 131 + r * 31 + i * 17) % (vocab - 1)
            am[r, i] = 1
        for i in range(T - 2 * r):
            labels[r, i] = (k * 7 + r * 11 + i * 5) % vocab
            dam[r, i] = 1
            if i > 0:
                dids[r, i] = labels[r, i - 1]
    return {"input_ids": ids, "attention_mask": am, "decoder_input_ids": dids,
            "decoder_attention_mask": dam, "labels": labels}


class Runner:
    def __init__(self, a, cfg, batches):
        torch.manual_seed(0)
        self.model = (ref.Transformer if a.model == "transformer" else ref.T5)(cfg)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches, self.i, self.loss = batches, 0, None

    def timed(self, n):
        t0 = time.perf_counter()
        for _ in range(n):
            loss = self.model(self.batches[self.i % len(self.batches)])
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.loss = loss
            self.i += 1
        self.loss.item()
        return time.perf_counter() - t0

    def info(self):
        l = self.loss.item() if self.loss is not None else float("nan")
        return {"loss": l if math.isfinite(l) else str(l)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, choices=["transformer", "t5"])
    ap.add_argument("--config", required=True, help="JSON from bench_seq2seq --print_config")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--src_len", type=int, default=64)
    ap.add_argument("--tgt_len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = json.loads(a.config)
    batches = [make_batch(k, a.batch, a.src_len, a.tgt_len, cfg["src_vocab_size"]) for k in range(8)]
    r = Runner(a, cfg, batches)
    warm = {"eager": r.timed(a.warmup)}

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
                emit({"mode": cmd[1], "steps": n, "sec": r.timed(n)})
            elif cmd[0] == "info":
                emit({"info": {"eager": r.info()}})
            else:
                raise SystemExit(f"seq2seq_peer.py: unknown command {line!r}")
        return
    per = [r.timed(a.steps) / a.steps for _ in range(a.repeats)]
    emit({"side": "pytorch", "model": a.model, "mode": "eager", "threads": a.threads,
          "sec_per_step": statistics.median(per), **r.info(), "torch_version": torch.__version__})


if __name__ == "__main__":
    main()
