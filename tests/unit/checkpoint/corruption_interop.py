"""Interop for the checksum tests (test_corruption.cpp), with h5py, numpy and torch.

  read-mdl FILE OUT.json    h5py reads every dataset of a cstorch .mdl file (through HDF5's
                            Fletcher-32 filter) and writes {key: hex of its bytes} to OUT.json
  damaged-mdl FILE KEY      h5py's reading of the dataset of KEY must fail (checksum error)
  unwritten-mdl FILE KEY ROWS
                            replaces the dataset of KEY by a chunked one of ROWS rows whose
                            chunks are never written (the structure description says the shape)
  check-pt FILE             Python's zipfile checks the CRC-32 of every record
  check-st FILE             zlib.crc32 of each tensor equals its cstorch.tensor_crc32.<name>
                            metadata
  write DIR                 files from other writers, and DIR/expected.json ({file: {key: {dtype,
                            shape, hex}}}) with what each holds

Exit status 0 when all is as expected; 3 when a module is missing.
"""
import json
import os
import struct
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # pragma: no cover
    print("missing module:", e)
    sys.exit(3)


def dataset_of(structure, key):
    """The dataset name of tensor KEY (flattened) in a cstorch structure description."""
    out = {}

    def walk(node, prefix):
        if node["kind"] == "tensor":
            out[prefix] = node["dataset"]
        elif node["kind"] == "map":
            for k, v in zip(node["keys"], node["values"]):
                walk(v, prefix + "." + k if prefix else k)
        elif node["kind"] == "list":
            for i, v in enumerate(node["items"]):
                walk(v, prefix + "." + str(i) if prefix else str(i))

    walk(structure, "")
    return out if key is None else out[key]


def read_mdl(path, out):
    res = {}
    with h5py.File(path, "r") as f:
        structure = json.loads(f.attrs["cstorch_structure"])
        for key, name in dataset_of(structure, None).items():
            d = f[name]
            if d.size > 0 and d.ndim > 0:
                assert d.fletcher32, (key, "no Fletcher-32 filter")
                assert d.chunks is not None, key
            if d.ndim == 0:
                assert d.id.get_create_plist().get_layout() == h5py.h5d.COMPACT, key
            res[key] = np.ascontiguousarray(d[()]).tobytes().hex()
    with open(out, "w") as f:
        json.dump(res, f)
    print("OK read", len(res))


def damaged_mdl(path, key):
    with h5py.File(path, "r") as f:
        name = dataset_of(json.loads(f.attrs["cstorch_structure"]), key)
        try:
            f[name][()]
        except OSError as e:
            print("OK h5py refuses:", e)
            return
    print("h5py read the damaged dataset", name)
    sys.exit(1)


def unwritten_mdl(path, key, rows):
    with h5py.File(path, "r+") as f:
        structure = json.loads(f.attrs["cstorch_structure"])
        name = dataset_of(structure, key)
        d = f[name]
        shape = (int(rows),) + d.shape[1:]
        dtype, attrs = d.dtype, dict(d.attrs)
        del f[name]
        n = f.create_dataset(name, shape=shape, dtype=dtype, chunks=(1,) + shape[1:],
                             fletcher32=True)
        for k, v in attrs.items():
            n.attrs[k] = v

        def walk(node):
            if node["kind"] == "tensor" and node["dataset"] == name:
                node["shape"] = list(shape)
            for v in node.get("values", []) + node.get("items", []):
                walk(v)

        walk(structure)
        f.attrs["cstorch_structure"] = json.dumps(structure)
    print("OK unwritten", shape)


def check_pt(path):
    import zipfile

    bad = zipfile.ZipFile(path).testzip()
    assert bad is None, "CRC mismatch in " + bad
    print("OK zip")


def check_st(path):
    import zlib

    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__")
    for name, t in header.items():
        b, e = t["data_offsets"]
        want = meta["cstorch.tensor_crc32." + name]
        assert "%08x" % zlib.crc32(raw[8 + n + b:8 + n + e]) == want, name
    print("OK st", len(header))


def entry(a):
    a = np.asarray(a)
    names = {np.dtype("float32"): "f32", np.dtype("int64"): "i64", np.dtype("int32"): "i32",
             np.dtype("bool"): "bool", np.dtype("float16"): "f16"}
    return {"dtype": names[a.dtype], "shape": list(a.shape), "hex": a.tobytes(order="C").hex()}


def write(d):
    import torch  # only here: the .mdl checks need no torch

    rng = np.random.default_rng(7)
    expected = {}
    w = rng.standard_normal((61, 33)).astype(np.float32)
    b = rng.standard_normal(33).astype(np.float32)
    mask = rng.random((3, 101)) < 0.5
    ids = rng.integers(-10**12, 10**12, size=17)

    # torch.save: tensors, a view of a larger storage, a scalar.
    base = torch.from_numpy(rng.standard_normal(100).astype(np.float32))
    obj = {"w": torch.from_numpy(w), "b": torch.from_numpy(b), "mask": torch.from_numpy(mask),
           "ids": torch.from_numpy(ids), "view": base[10:30], "step": torch.tensor(1234567890123)}
    torch.save(obj, os.path.join(d, "torch.pt"))
    expected["torch.pt"] = {"w": entry(w), "b": entry(b), "mask": entry(mask), "ids": entry(ids),
                            "view": entry(base[10:30].numpy()), "step": entry(np.array(1234567890123))}

    # h5py, following docs/checkpoint-format.md, with several layouts of the data.
    def h5(name, layouts):
        keys = list(layouts)
        arrays = {"w": w, "b": b, "mask": mask, "ids": ids}
        with h5py.File(os.path.join(d, name), "w", libver=("v110", "v110")) as f:
            f.attrs["cstorch_format_version"] = np.int64(1)
            values = []
            for k in keys:
                a = arrays[k]
                ds = f.create_dataset(k, data=a, **layouts[k])
                ds.attrs["dtype"] = entry(a)["dtype"]
                values.append({"kind": "tensor", "dataset": k, "dtype": entry(a)["dtype"],
                               "shape": list(a.shape)})
            f.attrs["cstorch_structure"] = json.dumps({"kind": "map", "keys": keys, "values": values})
            f.attrs["__SUCCESS__"] = np.int64(1)
        expected[name] = {k: entry(arrays[k]) for k in keys}

    # Contiguous, unfiltered: what cstorch wrote before checksums (and h5py's default).
    h5("plain.mdl", {"w": {}, "b": {}, "mask": {}, "ids": {}})
    # Fletcher-32 with h5py's own chunk shapes, with chunks of cstorch's form (rows of full
    # width, a padded last chunk) and with compression in the pipeline too.
    h5("fletcher.mdl", {"w": {"fletcher32": True, "chunks": (7, 33)},
                        "b": {"fletcher32": True, "chunks": (5,)},
                        "mask": {"fletcher32": True, "chunks": (2, 101)},
                        "ids": {"fletcher32": True, "chunks": True}})
    h5("fletcher_other.mdl", {"w": {"fletcher32": True, "chunks": (8, 8)},
                              "b": {"fletcher32": True, "compression": "gzip"},
                              "mask": {"fletcher32": True, "chunks": (3, 7)},
                              "ids": {"fletcher32": True, "shuffle": True, "compression": "gzip"}})

    # safetensors from another writer: no cstorch checksums (one with foreign metadata).
    def st(name, meta):
        header, blobs, off = {}, [], 0
        if meta is not None:
            header["__metadata__"] = meta
        arrays = {"w": (w, "F32"), "b": (b, "F32"), "mask": (mask, "BOOL"), "ids": (ids, "I64")}
        for k, (a, t) in arrays.items():
            raw = np.ascontiguousarray(a).tobytes()
            header[k] = {"dtype": t, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
            blobs.append(raw)
            off += len(raw)
        h = json.dumps(header).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(d, name), "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
        expected[name] = {k: entry(a) for k, (a, _) in arrays.items()}

    st("plain.safetensors", None)
    st("meta.safetensors", {"format": "pt"})

    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected, f)
    print("OK write", len(expected))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "read-mdl":
        read_mdl(sys.argv[2], sys.argv[3])
    elif cmd == "damaged-mdl":
        damaged_mdl(sys.argv[2], sys.argv[3])
    elif cmd == "unwritten-mdl":
        unwritten_mdl(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "check-pt":
        check_pt(sys.argv[2])
    elif cmd == "check-st":
        check_st(sys.argv[2])
    elif cmd == "write":
        try:
            write(sys.argv[2])
        except ImportError as e:
            print("missing module:", e)
            sys.exit(3)
    else:
        sys.exit("unknown command " + cmd)
