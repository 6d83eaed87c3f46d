"""Compare a GGUF written by `lode quantize` with llama-quantize's (ci/llama_mix_ref.sh):
one line 'LABEL: identical (N bytes)' or the tensors whose type or bytes differ, grouped
by (lode type, llama type), and the metadata keys that differ."""
import hashlib, sys
from collections import Counter
import gguf

label, a, b = sys.argv[1:4]
da, db = open(a, "rb").read(), open(b, "rb").read()
if da == db:
    print(f"{label}: identical ({len(da)} bytes, sha256 {hashlib.sha256(da).hexdigest()[:16]})")
    sys.exit(0)
ra, rb = gguf.GGUFReader(a), gguf.GGUFReader(b)
ta = {t.name: t for t in ra.tensors}
tb = {t.name: t for t in rb.tensors}
diff = Counter()
same = Counter()
examples = {}
for name, t in tb.items():
    u = ta.get(name)
    if u is None:
        diff[("missing", t.tensor_type.name)] += 1
        continue
    key = (u.tensor_type.name, t.tensor_type.name)
    if u.tensor_type != t.tensor_type or bytes(u.data.tobytes()) != bytes(t.data.tobytes()):
        diff[key] += 1
        examples.setdefault(key, name)
    else:
        same[key] += 1
order_same = [t.name for t in ra.tensors] == [t.name for t in rb.tensors]
meta = []
fa = {k: f for k, f in ra.fields.items() if not k.startswith("GGUF.")}
fb = {k: f for k, f in rb.fields.items() if not k.startswith("GGUF.")}
for k in sorted(set(fa) | set(fb)):
    if k not in fa or k not in fb or [bytes(p.tobytes()) for p in fa[k].parts] != [bytes(p.tobytes()) for p in fb[k].parts]:
        meta.append(k)
print(f"{label}: differ; tensors equal: {sum(same.values())} ({', '.join(f'{n} {k[1]}' for k, n in sorted(same.items()))})")
for k, n in sorted(diff.items()):
    print(f"  {n} tensors lode {k[0]} / llama {k[1]} differ, e.g. {examples.get(k, '')}")
if meta:
    print(f"  metadata keys that differ: {', '.join(meta)}")
if list(fa) != list(fb):
    print("  metadata key order differs")
if not order_same:
    print("  tensor order differs")
