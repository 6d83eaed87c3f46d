#!/usr/bin/env python3
"""Reference dequantizations (and, where gguf-py has one, quantizations) of random blocks.

For each type: 96 random valid blocks (random code bytes; the f16 scale fields random
finite values, zeros, negatives and subnormals among them; MXFP4's exponent any byte;
the grid types IQ3_S .. IQ1_M enough blocks that random indices reach nearly every grid
entry, 8 draws per entry, and IQ1_M's scale in the top nibbles of its scale words)
written to tests/data/quant-ref/<TYPE>.blocks, and in quant-ref.json the sha256 and the
first 64 bit patterns of the little-endian f32 values `gguf.quants.dequantize` gives.
For types gguf-py can quantize (MXFP4), random f32 rows in <TYPE>.f32 and the sha256 of
the bytes `gguf.quants.quantize` gives. `runtime/tests/quant_gguf_py.rs` compares.

    pip install gguf==0.19.0 numpy
    python3 ci/gguf_quant_ref.py [-o tests/data/quant-ref]
"""
import argparse
import hashlib
import importlib.metadata
import json
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

N_BLOCKS = 96
# Byte offsets of the f16 scale fields inside a block.
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: [],
              T.IQ3_S: [0], T.IQ3_XXS: [0], T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ1_S: [0], T.IQ1_M: []}
# Grid types: (grid entries, grid indices per block).
GRIDS = {T.IQ3_S: (512, 64), T.IQ3_XXS: (256, 64), T.IQ2_XXS: (256, 32), T.IQ2_XS: (512, 32), T.IQ2_S: (1024, 32),
         T.IQ1_S: (2048, 32), T.IQ1_M: (2048, 32)}
QUANTIZERS = [T.MXFP4]


def random_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = np.exp2(rng.uniform(-26, 6, size=n)).astype(np.float16)
    sign = np.where(rng.random(n) < 0.3, -1, 1).astype(np.float16)
    v = mag * sign
    v[rng.random(n) < 0.05] = 0
    return v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", default="tests/data/quant-ref")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(2026)
    out = {"generator": "gguf-py " + importlib.metadata.version("gguf"), "types": {}}
    for qt, fields in F16_FIELDS.items():
        block, size = GGML_QUANT_SIZES[qt]
        nb = max(N_BLOCKS, 8 * GRIDS[qt][0] // GRIDS[qt][1]) if qt in GRIDS else N_BLOCKS
        blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        for off in fields:
            blocks[:, off:off + 2] = random_f16(rng, nb).view(np.uint8).reshape(nb, 2)
        if qt == T.IQ1_M:
            d = random_f16(rng, nb).view(np.uint16)
            for k in range(4):
                blocks[:, 49 + 2 * k] = (blocks[:, 49 + 2 * k] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4).astype(np.uint8)
        with open(os.path.join(a.out, f"{qt.name}.blocks"), "wb") as f:
            f.write(blocks.tobytes())
        vals = dequantize(blocks.reshape(-1), qt).astype("<f4").reshape(-1)
        assert vals.size == nb * block
        assert np.isfinite(vals).all(), qt.name
        entry = {"n_blocks": nb, "block_elems": block, "block_bytes": size,
                 "dequant_sha256": hashlib.sha256(vals.tobytes()).hexdigest(),
                 "dequant_first_bits": [int(v) for v in vals[:64].view("<u4")]}
        if qt in QUANTIZERS:
            x = (rng.standard_normal(N_BLOCKS * block) * np.exp2(rng.integers(-12, 8, size=N_BLOCKS * block))).astype("<f4")
            x[rng.random(x.size) < 0.02] = 0
            with open(os.path.join(a.out, f"{qt.name}.f32"), "wb") as f:
                f.write(x.tobytes())
            q = quantize(x.reshape(N_BLOCKS, block), qt)
            entry["quant_sha256"] = hashlib.sha256(q.tobytes()).hexdigest()
        out["types"][qt.name] = entry
    with open(os.path.join(a.out, "quant-ref.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{a.out}: {len(out['types'])} types")


if __name__ == "__main__":
    main()
