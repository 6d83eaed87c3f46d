#!/usr/bin/env python3
"""The runtime crate's module import graph, file by file: prints every cycle (strongly
connected set of more than one file) and every import from weights/ into backend/gpu/.
Exit 1 if there is any. A file imports another when it names a path into it (`use
crate::a::b`, `super::x`, `crate::a::b::f(...)` in code); a module's mod.rs declaring its
children is not an import. Usage: python3 ci/import-graph.py [runtime/src]"""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "runtime", "src")
root = os.path.normpath(root)
files = {}
for d, _, fs in os.walk(root):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib"):
                rel = rel[:-1]
            files[tuple(rel)] = p

def module_file(parts):
    """The longest module prefix of `parts` that is a file."""
    for n in range(len(parts), 0, -1):
        if tuple(parts[:n]) in files:
            return tuple(parts[:n])
    return None

def strip(src):
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r'"(\\.|[^"\\])*"', '""', src)
    # test modules are not part of the graph
    return re.split(r"#\[cfg\(test\)\]", src)[0]

edges = {m: set() for m in files}
for m, p in files.items():
    src = strip(open(p, encoding="utf-8").read())
    paths = re.findall(r"\b((?:crate|super|self)(?:::(?:super|\w+))+)", src)
    # `use super::{a, b::c}` / `crate::x::{y, z}`: each item after the prefix
    for pre, items in re.findall(r"\b((?:crate|super|self)(?:::(?:super|\w+))*)::\{([^}]*)\}", src):
        for it in items.split(","):
            it = it.strip().split(" as ")[0]
            if it and it != "self":
                paths.append(pre + "::" + it)
    for path in paths:
        parts = path.split("::")
        if parts[0] == "crate":
            tgt = parts[1:]
        else:
            base = list(m)
            if parts[0] == "self":
                parts = parts[1:]
            while parts and parts[0] == "super":
                parts = parts[1:]
                base = base[:-1]
            tgt = base + parts
        f = module_file([t for t in tgt if t.isidentifier()])
        if f is None or f == m:
            continue
        # a module naming its own descendant (declared by it) or its ancestor's items is
        # the module tree, not an import between peers
        if f[:len(m)] == m or m[:len(f)] == f:
            continue
        edges[m].add(f)

# Tarjan's strongly connected components
index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
def sc(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            sc(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        out.append(comp)
sys.setrecursionlimit(10000)
for v in files:
    if v not in index:
        sc(v)
bad = 0
def name(m): return "/".join(m) or "lib"
for comp in out:
    if len(comp) > 1:
        # parent ↔ child through the parent's own items (a trait, a type) is how Rust
        # modules are built; only report sets that are not one parent and its children.
        bad += 1
        print("cycle:", ", ".join(sorted(name(c) for c in comp)))
for m, es in edges.items():
    if m[:1] == ("weights",):
        for e in es:
            if e[:2] == ("backend", "gpu"):
                bad += 1
                print(f"weights -> backend/gpu: {name(m)} imports {name(e)}")
print(f"{len(files)} files, {sum(len(e) for e in edges.values())} imports, {bad} problems")
sys.exit(1 if bad else 0)
