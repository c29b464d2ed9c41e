"""No module in src/stalwart calls a torch collective that pickles (docs/security.md: nothing from
the network is unpickled); ranks exchange JSON over tensors (protocol/json_collective.py)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent.parent / "src" / "stalwart"
PICKLING = {
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}


def object_collective_calls(root: Path = SRC) -> list[str]:
    """``path:line name`` for every call or reference of a pickling collective under ``root``."""
    out: list[tuple[str, int, str]] = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.Name):
                name = node.id
            elif isinstance(node, ast.alias):
                name = node.name.rsplit(".", 1)[-1]
            if name in PICKLING:
                out.append((str(path.relative_to(root.parent)), getattr(node, "lineno", 0), name))
    return [f"{where}:{line} {name}" for where, line, name in sorted(out)]


def test_no_module_in_src_uses_a_pickling_collective():
    assert object_collective_calls() == []


def test_the_check_names_every_kind_of_use(tmp_path):
    pkg = tmp_path / "stalwart"
    pkg.mkdir()
    (pkg / "fine.py").write_text('"""all_gather_object is only named here."""\nx = "broadcast_object_list"\n')
    (pkg / "bad.py").write_text(
        "import torch.distributed as dist\n"
        "from torch.distributed import gather_object\n"
        "dist.all_gather_object(out, obj)\n"
        "f = dist.broadcast_object_list\n"
    )
    assert object_collective_calls(pkg) == [
        "stalwart/bad.py:2 gather_object",
        "stalwart/bad.py:3 all_gather_object",
        "stalwart/bad.py:4 broadcast_object_list",
    ]
