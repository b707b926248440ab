#!/usr/bin/env python3
"""PyTorch side of tests/reference/test_optim_interchange.cpp: optimizer state moved between
cstorch and torch.optim mid-run.

usage: optim_interchange.py IN.json OUT.json

IN.json: {"params": [{"name", "shape", "data"}...], "grads": [[flat per param] per step],
          "n": N, "m": M, "cases": [{"id", "type", "args", "groups", "files": [cstorch .pt ...],
          "torch_file": path}...]}
  "groups": null (one group of every parameter) or [{"params": [indices], options...}, ...]:
  torch.optim's parameter groups (the options over `args`).

For each case:
  - from cstorch: each of `files` (a cstorch checkpoint after N steps, {"model", "optimizer"})
    is torch.load-ed; the parameters come from "model", a fresh torch.optim.<type> takes
    "optimizer" through load_state_dict, and M more steps follow (gradients N .. N+M-1). The
    loaded layout is checked: integer state keys that attach to the parameters, tuples for
    betas / etas / step_sizes, booleans as booleans, state tensors named as torch names them.
  - to cstorch: torch trains N steps from the initial parameters, saves
    torch.save({"model": state_dict, "optimizer": opt.state_dict()}) to `torch_file`, and
    trains M more.
OUT.json: {"<id>": {"from_cstorch": [[flat params after N+M] per file], "torch": [flat params
after N+M]}}. Exits non-zero with a message when a check fails.
"""
import collections
import json
import sys

import torch

PAIRS = ("betas", "etas", "step_sizes")
BOOLS = ("amsgrad", "maximize", "nesterov", "centered")
# State torch keeps as a 0-d tensor / as a Python int (torch 1.13 and newer).
TENSOR_STEP = ("Adam", "AdamW", "Adagrad", "Adamax", "ASGD", "NAdam", "RAdam")
INT_STEP = ("Adadelta", "RMSprop", "Rprop")


def torch_args(args):
    a = dict(args)
    for k in PAIRS:
        if k in a:
            a[k] = tuple(a[k])
    return a


def grads_at(j, t):
    return [torch.tensor(g, dtype=torch.float32).reshape(p["shape"])
            for g, p in zip(j["grads"][t], j["params"])]


def train(params, opt, j, first, count):
    for t in range(first, first + count):
        for p, g in zip(params, grads_at(j, t)):
            p.grad = g.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)


def param_arg(case, params):
    """What the case's torch optimizer is built over: its parameters, or its groups."""
    if case.get("groups") is None:
        return params
    return [dict(torch_args({k: v for k, v in g.items() if k != "params"}),
                 params=[params[i] for i in g["params"]]) for g in case["groups"]]


def flat(params):
    return [float(v) for p in params for v in p.detach().reshape(-1).tolist()]


def check_layout(case, sd, path):
    where = "%s (%s)" % (path, case["id"])
    assert set(sd.keys()) == {"state", "param_groups"}, where + ": keys " + str(sd.keys())
    for k, st in sd["state"].items():
        assert type(k) is int, "%s: state key %r is not an int" % (where, k)
        if "step" in st:
            if case["type"] in TENSOR_STEP:
                assert torch.is_tensor(st["step"]) and st["step"].dim() == 0, \
                    "%s: state %d step %r is not a 0-d tensor" % (where, k, st["step"])
            if case["type"] in INT_STEP:
                assert type(st["step"]) is int, \
                    "%s: state %d step %r is not an int" % (where, k, st["step"])
        for name, v in st.items():
            assert name in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                            "square_avg", "acc_delta", "sum", "exp_inf", "eta", "mu", "ax",
                            "mu_product", "grad_avg", "prev", "step_size"), \
                "%s: state %d has a name torch does not use: %s" % (where, k, name)
    for gi, g in enumerate(sd["param_groups"]):
        for k in PAIRS:
            if k in g:
                assert type(g[k]) is tuple and len(g[k]) == 2, \
                    "%s: param_groups.%d.%s = %r is not a pair tuple" % (where, gi, k, g[k])
        for k in BOOLS:
            if k in g:
                assert type(g[k]) is bool, \
                    "%s: param_groups.%d.%s = %r is not a bool" % (where, gi, k, g[k])
        for k in ("beta1", "beta2", "etaminus", "etaplus", "step_size_min", "step_size_max"):
            assert k not in g, "%s: param_groups.%d has cstorch's key %s" % (where, gi, k)


def main():
    with open(sys.argv[1]) as f:
        j = json.load(f)
    n, m = j["n"], j["m"]
    out = {}
    for case in j["cases"]:
        cls = getattr(torch.optim, case["type"])
        args = torch_args(case["args"])
        res = {"from_cstorch": []}
        for path in case["files"]:
            ck = torch.load(path)
            params = [ck["model"][p["name"]].clone().requires_grad_(True) for p in j["params"]]
            sd = ck["optimizer"]
            check_layout(case, sd, path)
            opt = cls(param_arg(case, params), **args)
            opt.load_state_dict(sd)
            # Every state entry attached to a parameter (torch keeps entries whose key is not
            # one of the groups' parameter ids under that key instead).
            attached = sum(1 for k in opt.state if torch.is_tensor(k))
            assert attached == len(sd["state"]) == len(opt.state), \
                "%s (%s): %d of %d state entries attached to parameters" % (
                    path, case["id"], attached, len(opt.state))
            train(params, opt, j, n, m)
            res["from_cstorch"].append(flat(params))
        params = [torch.tensor(p["data"], dtype=torch.float32).reshape(p["shape"])
                  .requires_grad_(True) for p in j["params"]]
        opt = cls(param_arg(case, params), **args)
        train(params, opt, j, 0, n)
        model = collections.OrderedDict((p["name"], t.detach())
                                        for p, t in zip(j["params"], params))
        torch.save({"model": model, "optimizer": opt.state_dict()}, case["torch_file"])
        train(params, opt, j, n, m)
        res["torch"] = flat(params)
        out[case["id"]] = res
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    print("OK")


if __name__ == "__main__":
    main()
