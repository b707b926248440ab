#!/usr/bin/env python3
"""PyTorch reference for tests/reference/test_optim_reference.cpp.

usage: optim_reference.py IN.json OUT.json

IN.json: {"params": [{"shape", "data"}...], "grads": [[flat per param] per step],
          "optimizers": [{"id", "type", "args"}...], "schedulers": [{"id", "expr", "lr", "steps"}]}

For each optimizer configuration, trains the parameters (float32) with the given gradient at
every step and records the parameters after every step and the final state tensors. Types that
torch.optim has use torch.optim; Lamb, Lion and Adafactor are written out below from their
papers (independently of the C++ code). For each scheduler, evaluates `expr` (a torch
lr_scheduler built on `opt`, an SGD optimizer with learning rate `lr`) and records the learning
rate at steps 0 .. steps-1.
"""
import json
import math
import sys
import warnings

import torch


class Lamb(torch.optim.Optimizer):
    """You et al. 2019, Algorithm 2 (bias-corrected Adam moments, trust ratio ||x|| / ||r||)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, adam=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam=adam))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                r = m_hat / (v_hat.sqrt() + g["eps"])
                if g["weight_decay"] != 0:
                    r = r + g["weight_decay"] * p
                ratio = 1.0
                if not g["adam"]:
                    wn, rn = p.norm().item(), r.norm().item()
                    ratio = wn / rn if wn > 0 and rn > 0 else 1.0
                p.sub_(g["lr"] * ratio * r)


class Lion(torch.optim.Optimizer):
    """Chen et al. 2023, Algorithm 2."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                m = st["exp_avg"]
                c = b1 * m + (1 - b1) * p.grad
                p.sub_(g["lr"] * (torch.sign(c) + g["weight_decay"] * p))
                m.copy_(b2 * m + (1 - b2) * p.grad)


class Adafactor(torch.optim.Optimizer):
    """Shazeer & Stern 2018 (Algorithms 4, 5; update clipping; relative step sizes)."""

    def __init__(self, params, lr=None, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True, relative_step=None,
                 warmup_init=False):
        if relative_step is None:
            relative_step = lr is None
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1, weight_decay=weight_decay,
                                      scale_parameter=scale_parameter, relative_step=relative_step,
                                      warmup_init=warmup_init))

    @staticmethod
    def rms(x):
        return x.norm(2) / math.sqrt(x.numel())

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            e1, e2 = g["eps"]
            for p in g["params"]:
                grad = p.grad
                st = self.state[p]
                factored = p.dim() >= 2
                if not st:
                    st["step"] = 0
                    if g["beta1"] is not None:
                        st["exp_avg"] = torch.zeros_like(p)
                    if factored:
                        st["exp_avg_sq_row"] = torch.zeros(p.shape[:-1])
                        st["exp_avg_sq_col"] = torch.zeros(p.shape[:-2] + p.shape[-1:])
                    else:
                        st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                if g["relative_step"]:
                    min_step = 1e-6 * t if g["warmup_init"] else 1e-2
                    rho = min(min_step, 1.0 / math.sqrt(t))
                else:
                    rho = g["lr"]
                alpha = max(e2, self.rms(p).item()) * rho if g["scale_parameter"] else rho
                beta2t = 1.0 - math.pow(t, g["decay_rate"])
                sq = grad ** 2 + e1
                if factored:
                    r, c = st["exp_avg_sq_row"], st["exp_avg_sq_col"]
                    r.mul_(beta2t).add_(sq.mean(dim=-1), alpha=1 - beta2t)
                    c.mul_(beta2t).add_(sq.mean(dim=-2), alpha=1 - beta2t)
                    v_hat = (r / r.mean(dim=-1, keepdim=True)).unsqueeze(-1) * c.unsqueeze(-2)
                    u = grad / v_hat.sqrt()
                else:
                    v = st["exp_avg_sq"]
                    v.mul_(beta2t).add_(sq, alpha=1 - beta2t)
                    u = grad / v.sqrt()
                u = u / max(1.0, self.rms(u).item() / g["clip_threshold"])
                u = u * alpha
                if g["beta1"] is not None:
                    m = st["exp_avg"]
                    m.mul_(g["beta1"]).add_(u, alpha=1 - g["beta1"])
                    u = m
                if g["weight_decay"] != 0:
                    p.add_(p, alpha=-g["weight_decay"] * alpha)
                p.sub_(u)


PAPER = {"Lamb": Lamb, "Lion": Lion, "Adafactor": Adafactor}


def make_optimizer(kind, params, args):
    args = dict(args)
    for k in ("betas", "etas", "step_sizes", "eps"):
        if k in args and isinstance(args[k], list):
            args[k] = tuple(args[k])
    cls = PAPER.get(kind) or getattr(torch.optim, kind)
    return cls(params, **args)


def run_optimizer(cfg, spec):
    params = [torch.tensor(p["data"], dtype=torch.float32).reshape(p["shape"]).requires_grad_()
              for p in spec["params"]]
    opt = make_optimizer(cfg["type"], params, cfg["args"])
    traj = []
    for step_grads in spec["grads"]:
        for p, g in zip(params, step_grads):
            p.grad = torch.tensor(g, dtype=torch.float32).reshape(p.shape)
        opt.step()
        traj.append([v for p in params for v in p.detach().reshape(-1).tolist()])
    state = {}
    for i, p in enumerate(params):
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and v.numel() > 0:
                state["%d.%s" % (i, k)] = v.detach().float().reshape(-1).tolist()
    return {"trajectory": traj, "state": state}


def run_scheduler(cfg):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=cfg["lr"], momentum=0.9)
    env = {"torch": torch, "math": math, "opt": opt, "lr_scheduler": torch.optim.lr_scheduler}
    sched = eval(cfg["expr"], env)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(cfg["steps"] - 1):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return lrs


def main():
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    out = {"optimizers": {}, "schedulers": {}}
    for cfg in spec["optimizers"]:
        out["optimizers"][cfg["id"]] = run_optimizer(cfg, spec)
    for cfg in spec["schedulers"]:
        out["schedulers"][cfg["id"]] = run_scheduler(cfg)
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
