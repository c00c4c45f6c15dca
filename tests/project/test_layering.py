"""The layering of autosp's packages (docs/design.md section 1), read from the source, lazy imports included:

- ``cost_models`` imports nothing from ``planner``, ``compiler`` or ``profiling``;
- ``profiling`` (calibration, graph profiling: the tools that produce the profiles the cost model reads)
  imports nothing from ``planner`` or ``compiler``;
- ``planner`` imports nothing from ``compiler``;
- ``compiler`` imports the planner only through ``autosp.planner.plan`` (loading a plan), and only from
  ``autosp.compiler.api.load_plan``;
- the shared modules of ``autosp/`` (errors, version, units, files) import none of the packages;
- no module imports another that (directly or through others) imports it back;
- planning imports no torch, deepspeed or transformers.

Run as a script it prints the package-to-package import edges and the longest file of each package:
``.venv/bin/python tests/project/test_layering.py [REPO_ROOT]``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
FOLDERS = {"autosp": "autosp", "planner": "autosp.planner", "compiler": "autosp.compiler",
           "cost_models": "autosp.cost_models"}
SHARED = {"autosp.errors", "autosp.version", "autosp.units", "autosp.files", "autosp.messages", "autosp.guard"}
FACADE = {"autosp", "autosp.cli"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{module name: file} of the packages."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_main_guard(node) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _imports(tree) -> list[str]:
    """Every module name imported anywhere in ``tree`` (functions included), except under
    ``if __name__ == "__main__":`` (script entry points, never run on import)."""
    out = []

    def visit(node):
        if _is_main_guard(node):
            return
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.extend(f"{node.module}.{alias.name}" for alias in node.names)  # resolved against modules below
            out.append(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the autosp modules it imports}. ``from package import submodule`` is an edge to the
    submodule only; a parent package's ``__init__``, which any import of its children runs, is an edge only
    where a module imports it by name (``import autosp``)."""
    mods = modules(root)
    graph = {}
    for name, path in mods.items():
        targets = {imported for imported in _imports(ast.parse(path.read_text(encoding="utf-8")))
                   if imported in mods and imported != name}
        # `from pkg import sub` lists both pkg and pkg.sub: keep pkg only if a name other than a submodule
        # was taken from it
        for imported in list(targets):
            subs = [t for t in targets if t.startswith(imported + ".")]
            if subs and not _takes_names(path, imported, mods):
                targets.discard(imported)
        graph[name] = targets
    return graph


def _takes_names(path: Path, package: str, mods: dict) -> bool:
    """Whether ``path`` imports a name from ``package`` that is not one of its submodules (or imports the
    package itself with ``import``)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == package and node.level == 0:
            if any(f"{package}.{alias.name}" not in mods for alias in node.names):
                return True
        if isinstance(node, ast.Import) and any(alias.name == package for alias in node.names):
            return True
    return False


def package_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("planner", "compiler", "cost_models", "profiling"):
        return parts[1]
    return "autosp (shared)" if module in SHARED else "autosp (facade)"


def package_edges(graph) -> Counter:
    edges = Counter()
    for src, targets in graph.items():
        for dst in targets:
            a, b = package_of(src), package_of(dst)
            if a != b:
                edges[(a, b)] += 1
    return edges


def cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def longest_files(root: Path = ROOT) -> dict[str, tuple[str, int]]:
    out = {}
    for name, path in modules(root).items():
        package = package_of(name).split(" ")[0]
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > out.get(package, ("", 0))[1]:
            out[package] = (str(path.relative_to(root)), lines)
    return out


# -- the tests ---------------------------------------------------------------------------------------

GRAPH = import_graph()


def _violations(rule) -> list[str]:
    return sorted(f"{src} -> {dst}" for src, targets in GRAPH.items() for dst in targets if not rule(src, dst))


def test_cost_models_import_neither_the_planner_nor_the_compiler():
    assert _violations(lambda s, d: package_of(s) != "cost_models" or package_of(d) in ("cost_models", "autosp (shared)")) == []


def test_profiling_imports_neither_the_planner_nor_the_compiler():
    assert _violations(lambda s, d: package_of(s) != "profiling"
                       or package_of(d) in ("profiling", "cost_models", "autosp (shared)")) == []


def test_the_planner_never_imports_the_compiler():
    assert _violations(lambda s, d: package_of(s) != "planner" or package_of(d) != "compiler") == []
    assert _violations(lambda s, d: package_of(s) != "planner" or package_of(d) != "autosp (facade)") == []


def test_the_compiler_reads_the_planner_only_by_loading_a_plan():
    assert _violations(lambda s, d: package_of(s) != "compiler" or package_of(d) != "planner"
                       or (s, d) == ("autosp.compiler.api", "autosp.planner.plan")) == []
    assert _violations(lambda s, d: package_of(s) != "compiler" or package_of(d) != "autosp (facade)") == []


def test_the_shared_modules_import_none_of_the_packages():
    assert _violations(lambda s, d: s not in SHARED or d in SHARED) == []


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_the_graph_reader_sees_lazy_imports_and_cycles():
    """The checks above are only as good as the reader: it must see an import inside a function, skip the
    script guard, and find a cycle."""
    assert "autosp.planner.plan" in GRAPH["autosp.compiler.api"]  # imported inside load_plan()
    assert "autosp.cli" not in GRAPH["autosp.compiler.train_cli"]  # only under if __name__ == "__main__"
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_planning_imports_no_torch_deepspeed_or_transformers(tmp_path):
    """Every planner module, and a plan, a check and a selection, in a fresh process."""
    code = f"""
import importlib, pkgutil, sys
import autosp.planner
for info in pkgutil.walk_packages(autosp.planner.__path__, "autosp.planner."):
    importlib.import_module(info.name)
from autosp.planner.api import plan_for
from autosp.planner.check import check, select
from autosp.planner.plan import save_plan
from autosp.planner.request import PlanRequest
plan = plan_for(PlanRequest(model="llama-3.2-1b", ctx="32k", hw="h100x8"))
save_plan(plan, r"{tmp_path}/plan.json")
assert check(r"{tmp_path}/plan.json", cache=None)["exit_code"] == 0
assert select([r"{tmp_path}/plan.json"], cache=None)["exit_code"] == 0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "transformers"))
print("HEAVY", heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout, out.stdout


def main(argv=None) -> int:
    root = Path((argv or sys.argv[1:] or [ROOT])[0]).resolve()
    graph = import_graph(root)
    print(f"package import edges of {root} (module imports, lazy ones included):")
    for (a, b), n in sorted(package_edges(graph).items()):
        print(f"  {a:<16} -> {b:<16} {n:3d}")
    found = cycles(graph)
    print(f"module import cycles: {len(found)}" + "".join(f"\n  {' <-> '.join(c)}" for c in found))
    print("longest file of each package:")
    for package, (path, lines) in sorted(longest_files(root).items()):
        print(f"  {package:<12} {path:<48} {lines:5d} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
