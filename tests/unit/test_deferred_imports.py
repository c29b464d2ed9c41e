"""Every import inside a function in src/ says why it is not at module level (``# deferred: ...`` on
its line or just above): a heavy library kept off a light path, an optional extra, or a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "stalwart"


def undeclared(source: str, name: str = "<src>") -> list[str]:
    """The function-level imports of ``source`` without a ``deferred`` reason, as ``name:line``."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Import, ast.ImportFrom)):
                near = " ".join(lines[max(0, sub.lineno - 3) : sub.end_lineno])
                if "deferred" not in near:
                    out.append(f"{name}:{sub.lineno}")
    return sorted(set(out))


def test_the_rule_finds_an_undeclared_import_and_accepts_a_declared_one():
    bare = "def f():\n    import json\n    return json\n"
    said = "def f():\n    import torch  # deferred: heavy (torch)\n    return torch\n"
    above = "def f():\n    # deferred: cycle with stalwart.x\n    from . import x\n    return x\n"
    assert undeclared(bare) == ["<src>:2"]
    assert undeclared(said) == [] and undeclared(above) == []


def test_every_function_level_import_in_src_says_why_it_is_deferred():
    missing = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in undeclared(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert not missing, f"{len(missing)} function-level import(s) without '# deferred: <why>': {missing[:10]}"
