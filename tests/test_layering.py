"""The package's layer order, enforced: lower layers never import higher ones, no import cycles,
no module over 800 lines.

The order is DESIGN.md's (formats at the bottom, cli at the top). Peers on one rung (``models`` and
``vllm_plugin``; ``recommend`` and ``gate``) may not import each other either. Every import counts,
including those inside functions and ``TYPE_CHECKING`` blocks: a deferred import is still a
dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "replayssm_quant"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# Bottom to top. Names on one rung are peers.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("interception",),
    ("formats",),
    ("precision",),
    ("ssm",),
    ("kernels",),
    ("models", "vllm_plugin"),
    ("evals",),
    ("results",),
    ("recommend", "gate"),
    ("report",),
    ("sweep",),
    ("cli",),
)
RANK = {name: i for i, rung in enumerate(LAYERS) for name in rung}
MAX_LINES = 800


def module_name(path: Path, root: Path) -> str:
    rel = path.with_suffix("").relative_to(root.parent)
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the package modules it imports (``from .x import y`` resolves to ``x.y`` when that
    is a module)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == root.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base[: len(base) - (node.level - 1)]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != root.name:
                    continue
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
                out.update(subs if len(subs) == len(node.names) else [target, *subs])
        graph[mod] = {t for t in out if t != mod}
    return graph


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package root


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up the order, sideways between peers, or into a layer the order does
    not name (a new top-level module must be placed in LAYERS)."""
    bad = []
    for mod, targets in sorted(graph.items()):
        src = layer_of(mod)
        for tgt in sorted(targets):
            dst = layer_of(tgt)
            if src is None or dst is None or src == dst:
                continue  # the package root only re-exports; imports inside one layer are free
            if src not in RANK or dst not in RANK:
                bad.append(f"{mod} -> {tgt}: layer {src if src not in RANK else dst!r} is not in LAYERS")
            elif RANK[dst] >= RANK[src]:
                bad.append(f"{mod} -> {tgt}: {src} may not import {dst}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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


def test_every_import_goes_down_the_layers():
    assert upward_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_no_module_over_800_lines():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


@pytest.mark.parametrize("src, dst", [("formats", "cli.app"), ("results.model", "report.render"),
                                      ("models.loading", "vllm_plugin.hooks")])
def test_the_check_catches_an_upward_or_sideways_import(src, dst):
    graph = {f"{PACKAGE}.{src}": {f"{PACKAGE}.{dst}"}, f"{PACKAGE}.{dst}": set()}
    assert len(upward_imports(graph)) == 1


def test_the_check_catches_a_cycle_and_an_unplaced_layer():
    a, b = f"{PACKAGE}.kernels.a", f"{PACKAGE}.kernels.b"
    assert cycles({a: {b}, b: {a}}) == [[a, b]]
    assert upward_imports({f"{PACKAGE}.newthing": {f"{PACKAGE}.formats"}}) != []


def test_relative_imports_resolve(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "formats.py").write_text("")
    (pkg / "kernels" / "__init__.py").write_text("from . import a\n")
    (pkg / "kernels" / "a.py").write_text("from ..formats import x\nfrom .. import cli\n")
    (pkg / "cli.py").write_text("")
    graph = import_graph(pkg)
    assert graph[f"{PACKAGE}.kernels"] == {f"{PACKAGE}.kernels.a"}
    assert graph[f"{PACKAGE}.kernels.a"] == {f"{PACKAGE}.formats", f"{PACKAGE}.cli"}
    assert upward_imports(graph) == [f"{PACKAGE}.kernels.a -> {PACKAGE}.cli: kernels may not import cli"]
