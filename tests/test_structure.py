"""The package's shape: the tree is the architecture. pydsz's stages are folders ranked from what a device
needs (format/) to the command line (cli/); a module imports only its own stage and those below it, never
one above (imports inside functions included), and no circle. The decoder's stage imports nothing of
the others. No module so long that it mixes concerns, no public function so wide that its arguments
should travel as a bundle (a Budget, a Run, a Retraining)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pydsz"
MAX_LINES = 450
MAX_PARAMETERS = 8
MAX_TOP_MODULES = 12
# each stage's rank: a module may import from its own stage and those of a lower rank only
RANKS = {"": 0, "errors": 0, "context": 0, "tables": 0, "_core": 0,
         "format": 1, "gpu": 1, "model": 2, "budget": 2, "encode": 3, "assess": 4, "prune": 5, "compress": 6,
         "bench": 7, "cli": 8}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The pydsz modules `name` imports anywhere in its body, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule; `from mod import name` the module
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_finds_a_circle_when_there_is_one(tmp_path):
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_pydsz_has_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # a package's __init__ importing its own modules is how packages are built, not a circle
    graph = {name: {m for m in deps if not (m.startswith(name + ".") and modules[name].name == "__init__.py")}
             for name, deps in graph.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_is_over_the_line_limit(name):
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name}: {lines} lines, split it by concern"


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_every_module_is_in_a_ranked_stage():
    assert sorted({_stage(m) for m in _modules()} - set(RANKS)) == []


def test_no_import_runs_back_up_a_stage():
    """pydsz/__init__ names the encoder's entry points by string and imports them on first use
    (a device that only decodes never loads them): that is the one way down to up."""
    upward = sorted(f"{name} -> {dep}" for name, deps in _graph().items() if name != "pydsz"
                    for dep in deps if RANKS[_stage(dep)] > RANKS[_stage(name)])
    assert upward == []


def test_the_decoder_stage_imports_nothing_of_the_others():
    """pydsz/format/ with pydsz._core and pydsz.errors is what a device installs and imports."""
    allowed = {"pydsz", "pydsz.errors", "pydsz._core"}
    found = sorted(f"{name} -> {dep}" for name, deps in _graph().items() if _stage(name) == "format"
                   for dep in deps if _stage(dep) != "format" and dep not in allowed)
    assert found == []


def test_few_modules_are_left_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, top


def _public_functions(path: Path):
    """(name, parameter count) of each public function and method of a module, self and cls aside."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if child.name.startswith("_") and child.name != "__init__":
                    continue
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
                yield prefix + child.name, count
            elif isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                yield from walk(child, prefix + child.name + ".")
    yield from walk(ast.parse(path.read_text()), "")


def test_the_parameter_count_finds_a_wide_function(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(a, b, *c, d=1, **e): pass\nclass K:\n    def g(self, a): pass\n    def _h(self, *a): pass\n")
    assert list(_public_functions(path)) == [("f", 5), ("K.g", 1)]


@pytest.mark.parametrize("name", sorted(n for n, p in _modules().items() if not p.stem.startswith("_")))
def test_no_public_function_is_wider_than_a_bundle(name):
    wide = [f"{f} ({n})" for f, n in _public_functions(_modules()[name]) if n > MAX_PARAMETERS]
    assert wide == [], f"{name}: pass what travels together as one value (context.Run, budget.rule.Budget, ...)"
