#!/usr/bin/env python3
"""Writes the example data of docs/your-own-data.md under OUT (default: data): a small
classification table (16 features, 4 classes; 2,000 training and 400 validation rows) as CSV,
.npz and HDF5 files in OUT/tabular, the files configs/fc_csv.yaml, fc_npz.yaml and fc_h5.yaml
train from. Classes are Gaussian clouds around 4 random centres, so a small MLP separates them.
Deterministic (seed 7). Needs NumPy and h5py (Debian python3-numpy, python3-h5py)."""
import csv
import os
import sys

import h5py
import numpy as np


def table(rng, centres, n):
    y = rng.integers(0, len(centres), n)
    x = centres[y] + rng.normal(0.0, 1.0, (n, centres.shape[1]))
    return x.astype(np.float32), y.astype(np.int64)


def main():
    # One optional argument, the output folder ("--help" had made a folder of that name).
    args = sys.argv[1:]
    if len(args) > 1 or (args and args[0].startswith("-")):
        print(__doc__.strip() + "\n\nusage: make_example_data.py [OUT]", file=sys.stderr)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    out = os.path.join(args[0] if args else "data", "tabular")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    centres = rng.normal(0.0, 0.6, (4, 16))
    for split, n in (("train", 2000), ("val", 400)):
        x, y = table(rng, centres, n)
        names = [f"f{i}" for i in range(x.shape[1])] + ["label"]
        with open(os.path.join(out, f"{split}.csv"), "w", newline="") as f:
            w = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC)  # a quoted header, plain numbers
            w.writerow(names)
            for row, label in zip(x.tolist(), y.tolist()):
                w.writerow([round(v, 5) for v in row] + [label])
        np.savez_compressed(os.path.join(out, f"{split}.npz"), x=x, y=y)
        with h5py.File(os.path.join(out, f"{split}.h5"), "w") as f:
            f.create_dataset("features", data=x)
            f.create_dataset("labels", data=y)
    print(f"wrote {out}/{{train,val}}.{{csv,npz,h5}}")


if __name__ == "__main__":
    main()
