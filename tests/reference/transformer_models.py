#!/usr/bin/env python3
"""PyTorch reference for tests/reference/test_transformer_models.cpp.

usage: transformer_models.py IN.json OUT.json

IN.json names the model ("gpt2" or "bert"), its sizes, a weights file written by cstorch
(torch.save format, {"model": state_dict}) and the batches. The models are written here with
torch.nn only (nn.Embedding, nn.TransformerEncoderLayer, nn.LayerNorm, nn.Linear) under the
same parameter names as cstorch's. OUT.json: the first batch's loss and every parameter's
gradient, then the loss at each step of an AdamW run over the batches.
"""
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        E = c["hidden_size"]
        self.wte = nn.Embedding(c["vocab_size"], E)
        self.wpe = nn.Embedding(c["max_position_embeddings"], E)
        self.h = nn.ModuleList([
            nn.TransformerEncoderLayer(E, c["num_heads"], c["filter_size"], dropout=0.0,
                                       activation=lambda x: F.gelu(x, approximate="tanh"),
                                       layer_norm_eps=c["layer_norm_epsilon"], batch_first=True,
                                       norm_first=True)
            for _ in range(c["num_hidden_layers"])])
        self.ln_f = nn.LayerNorm(E, eps=c["layer_norm_epsilon"])

    def loss(self, b):
        ids = b["input_ids"]
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe.weight[:T]
        causal = torch.full((T, T), float("-inf")).triu(1)
        for layer in self.h:
            x = layer(x, src_mask=causal)
        logits = self.ln_f(x) @ self.wte.weight.t()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["labels"].reshape(-1),
                             reduction="none")
        m = b["attention_mask"].reshape(-1).float()
        return (ce * m).sum() / m.sum()


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        E = c["hidden_size"]
        eps = c["layer_norm_epsilon"]
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Embedding(c["vocab_size"], E)
        self.embeddings.position_embeddings = nn.Embedding(c["max_position_embeddings"], E)
        self.embeddings.token_type_embeddings = nn.Embedding(c["num_segments"], E)
        self.embeddings.LayerNorm = nn.LayerNorm(E, eps=eps)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(E, c["num_heads"], c["filter_size"], dropout=0.0,
                                       activation="gelu", layer_norm_eps=eps, batch_first=True,
                                       norm_first=False)
            for _ in range(c["num_hidden_layers"])])
        self.pooler = nn.Module()
        self.pooler.dense = nn.Linear(E, E)
        self.cls = nn.Module()
        self.cls.predictions = nn.Module()
        self.cls.predictions.transform = nn.Module()
        self.cls.predictions.transform.dense = nn.Linear(E, E)
        self.cls.predictions.transform.LayerNorm = nn.LayerNorm(E, eps=eps)
        self.cls.predictions.bias = nn.Parameter(torch.zeros(c["vocab_size"]))
        self.cls.seq_relationship = nn.Linear(E, 2)

    def loss(self, b):
        ids = b["input_ids"]
        T = ids.shape[1]
        e = self.embeddings
        x = e.word_embeddings(ids) + e.position_embeddings.weight[:T] + \
            e.token_type_embeddings(b["token_type_ids"])
        x = e.LayerNorm(x)
        pad = b["attention_mask"] == 0  # torch's key_padding_mask: True = ignore
        for layer in self.encoder.layers:
            x = layer(x, src_key_padding_mask=pad)
        p = self.cls.predictions
        t = p.transform.LayerNorm(F.gelu(p.transform.dense(x)))
        logits = t @ e.word_embeddings.weight.t() + p.bias
        mlm = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["mlm_labels"].reshape(-1),
                              ignore_index=-100)
        pooled = torch.tanh(self.pooler.dense(x[:, 0]))
        nsp = F.cross_entropy(self.cls.seq_relationship(pooled), b["next_sentence_label"])
        return mlm + nsp


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    c = cfg["config"]
    model = GPT2(c) if cfg["model"] == "gpt2" else Bert(c)
    state = torch.load(cfg["weights"])["model"]
    model.load_state_dict(state, strict=True)
    batches = []
    for b in cfg["batches"]:
        batches.append({k: torch.tensor(v["data"], dtype=torch.int64).reshape(v["shape"])
                        for k, v in b.items()})
    out = {}
    loss = model.loss(batches[0])
    loss.backward()
    out["loss0"] = float(loss)
    out["grads"] = {k: p.grad.reshape(-1).tolist() for k, p in model.named_parameters()}
    model.zero_grad()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    losses = []
    for s in range(cfg["steps"]):
        loss = model.loss(batches[s % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    out["losses"] = losses
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
