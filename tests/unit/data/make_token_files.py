"""Writes the HDF5 token files the data-source unit tests read (h5py, as the Model Zoo's
preprocessing does). Usage: make_token_files.py OUT_DIR

Sample s of a good file (global index g = first + s) has input ids 1000*g + k, mask 1 for
k < 6 else 0, labels 1000*g + k + 1, for k in 0..7 (msl 8)."""
import os
import shutil
import sys

import h5py
import numpy as np

MSL = 8


def samples(first, n, dtype=np.int32):
    d = np.zeros((n, 3, MSL), dtype=dtype)
    for s in range(n):
        g = first + s
        d[s, 0] = 1000 * g + np.arange(MSL)
        d[s, 1] = (np.arange(MSL) < 6).astype(dtype)
        d[s, 2] = 1000 * g + np.arange(MSL) + 1
    return d


def write(path, name, data, **kw):
    with h5py.File(path, "w") as f:
        f.create_dataset(name, data=data, **kw)


out = sys.argv[1]
os.makedirs(os.path.join(out, "dir"), exist_ok=True)
write(os.path.join(out, "dir", "a.h5"), "data", samples(0, 5))
write(os.path.join(out, "dir", "b.h5"), "data", samples(5, 3, np.int64))
write(os.path.join(out, "bad_shape.h5"), "data", np.zeros((4, 2, MSL), np.int32))
write(os.path.join(out, "bad_msl.h5"), "data", np.zeros((2, 3, 6), np.int32))
write(os.path.join(out, "floats.h5"), "data", np.zeros((2, 3, MSL), np.float32))
write(os.path.join(out, "no_data.h5"), "tokens", samples(0, 2))
# Masks that are not 0 / 1 (sample 1, token 3 is 2), and a sample that counts no token (sample 2).
bad_mask = samples(0, 3)
bad_mask[1, 1, 3] = 2
write(os.path.join(out, "mask_two.h5"), "data", bad_mask)
no_token = samples(0, 3)
no_token[2, 1, :] = 0
write(os.path.join(out, "no_token.h5"), "data", no_token)
# Truncated: the first half of a good file.
src = os.path.join(out, "dir", "a.h5")
with open(src, "rb") as f:
    raw = f.read()
with open(os.path.join(out, "truncated.h5"), "wb") as f:
    f.write(raw[: len(raw) // 2])
# Corrupt: one compressed chunk per sample; sample 3's chunk is overwritten with garbage, so the
# file opens but reading sample 3 fails.
path = os.path.join(out, "corrupt.h5")
write(path, "data", samples(0, 6), chunks=(1, 3, MSL), compression="gzip")
with h5py.File(path, "r") as f:
    info = f["data"].id.get_chunk_info(3)
with open(path, "r+b") as f:
    f.seek(info.byte_offset)
    f.write(b"\xff" * info.size)
with open(os.path.join(out, "not_hdf5.h5"), "w") as f:
    f.write("this is not an HDF5 file\n")
