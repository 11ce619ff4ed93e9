"""The folder tree is the architecture: every import points down a layer, and no module circle exists.

The order is ``gateway.LAYERS`` (bottom first; ``gateway`` itself, its ``__main__``, on top), and inside
``gateway.serving`` the rooms' order is ``gateway.serving.ROOMS``: this test reads both and writes neither.
Packages on one level do not import each other. Inside ``gateway.backends`` each engine is a sealed room:
the gateway reaches engines only through the modules at the top of ``gateway.backends`` (the contract, the
registry, the shared objective, and what every engine reads: model facts, checked numbers, bandwidths), and
one engine never imports the other. Imports under ``if TYPE_CHECKING:`` count too (a type from above is
still an arrow up), relative imports are resolved, and ``from package import name`` is an arrow to the
package's ``__init__``: a circle through an ``__init__`` is a circle.

Each rule is a function over an import graph, so that a small seeded tree can prove the rule catches
what it is meant to catch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path

import pytest

import gateway
from gateway import serving
from tests.source_trees import parsed, source_of, walked

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {f"gateway.{name}": rank for rank, level in enumerate(gateway.LAYERS) for name in level} | {
    "gateway": len(gateway.LAYERS)  # the package itself (``__main__``) sits on top
}

SERVING_ROOMS = {
    f"gateway.serving.{name}" if name else "gateway.serving": rank
    for rank, level in enumerate(serving.ROOMS)
    for name in level
}

Graph = dict[str, set[str]]


def _package(module: str, ranks: Mapping[str, float] = LAYERS) -> str | None:
    """The layer (or room) a module belongs to: the longest key of ``ranks`` it starts with; None outside all."""
    return max((name for name in ranks if module == name or module.startswith(name + ".")), key=len, default=None)


def _engines(graph: Graph) -> set[str]:
    """The engines' rooms: each package directly under ``gateway.backends`` (a module there, such as the
    contract, the shared objective or the model facts, belongs to no engine)."""
    return {".".join(m.split(".")[:3]) for m in graph if m.startswith("gateway.backends.") and m.count(".") >= 3}


def _engine(module: str, engines: set[str]) -> str | None:
    """``gateway.backends.vllm`` for any module inside that engine's folder; None outside every engine."""
    return next((e for e in engines if module == e or module.startswith(e + ".")), None)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for top in ("gateway",):
        for path in (root / top).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from`` import names, relative ones resolved against the importing module's package."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _parsed(path: Path) -> ast.Module:
    """A source file's tree, parsed once for the import graph and every rule that reads the code."""
    return parsed(source_of(path))


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The project modules this one imports. ``from pkg import submodule`` names both: the package's
    ``__init__`` runs and hands the name over."""
    targets = set()
    for node in walked(source_of(path)):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, path, node)
            targets.add(source)
            targets |= {f"{source}.{alias.name}" for alias in node.names}
    return {target for target in targets if target in known and target != module}


def import_graph(root: Path) -> Graph:
    found = modules(root)
    return {module: imports(module, path, set(found)) for module, path in found.items()}


def _arrows_up(graph: Graph, ranks: Mapping[str, float]) -> list[str]:
    """Arrows between two of ``ranks``' packages that point to a higher one or across to another of the
    same rank. A package's own modules importing each other, or its ``__init__`` re-exporting them, are
    inside one package; a module outside every package of ``ranks`` is not judged here."""
    arrows = []
    for module, targets in graph.items():
        home = _package(module, ranks)
        for target in targets:
            there = _package(target, ranks)
            if home is not None and there is not None and there != home and ranks[there] >= ranks[home]:
                arrows.append(f"{module} -> {target}")
    return sorted(arrows)


def upward_imports(graph: Graph) -> list[str]:
    """Arrows to a higher layer, or across to another package of the same level."""
    return _arrows_up(graph, LAYERS)


def serving_room_arrows(graph: Graph) -> list[str]:
    """Inside serving: arrows to a higher room, or across between the dialects, the transport and the
    scheduler."""
    return _arrows_up(graph, SERVING_ROOMS)


def engine_reach(graph: Graph) -> list[str]:
    """Arrows into an engine's room from outside it: the generic layers, the seams, or the other engine."""
    engines = _engines(graph)
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _engine(target, engines) is not None and _engine(module, engines) != _engine(target, engines)
    )


def circles(graph: Graph) -> list[str]:
    state: dict[str, int] = {}
    found: list[str] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                found.append(" -> ".join([*trail[trail.index(target) :], target]))
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


@cache
def project_graph() -> Graph:
    """This tree's import graph, built by the first rule that reads it: not at import, which every
    worker of a parallel run pays while collecting (about 0.7 s of parsing each)."""
    return import_graph(ROOT)


def test_every_import_points_down_a_layer() -> None:
    upward = upward_imports(project_graph())
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def test_serving_rooms_import_only_the_rooms_below() -> None:
    arrows = serving_room_arrows(project_graph())
    assert not arrows, "imports between serving's rooms that do not point down:\n" + "\n".join(arrows)


def test_engines_are_reached_only_through_the_contract_and_the_registry() -> None:
    """The registry is the one module that names every engine, by its package (whose ``BACKEND`` says
    the rest through the contract: its lender included); everything else asks it."""
    reaching = [
        arrow
        for arrow in engine_reach(project_graph())
        if not (arrow.startswith("gateway.backends.registry -> ") and arrow.split(" -> ")[1].count(".") == 2)
    ]
    assert not reaching, "imports into an engine from outside it:\n" + "\n".join(reaching)


def test_no_module_circle() -> None:
    found = circles(project_graph())
    assert not found, "import circles:\n" + "\n".join(found)


SEEDED_VIOLATIONS = {
    "a relative import pointing up": (
        {"gateway/core/files.py": "from ..serving import app\n", "gateway/serving/app.py": ""},
        upward_imports,
        "gateway.core.files -> gateway.serving.app",
    ),
    "the core importing the top package": (
        {"gateway/__init__.py": "", "gateway/core/files.py": "from gateway import __version__\n"},
        upward_imports,
        "gateway.core.files -> gateway",
    ),
    "the generic layers importing an engine module": (
        {
            "gateway/planning/planner.py": "from gateway.backends.vllm.ladder import ladder\n",
            "gateway/backends/vllm/ladder.py": "",
        },
        engine_reach,
        "gateway.planning.planner -> gateway.backends.vllm.ladder",
    ),
    "one engine importing the other": (
        {
            "gateway/backends/llamacpp/ladder.py": "import gateway.backends.vllm.memory\n",
            "gateway/backends/vllm/memory.py": "",
        },
        engine_reach,
        "gateway.backends.llamacpp.ladder -> gateway.backends.vllm.memory",
    ),
    "a dialect importing the transport": (
        {
            "gateway/serving/dialects/messages_api.py": "from gateway.serving.transport.proxy import EngineClient\n",
            "gateway/serving/transport/proxy.py": "",
        },
        serving_room_arrows,
        "gateway.serving.dialects.messages_api -> gateway.serving.transport.proxy",
    ),
    "the transport calling back into the edge": (
        {
            "gateway/serving/transport/proxy.py": "from ..edge import middleware\n",
            "gateway/serving/edge/middleware.py": "",
        },
        serving_room_arrows,
        "gateway.serving.transport.proxy -> gateway.serving.edge.middleware",
    ),
    "a room importing serving's top": (
        {
            "gateway/serving/edge/metrics.py": "from gateway.serving.runtime import Runtime\n",
            "gateway/serving/runtime.py": "",
        },
        serving_room_arrows,
        "gateway.serving.edge.metrics -> gateway.serving.runtime",
    ),
    "a circle through a package __init__": (
        {
            "gateway/backends/vllm/__init__.py": "from gateway.backends.vllm.backend import VllmBackend\n",
            "gateway/backends/vllm/backend.py": "from gateway.backends.vllm import releases\n",
            "gateway/backends/vllm/releases.py": "",
        },
        circles,
        "gateway.backends.vllm -> gateway.backends.vllm.backend -> gateway.backends.vllm",
    ),
}


@pytest.mark.parametrize("files, rule, arrow", SEEDED_VIOLATIONS.values(), ids=SEEDED_VIOLATIONS.keys())
def test_each_rule_catches_its_seeded_violation(tmp_path: Path, files: dict[str, str], rule, arrow: str) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert arrow in rule(import_graph(tmp_path))


def test_every_package_says_what_it_holds() -> None:
    bare = [
        str(path.relative_to(ROOT))
        for top in ("gateway",)
        for path in (ROOT / top).rglob("__init__.py")
        if path.parts[-3] != "tests" and not ast.get_docstring(_parsed(path))
    ]
    assert not bare, f"packages without a docstring: {bare}"


def _generic_layers() -> list[Path]:
    """Every module of the gateway outside ``gateway/backends/``, the one folder that knows engines."""
    engines = ROOT / "gateway" / "backends"
    return [path for path in sorted((ROOT / "gateway").rglob("*.py")) if engines not in path.parents]


ENGINE_WORDS = re.compile(r"vllm|llama|gguf|ggml|\brpc\b|rpc_", re.IGNORECASE)


def _code_words(source: str) -> list[tuple[int, str]]:
    """Names, attributes, parameters and string constants; docstrings left out (they may name engines)."""
    nodes = walked(source)
    docstrings = {
        id(node.body[0].value)
        for node in nodes
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    words = []
    for node in nodes:
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
    """Engine knowledge lives in gateway/backends/; the rest of gateway/ asks the registry."""
    named = [
        f"{path.relative_to(ROOT)}:{line}: {word[:80]!r}"
        for path in _generic_layers()
        for line, word in _code_words(source_of(path))
        if ENGINE_WORDS.search(word)
    ]
    assert not named, "engine names in the generic layers:\n" + "\n".join(named)


def test_no_test_imports_a_benchmark() -> None:
    """Benchmarks print figures and may import the tests' replays; never the other way round."""
    importing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if "benchmarks" in path.read_text()  # no import of benchmarks without the word
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(
            name == "benchmarks" or name.startswith("benchmarks.")
            for name in ([node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
        )
    ]
    assert not importing, f"tests importing benchmarks/: {importing}"


ENGINE_OBJECTS = {"backend", "option", "candidate", "chosen", "installation"}


def test_the_generic_layers_ask_engines_only_what_the_contract_says() -> None:
    """``getattr(option, "x", None)`` on an engine object is a member the contract (gateway/backends/base.py) does
    not declare: the generic layers rely on it unseen, and a third engine would not know to provide it."""
    probes = [
        f"{path.relative_to(ROOT)}:{node.lineno}: getattr({node.args[0].id}, ...)"
        for path in _generic_layers()
        for node in walked(source_of(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and node.args
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id in ENGINE_OBJECTS
    ]
    assert not probes, "probes around the engine contract:\n" + "\n".join(probes)


def test_the_architecture_page_draws_the_layers_from_their_one_declaration() -> None:
    """docs/architecture.md shows ``gateway.LAYERS`` as drawn by ``gateway.layer_diagram()``: reorder the
    layers and the page must follow."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```text\n{gateway.layer_diagram()}\n```" in page
