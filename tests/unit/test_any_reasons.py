"""Every ``Any`` in src/ says why no precise type is given (issue 36): a ``# Any: ...`` comment on its
line or one of the two above, or one ``# Any in this module: ...`` line for a module whose every
``Any`` has the same cause (a JSON document, a third-party object without types, a user's
state_dict values). ``Any`` in an import, a string or a comment is not a use."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "stalwart"
MODULE_REASON = "# Any in this module:"


def unexplained(source: str, name: str = "<src>") -> list[str]:
    """The lines of ``source`` that use ``Any`` with no reason given, as ``name:line``."""
    if MODULE_REASON in source:
        return []
    lines = source.splitlines()
    out = []
    in_import = False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if (
            tok.type == tokenize.NAME
            and tok.string in ("import", "from")
            and tok.start[1] == len(tok.line) - len(tok.line.lstrip())
        ):
            in_import = True
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            in_import = False
        elif tok.type == tokenize.NAME and tok.string == "Any" and not in_import:
            row = tok.start[0]
            near = " ".join(lines[max(0, row - 3) : row])
            if "Any:" not in near:
                out.append(f"{name}:{row}")
    return sorted(set(out), key=lambda s: int(s.rsplit(":", 1)[1]))


def test_the_rule_finds_an_unexplained_any_and_accepts_an_explained_one():
    bare = "from typing import Any\n\n\ndef f(x: Any) -> None:\n    return None\n"
    said = "from typing import Any\n\n\ndef f(x: Any) -> None:  # Any: torch's hook argument\n    pass\n"
    module = "# Any in this module: a JSON document\nfrom typing import Any\n\nX: dict[str, Any] = {}\n"
    text = 'from typing import Any\n\nDOC = "Any value goes"  # not a use\n'
    assert unexplained(bare) == ["<src>:4"]
    assert unexplained(said) == [] and unexplained(module) == [] and unexplained(text) == []


def test_every_any_in_src_says_why():
    missing = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in unexplained(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert not missing, "Any without a reason ('# Any: ...' or '# Any in this module: ...'): " + ", ".join(
        missing
    )
