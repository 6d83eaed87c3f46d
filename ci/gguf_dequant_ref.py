#!/usr/bin/env python3
"""Reference digests of every tensor's dequantization, by the `gguf` Python package.

For each tensor of a GGUF file: its name, type, element count, the sha256 of the
little-endian f32 bytes that `gguf.quants.dequantize` produces, and the bit patterns of
the first 32 values. `runtime/tests/quant_real_models.rs` dequantizes the same tensors
with lode and compares bit for bit, so the tests need no Python once the digests are
committed under tests/data/gguf-dequant/.

    pip install gguf==0.19.0 numpy
    python3 ci/gguf_dequant_ref.py MODEL.gguf [...] [-o tests/data/gguf-dequant]
"""
import argparse
import hashlib
import importlib.metadata
import json
import os

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

FIRST = 32


def digest(path: str) -> dict:
    r = GGUFReader(path)
    tensors = []
    for t in r.tensors:
        # gguf-py's numpy view: tensor data as stored; dequantize to f32 in row-major order.
        vals = dequantize(t.data, t.tensor_type).astype("<f4", copy=False).reshape(-1)
        tensors.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "n_elements": int(t.n_elements),
            "sha256_f32le": hashlib.sha256(vals.tobytes()).hexdigest(),
            "first_bits": [int(v) for v in vals[:FIRST].view("<u4")],
        })
    with open(path, "rb") as f:
        file_sha = hashlib.file_digest(f, "sha256").hexdigest()
    return {"file": os.path.basename(path), "file_sha256": file_sha,
            "generator": "gguf-py " + importlib.metadata.version("gguf"),
            "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("-o", "--out", default="tests/data/gguf-dequant")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for m in a.models:
        d = digest(m)
        out = os.path.join(a.out, os.path.basename(m).removesuffix(".gguf") + ".json")
        # One tensor per line: small, diffable.
        head = {k: v for k, v in d.items() if k != "tensors"}
        with open(out, "w") as f:
            f.write(json.dumps(head)[:-1] + ', "tensors": [\n')
            f.write(",\n".join(json.dumps(t, separators=(",", ":")) for t in d["tensors"]))
            f.write("\n]}\n")
        print(f"{out}: {len(d['tensors'])} tensors")


if __name__ == "__main__":
    main()
