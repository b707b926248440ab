#!/usr/bin/env python3
"""PyTorch reference for tests/reference/test_ops_reference.cpp.

usage: check_ops.py ROWS.json VERDICTS.json

ROWS.json holds, per row: the Python expression over `x`, the inputs (shape, dtype, flat
values, requires_grad), the upstream gradients and cstorch's eager and traced outputs and
input gradients. For every row this rebuilds the inputs (float32 inputs become float64 unless
the row is "native", so the reference is computed in float64), evaluates the expression,
computes the vector-Jacobian products with torch.autograd.grad and compares both cstorch
modes with |got - ref| <= atol (* max|ref| with norm_tol) + rtol * |ref|. Integer and bool
outputs must match exactly; dtypes must match torch's (float64 counts as f32).
"""
import json
import math
import sys
import traceback

import torch
import torch.nn.functional as F

DTYPES = {
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "i32": torch.int32,
    "i64": torch.int64,
    "bool": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}
NAMES[torch.float64] = "f32"


def decode(vals):
    return [float(v) if isinstance(v, str) else v for v in vals]


def build(t, native):
    """A torch tensor from a JSON tensor; float32 becomes float64 unless native."""
    dt = DTYPES[t["dtype"]]
    data = decode(t["data"])
    shape = t["shape"]
    if dt.is_floating_point:
        r = torch.tensor(data, dtype=torch.float64).reshape(shape)
        if native or dt != torch.float32:
            r = r.to(dt)  # exact: the values are representable in dt
        return r
    if dt == torch.bool:
        return torch.tensor([v != 0 for v in data], dtype=torch.bool).reshape(shape)
    return torch.tensor([int(v) for v in data], dtype=torch.int64).reshape(shape).to(dt)


def as_list(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return list(out)
    raise TypeError("the expression returned %s, not a tensor or a list of tensors" % type(out).__name__)


def fmt(v):
    return "%.6g" % v


def compare(what, ref, got, rtol, atol, norm_tol):
    """One check: dict(what, ok, max_abs, max_rel, msg)."""
    c = {"what": what, "ok": False, "max_abs": None, "max_rel": None, "msg": ""}
    ref = ref.detach()
    if list(ref.shape) != list(got["shape"]):
        c["msg"] = "shape %s, torch %s" % (got["shape"], list(ref.shape))
        return c
    want_dt = NAMES.get(ref.dtype, str(ref.dtype))
    if want_dt != got["dtype"]:
        c["msg"] = "dtype %s, torch %s" % (got["dtype"], want_dt)
        return c
    g = torch.tensor(decode(got["data"]), dtype=torch.float64).reshape(ref.shape)
    if ref.dtype == torch.float64:
        # A float64 reference stands for a float32 result: round it once to float32 (0.5 ulp)
        # so that what overflows float32 is inf in the reference too.
        ref = ref.to(torch.float32)
    r = ref.to(torch.float64)
    if not ref.dtype.is_floating_point:
        bad = (g != r)
        c["max_abs"] = float((g - r).abs().max()) if g.numel() else 0.0
        c["max_rel"] = c["max_abs"]
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            c["msg"] = "%d of %d elements differ (exact match required); first at flat index %d: got %s, torch %s" % (
                int(bad.sum()), g.numel(), i, fmt(g.flatten()[i]), fmt(r.flatten()[i]))
            return c
        c["ok"] = True
        return c
    nan_r, nan_g = torch.isnan(r), torch.isnan(g)
    same_inf = torch.isinf(r) & (g == r)
    finite = torch.isfinite(r) & torch.isfinite(g)
    diff = torch.where(finite, (g - r).abs(), torch.zeros_like(r))
    scale = float(r[torch.isfinite(r)].abs().max()) if bool(torch.isfinite(r).any()) else 0.0
    a = atol * (scale if norm_tol else 1.0)
    bound = a + rtol * r.abs()
    ok_elem = (nan_r & nan_g) | same_inf | (finite & (diff <= bound))
    rel = diff / r.abs().clamp_min(1e-30)
    c["max_abs"] = float(diff.max()) if diff.numel() else 0.0
    c["max_rel"] = float(torch.where(finite, rel, torch.zeros_like(rel)).max()) if diff.numel() else 0.0
    if bool(ok_elem.all()):
        c["ok"] = True
        return c
    bad = ~ok_elem
    excess = torch.where(bad, torch.where(finite, diff / bound.clamp_min(1e-300), torch.full_like(diff, math.inf)),
                         torch.zeros_like(diff))
    i = int(excess.flatten().argmax())
    c["msg"] = ("%d of %d elements out of tolerance (rtol %s, atol %s%s); max abs err %s, max rel err %s; "
                "worst at flat index %d: got %s, torch %s") % (
        int(bad.sum()), g.numel(), fmt(rtol), fmt(atol), " x max|ref| " + fmt(scale) if norm_tol else "",
        fmt(c["max_abs"]), fmt(c["max_rel"]), i, fmt(g.flatten()[i]), fmt(r.flatten()[i]))
    return c


def check_row(row):
    v = {"name": row["name"], "ok": False, "checks": [], "error": ""}  # cpp_error: reported by C++
    native = row["native"]
    rtol, atol, norm_tol = row["rtol"], row["atol"], row["norm_tol"]
    xs = []
    leaves = []
    for t in row["inputs"]:
        x = build(t, native)
        if row["grad"] and t["requires_grad"]:
            x.requires_grad_(True)
            leaves.append(x)
        xs.append(x)
    env = {"torch": torch, "F": F, "math": math, "x": xs}
    try:
        with torch.set_grad_enabled(bool(leaves)):
            outs = as_list(eval(row["expr"], env))
    except Exception as e:  # noqa: BLE001
        v["error"] = "evaluating %r in torch failed: %s: %s" % (row["expr"], type(e).__name__, e)
        return v
    grads = None
    if leaves:
        ys, gs = [], []
        for k, y in enumerate(outs):
            up = row.get("upstream", [None] * len(outs))
            u = up[k] if k < len(up) else None
            if u is not None and y.requires_grad:
                ys.append(y)
                gs.append(build(u, True).to(y.dtype))
        gr = [None] * len(leaves)
        if ys:
            try:
                gr = torch.autograd.grad(ys, leaves, grad_outputs=gs, allow_unused=True)
            except Exception as e:  # noqa: BLE001  (the output checks below say more)
                v["error"] = "torch.autograd.grad failed: %s: %s" % (type(e).__name__, e)
        if not v["error"]:
            grads = [g if g is not None else torch.zeros_like(l) for g, l in zip(gr, leaves)]
    for mode in ("eager", "traced"):
        res = row.get(mode)
        if res is None:
            continue
        if len(res["outputs"]) != len(outs):
            v["checks"].append({"what": "%s outputs" % mode, "ok": False,
                                "msg": "%d outputs, torch %d" % (len(res["outputs"]), len(outs))})
            continue
        for k, (ref, got) in enumerate(zip(outs, res["outputs"])):
            v["checks"].append(compare("%s output %d" % (mode, k), ref, got, rtol, atol, norm_tol))
        if grads is not None:
            gidx = [i for i, t in enumerate(row["inputs"]) if t["requires_grad"]]
            for i, ref, got in zip(gidx, grads, res["grads"]):
                v["checks"].append(compare("%s grad of input %d" % (mode, i), ref, got, rtol, atol, norm_tol))
    v["ok"] = bool(v["checks"]) and all(c["ok"] for c in v["checks"]) and not v["error"]
    return v


def finite_only(o):
    """JSON has no NaN / Infinity: non-finite floats become strings."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: finite_only(v) for k, v in o.items()}
    if isinstance(o, list):
        return [finite_only(v) for v in o]
    return o


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with open(sys.argv[1]) as f:
        rows = json.load(f)["rows"]
    torch.set_num_threads(1)
    out = []
    for row in rows:
        try:
            out.append(check_row(row))
        except Exception:  # noqa: BLE001
            out.append({"name": row["name"], "ok": False, "checks": [],
                        "error": "check_ops.py crashed on this row:\n" + traceback.format_exc()})
    with open(sys.argv[2], "w") as f:
        json.dump(finite_only({"rows": out}), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
