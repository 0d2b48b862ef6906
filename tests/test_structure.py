"""The package's shape: no import cycle among its modules, no module over 400 lines."""

import ast
from pathlib import Path

import normprop_cli

PACKAGE = Path(normprop_cli.__file__).parent
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its file, lazy imports included.
    `from pkg import x` counts as importing pkg.x when that is a module, else pkg."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def package_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_the_import_graph_sees_the_packages_imports():
    graph = package_graph()
    assert "normprop_cli.engine.job" in graph["normprop_cli.engine.executor"]
    assert "normprop_cli.engine.trainer" in graph["normprop_cli.engine.job"]
    assert "normprop_cli.nn.layers" in graph["normprop_cli.nn.nin"]  # a relative import


def test_no_import_cycle_among_the_modules():
    assert cycles(package_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_executors_train_a_run_below_the_sweep():
    graph = package_graph()
    assert "normprop_cli.engine.sweep" not in graph["normprop_cli.engine.executor"]
    assert "normprop_cli.engine.sweep" not in graph["normprop_cli.engine.launch"]
    assert "normprop_cli.engine.launch" not in graph["normprop_cli.status"]  # status needs no submitit


def test_nn_and_data_import_nothing_else_of_the_package():
    for name, targets in package_graph().items():
        for pure in ("normprop_cli.nn", "normprop_cli.data"):
            if name == pure or name.startswith(f"{pure}."):
                assert all(t.startswith(pure) for t in targets), (name, targets)


def test_no_module_is_over_400_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# The floors of the package, top to bottom: a module imports only from its own floor's package or
# from floors below it (import-linter's layers contract, checked here on the same import graph).
FLOORS = (
    ("normprop_cli.__main__",),
    ("normprop_cli.cli",),
    ("normprop_cli.tools",),
    ("normprop_cli.readme",),
    ("normprop_cli.report",),
    ("normprop_cli.smoke", "normprop_cli.experiments", "normprop_cli.bench"),
    ("normprop_cli.status", "normprop_cli.verdicts"),
    ("normprop_cli.engine",),
    ("normprop_cli.hints",),
    ("normprop_cli.config", "normprop_cli.io", "normprop_cli.device", "normprop_cli.prose"),
    (
        "normprop_cli.nn",
        "normprop_cli.data",
        "normprop_cli.statistics",
        "normprop_cli.outcomes",
        "normprop_cli.errors",
        "normprop_cli.schema",
    ),
)


def place(module: str) -> tuple[int, str] | None:
    """(floor, the package of FLOORS it belongs to), None for the package's face."""
    for floor, names in enumerate(FLOORS):
        for name in names:
            if module == name or module.startswith(f"{name}."):
                return floor, name
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) where the imported module stands on a higher floor, or on the same floor
    in another package."""
    wrong = []
    for module, targets in graph.items():
        here = place(module)
        for target in targets:
            there = place(target)
            if here and there and (there[0] < here[0] or (there[0] == here[0] and there[1] != here[1])):
                wrong.append((module, target))
    return sorted(wrong)


def test_every_module_stands_on_a_floor():
    assert [m for m in package_graph() if m != "normprop_cli" and place(m) is None] == []


def test_no_import_runs_back_up_a_floor():
    assert upward_imports(package_graph()) == []


def test_statistics_stand_below_the_experiments_and_the_verdicts():
    assert place("normprop_cli.statistics")[0] > place("normprop_cli.experiments.tables")[0]
    assert place("normprop_cli.statistics")[0] > place("normprop_cli.verdicts.rule")[0]
    graph = package_graph()
    assert all(t.startswith(("normprop_cli.errors",)) for t in graph["normprop_cli.statistics"])


def test_the_floor_check_finds_an_import_that_runs_back_up():
    graph = {
        "normprop_cli.verdicts.measures": {"normprop_cli.experiments.tables"},
        "normprop_cli.cli": {"normprop_cli.nn"},
    }
    assert upward_imports(graph) == [("normprop_cli.verdicts.measures", "normprop_cli.experiments.tables")]
