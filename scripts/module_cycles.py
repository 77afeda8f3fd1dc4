#!/usr/bin/env python3
"""Finds import circles between the modules (files) of each workspace crate.

    python3 scripts/module_cycles.py [CRATE_SRC_DIR ...]

A module depends on another when its non-test code names it by path
(`crate::a::b`, `super::b`, `self::b`). A module naming one of its ancestors
is not counted (a parent re-exports its children; the children may use what
it defines), so what is reported are circles between siblings and cousins:
`ops/conv.rs` uses `ops/quant.rs` which uses `ops/conv.rs`. Prints every
strongly connected component of two or more modules with one edge of each
pair as evidence; exit status 1 when there is one. Default: every `src/` of
the workspace's crates.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = ["compiler/ir", "compiler/onnx", "compiler/driver", "compiler/cli", "passes", "targets/cpu",
          "targets/cuda", "runtime", "runtime/format", "tests", "tests/kit", "python"]
PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{")


def module_of(src, path):
    """`src/ops/conv.rs` -> ('ops', 'conv'); `src/ops/mod.rs` -> ('ops',)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def strip_tests(text):
    """The file without its `#[cfg(test)] mod tests { ... }` tail."""
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(pub(\(crate\))? )?mod \w+ \{", text, re.M)
    return text[: m.start()] if m else text


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)


def resolve(modules, here, anchor, names):
    """The deepest known module that `anchor::names` reaches from `here`."""
    if anchor == "crate":
        base = ()
    elif anchor == "self":
        base = here
    else:  # super, possibly repeated: super::super::x
        base = here[:-1]
        while names and names[0] == "super":
            base, names = base[:-1], names[1:]
    best = None
    for i in range(len(names) + 1):
        cand = base + tuple(names[:i])
        if cand in modules:
            best = cand
    return best


USE_RE = re.compile(r"\bpub(?:\([^)]*\))? use ((?:self::|crate::)?[\w:]+?)::(\{[^}]*\}|\w+)\s*;")


def reexports(files, modules):
    """(module, item) -> the module defining `item` that `module` re-exports
    (`pub use conv::Conv;` in `ops/mod.rs`)."""
    out = {}
    for here, path in files.items():
        for m in USE_RE.finditer(strip_comments(path.read_text())):
            prefix, items = m.group(1), m.group(2).strip("{}")
            names = [n for n in prefix.split("::") if n]
            anchor = names.pop(0) if names[0] in ("crate", "self") else "self"
            target = resolve(modules, here, anchor, names)
            if target is None or target == here:
                continue
            for item in items.split(","):
                item = item.strip()
                alias = item.split(" as ")[-1].strip()
                if item and item not in ("self", "*"):
                    out[(here, alias)] = target
    return out


def crate_cycles(src):
    files = {module_of(src, p): p for p in src.rglob("*.rs")}
    modules = set(files)
    exported = reexports(files, modules)
    edges = {m: {} for m in modules}
    for here, path in files.items():
        text = strip_comments(strip_tests(path.read_text()))
        refs = [(a, n) for a, n in PATH_RE.findall(text)]
        refs += [(a, n) for a, n in GROUP_RE.findall(text)]
        # `use super::{a, b::c}`: the group's first-level names count too.
        for m in re.finditer(r"\b(crate|super|self)((?:::\w+)*)::\{([^}]*)\}", text):
            for item in m.group(3).split(","):
                item = item.strip().split(" as ")[0]
                if item and item != "self" and item != "*":
                    refs.append((m.group(1), m.group(2) + "::" + item))
        for anchor, names in refs:
            parts = [n for n in names.split("::") if n]
            target = resolve(modules, here, anchor, parts)
            # An item named through a re-export belongs to its own module.
            for name in parts:
                if target is not None and (target, name) in exported:
                    target = exported[(target, name)]
            if target is None or target == here or here[: len(target)] == target:
                continue  # itself, or an ancestor
            edges[here].setdefault(target, f"{path.relative_to(ROOT)}: {anchor}{names}")
    return strongly_connected(edges)


def strongly_connected(edges):
    """Tarjan's algorithm; components of two or more nodes."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [(c, {(a, b): edges[a][b] for a in c for b in c if b in edges[a]}) for c in out]


def main():
    dirs = [pathlib.Path(d) for d in sys.argv[1:]] or [ROOT / c / "src" for c in CRATES]
    found = 0
    for src in dirs:
        src = src.resolve()
        for comp, evidence in crate_cycles(src):
            found += 1
            names = ", ".join("::".join(m) or "<root>" for m in comp)
            print(f"{src.relative_to(ROOT)}: circle among {names}")
            for (a, b), where in sorted(evidence.items()):
                print(f"    {'::'.join(a)} -> {'::'.join(b)}   ({where})")
    print(f"{found} import circle(s) in {len(dirs)} crate(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
