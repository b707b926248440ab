#!/usr/bin/python3
"""Writes the benchmark batches shared by cstorch and its PyTorch peer.

PREFIX.x.f32: BATCHES*BATCH rows of 784 float32 ~ N(0, 1) (row-major, little-endian)
PREFIX.y.i64: BATCHES*BATCH int64 labels in [0, 10)
Generated with numpy from a fixed seed; the values only need to be the same for both sides.
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="file prefix")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--batches", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.batch * a.batches
    x = rng.standard_normal((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=n, dtype=np.int64)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    x.astype("<f4").tofile(a.out + ".x.f32")
    y.astype("<i8").tofile(a.out + ".y.i64")


if __name__ == "__main__":
    main()
