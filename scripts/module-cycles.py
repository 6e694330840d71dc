#!/usr/bin/env python3
"""Prints the cycles between the top-level modules of each crate under crates/.

A crate's top-level modules are its files src/foo.rs and folders src/foo/
(the crate roots lib.rs and main.rs are not modules of their own). Module A
depends on module B when a file of A names B by path: `crate::B`,
`$crate::B`, `super::…::B` resolving to B, or B inside a
`use crate::{…}` group. A file in a folder (src/foo/bar.rs) counts toward
its top-level module (foo). Comments, strings and character literals are
stripped first, so prose and messages naming a module make no edge.

A cycle is a strongly connected component of more than one module: modules
that cannot be understood, tested or moved one without the others. Prints
every cycle found; exits 1 when there is one, 0 otherwise.

    scripts/module-cycles.py [--crates DIR] [CRATE...]
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(src: str) -> str:
    """The source with comments, string and char literals blanked out
    (newlines kept), so only code is left to search."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
            continue
        if src.startswith("/*", i):
            # Block comments nest in Rust.
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if src[i] == "\n":
                        out.append("\n")
                    i += 1
            out.append(" ")
            continue
        # Raw strings: r"…", r#"…"#, br"…" (no escapes inside).
        m = re.match(r'b?r(#*)"', src[i:i + 260])
        if m and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        if c == '"' or (c == "b" and src.startswith('b"', i)
                        and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            j += 1
            out.append('""' + "\n" * src.count("\n", i, j))
            i = j
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{1F600}', '\''); a lifetime
            # ('a) has no closing quote and is kept as code.
            m = re.match(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'", src[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def group_heads(text: str, start: int) -> list[str]:
    """The first name of each item of the `{…}` group opening at `start`."""
    depth, item, heads = 0, [], []
    for c in text[start:]:
        if c == "{":
            depth += 1
            if depth == 1:
                continue
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        if depth == 1 and c == ",":
            heads.append("".join(item))
            item = []
        else:
            item.append(c)
    heads.append("".join(item))
    names = []
    for h in heads:
        m = re.match(r"\s*(" + IDENT + ")", h)
        if m:
            names.append(m.group(1))
    return names


def file_module_path(src_dir: Path, f: Path) -> list[str]:
    """The module path of a file: src/a.rs -> [a], src/a/mod.rs -> [a],
    src/a/b.rs -> [a, b]."""
    parts = list(f.relative_to(src_dir).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return parts


def references(text: str, path: list[str]) -> set[str]:
    """The top-level modules the code names, given the module path of its
    file. Inline `mod x { … }` blocks shift what `super` means inside them."""
    found = set()
    # Where each inline module's body starts and ends, to know the module
    # path at any offset.
    inline = []  # (start, end, name)
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, j = 0, m.end() - 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        inline.append((m.end(), j, m.group(1)))

    def path_at(pos: int) -> list[str]:
        return path + [name for (s, e, name) in inline if s <= pos < e]

    for m in re.finditer(r"(?<![A-Za-z0-9_])\$?crate\s*::\s*(\{|" + IDENT + ")", text):
        if m.group(1) == "{":
            found.update(group_heads(text, m.end() - 1))
        else:
            found.add(m.group(1))
    for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:super\s*::\s*)+)(\{|" + IDENT + ")", text):
        ups = m.group(1).count("super")
        here = path_at(m.start())
        if ups > len(here):
            continue
        base = here[: len(here) - ups]
        if base:
            # Still inside a top-level module: names its own submodule.
            found.add(base[0])
            continue
        if m.group(2) == "{":
            found.update(group_heads(text, m.end() - 1))
        else:
            found.add(m.group(2))
    return found


def crate_graph(src_dir: Path) -> dict[str, set[str]]:
    # A module is its file src/foo.rs, its folder src/foo/, or both.
    modules: dict[str, list[Path]] = {}
    for p in sorted(src_dir.iterdir()):
        if p.is_file() and p.suffix == ".rs" and p.stem not in ("lib", "main"):
            modules.setdefault(p.stem, []).append(p)
        elif p.is_dir() and p.name != "bin":
            modules.setdefault(p.name, []).extend(sorted(p.rglob("*.rs")))
    graph = {}
    for name, files in modules.items():
        deps = set()
        for f in files:
            text = strip(f.read_text(encoding="utf-8"))
            deps |= references(text, file_module_path(src_dir, f))
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crates", type=Path, default=ROOT / "crates")
    ap.add_argument("crate", nargs="*", help="only these crates (default: all)")
    args = ap.parse_args()
    failed = False
    for crate in sorted(p for p in args.crates.iterdir() if (p / "src").is_dir()):
        if args.crate and crate.name not in args.crate:
            continue
        graph = crate_graph(crate / "src")
        for comp in cycles(graph):
            failed = True
            # Each module's edges inside the component: where to cut.
            edges = "; ".join(
                f"{m} -> {', '.join(sorted(graph[m] & set(comp)))}" for m in comp
            )
            print(f"{crate.name}: cycle {' <-> '.join(comp)}\n    {edges}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
