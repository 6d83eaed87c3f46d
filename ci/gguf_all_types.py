#!/usr/bin/env python3
"""A GGUF file holding one small tensor of every ggml type the `gguf` Python package knows.

Writes tests/data/gguf-types/all-types.gguf (tensor `t.<TYPE>`: two rows of two blocks of
random bytes, float types: two rows of 64 elements) and all-types.json (per tensor: type
name, id, dims and byte size, from gguf-py's GGML_QUANT_SIZES).
`tests/inspect_types.rs` opens the file with lode and compares.

    pip install gguf==0.19.0 numpy
    python3 ci/gguf_all_types.py [-o tests/data/gguf-types]
"""
import argparse
import importlib.metadata
import json
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="tests/data/gguf-types")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "all-types.gguf")
    rng = np.random.default_rng(23)
    w = GGUFWriter(path, arch="none")
    w.add_name("every ggml type")
    meta = []
    for qt in GGMLQuantizationType:
        block, tsize = GGML_QUANT_SIZES[qt]
        ne0 = 2 * block if block > 1 else 64
        rows = 2
        row_bytes = ne0 // block * tsize
        data = rng.integers(0, 256, size=(rows, row_bytes), dtype=np.uint8)
        name = f"t.{qt.name}"
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qt)
        meta.append({"name": name, "type": qt.name, "id": int(qt.value),
                     "dims": [ne0, rows], "n_bytes": rows * row_bytes})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(a.out, "all-types.json"), "w") as f:
        # One tensor per line: small, diffable.
        f.write('{"generator": "gguf-py %s", "tensors": [\n' % importlib.metadata.version("gguf"))
        f.write(",\n".join(json.dumps(t, separators=(",", ":")) for t in meta))
        f.write("\n]}\n")
    print(f"{path}: {len(meta)} tensors")


if __name__ == "__main__":
    main()
