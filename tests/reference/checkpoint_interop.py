"""Checkpoint interchange with Python, for tests/reference/test_checkpoint_interop.cpp.

A manifest (manifest.json in a folder) lists expected tensors and values by key path:
  {"tensors": [{"path": [...], "dtype": "f32", "shape": [..], "file": "0.bin"}, ...],
   "values": [{"path": [...], "value": ...}, ...], "tied": [[path_a, path_b], ...]}
with each tensor's row-major little-endian bytes in its file.

  check-h5 FILE DIR     h5py reads every tensor and the metadata of a cstorch HDF5 file
  check-pt FILE DIR     torch.load (and weights_only=True) of a cstorch .pt file
  check-st FILE DIR     a safetensors file parsed here by hand (no safetensors package)
  write DIR             writes py.mdl (h5py, following docs/checkpoint-format.md), torch.pt
                        (torch.save, with views, OrderedDicts, int keys, tuples, tied tensors)
                        and py.safetensors, plus DIR/manifest.json of what they hold
  model DIR             a torch model: model.pt (state_dict), x.bin, y.bin (its output)
  write-f64 DIR         float64 tensors: f64.pt (torch.save, with views) and f64.safetensors,
                        whose manifest holds the values as torch's .float() rounds them; and
                        big.pt, whose tensor "w" holds 1e39 (beyond float32) at element 2
Prints "OK" and exits 0 on success; an AssertionError says what differs.
"""
import collections
import json
import math
import os
import struct
import sys

import numpy as np
import torch

NP = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i32": np.int32,
      "i64": np.int64, "bool": np.uint8}
TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
         "i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
ST = {"f32": "F32", "f16": "F16", "bf16": "BF16", "i32": "I32", "i64": "I64", "bool": "BOOL"}


def load_manifest(d):
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    for t in m["tensors"]:
        with open(os.path.join(d, t["file"]), "rb") as f:
            t["bytes"] = f.read()
    return m


def flat(path):
    return ".".join(str(p) for p in path)


def same_value(a, b):
    if isinstance(b, float) and math.isnan(b):
        return isinstance(a, float) and math.isnan(a)
    if isinstance(b, bool) or isinstance(a, bool):
        return type(a) is type(b) and a == b
    return a == b and type(a) is type(b)


def torch_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.numpy().tobytes()


# ---------------------------------------------------------------------------------------------

def structure_lookup(node, path):
    for p in path:
        if node["kind"] == "map":
            node = node["values"][node["keys"].index(str(p))]
        else:
            node = node["items"][int(p)]
    return node


def decode_json_value(node):
    k = node["kind"]
    if k == "none":
        return None
    if k == "float":
        return float(node["value"])  # numbers, or "nan" / "inf" / "-inf"
    if k in ("bool", "int", "string"):
        return node["value"]
    raise AssertionError("not a scalar: %r" % node)


def check_h5(path, d):
    import h5py
    m = load_manifest(d)
    with h5py.File(path, "r") as f:
        assert int(f.attrs["cstorch_format_version"]) == 1
        assert int(f.attrs["__SUCCESS__"]) == 1
        structure = json.loads(f.attrs["cstorch_structure"])
        n = 0
        for t in m["tensors"]:
            node = structure_lookup(structure, t["path"])
            assert node["kind"] == "tensor", node
            assert node["dtype"] == t["dtype"] and node["shape"] == t["shape"], (node, t)
            ds = f[node["dataset"]]
            dt = ds.attrs["dtype"]
            dt = dt.decode() if isinstance(dt, bytes) else dt
            assert dt == t["dtype"], (flat(t["path"]), dt)
            arr = ds[()]
            assert list(arr.shape) == t["shape"], (flat(t["path"]), arr.shape)
            assert arr.dtype == NP[t["dtype"]], (flat(t["path"]), arr.dtype)
            assert arr.tobytes() == t["bytes"], "values differ at " + flat(t["path"])
            n += 1
        for v in m["values"]:
            got = decode_json_value(structure_lookup(structure, v["path"]))
            assert same_value(got, v["value"]), (flat(v["path"]), got, v["value"])
        for a, b in m["tied"]:
            na, nb = structure_lookup(structure, a), structure_lookup(structure, b)
            assert na["dataset"] == nb["dataset"], (na, nb)
            # The second key is a hard link to the same dataset.
            link = flat(b).replace("%", "%25").replace("/", "%2F")
            assert f[link].id == f[na["dataset"]].id, link
    print("OK h5", n)


def torch_lookup(obj, path):
    for p in path:
        if isinstance(obj, dict):
            # An optimizer state dict's "state" is keyed by int parameter ids, as torch's.
            obj = obj[p] if p in obj else obj[int(p)]
        else:
            obj = obj[int(p)]
    return obj


def check_pt(path, d):
    m = load_manifest(d)
    # torch 1.13's weights_only unpickler has no float opcode (BINFLOAT; added in torch 2), so
    # files holding float values are checked with the full unpickler only.
    has_float = any(isinstance(v["value"], float) for v in m["values"])
    for weights_only in (False,) if has_float else (False, True):
        obj = torch.load(path, weights_only=weights_only)
        if isinstance(obj, dict) and "optimizer" in obj:
            keys = list(obj["optimizer"]["state"])
            assert all(type(k) is int for k in keys), keys
        for t in m["tensors"]:
            x = torch_lookup(obj, t["path"])
            assert isinstance(x, torch.Tensor), flat(t["path"])
            assert x.dtype == TORCH[t["dtype"]], (flat(t["path"]), x.dtype)
            assert list(x.shape) == t["shape"], (flat(t["path"]), x.shape)
            assert torch_bytes(x) == t["bytes"], "values differ at " + flat(t["path"])
        for v in m["values"]:
            got = torch_lookup(obj, v["path"])
            assert same_value(got, v["value"]), (flat(v["path"]), got, v["value"])
        for a, b in m["tied"]:
            assert torch_lookup(obj, a) is torch_lookup(obj, b), (a, b)
    print("OK pt", len(m["tensors"]))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def check_st(path, d):
    m = load_manifest(d)
    header, data = read_safetensors(path)
    meta = header.get("__metadata__", {})
    structure = json.loads(meta["cstorch_structure"]) if "cstorch_structure" in meta else None
    # The data buffer is fully used and tensors do not overlap (the format's rule).
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    pos = 0
    for b, e in spans:
        assert b == pos, spans
        pos = e
    assert pos == len(data), (pos, len(data))
    for t in m["tensors"]:
        name = structure_lookup(structure, t["path"])["dataset"] if structure else flat(t["path"])
        h = header[name]
        assert h["dtype"] == ST[t["dtype"]] and h["shape"] == t["shape"], (name, h, t)
        b, e = h["data_offsets"]
        assert data[b:e] == t["bytes"], "values differ at " + name
    print("OK st", len(m["tensors"]))


# ---------------------------------------------------------------------------------------------

class Manifest:
    def __init__(self, d):
        self.d, self.tensors, self.values, self.tied = d, [], [], []

    def tensor(self, path, t, dtype):
        f = "%d.bin" % len(self.tensors)
        with open(os.path.join(self.d, f), "wb") as out:
            out.write(torch_bytes(t))
        self.tensors.append({"path": path, "dtype": dtype, "shape": list(t.shape), "file": f})

    def value(self, path, v):
        self.values.append({"path": path, "value": v})

    def save(self):
        with open(os.path.join(self.d, "manifest.json"), "w") as f:
            json.dump({"tensors": self.tensors, "values": self.values, "tied": self.tied}, f)


def write(d):
    import h5py
    torch.manual_seed(0)
    m = Manifest(d)
    base = torch.randn(6, 8)
    tensors = {
        "f32": (torch.randn(3, 4), "f32"),
        "bf16": (torch.randn(5).to(torch.bfloat16), "bf16"),
        "f16": (torch.randn(2, 2).to(torch.float16), "f16"),
        "i32": (torch.tensor([1, -2, 2**31 - 1], dtype=torch.int32), "i32"),
        "i64": (torch.tensor([-2**63, 0, 2**63 - 1], dtype=torch.int64), "i64"),
        "bool": (torch.tensor([[True, False], [False, True]]), "bool"),
        "scalar": (torch.tensor(2.5), "f32"),
        "empty": (torch.zeros(0, 3), "f32"),
    }
    # torch.save: an OrderedDict state dict, views sharing one storage, int keys, tuples.
    sd = collections.OrderedDict()
    for k, (t, dt) in tensors.items():
        sd[k] = t
        m.tensor(["model", k], t, dt)
    sd["transposed"] = base.t()  # strided view
    m.tensor(["model", "transposed"], base.t(), "f32")
    sd["row"] = base[2]  # offset view
    m.tensor(["model", "row"], base[2], "f32")
    sd["cols"] = base[:, 1:3]  # offset + stride
    m.tensor(["model", "cols"], base[:, 1:3], "f32")
    tied = torch.randn(4, 4)
    sd["enc.weight"] = tied
    sd["dec.weight"] = tied
    m.tensor(["model", "enc.weight"], tied, "f32")
    m.tensor(["model", "dec.weight"], tied, "f32")
    m.tied.append([["model", "enc.weight"], ["model", "dec.weight"]])
    param = torch.nn.Parameter(torch.randn(3))
    mom = torch.randn(3)
    obj = {
        "model": sd,
        "optimizer": {"state": {0: {"momentum_buffer": mom, "step": 7}},
                      "param_groups": [{"lr": 0.1, "params": [0], "nesterov": False}]},
        "param": param,
        "pair": (1, "two", None, 2.5),
        "global_step": 1234567890123,
        "neg": -5,
    }
    m.tensor(["optimizer", "state", "0", "momentum_buffer"], mom, "f32")
    m.tensor(["param"], param.detach(), "f32")
    m.value(["optimizer", "state", "0", "step"], 7)
    m.value(["optimizer", "param_groups", 0, "lr"], 0.1)
    m.value(["optimizer", "param_groups", 0, "nesterov"], False)
    m.value(["optimizer", "param_groups", 0, "params", 0], 0)
    m.value(["pair", 0], 1)
    m.value(["pair", 1], "two")
    m.value(["pair", 2], None)
    m.value(["pair", 3], 2.5)
    m.value(["global_step"], 1234567890123)
    m.value(["neg"], -5)
    torch.save(obj, os.path.join(d, "torch.pt"))

    # h5py, following docs/checkpoint-format.md (only the "model" tensors and two values).
    with h5py.File(os.path.join(d, "py.mdl"), "w", libver=("v110", "v110")) as f:
        f.attrs["cstorch_format_version"] = np.int64(1)
        keys, values = [], []
        for k, (t, dt) in tensors.items():
            arr = np.frombuffer(torch_bytes(t), dtype=NP[dt]).reshape(tuple(t.shape))
            if dt == "bool":
                arr = arr.astype(np.bool_)  # h5py's enum bool
            ds = f.create_dataset("model." + k, data=arr)
            ds.attrs["dtype"] = dt
            keys.append(k)
            values.append({"kind": "tensor", "dataset": "model." + k, "dtype": dt,
                           "shape": list(t.shape)})
        f.attrs["cstorch_structure"] = json.dumps(
            {"kind": "map", "keys": ["model", "global_step", "lr"],
             "values": [{"kind": "map", "keys": keys, "values": values},
                        {"kind": "int", "value": 1234567890123},
                        {"kind": "float", "value": 0.1}]})
        f.attrs["__SUCCESS__"] = np.int64(1)

    # safetensors, by hand: the model tensors under flat keys.
    header, blobs, off = {}, [], 0
    for k, (t, dt) in tensors.items():
        b = torch_bytes(t)
        header["model." + k] = {"dtype": ST[dt], "shape": list(t.shape),
                                "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    with open(os.path.join(d, "py.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    m.save()
    print("OK write")


def write_f64(d):
    m = Manifest(d)
    w = torch.tensor([[1.0, 1.0 + 2.0**-30, -0.1, 1e-40],
                      [3.4e38, float("inf"), float("-inf"), float("nan")],
                      [1.0 / 3.0, -2.0**-150, 123456789.123, 0.0]], dtype=torch.float64)
    base = torch.randn(5, 6, dtype=torch.float64)
    sd = collections.OrderedDict()
    sd["w"] = w
    sd["transposed"] = base.t()
    sd["row"] = base[3]
    sd["f32"] = torch.randn(4)
    for k in sd:
        m.tensor([k], sd[k].float(), "f32")
    torch.save(sd, os.path.join(d, "f64.pt"))
    header, blobs, off = {}, [], 0
    for k, t in (("w", w), ("f32", sd["f32"])):
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": "F64" if t.dtype == torch.float64 else "F32",
                     "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(os.path.join(d, "f64.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    torch.save({"w": torch.tensor([1.0, 2.0, 1e39], dtype=torch.float64)},
               os.path.join(d, "big.pt"))
    m.save()
    print("OK write-f64")


def model(d):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 5))
    torch.save(net.state_dict(), os.path.join(d, "model.pt"))
    x = torch.randn(8, 20)
    with torch.no_grad():
        y = net(x)
    with open(os.path.join(d, "x.bin"), "wb") as f:
        f.write(x.numpy().tobytes())
    with open(os.path.join(d, "y.bin"), "wb") as f:
        f.write(y.numpy().tobytes())
    print("OK model")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "check-h5":
        check_h5(sys.argv[2], sys.argv[3])
    elif cmd == "check-pt":
        check_pt(sys.argv[2], sys.argv[3])
    elif cmd == "check-st":
        check_st(sys.argv[2], sys.argv[3])
    elif cmd == "write":
        write(sys.argv[2])
    elif cmd == "model":
        model(sys.argv[2])
    elif cmd == "write-f64":
        write_f64(sys.argv[2])
    else:
        raise SystemExit("unknown command " + cmd)
