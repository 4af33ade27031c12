"""The layout's rules, read from the source: imports only run downwards through the layers, and no module imports
itself back through another (docs/architecture.md draws the layers)."""

import ast
from pathlib import Path

import minirope

PACKAGE = Path(minirope.__file__).parent
# each layer, and the layers it may import: the model files at the top level, then data, output, training,
# post-training and the commands, each on the ones before it
LAYERS = ("top", "data", "output", "training", "posttraining", "commands")


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "top"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str) -> set[str]:
    """The minirope modules `path` imports (at any depth of the file: also those imported inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *filter(None, [base])])
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {other for other in imports(path, name) if other in known and other != name}
            for name, path in known.items()}  # fmt: skip


def test_imports_only_run_downwards_through_the_layers():
    upward = [
        f"{name} ({layer(name)}) imports {other} ({layer(other)})"
        for name, others in graph().items()
        for other in others
        if LAYERS.index(layer(other)) > LAYERS.index(layer(name))
    ]
    assert upward == []
    assert {layer(name) for name in graph()} == set(LAYERS)  # every layer exists


def test_no_module_imports_itself_back_through_others():
    edges = graph()
    # a package imports its modules for their names; a cycle through the package file alone is not one
    edges = {name: {other for other in others if not name.startswith(other + ".")} for name, others in edges.items()}
    state, cycles = {}, []

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for other in sorted(edges[name]):
            if state.get(other) == "open":
                cycles.append(" -> ".join([*path[path.index(other) :], other]))
            elif other not in state:
                visit(other, [*path, other])
        state[name] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert cycles == []
