"""The project's source files parsed once per test process: the layer rules (test_layers.py) and the
code rules (test_code_quality.py) each read every module of gateway/, and parsing and walking 180 files
was a second of the fast suite per rule."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path


@cache
def parsed(source: str) -> ast.Module:
    """``source``'s tree (shared: callers only read it)."""
    return ast.parse(source)


@cache
def walked(source: str) -> tuple[ast.AST, ...]:
    """Every node of ``source``'s tree, in :func:`ast.walk`'s order."""
    return tuple(ast.walk(parsed(source)))


@cache
def source_of(path: Path) -> str:
    """A file's text, read once."""
    return path.read_text()
