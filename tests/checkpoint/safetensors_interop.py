#!/usr/bin/env python3
"""Loom's safetensors files against the safetensors package (Hugging Face's reader).

  safetensors_interop.py --tool build/tests/safetensors_interop_tool --dir DIR

1. Loom writes the reference tensors (`tool write`); the safetensors package
   reads the file and every tensor is compared bit for bit with the reference
   computed here; Loom's per-tensor CRC-32C and shard records are checked too.
2. The safetensors package writes the same tensors; Loom reads them
   (`tool check`) and compares bit for bit.

Needs numpy and safetensors (tests/requirements.txt). scripts/setup.sh installs
them into a virtual environment (LOOM_TEST_VENV, default <repo>/.test-venv);
when this interpreter lacks them the script re-runs itself with that
environment's, and skips (exit 77, with the reason) when there is none.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from test_venv import reexec_with_test_venv  # noqa: E402

try:
    import numpy as np
    import safetensors
except ImportError as e:
    reexec_with_test_venv(f"the safetensors package is not importable ({e})")


def reference():
    """name -> (safetensors dtype, shape, little-endian bytes); the same formulas
    as safetensors_interop_tool.cpp."""
    i = np.arange(15, dtype=np.float64)
    f32 = (i * 0.37 - 2.0).astype(np.float32).reshape(3, 5)
    f16 = ((np.arange(8) - 4) * 0.5).astype(np.float16)
    bf16 = (0x3F80 + 37 * np.arange(6)).astype(np.uint16).reshape(2, 3)  # raw bits
    i32 = (np.arange(4) * 7 - 20).astype(np.int32).reshape(2, 2)
    i64 = (np.arange(3, dtype=np.int64) * 1000000000000 + 3)
    as_le = lambda a: a.astype(a.dtype.newbyteorder("<")).tobytes()
    return {
        "f32": ("F32", [3, 5], as_le(f32)),
        "bf16": ("BF16", [2, 3], as_le(bf16)),
        "f16": ("F16", [8], as_le(f16)),
        "i32": ("I32", [2, 2], as_le(i32)),
        "i64": ("I64", [3], as_le(i64)),
    }


def crc32c(data):
    """CRC-32C, written out here so that Loom's checksums are checked independently."""
    crc = 0xFFFFFFFF
    table = crc32c.table
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _table():
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        out.append(c)
    return out


crc32c.table = _table()


def check_loom_file(path, failures):
    with open(path, "rb") as f:
        raw = f.read()
    tensors = dict(safetensors.deserialize(raw))  # the package's own parser and validation
    header_len = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + header_len])["__metadata__"]
    records = json.loads(meta["loom.tensors"])
    if meta.get("written_by") != "loom":
        failures.append(f"{path}: metadata written_by is {meta.get('written_by')!r}")
    want = reference()
    if set(tensors) != set(want):
        failures.append(f"{path}: tensors {sorted(tensors)}, expected {sorted(want)}")
    for name, (dtype, shape, data) in want.items():
        got = tensors.get(name)
        if got is None:
            continue
        if got["dtype"] != dtype or list(got["shape"]) != shape or bytes(got["data"]) != data:
            failures.append(f"{path}: tensor {name} differs (dtype {got['dtype']}, shape "
                            f"{got['shape']}, {len(got['data'])} bytes)")
        if int(records[name]["crc32c"], 16) != crc32c(data):
            failures.append(f"{path}: tensor {name} has crc32c {records[name]['crc32c']}, "
                            f"expected {crc32c(data):08x}")
    # numpy's view through the package's numpy loader, for the dtypes numpy has.
    from safetensors.numpy import load_file
    try:
        loaded = load_file(path)
    except Exception as e:  # BF16 has no numpy dtype; the loader refuses the whole file
        loaded = None
        print(f"(safetensors.numpy.load_file: {e}; raw bytes compared instead)")
    if loaded is not None:
        for name in ("f32", "f16", "i32", "i64"):
            if loaded[name].tobytes() != want[name][2]:
                failures.append(f"{path}: numpy view of {name} differs")
    if records["bf16"].get("global_shape") != [4, 3] or records["bf16"].get("offsets") != [2, 0]:
        failures.append(f"{path}: shard record of bf16 is {records['bf16']}")


def write_python_file(path):
    keep = []  # the buffers must stay alive while the package serializes them
    specs = {}
    for name, (dtype, shape, data) in reference().items():
        buffer = np.frombuffer(data, dtype=np.uint8).copy()
        keep.append(buffer)
        specs[name] = safetensors.TensorSpec(
            dtype={"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I32": "int32",
                   "I64": "int64"}[dtype],
            shape=shape, data_ptr=buffer.ctypes.data, data_len=buffer.nbytes)
    safetensors.serialize_file(specs, path, {"written_by": "safetensors"})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}")
    failures = []

    loom_file = os.path.join(args.dir, "from_loom.safetensors")
    subprocess.run([args.tool, "write", loom_file], check=True)
    check_loom_file(loom_file, failures)

    python_file = os.path.join(args.dir, "from_safetensors.safetensors")
    write_python_file(python_file)
    result = subprocess.run([args.tool, "check", python_file], capture_output=True, text=True)
    print(result.stdout + result.stderr, end="")
    if result.returncode != 0:
        failures.append(f"Loom could not read {python_file} bit for bit")

    for failure in failures:
        print("FAIL: " + failure)
    if not failures:
        print("Loom's files read bit for bit by the safetensors package, and the package's by Loom")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
