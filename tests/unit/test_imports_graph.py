"""The import graph of tracr's own modules, read statically from the AST.

Every ``import`` counts, at module level or inside a function (a lazy import
is still a dependency): the graph must have no cycle, and the packages must
point one way: ``app.py -> app_api -> experiment_design, MyDatasets`` and
``MyDatasets -> experiment_design`` (datasets register themselves in the
registry that ``experiment_design`` owns; the registry finds them by package
name, the same discovery rule as every other extension point).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOPS = ("app_api", "experiment_design", "MyDatasets")
# package -> the tracr packages it may import (besides itself)
ALLOWED = {
    "app": {"app_api", "experiment_design", "MyDatasets"},
    "app_api": {"experiment_design", "MyDatasets"},
    "MyDatasets": {"experiment_design"},
    "experiment_design": set(),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    mods = {"app": REPO / "app.py"}
    for top in TOPS:
        for path in sorted((REPO / top).rglob("*.py")):
            mods[_module_name(path)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The most specific module of ours that ``name`` names (``a.b.C`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in mods:
            return cand
        parts.pop()
    return None


def _edges(mod: str, path: Path, mods: dict[str, Path]) -> set[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [f"{module}.{a.name}" for a in node.names]
        for n in names:
            target = _resolve(n, mods)
            if target and target != mod:
                out.add((target, node.lineno))
    return out


def _graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    lines: dict[tuple[str, str], int] = {}
    for mod, path in mods.items():
        for target, line in _edges(mod, path, mods):
            graph[mod].add(target)
            lines.setdefault((mod, target), line)
    return graph, lines


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_our_packages():
    graph, _ = _graph()
    assert "app_api.runner" in graph and "experiment_design.split" in graph
    assert any(t.startswith("experiment_design") for t in graph["app_api.runner"]) or any(
        t.startswith("experiment_design") for m, ts in graph.items() if m.startswith("app_api")
        for t in ts
    )


def test_the_import_graph_has_no_cycle():
    graph, lines = _graph()
    cycles = _cycles(graph)
    report = []
    for comp in cycles:
        members = set(comp)
        edges = [
            f"    {a} -> {b} (line {lines[(a, b)]})"
            for a in comp
            for b in sorted(graph[a] & members)
        ]
        report.append("cycle among " + ", ".join(comp) + ":\n" + "\n".join(edges))
    assert not cycles, "\n".join(report)


def test_packages_import_one_way():
    graph, lines = _graph()
    bad = []
    for mod, targets in graph.items():
        top = mod.split(".")[0]
        for t in sorted(targets):
            ttop = t.split(".")[0]
            if ttop != top and ttop not in ALLOWED[top]:
                bad.append(f"{mod} -> {t} (line {lines[(mod, t)]})")
    assert not bad, "imports against the package direction:\n" + "\n".join(bad)


def test_subpackages_have_no_cycle():
    """Collapsed to subpackages (``app_api.runner``, ``experiment_design.roles``, ...), the
    graph still has no cycle: a package does not reach back into one that depends on it."""
    graph, lines = _graph()
    sub: dict[str, set[str]] = {}
    via: dict[tuple[str, str], str] = {}
    for mod, targets in graph.items():
        a = ".".join(mod.split(".")[:2])
        sub.setdefault(a, set())
        for t in targets:
            b = ".".join(t.split(".")[:2])
            sub.setdefault(b, set())
            if a != b:
                sub[a].add(b)
                via.setdefault((a, b), f"{mod} -> {t} (line {lines[(mod, t)]})")
    cycles = _cycles(sub)
    report = []
    for comp in cycles:
        members = set(comp)
        report.append("cycle among " + ", ".join(comp) + ":\n" + "\n".join(
            f"    {via[(a, b)]}" for a in comp for b in sorted(sub[a] & members)))
    assert not cycles, "\n".join(report)


REASONS = ("for start-up time", "imported inside", "imported where")


def _says_why(lines: list[str], node: ast.stmt, doc: str) -> bool:
    """A comment on the import, above it (over the imports just before it), or a module
    docstring that says why its imports wait (:data:`REASONS`)."""
    if any(r in doc for r in REASONS):
        return True
    if any("#" in line for line in lines[node.lineno - 1: node.end_lineno]):
        return True
    i = node.lineno - 2
    while i >= 0:
        text = lines[i].strip()
        if text.startswith("#"):
            return True
        if not text.startswith(("from ", "import ")):
            return False
        i -= 1
    return False


def test_own_imports_inside_functions_say_why():
    """Imports of our own modules sit at the top of the file; one inside a function (kept
    there for start-up time: torch out of ``tracr --help`` and ``tracr experiment
    validate``, PyYAML out of ``tracr --help``) says so, at the import or once in the
    module docstring."""
    bad = []
    for path in _modules().values():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        doc = ast.get_docstring(tree) or ""
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and not inner.level:
                    names = [inner.module or ""]
                elif isinstance(inner, ast.Import):
                    names = [a.name for a in inner.names]
                else:
                    continue
                ours = [n for n in names if n.split(".")[0] in ("app", *TOPS)]
                if ours and not _says_why(lines, inner, doc):
                    bad.append(f"{path.relative_to(REPO)}:{inner.lineno} imports {ours[0]}")
    assert not bad, "imports of our own modules inside a function, with no reason given " \
        "(move them to the top, or say why they wait):\n" + "\n".join(sorted(set(bad)))
