"""Every use of ``typing.Any`` in src/ says why a precise type will not do (``# Any: <why>`` on its
line or one of the two lines above): a third-party API that forces it, JSON of any shape, an
optional or lazily imported library. Imports of ``Any`` need no reason; their uses do."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "stalwart"
_REASON = re.compile(r"#\s*Any\b|Any:")


def unexplained(source: str, name: str = "<src>") -> list[str]:
    """The lines of ``source`` that use the name ``Any`` (not in an import, a string or a comment)
    without a reason comment on that line or the two above, as ``name:line``."""
    uses: set[int] = set()
    reasons: set[int] = set()
    in_import = False
    at_start = True  # the next token begins a logical line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if _REASON.search(tok.string):
                reasons.add(tok.start[0])
            continue
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            if tok.type == tokenize.NEWLINE:
                at_start, in_import = True, False
            continue
        if at_start:
            in_import = tok.type == tokenize.NAME and tok.string in ("import", "from")
            at_start = False
        if tok.type == tokenize.NAME and tok.string == "Any" and not in_import:
            uses.add(tok.start[0])
    return [f"{name}:{line}" for line in sorted(uses) if not reasons & {line, line - 1, line - 2}]


def test_the_rule_finds_an_unexplained_any_and_accepts_an_explained_one():
    bare = "from typing import Any\n\n\ndef f(x: Any) -> Any:\n    return x\n"
    said = "from typing import Any\n\n\ndef f(x: Any) -> None:  # Any: json.loads output\n    pass\n"
    above = (
        "from typing import Any\n\n# Any: typer passes each option's own type\nFLAGS: dict[str, Any] = {}\n"
    )
    prose = 'def f() -> None:\n    """Any input is fine."""\n    # Any input is fine.\n'
    far = "from typing import Any\n\n# Any: too far above\n\n\nX: Any = None\n"
    assert unexplained(bare) == ["<src>:4"]
    assert unexplained(said) == [] and unexplained(above) == [] and unexplained(prose) == []
    assert unexplained(far) == ["<src>:6"]


def test_every_any_in_src_says_why():
    missing = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        for hit in unexplained(path.read_text(), str(path.relative_to(SRC)))
    ]
    assert not missing, f"{len(missing)} use(s) of Any without '# Any: <why>': {missing[:10]}"
