#!/usr/bin/env bash
# benches/structure.sh REV... : structure measurements of committed trees
# (issue 14 asks for them "before and after" the restructuring).
#
#   bash benches/structure.sh                 # HEAD
#   bash benches/structure.sh 4114465 HEAD    # before and after, as in
#                                             # benches/results/structure.md
#
# For every revision it exports the committed tree (`git archive REV`, so
# uncommitted edits never count) into a temporary directory and measures:
#
#   1. layers and back-arrows: every reference from one top-level module of
#      src/ to another (`use crate::x`, `crate::x::` paths, `super::` chains
#      that climb out to the crate root, `urutan::x` from the binary), the
#      ones that point up the layer order below, and cycles;
#   2. imports per module: distinct other modules named, `use` statements;
#   3. the longest functions of the product (src/ without its unit tests);
#   4. duplicated code: the `duplicates` command on the whole tree and on src/;
#   5. lines: product, unit tests, tests/, benches/, and harness per product.
#
# It prints Markdown: a summary table over all revisions, then one section per
# revision. It builds and runs nothing of the project (no cargo): it reads the
# files as text. Needs git, tar and python3; `duplicates` is optional (section
# 4 says so when it is missing).
set -euo pipefail

if ! command -v python3 >/dev/null 2>&1; then
    echo "structure.sh: python3 is needed (it parses the Rust sources); install it and run again" >&2
    exit 2
fi

# The repository this script belongs to (wherever it is called from).
repo=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
if [ "$#" -eq 0 ]; then
    set -- HEAD
fi

# How long `duplicates` may take per call (its --seconds), and its row limit.
DUP_SECONDS=${DUP_SECONDS:-120}
DUP_MOST=${DUP_MOST:-200}
# DUPLICATES=none leaves section 4 out (a quick run).
DUPLICATES=${DUPLICATES:-duplicates}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/structure.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP   # so that the EXIT trap cleans up on a signal too

py="$tmp/structure.py"
cat >"$py" <<'PY'
"""Parsing and reporting half of benches/structure.sh (see there).

Subcommands:
  code  TREE JSON     sections 1-3 (layers, imports, longest functions)
  dups  WHOLE SRC JSON SECONDS MOST  section 4 from the two outputs of `duplicates`
  lines TREE JSON     section 5 (line counts)
  summary JSON...     the before/after table
Each writes its figures into JSON (one file per revision) for `summary`.
"""
import json
import os
import re
import sys
from collections import defaultdict

# ---------------------------------------------------------------------------
# The layer order, bottom first. A reference may point to its own layer or to
# a lower one; one that points to a higher layer is a back-arrow.
#
# Derived from /work/shared/architecture.md ("Dependencies point inward: the
# core never imports lapin or sqlx"; config, message and outcome are the pure
# core; store and broker are the edges; shard, outbox, effects and the
# resharding code are built on them; supervisor and the operator commands sit
# above; demo and main on top), refined by reading the crate's actual
# `use crate::...` references:
#   * metrics and telemetry are vocabularies (metric names, the RetryReason
#     enum, log setup) that import only the core and that the store, the
#     shard and the resharding code use: they sit just above the core, not
#     with http;
#   * health (readiness state) uses store::ping and is used by shard,
#     reshard and the outbox relay: one layer above the edges;
#   * before the resharding wing, ring, handoff and retire were top-level
#     modules: they take reshard's place;
#   * dlq stays with the operator commands, where architecture.md puts it
#     (`urutan dlq` lists and replays), so a worker reaching into it shows up.
# A top-level module missing from this list is reported as unplaced and its
# references are not judged.
LAYERS = [
    ("core (pure)", ["message", "outcome", "config", "rfc3339"]),
    ("vocabulary", ["metrics", "telemetry"]),
    ("edges (I/O)", ["store", "broker"]),
    ("readiness, records", ["health", "dead_letter"]),
    ("ordering", ["reshard", "ring", "handoff", "retire", "shard", "outbox", "effects"]),
    ("services and commands", ["supervisor", "dlq", "ops", "verify", "http"]),
    ("binary", ["demo", "commands", "main"]),
]
LAYER_OF = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}


def rel(path, tree):
    return os.path.relpath(path, tree)


def rust_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            if f.endswith(".rs"):
                out.append(os.path.join(dirpath, f))
    return out


# ---------------------------------------------------------------------------
# Lexing: a copy of the source of the same length and the same line breaks,
# comments blanked to spaces and the insides of string and char literals
# replaced by '_' (so braces, `crate::` and `;` in them do not count, while a
# line of a multi-line string still counts as a line of code).

RAW_START = re.compile(r'b?r(#*)"')


def clean(text):
    out = list(text)
    n = len(text)

    def blank(a, b, comment):
        for k in range(a, b):
            c = text[k]
            if c == "\n":
                continue
            out[k] = " " if comment or c.isspace() else "_"

    i = 0
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j, True)
            i = j
        elif c == "/" and text.startswith("/*", i):
            depth, j = 0, i
            while j < n:  # block comments nest in Rust
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                    if depth == 0:
                        break
                else:
                    j += 1
            blank(i, j, True)
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) \
                and RAW_START.match(text, i):
            m = RAW_START.match(text, i)
            end = text.find('"' + m.group(1), m.end())
            end = n if end < 0 else end
            blank(m.end(), end, False)
            i = end + 1 + len(m.group(1))
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n), False)
            i = j + 1
        elif c == "'":
            # char literal ('x', '\n', '\u{..}', '{') or a lifetime ('a, 'static)
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 3)
                j = n if j < 0 else j
                blank(i + 1, j, False)
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                blank(i + 1, i + 2, False)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def line_starts(text):
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    return starts


def line_of(starts, offset):
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1  # 1-based


def match_brace(code, open_idx):
    """Offset of the brace closing the one at open_idx (or the end)."""
    depth = 0
    for k in range(open_idx, len(code)):
        ch = code[k]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(code) - 1


def item_end(code, start):
    """From start, the end of the next item: (offset of its '{', offset of its
    closing '}') or (None, offset of its ';'). Skips ';' inside [] and ()."""
    depth = 0
    for k in range(start, len(code)):
        ch = code[k]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0 and ch == "{":
            return k, match_brace(code, k)
        elif depth == 0 and ch == ";":
            return None, k
    return None, len(code) - 1


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
INLINE_MOD = re.compile(r"(?<![\w:])mod\s+(\w+)\s*\{")
MOD_DECL = re.compile(r"(?<![\w:])mod\s+(\w+)\s*;")


class Source:
    """One .rs file: its text, cleaned text, test lines, inline modules."""

    def __init__(self, path):
        with open(path, encoding="utf-8", errors="replace") as f:
            self.text = f.read()
        self.path = path
        self.code = clean(self.text)
        self.starts = line_starts(self.code)
        self.lines = self.code.split("\n")
        self.raw_lines = self.text.split("\n")
        # `#[cfg(test)]` items (in practice `mod tests { ... }`): their lines,
        # and the files of `#[cfg(test)] mod x;` declarations.
        self.test_lines = set()
        self.test_mod_files = []
        for m in CFG_TEST.finditer(self.code):
            open_, close = item_end(self.code, m.end())
            first, last = line_of(self.starts, m.start()), line_of(self.starts, close)
            self.test_lines.update(range(first, last + 1))
            if open_ is None:
                decl = MOD_DECL.search(self.code, m.end(), close + 1)
                if decl:
                    self.test_mod_files.append(decl.group(1))
        # inline `mod name { ... }` blocks, for resolving `super::`
        self.inline_mods = []
        for m in INLINE_MOD.finditer(self.code):
            self.inline_mods.append((m.start(), match_brace(self.code, m.end() - 1), m.group(1)))

    def line(self, offset):
        return line_of(self.starts, offset)

    def is_test(self, offset):
        return self.line(offset) in self.test_lines

    def inline_path(self, offset):
        return [name for (a, b, name) in sorted(self.inline_mods) if a <= offset <= b]


# ---------------------------------------------------------------------------
# The crate's modules: src/lib.rs declares the library's top-level modules,
# src/main.rs the binary's (`mod demo;` since the demo left the library).


def test_mod_paths(path, names):
    """The files of `#[cfg(test)] mod name;` declared in the file at path."""
    base = os.path.dirname(path) if os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs") \
        else path[:-3]
    out = set()
    for name in names:
        out.add(os.path.join(base, name + ".rs"))
        out.add(os.path.join(base, name, "mod.rs"))
    return out


def declared_mods(src):
    code = clean(src.text)
    return [m.group(1) for m in MOD_DECL.finditer(code)]


def module_path(src_dir, path):
    """src/a.rs and src/a/mod.rs -> [a]; src/a/b.rs -> [a, b]."""
    parts = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


USE_STMT = re.compile(r"(?<![\w:])use\s+([^;]*);")  # strings are blanked: no ';' in them
USE_TOKEN = re.compile(r"\w+|::|[{},*]")
INLINE_REF = re.compile(r"(?<![\w:$])((?:super\s*::\s*)+|crate\s*::\s*|urutan\s*::\s*|self\s*::\s*)(\w+)")


def parse_use_tree(tokens):
    """`a::b::{self, c as d, e::*}` -> [[a,b,self],[a,b,c],[a,b,e,*]]; each
    segment is (name, offset)."""
    paths = []

    def tree(i, prefix):
        path = list(prefix)
        while i < len(tokens):
            tok, off = tokens[i]
            if tok == "{":
                i += 1
                while i < len(tokens) and tokens[i][0] != "}":
                    i = tree(i, path)
                    if i < len(tokens) and tokens[i][0] == ",":
                        i += 1
                return i + 1
            if tok == "*":
                paths.append(path + [("*", off)])
                return i + 1
            if tok in (",", "}"):
                paths.append(path)
                return i
            if tok == "as":
                i += 2
                continue
            if tok != "::":
                path = path + [(tok, off)]
            i += 1
        paths.append(path)
        return i

    tree(0, [])
    return [p for p in paths if p]


def analyse_code(tree):
    src_dir = os.path.join(tree, "src")
    lib_mods, bin_mods = [], []
    if os.path.exists(os.path.join(src_dir, "lib.rs")):
        lib_mods = declared_mods(Source(os.path.join(src_dir, "lib.rs")))
    if os.path.exists(os.path.join(src_dir, "main.rs")):
        bin_mods = declared_mods(Source(os.path.join(src_dir, "main.rs")))

    files = {}  # path -> (Source, top-level module, is binary)
    test_files = set()
    for path in rust_files(src_dir):
        mp = module_path(src_dir, path)
        if mp in (["lib"],):
            continue  # the library's root only declares the modules
        if mp == ["main"]:
            top, binary = "main", True
        else:
            top, binary = mp[0], mp[0] in bin_mods
        s = Source(path)
        files[path] = (s, top, binary)
        test_files.update(test_mod_paths(path, s.test_mod_files))

    refs = set()        # (from, to, file, line) outside unit tests
    use_stmts = defaultdict(int)
    crate_use_stmts = defaultdict(int)
    file_count = defaultdict(int)
    functions = []      # (lines, file, line, name)

    for path, (s, top, binary) in files.items():
        if path in test_files:
            continue
        file_count[top] += 1
        mp = ["main"] if top == "main" else module_path(src_dir, path)
        root_file = mp == ["main"]
        local = bin_mods if binary else lib_mods

        def resolve(segments, offset):
            """The top-level module a path names, or None (external, internal)."""
            names = [n for n, _ in segments]
            head = names[0]
            if head == "crate" and len(names) > 1:
                return names[1] if names[1] in local else None
            if head == "urutan" and binary and len(names) > 1:
                return names[1] if names[1] in lib_mods else None
            if head == "super":
                here = ([] if root_file else mp) + s.inline_path(offset)
                k = 0
                while k < len(names) and names[k] == "super":
                    k += 1
                if k == len(here) and k < len(names):
                    return names[k] if names[k] in local else None
                return None  # stays inside its own top-level module
            if head == "self" and root_file and len(names) > 1:
                return names[1] if names[1] in local else None
            if root_file and head in local and len(names) > 1:
                return head
            return None

        def add(target, offset):
            if target and target != top and not s.is_test(offset):
                refs.add((top, target, rel(path, tree), s.line(offset)))

        spans = []
        for m in USE_STMT.finditer(s.code):
            spans.append((m.start(), m.end()))
            if s.is_test(m.start()):
                continue
            use_stmts[top] += 1
            tokens = [(t.group(0), m.start(1) + t.start()) for t in USE_TOKEN.finditer(m.group(1))]
            crate_use = False
            for p in parse_use_tree(tokens):
                target = resolve(p, p[0][1])
                if p[0][0] in ("crate", "super", "self") or (p[0][0] == "urutan" and binary):
                    crate_use = True
                if target:
                    # the line of the segment naming the module
                    seg = p[1] if p[0][0] in ("crate", "urutan", "self") else \
                        next((q for q in p if q[0] != "super"), p[0])
                    add(target, seg[1])
            if crate_use:
                crate_use_stmts[top] += 1

        def in_use(offset):
            return any(a <= offset < b for a, b in spans)

        for m in INLINE_REF.finditer(s.code):
            if in_use(m.start()):
                continue
            segs = [(x, m.start()) for x in re.split(r"\s*::\s*", m.group(1).strip()) if x]
            add(resolve(segs + [(m.group(2), m.start(2))], m.start()), m.start(2))
        if root_file:  # bare `demo::x` in main.rs
            for m in re.finditer(r"(?<![\w:])(\w+)\s*::", s.code):
                if m.group(1) in local and not in_use(m.start()):
                    add(m.group(1), m.start())

        # functions with a body, outside unit tests
        for m in re.finditer(r"(?<![\w])fn\s+(\w+)", s.code):
            if s.is_test(m.start()):
                continue
            open_, close = item_end(s.code, m.end())
            if open_ is None:
                continue
            first, last = s.line(m.start()), s.line(close)
            functions.append((last - first + 1, rel(path, tree), first, m.group(1)))

    return {
        "lib_mods": lib_mods, "bin_mods": bin_mods, "files": files, "refs": refs,
        "use_stmts": use_stmts, "crate_use_stmts": crate_use_stmts,
        "file_count": file_count, "functions": functions,
    }


def sccs(nodes, edges):
    """Strongly connected components (Tarjan), those with more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def snippet(tree, file, line):
    with open(os.path.join(tree, file), encoding="utf-8", errors="replace") as f:
        text = f.read().split("\n")[line - 1].strip()
    return text if len(text) <= 100 else text[:97] + "..."


def cmd_code(tree, out_json):
    a = analyse_code(tree)
    refs = a["refs"]
    summary = {}
    tops = sorted(set(t for (_, t, _) in a["files"].values()))
    print("### 1. Layers and back-arrows\n")
    print("Layer order, bottom first (defined in benches/structure.sh): a module may")
    print("name modules of its own layer or below; naming one of a higher layer is a")
    print("back-arrow. Only the modules present at this revision are shown.\n")
    print("| layer | modules |")
    print("|---|---|")
    for i, (name, mods) in enumerate(LAYERS):
        present = [m for m in mods if m in tops]
        if present:
            print(f"| {i} {name} | {', '.join(present)} |")
    unplaced = [t for t in tops if t not in LAYER_OF]
    if unplaced:
        print(f"| (unplaced, not judged) | {', '.join(unplaced)} |")
    print()

    edges = defaultdict(set)
    edge_refs = defaultdict(list)
    for (f, t, file, line) in refs:
        edges[f].add(t)
        edge_refs[(f, t)].append((file, line))
    n_edges = sum(len(v) for v in edges.values())
    back = sorted(r for r in refs if r[0] in LAYER_OF and r[1] in LAYER_OF
                  and LAYER_OF[r[1]] > LAYER_OF[r[0]])
    back_edges = sorted(set((f, t) for (f, t, _, _) in back))
    print(f"References between top-level modules: **{len(refs)}** (a reference is a line")
    print("of product code naming another module: in a `use`, a `crate::x::` path, a")
    print("`super::` chain out of the module, or `urutan::x` from the binary; unit tests")
    print(f"and comments, doc links included, left out), over **{n_edges}** distinct module edges.\n")
    print(f"Back-arrows: **{len(back)}** references over **{len(back_edges)}** module edges.\n")
    for (f, t, file, line) in back:
        print(f"- `{file}:{line}` {f} ({LAYER_OF[f]}) -> {t} ({LAYER_OF[t]}): `{snippet(tree, file, line)}`")
    if back:
        print()
    cycles = sccs(tops, edges)
    if cycles:
        print("Cycles between top-level modules (each group reaches itself):\n")
        for c in cycles:
            inner = [f"{f} -> {t} ({len(edge_refs[(f, t)])})" for f in c for t in sorted(edges[f]) if t in c]
            print(f"- {{{', '.join(c)}}}: {'; '.join(inner)}")
        print()
    else:
        print("Cycles between top-level modules: none.\n")
    same = sorted((f, t) for f in edges for t in edges[f]
                  if f in LAYER_OF and t in LAYER_OF and LAYER_OF[f] == LAYER_OF[t])
    if same:
        print("Edges within one layer (allowed): " +
              ", ".join(f"{f} -> {t} ({len(edge_refs[(f, t)])})" for f, t in same) + ".\n")

    # 2. imports per module
    print("### 2. Imports per module\n")
    print("Per top-level module: the other crate modules it names (references in")
    print("brackets), its `use` statements (all; those of crate paths), files.")
    print("Product code only. Top 10 by modules named, then `use` statements.\n")
    rows = []
    for top in tops:
        named = sorted(edges.get(top, ()))
        rows.append((len(named), a["use_stmts"][top], top, named))
    rows.sort(key=lambda r: (-r[0], -r[1], r[2]))
    print("| module | modules named | use statements (crate) | files | names |")
    print("|---|---:|---:|---:|---|")
    for n, uses, top, named in rows[:10]:
        names = ", ".join(f"{t} ({len(edge_refs[(top, t)])})" for t in named)
        print(f"| {top} | {n} | {uses} ({a['crate_use_stmts'][top]}) | {a['file_count'][top]} | {names} |")
    print()
    if len(rows) > 10:
        print("Others: " + ", ".join(f"{r[2]} {r[0]}" for r in rows[10:]) + ".\n")

    # 3. longest functions
    funcs = sorted(a["functions"], key=lambda f: (-f[0], f[1], f[2]))
    print("### 3. Longest functions (product)\n")
    print("From `fn name` to its closing brace (signature, blank and comment lines")
    print(f"included), in src/ outside `#[cfg(test)]`. {len(funcs)} functions with a body;")
    n50 = sum(1 for f in funcs if f[0] >= 50)
    n100 = sum(1 for f in funcs if f[0] >= 100)
    print(f"{n50} of 50 lines or more, {n100} of 100 or more.\n")
    print("| lines | function | where |")
    print("|---:|---|---|")
    for n, file, line, name in funcs[:10]:
        print(f"| {n} | `{name}` | `{file}:{line}` |")
    print()

    top_row = rows[0] if rows else (0, 0, "-", [])
    lib_rows = [r for r in rows if r[2] in a["lib_mods"]]
    lib_row = lib_rows[0] if lib_rows else (0, 0, "-", [])
    summary.update({
        "modules": len(tops),
        "refs": len(refs), "edges": n_edges,
        "back_refs": len(back), "back_edges": len(back_edges),
        "back_list": [f"{file}:{line} {f}->{t}" for (f, t, file, line) in back],
        "cycles": ["{" + ", ".join(c) + "}" for c in cycles],
        "max_imports": f"{top_row[0]} ({top_row[2]}); library: {lib_row[0]} ({lib_row[2]})",
        "max_use": max(((a["use_stmts"][t], t) for t in tops), default=(0, "-")),
        "longest": f"{funcs[0][0]} (`{funcs[0][3]}`, {funcs[0][1]})" if funcs else "-",
        "fn50": n50, "fn100": n100,
    })
    save(out_json, summary)


# ---------------------------------------------------------------------------
# 4. duplicates: parse its header line and rows.

HEADER = re.compile(r"^(\d+) pairs? of places \((\d+) files? read\)(.*)$")


def parse_dups(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    r = {"pairs": None, "files": None, "shape": 0, "boilerplate": 0, "rows": [],
         "notes": [], "first": lines[0] if lines else "(no output)"}
    if not lines:
        return r
    m = HEADER.match(lines[0])
    if m:
        r["pairs"], r["files"] = int(m.group(1)), int(m.group(2))
        s = re.search(r"(\d+) by shape alone", m.group(3))
        b = re.search(r"(\d+) of those marked boilerplate", m.group(3))
        r["shape"] = int(s.group(1)) if s else 0
        r["boilerplate"] = int(b.group(1)) if b else 0
    elif lines[0].startswith("no duplicates"):
        r["pairs"] = 0
    for line in lines[1:]:
        if re.match(r"^D\d+ ", line):
            r["rows"].append(line)
        elif line.startswith(("incomplete:", "left out:", "(+")):
            r["notes"].append(line)
    return r


def cmd_dups(whole, src, out_json, seconds, most):
    print("### 4. Duplicated code\n")
    if whole == "-":
        print("Not measured: the `duplicates` command is not installed here (or DUPLICATES=none).\n")
        save(out_json, {"dup_whole": "-", "dup_src": "-"})
        return
    print(f"`duplicates --repo DIR --most {most} --seconds {seconds}` on the exported tree")
    print("(every file of the commit; it reads source and build files, not prose or")
    print("data) and on its src/. Pairs of places sharing 6 or more lines: exact, or")
    print("alike only by shape (other names and values), of which boilerplate.\n")
    print("| tree | pairs | exact | shape | of which boilerplate | files read | rows shown (exact / shape / boilerplate) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    summary = {}
    parsed = {}
    for label, key, path in (("whole tree", "dup_whole", whole), ("src/", "dup_src", src)):
        r = parse_dups(path)
        parsed[label] = r
        rows = r["rows"]
        rs = sum(1 for x in rows if "shape" in x.split()[4:])
        rb = sum(1 for x in rows if "boilerplate" in x.split()[4:])
        if r["pairs"] is None:
            print(f"| {label} | ? | | | | | first line: `{r['first']}` |")
            summary[key] = "?"
            continue
        exact = r["pairs"] - r["shape"]
        print(f"| {label} | {r['pairs']} | {exact} | {r['shape']} | {r['boilerplate']} | "
              f"{r['files'] or 0} | {len(rows)} ({len(rows) - rs} / {rs} / {rb}) |")
        summary[key] = f"{r['pairs']} ({exact} exact, {r['shape'] - r['boilerplate']} shape, {r['boilerplate']} boilerplate)"
        summary[key + "_n"] = r["pairs"]
    print()
    for label, r in parsed.items():
        for note in r["notes"]:
            if not note.startswith("(+"):
                print(f"- {label}: `{note}`")
    folders = defaultdict(int)
    for x in parsed["whole tree"]["rows"]:
        sides = x.split()[1:4:2]
        key = " ~ ".join(sorted(p.split("/")[0] if "/" in p else "(top)" for p in sides))
        folders[key] += 1
    if folders:
        print("\nRows of the whole tree by the folders of their two sides: " +
              ", ".join(f"{k} {v}" for k, v in sorted(folders.items(), key=lambda kv: (-kv[1], kv[0])))
              + ".")
    whole_rows = [x for x in parsed["whole tree"]["rows"] if "boilerplate" not in x.split()[4:]]
    if whole_rows:
        print("\nThe 10 largest pairs of the whole tree that are not boilerplate:\n")
        print("```")
        for x in whole_rows[:10]:
            print(x)
        print("```")
    print()
    save(out_json, summary)


# ---------------------------------------------------------------------------
# 5. lines: non-blank lines that are not only comment.


def code_lines(path, whole_file_is_test=False):
    s = Source(path)
    prod = test = 0
    for i, line in enumerate(s.lines, start=1):
        if line.strip():
            if whole_file_is_test or i in s.test_lines:
                test += 1
            else:
                prod += 1
    return prod, test


def script_lines(path):
    n = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            t = line.strip()
            if t and not t.startswith("#"):
                n += 1
    return n


def cmd_lines(tree, out_json):
    src = os.path.join(tree, "src")
    product = unit = 0
    n_src = 0
    files = rust_files(src)
    test_files = set()
    for p in files:
        test_files.update(test_mod_paths(p, Source(p).test_mod_files))
    for p in files:
        a, b = code_lines(p, p in test_files)
        product, unit, n_src = product + a, unit + b, n_src + 1
    harness = {}
    scripts = {}
    for d in ("tests", "benches"):
        root = os.path.join(tree, d)
        files = rust_files(root) if os.path.isdir(root) else []
        harness[d] = (sum(sum(code_lines(p)) for p in files), len(files))
        sh = []
        for dirpath, _, names in os.walk(root):
            sh += [os.path.join(dirpath, f) for f in names if f.endswith((".sh", ".py"))]
        scripts[d] = (sum(script_lines(p) for p in sh), len(sh))
    total = harness["tests"][0] + harness["benches"][0]
    ratio = total / product if product else 0.0
    ratio_unit = (total + unit) / product if product else 0.0
    print("### 5. Lines of harness per line of product\n")
    print("Non-blank lines that are not only comment (doc comments are comment).")
    print("Product: src/**/*.rs outside `#[cfg(test)]` items; unit tests: inside them;")
    print("harness: tests/**/*.rs and benches/**/*.rs (deploy/ left out).\n")
    print("| part | lines | files |")
    print("|---|---:|---:|")
    print(f"| product (src/, no unit tests) | {product} | {n_src} |")
    print(f"| unit tests in src/ | {unit} | |")
    print(f"| tests/ (.rs) | {harness['tests'][0]} | {harness['tests'][1]} |")
    print(f"| benches/ (.rs) | {harness['benches'][0]} | {harness['benches'][1]} |")
    print(f"| **harness / product** | **{ratio:.2f}** | |")
    print(f"| (harness + unit tests) / product | {ratio_unit:.2f} | |")
    print()
    extra = [f"{d}/ {n} lines in {k} files" for d, (n, k) in scripts.items() if k]
    if extra:
        print("Not counted above: shell and Python scripts (non-blank, non-`#` lines): "
              + "; ".join(extra) + ".\n")
    save(out_json, {"product": product, "unit": unit, "tests": harness["tests"][0],
                    "benches": harness["benches"][0], "ratio": f"{ratio:.2f}",
                    "ratio_unit": f"{ratio_unit:.2f}", "src_files": n_src})


# ---------------------------------------------------------------------------


def save(path, data):
    old = {}
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    old.update(data)
    with open(path, "w") as f:
        json.dump(old, f)


def cmd_summary(paths):
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    print("## Summary\n")
    print("| measure | " + " | ".join(r["label"] for r in runs) + " |")
    print("|---|" + "---|" * len(runs))

    def row(name, fn):
        print(f"| {name} | " + " | ".join(str(fn(r)) for r in runs) + " |")

    row("top-level modules / .rs files in src/", lambda r: f"{r.get('modules', '?')} / {r.get('src_files', '?')}")
    row("references between modules (module edges)", lambda r: f"{r.get('refs', '?')} ({r.get('edges', '?')})")
    row("**back-arrows**: references (module edges)", lambda r: f"**{r.get('back_refs', '?')}** ({r.get('back_edges', '?')})")
    row("cycles between modules", lambda r: ", ".join(r.get("cycles", [])) or "none")
    row("most modules named by one module", lambda r: r.get("max_imports", "?"))
    row("most `use` statements in one module", lambda r: "{} ({})".format(*r.get("max_use", ["?", "?"])))
    row("longest function, lines", lambda r: r.get("longest", "?"))
    row("functions of 50+ / 100+ lines", lambda r: f"{r.get('fn50', '?')} / {r.get('fn100', '?')}")
    row("duplicate pairs, whole tree", lambda r: r.get("dup_whole", "?"))
    row("duplicate pairs, src/", lambda r: r.get("dup_src", "?"))
    row("product lines (unit-test lines)", lambda r: f"{r.get('product', '?')} ({r.get('unit', '?')})")
    row("harness lines: tests/ + benches/", lambda r: f"{r.get('tests', '?')} + {r.get('benches', '?')}")
    row("**harness / product**", lambda r: f"**{r.get('ratio', '?')}**")
    row("(harness + unit tests) / product", lambda r: r.get("ratio_unit", "?"))
    print()


def main(argv):
    cmd = argv[1]
    if cmd == "code":
        cmd_code(argv[2], argv[3])
    elif cmd == "dups":
        cmd_dups(argv[2], argv[3], argv[4], argv[5], argv[6])
    elif cmd == "lines":
        cmd_lines(argv[2], argv[3])
    elif cmd == "label":
        save(argv[2], {"label": argv[3]})
    elif cmd == "summary":
        cmd_summary(argv[2:])
    else:
        sys.exit(f"structure.py: unknown subcommand {cmd}")


main(sys.argv)
PY

# One revision: export it, measure it; its section goes to $tmp/section.N.md,
# its figures to $tmp/summary.N.json.
measure() {
    local n=$1 rev=$2 sha short subject tree out json label
    sha=$(git -C "$repo" rev-parse --verify --quiet "$rev^{commit}") || {
        echo "structure.sh: '$rev' is not a revision of $repo" >&2
        exit 2
    }
    short=$(git -C "$repo" rev-parse --short "$sha")
    subject=$(git -C "$repo" log -1 --format='%cs, %s' "$sha")
    if [ "${#subject}" -gt 120 ]; then
        subject="${subject:0:117}..."
    fi
    tree="$tmp/tree.$n"
    out="$tmp/section.$n.md"
    json="$tmp/summary.$n.json"
    mkdir -p "$tree"
    echo "structure.sh: $rev ($short): exporting" >&2
    git -C "$repo" archive "$sha" | tar -x -C "$tree"

    label=$rev
    case $sha in
        "$rev"*) ;;                      # an abbreviated hash already
        *) label="$rev ($short)" ;;
    esac
    python3 "$py" label "$json" "$label"
    {
        echo "## $label"
        echo
        echo "Commit of $subject"
        echo
    } >"$out"
    echo "structure.sh: $rev ($short): modules, imports, functions" >&2
    python3 "$py" code "$tree" "$json" >>"$out"

    if [ "$DUPLICATES" != none ] && command -v "$DUPLICATES" >/dev/null 2>&1; then
        echo "structure.sh: $rev ($short): duplicates (up to 2 x ${DUP_SECONDS} s)" >&2
        "$DUPLICATES" --repo "$tree" --most "$DUP_MOST" --seconds "$DUP_SECONDS" >"$tmp/dups-whole.$n.txt" 2>&1 || true
        "$DUPLICATES" --repo "$tree/src" --most "$DUP_MOST" --seconds "$DUP_SECONDS" >"$tmp/dups-src.$n.txt" 2>&1 || true
        python3 "$py" dups "$tmp/dups-whole.$n.txt" "$tmp/dups-src.$n.txt" "$json" "$DUP_SECONDS" "$DUP_MOST" >>"$out"
    else
        python3 "$py" dups - - "$json" "$DUP_SECONDS" "$DUP_MOST" >>"$out"
    fi

    echo "structure.sh: $rev ($short): lines" >&2
    python3 "$py" lines "$tree" "$json" >>"$out"
    rm -rf "$tree"
}

n=0
for rev in "$@"; do
    n=$((n + 1))
    measure "$n" "$rev"
done

# Everything measured: the summary table first, then each revision's section.
summaries=()
for i in $(seq 1 "$n"); do
    summaries+=("$tmp/summary.$i.json")
done
python3 "$py" summary "${summaries[@]}"
for i in $(seq 1 "$n"); do
    cat "$tmp/section.$i.md"
done
