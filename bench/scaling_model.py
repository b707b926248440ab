#!/usr/bin/python3
"""Cost model of data-parallel training with a bucketed ring all-reduce (docs/scaling.md).

Step time of N replicas, per-replica batch fixed (weak scaling):
  T_compute       = 6 * P * tokens / F                (forward 1/3, backward 2/3)
  T_allreduce(N)  = 2 (N-1) k alpha + 2 (N-1)/N * S / beta     (ring: reduce-scatter + all-gather,
                    k = ceil(S / bucket) buckets, each paying the per-hop latency)
  exposed(N)      = max(T_allreduce - T_backward, T_allreduce / k)   (the backward pass hides
                    the communication except at least the last bucket)
  T_step(N)       = T_compute + exposed(N);  efficiency = T_step(1) / T_step(N)
Usage: scaling_model.py [--alpha S] [--beta B/s] [--flops F/s] [--tokens T] [--params P]
"""
import argparse
import math


def model(n, a):
    s = 4.0 * a.params                       # f32 gradient bytes
    k = max(1, math.ceil(s / a.bucket))
    t_compute = 6.0 * a.params * a.tokens / a.flops
    t_backward = t_compute * 2.0 / 3.0
    if n == 1:
        return t_compute, 0.0, 0.0
    t_ar = 2 * (n - 1) * k * a.alpha + 2.0 * (n - 1) / n * s / a.beta
    exposed = max(t_ar - t_backward, t_ar / k)
    return t_compute + exposed, t_ar, exposed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=124.44e6, help="GPT-2 small: 124.44M")
    ap.add_argument("--tokens", type=float, default=8 * 1024, help="tokens per replica per step")
    ap.add_argument("--flops", type=float, default=100e12, help="sustained FLOP/s per replica")
    ap.add_argument("--alpha", type=float, default=10e-6, help="latency per ring hop, s")
    ap.add_argument("--beta", type=float, default=12.5e9, help="link bandwidth, bytes/s")
    ap.add_argument("--bucket", type=float, default=4 * 2**20, help="bucket bytes")
    a = ap.parse_args()
    t1 = model(1, a)[0]
    print(f"| replicas | step (ms) | all-reduce (ms) | exposed (ms) | efficiency |")
    print(f"|---:|---:|---:|---:|---:|")
    for n in (1, 2, 4, 8, 16, 32, 64):
        t, ar, ex = model(n, a)
        print(f"| {n} | {1e3 * t:.1f} | {1e3 * ar:.1f} | {1e3 * ex:.1f} | {t1 / t:.3f} |")


if __name__ == "__main__":
    main()
