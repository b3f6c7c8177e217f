#!/usr/bin/env python3
"""include-graph.py — the module include graph of sim/ and oracle/, checked.

A module is a header and its source (sim/parallel/fs_par.h + fs_par.c; a .c or .inc without a
header is a module of its own). A includes B when any file of A has #include "B.h". The folders
are layers, lowest first:

    sim/base -> sim/backend -> sim/parallel -> sim/weights -> sim/model -> oracle -> sim/run -> CLIs

(sim/backend/gpu is part of backend; the CLIs are sim/main_flux_sim.c and oracle/main_flux_oracle.c.)
Fails (exit 1) on any include cycle between modules and on any arrow that points to a higher
layer; prints every module with what it includes. `make test` runs it (tools/ci/run-tests.sh).

    tools/ci/include-graph.py            the graph and the verdict
    tools/ci/include-graph.py --dot      Graphviz source of the graph (clustered by layer)
"""
import os
import re
import sys

LAYERS = ["sim/base", "sim/backend", "sim/parallel", "sim/weights", "sim/model", "oracle", "sim/run", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    base = os.path.basename(path)
    if base.startswith("main_"):
        return "cli"
    d = os.path.dirname(path)
    if d.startswith("sim/backend"):
        return "sim/backend"
    return d


def collect(root):
    files = []
    for top in ("sim", "oracle"):
        for dp, _, fns in os.walk(os.path.join(root, top)):
            for fn in fns:
                if fn.endswith((".c", ".h", ".inc", ".cu")):
                    files.append(os.path.relpath(os.path.join(dp, fn), root))
    return sorted(files)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    files = collect(root)
    module = {f: os.path.splitext(f)[0] for f in files}  # file -> module name (path sans extension)
    by_header = {}
    for f in files:
        if f.endswith(".h") or f.endswith(".inc"):
            by_header.setdefault(os.path.basename(f), []).append(f)
    edges = {}
    unresolved = []
    for f in files:
        m = module[f]
        edges.setdefault(m, set())
        text = open(os.path.join(root, f), encoding="utf-8", errors="replace").read()
        for inc in INCLUDE.findall(text):
            # quoted includes: beside the file first, then the -I folders (one header per name)
            near = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if near in module:
                target = near
            elif len(by_header.get(os.path.basename(inc), [])) == 1:
                target = by_header[os.path.basename(inc)][0]
            else:
                unresolved.append("%s: #include \"%s\"" % (f, inc))
                continue
            if module[target] != m:
                edges[m].add(module[target])
    mod_layer = {module[f]: layer_of(f) for f in files}

    if "--dot" in sys.argv:
        print("digraph includes {\n  rankdir=BT; node [shape=box, fontsize=10];")
        for i, L in enumerate(LAYERS):
            print('  subgraph "cluster_%d" { label="%s";' % (i, L))
            for m in sorted(x for x in edges if mod_layer[x] == L):
                print('    "%s" [label="%s"];' % (m, os.path.basename(m)))
            print("  }")
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print('  "%s" -> "%s";' % (a, b))
        print("}")
        return 0

    # cycles: strongly connected components with more than one module
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)

    upward = []
    for a in sorted(edges):
        for b in sorted(edges[a]):
            la, lb = LAYERS.index(mod_layer[a]), LAYERS.index(mod_layer[b])
            if lb > la:
                upward.append("%s (%s) -> %s (%s)" % (a, mod_layer[a], b, mod_layer[b]))

    for L in LAYERS:
        mods = sorted(x for x in edges if mod_layer[x] == L)
        if not mods:
            continue
        print("%s  (%d modules)" % (L, len(mods)))
        for m in mods:
            deps = sorted(os.path.basename(d) for d in edges[m])
            print("  %-22s -> %s" % (os.path.basename(m), ", ".join(deps) if deps else "-"))
    bad = 0
    for u in unresolved:
        print("FAIL unresolved include %s" % u)
        bad += 1
    for c in sccs:
        print("FAIL include cycle: %s" % " <-> ".join(c))
        bad += 1
    for u in upward:
        print("FAIL include against the layers: %s" % u)
        bad += 1
    n_edges = sum(len(v) for v in edges.values())
    print("include-graph: %d modules, %d arrows, %d cycles, %d upward arrows, %d unresolved"
          % (len(edges), n_edges, len(sccs), len(upward), len(unresolved)))
    print("%d passed, %d failed" % (1 if bad == 0 else 0, 1 if bad else 0))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
