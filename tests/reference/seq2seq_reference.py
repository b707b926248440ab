"""Plain-PyTorch (torch.nn only) Transformer (AIAYN) and T5 v1.0 for test_seq2seq_reference.cpp.

Usage: seq2seq_reference.py IN.pt OUT.pt

IN.pt (written by cstorch): {"model": "transformer" | "t5", "config": {...}, "weights":
{name: tensor}, "batches": [{input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask, labels}, ...], "lr": float, "weight_decay": float}.

OUT.pt: {"loss": float (batch 0, the given weights), "grads": {name: tensor} (of that loss),
"losses": [float] (AdamW, one step per batch, from the given weights)}.

Written independently of cstorch from the papers / torch.nn: the Transformer uses
torch.nn.TransformerEncoderLayer / TransformerDecoderLayer (post-norm, ReLU); T5 follows
Hugging Face's T5 v1.0 modelling code (RMS norm, unscaled attention, bucketed relative bias
from the first block, tied head with the d_model**-0.5 rescale).
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


def masked_loss(logits, b, label_smoothing):
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), b["labels"].reshape(-1).long(),
                         ignore_index=-100, label_smoothing=label_smoothing, reduction="none")
    w = b["decoder_attention_mask"].reshape(-1).float()
    return (ce * w).sum() / w.sum()


# ---------------------------------------------------------------------------------------------
class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        E = c["d_model"]
        if c["share_encoder_decoder_embedding"]:
            self.embedding = nn.Embedding(c["src_vocab_size"], E)
            emb = (self.embedding, self.embedding)
        else:
            self.encoder_embedding = nn.Embedding(c["src_vocab_size"], E)
            self.decoder_embedding = nn.Embedding(c["tgt_vocab_size"], E)
            emb = (self.encoder_embedding, self.decoder_embedding)
        # A plain dict: module attributes would register the aliases as more parameters.
        self.emb = {"src": emb[0], "tgt": emb[1]}
        kw = dict(d_model=E, nhead=c["num_heads"], dim_feedforward=c["d_ff"], dropout=0.0,
                  activation="relu", layer_norm_eps=c["layer_norm_epsilon"], batch_first=True,
                  norm_first=False)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(**kw) for _ in range(c["encoder_num_hidden_layers"])])
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(
            [nn.TransformerDecoderLayer(**kw) for _ in range(c["decoder_num_hidden_layers"])])
        if not c["share_embedding_weights"]:
            self.lm_head = nn.Linear(E, c["tgt_vocab_size"], bias=False)
        # PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...), in double.
        P = max(c["src_max_position_embeddings"], c["tgt_max_position_embeddings"])
        pos = torch.arange(P, dtype=torch.float64)[:, None]
        i = torch.arange(0, E, 2, dtype=torch.float64)[None, :]
        angle = pos / torch.pow(10000.0, i / E)
        pe = torch.zeros(P, E, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(angle)
        pe[:, 1::2] = torch.cos(angle)
        self.register_buffer("pe", pe.float(), persistent=False)

    def forward(self, b):
        E = self.c["d_model"]
        ids, dids = b["input_ids"].long(), b["decoder_input_ids"].long()
        S, T = ids.shape[1], dids.shape[1]
        src_pad = b["attention_mask"] == 0
        tgt_pad = b["decoder_attention_mask"] == 0
        x = self.emb["src"](ids) * math.sqrt(E) + self.pe[:S]
        for layer in self.encoder.layers:
            x = layer(x, src_key_padding_mask=src_pad)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        y = self.emb["tgt"](dids) * math.sqrt(E) + self.pe[:T]
        for layer in self.decoder.layers:
            y = layer(y, x, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        logits = self.lm_head(y) if hasattr(self, "lm_head") else y @ self.emb["tgt"].weight.t()
        return masked_loss(logits, b, self.c["label_smoothing"])


# ---------------------------------------------------------------------------------------------
def relative_bucket(rel, bidirectional, num_buckets, max_distance):
    buckets = torch.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        buckets += (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.min(rel, torch.zeros_like(rel))
    max_exact = num_buckets // 2
    small = rel < max_exact
    large = max_exact + (torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(small, rel, large)


class T5LayerNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class T5Attention(nn.Module):
    def __init__(self, c, has_bias, bidirectional):
        super().__init__()
        self.H, self.D = c["num_heads"], c["d_kv"]
        I = self.H * self.D
        self.q = nn.Linear(c["d_model"], I, bias=False)
        self.k = nn.Linear(c["d_model"], I, bias=False)
        self.v = nn.Linear(c["d_model"], I, bias=False)
        self.o = nn.Linear(I, c["d_model"], bias=False)
        self.bidirectional = bidirectional
        self.nb = c["relative_attention_num_buckets"]
        self.md = c["relative_attention_max_distance"]
        if has_bias:
            self.relative_attention_bias = nn.Embedding(self.nb, self.H)

    def compute_bias(self, Tq, Tk):
        ctx = torch.arange(Tq)[:, None]
        mem = torch.arange(Tk)[None, :]
        buckets = relative_bucket(mem - ctx, self.bidirectional, self.nb, self.md)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x, kv, key_pad, causal, bias):
        B, Tq, Tk = x.shape[0], x.shape[1], kv.shape[1]
        q = self.q(x).view(B, Tq, self.H, self.D).transpose(1, 2)
        k = self.k(kv).view(B, Tk, self.H, self.D).transpose(1, 2)
        v = self.v(kv).view(B, Tk, self.H, self.D).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)  # no 1/sqrt(d_kv): T5
        if bias is not None:
            scores = scores + bias
        masked = key_pad[:, None, None, :]
        if causal:
            masked = masked | torch.triu(torch.ones(Tq, Tk, dtype=torch.bool), 1)[None, None]
        scores = scores.masked_fill(masked, float("-inf"))
        w = torch.softmax(scores.float(), dim=-1)
        out = (w @ v).transpose(1, 2).reshape(B, Tq, self.H * self.D)
        return self.o(out)


class Sub(nn.Module):
    pass


class T5Stack(nn.Module):
    def __init__(self, c, decoder):
        super().__init__()
        L = c["decoder_num_hidden_layers" if decoder else "encoder_num_hidden_layers"]
        E, eps = c["d_model"], c["layer_norm_epsilon"]
        self.decoder = decoder
        self.block = nn.ModuleList()
        for i in range(L):
            blk = Sub()
            blk.layer = nn.ModuleList()
            sa = Sub()
            sa.SelfAttention = T5Attention(c, i == 0, not decoder)
            sa.layer_norm = T5LayerNorm(E, eps)
            blk.layer.append(sa)
            if decoder:
                ca = Sub()
                ca.EncDecAttention = T5Attention(c, False, False)
                ca.layer_norm = T5LayerNorm(E, eps)
                blk.layer.append(ca)
            ff = Sub()
            ff.DenseReluDense = Sub()
            ff.DenseReluDense.wi = nn.Linear(E, c["d_ff"], bias=False)
            ff.DenseReluDense.wo = nn.Linear(c["d_ff"], E, bias=False)
            ff.layer_norm = T5LayerNorm(E, eps)
            blk.layer.append(ff)
            self.block.append(blk)
        self.final_layer_norm = T5LayerNorm(E, eps)

    def forward(self, x, key_pad, memory=None, memory_pad=None):
        T = x.shape[1]
        bias = self.block[0].layer[0].SelfAttention.compute_bias(T, T)
        for blk in self.block:
            sa = blk.layer[0]
            h = sa.layer_norm(x)
            x = x + sa.SelfAttention(h, h, key_pad, self.decoder, bias)
            if self.decoder:
                ca = blk.layer[1]
                h = ca.layer_norm(x)
                x = x + ca.EncDecAttention(h, memory, memory_pad, False, None)
            ff = blk.layer[-1]
            h = ff.layer_norm(x)
            x = x + ff.DenseReluDense.wo(F.relu(ff.DenseReluDense.wi(h)))
        return self.final_layer_norm(x)


class T5(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        if c["share_encoder_decoder_embedding"]:
            self.shared = nn.Embedding(c["src_vocab_size"], c["d_model"])
            emb = (self.shared, self.shared)
        else:
            self.encoder_embed_tokens = nn.Embedding(c["src_vocab_size"], c["d_model"])
            self.decoder_embed_tokens = nn.Embedding(c["tgt_vocab_size"], c["d_model"])
            emb = (self.encoder_embed_tokens, self.decoder_embed_tokens)
        self.emb = {"src": emb[0], "tgt": emb[1]}
        self.encoder = T5Stack(c, False)
        self.decoder = T5Stack(c, True)
        if not c["share_embedding_weights"]:
            self.lm_head = nn.Linear(c["d_model"], c["tgt_vocab_size"], bias=False)

    def forward(self, b):
        src_pad = b["attention_mask"] == 0
        tgt_pad = b["decoder_attention_mask"] == 0
        mem = self.encoder(self.emb["src"](b["input_ids"].long()), src_pad)
        y = self.decoder(self.emb["tgt"](b["decoder_input_ids"].long()), tgt_pad, mem, src_pad)
        if hasattr(self, "lm_head"):
            logits = self.lm_head(y)
        else:
            logits = (y * self.c["d_model"] ** -0.5) @ self.emb["tgt"].weight.t()
        return masked_loss(logits, b, self.c["label_smoothing"])


# ---------------------------------------------------------------------------------------------
def build(spec):
    model = (Transformer if spec["model"] == "transformer" else T5)(spec["config"])
    missing, unexpected = model.load_state_dict(spec["weights"], strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    model.train()  # dropout is 0: the training-mode paths without dropout
    return model


def main():
    torch.manual_seed(0)
    spec = torch.load(sys.argv[1])
    batches = spec["batches"]
    model = build(spec)
    loss = model(batches[0])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model = build(spec)
    opt = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"])
    losses = []
    for b in batches:
        opt.zero_grad()
        l = model(b)
        l.backward()
        opt.step()
        losses.append(float(l))
    torch.save({"loss": float(loss), "grads": grads, "losses": losses}, sys.argv[2])


if __name__ == "__main__":
    main()
