"""The folder tree is the architecture: every import points down a layer, and no module circle exists.

Layers, bottom first (README "Layout"): ``gateway.core`` < ``gateway.hub`` < ``backends`` < ``gateway.agents`` <
``gateway.planning`` and ``gateway.supervision`` < ``gateway.serving`` < ``gateway.nodes`` (the
worker serves HTTP with the serving layer's parts) < ``gateway.cli`` < ``gateway`` itself (``__main__``).
Packages on one level do not import each other.
Imports under ``if TYPE_CHECKING:`` count too: a type from above is still an arrow up.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {
    "gateway.core": 0,
    "gateway.hub": 0.5,
    "backends": 1,
    "gateway.agents": 2,
    "gateway.planning": 3,
    "gateway.supervision": 3,
    "gateway.serving": 4,
    "gateway.nodes": 5,
    "gateway.cli": 6,
    "gateway": 7,
}


def _package(module: str) -> str:
    """The layer a module belongs to: the longest LAYERS key it starts with."""
    return max((name for name in LAYERS if module == name or module.startswith(name + ".")), key=len)


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("gateway", "backends"):
        for path in (ROOT / top).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules this one imports (``from pkg import submodule`` names the submodule)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets.add(node.module)
            targets |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {target for target in targets if target in known and target != module}


GRAPH = {module: _imports(module, path, set(_modules())) for module, path in _modules().items()}


def test_every_import_points_down_a_layer() -> None:
    upward = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _package(target) != _package(module)
        and LAYERS[_package(target)] >= LAYERS[_package(module)]
        and not module.startswith(_package(target) + ".")  # a package's own __init__ re-exports
    ]
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_no_module_circle() -> None:
    """Package ``__init__`` re-exports are left out: importing a package's own parts is not a circle."""
    edges = {
        m: {t for t in ts if not (m == t.rsplit(".", 1)[0] or t == m.rsplit(".", 1)[0])} for m, ts in GRAPH.items()
    }
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_package_says_what_it_holds() -> None:
    bare = [
        str(path.relative_to(ROOT))
        for path in ROOT.glob("*/**/__init__.py")
        if path.parts[-3] != "tests"
        and path.relative_to(ROOT).parts[0] in ("gateway", "backends")
        and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not bare, f"packages without a docstring: {bare}"


ENGINE_WORDS = re.compile(r"vllm|llama|gguf|ggml|\brpc\b|rpc_", re.IGNORECASE)


def _code_words(tree: ast.AST) -> list[tuple[int, str]]:
    """Names, attributes, parameters and string constants; docstrings left out (they may name engines)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            words.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute | ast.FunctionDef | ast.ClassDef | ast.arg):
            words.append(
                (getattr(node, "lineno", 0), getattr(node, "attr", None) or getattr(node, "name", None) or node.arg)
            )  # type: ignore[attr-defined]
    return words


def test_the_generic_layers_name_no_engine_outside_docstrings() -> None:
    """Engine knowledge lives in backends/<engine>/; gateway/ asks the registry."""
    named = [
        f"{path.relative_to(ROOT)}:{line}: {word[:80]!r}"
        for path in sorted((ROOT / "gateway").rglob("*.py"))
        for line, word in _code_words(ast.parse(path.read_text()))
        if ENGINE_WORDS.search(word)
    ]
    assert not named, "engine names in the generic layers:\n" + "\n".join(named)


def test_no_test_imports_a_benchmark() -> None:
    """Benchmarks print figures and may import the tests' replays; never the other way round."""
    importing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            name == "benchmarks" or name.startswith("benchmarks.")
            for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        )
    ]
    assert not importing, f"tests importing benchmarks/: {importing}"
