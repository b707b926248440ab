#!/usr/bin/env python3
"""PyTorch reference for tests/reference/test_metrics_reference.cpp.

usage: metrics_reference.py IN.json OUT.json

IN.json holds batches {logits [N, C], labels [N], weights [N], probs [N], binary [N]} and the
metric settings; OUT.json gets {metric name: value} computed here independently with torch
(float64): torch.bincount confusion matrices, torch.topk, F.cross_entropy, and TF's AUC
threshold rule written out.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F


def safe_div(a, b):
    return torch.where(b > 0, a / torch.where(b > 0, b, torch.ones_like(b)), torch.zeros_like(a))


def main():
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    C = cfg["num_classes"]
    k = cfg["k"]
    T = cfg["num_thresholds"]
    beta = cfg["beta"]
    batches = []
    for b in cfg["batches"]:
        n = len(b["labels"])
        batches.append({
            "logits": torch.tensor(b["logits"], dtype=torch.float32).reshape(n, C),
            "labels": torch.tensor([int(v) for v in b["labels"]], dtype=torch.int64),
            "weights": torch.tensor(b["weights"], dtype=torch.float32),
            "probs": torch.tensor(b["probs"], dtype=torch.float32),
            "binary": torch.tensor([int(v) for v in b["binary"]], dtype=torch.int64),
        })

    out = {}
    # Accuracy (weighted) and mean of row sums (weighted).
    correct = sum(((b["labels"] == b["logits"].argmax(1)).double() * b["weights"].double()).sum() for b in batches)
    wsum = sum(b["weights"].double().sum() for b in batches)
    out["accuracy"] = float(correct / wsum)
    out["mean"] = float(sum((b["logits"].double().sum(1) * b["weights"].double()).sum() for b in batches) / wsum)
    # Perplexity: exp(total summed cross entropy / total tokens).
    loss = sum(F.cross_entropy(b["logits"], b["labels"], reduction="sum").double() for b in batches)
    tokens = sum(b["labels"].numel() for b in batches)
    out["perplexity"] = math.exp(float(loss) / tokens)

    # Confusion matrix cm[label, prediction], weighted.
    cm = torch.zeros(C * C, dtype=torch.float64)
    for b in batches:
        idx = b["labels"] * C + b["logits"].argmax(1)
        cm += torch.bincount(idx, weights=b["weights"].double(), minlength=C * C)
    cm = cm.reshape(C, C)
    tp = cm.diagonal()
    row = cm.sum(1)
    col = cm.sum(0)
    b2 = beta * beta

    def fb(p, r):
        return safe_div((1 + b2) * p * r, b2 * p + r)

    keep = torch.ones(C, dtype=torch.bool)
    for c in cfg["ignore_labels"]:
        keep[c] = False
    t = tp[keep].sum()
    out["fbeta_micro"] = float(fb(safe_div(t, col[keep].sum()), safe_div(t, row[keep].sum())))
    out["fbeta_macro"] = float(fb(safe_div(tp, col), safe_div(tp, row))[keep].mean())
    denom = row + col - tp
    out["miou"] = float(safe_div(tp, denom).sum() / (denom > 0).sum())
    dd = row + col
    out["dice"] = float(safe_div(2 * tp, dd).sum() / (dd > 0).sum())
    out["mpca"] = float(safe_div(tp, row).mean())

    # AUC as tf.compat.v1.metrics.auc (float32 thresholds and comparisons).
    eps = 1e-7
    thr = [0.0 - eps] + [(i + 1) * 1.0 / (T - 1) for i in range(T - 2)] + [1.0 + eps]
    thr = torch.tensor(thr, dtype=torch.float32)
    tps = torch.zeros(T, dtype=torch.float64)
    fps = torch.zeros(T, dtype=torch.float64)
    tns = torch.zeros(T, dtype=torch.float64)
    fns = torch.zeros(T, dtype=torch.float64)
    for b in batches:
        above = b["probs"][None, :] > thr[:, None]
        pos = (b["binary"] != 0)[None, :]
        w = b["weights"].double()[None, :]
        tps += ((above & pos).double() * w).sum(1)
        fps += ((above & ~pos).double() * w).sum(1)
        fns += ((~above & pos).double() * w).sum(1)
        tns += ((~above & ~pos).double() * w).sum(1)
    for curve in ("ROC", "PR"):
        if curve == "ROC":
            x = fps / (fps + tns + eps)
            y = tps / (tps + fns + eps)
        else:
            x = tps / (tps + fns + eps)
            y = (tps + eps) / (tps + fps + eps)
        dx = x[:-1] - x[1:]
        out["auc_" + curve + "_interpolation"] = float((dx * (y[:-1] + y[1:]) / 2).sum())
        out["auc_" + curve + "_minoring"] = float((dx * torch.minimum(y[:-1], y[1:])).sum())
        out["auc_" + curve + "_majoring"] = float((dx * torch.maximum(y[:-1], y[1:])).sum())

    # Precision / recall at k with one label per row; weights per row.
    hits = 0.0
    for b in batches:
        top = b["logits"].topk(k, dim=1).indices
        hit = (top == b["labels"][:, None]).any(1).double()
        hits += float((hit * b["weights"].double()).sum())
    out["precision_at_k"] = hits / (k * float(wsum))
    out["recall_at_k"] = hits / float(wsum)

    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
