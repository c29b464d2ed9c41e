"""The vocabulary scanner the tests share (policy/vocabulary.py): every labelled word a surface
prints, and the ones outside the vocabulary. Used by tests/unit/test_vocabulary_surfaces.py (the
report, /metrics, the dashboard) and the docs walk (every documented command's JSON output)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from stalwart.policy.vocabulary import WORDS

# a JSON field or a map's keys, and the kind of word it holds
FIELDS = {
    "failure": "failure",
    "component": "component",
    "class": "fault_class",
    "path": "path",
    "state": "node_state",
}
KEYED = {"restarts_by_cause": "cause", "interruptions_by_cause": "cause", "incidents_by_class": "component"}
# a /metrics label, and the kind of word it holds
LABELS = {"cause": "cause", "class": "component", "state": "node_state"}


def words_in(doc: object, where: str = "") -> Iterator[tuple[str, str, str]]:
    """(kind, word, where) for every labelled word in a JSON document."""
    if isinstance(doc, Mapping):
        for k, v in doc.items():
            if k in FIELDS and isinstance(v, str) and v:
                yield FIELDS[k], v, f"{where}.{k}"
            if k in KEYED and isinstance(v, Mapping):
                yield from ((KEYED[k], str(key), f"{where}.{k}") for key in v)
            yield from words_in(v, f"{where}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from words_in(v, f"{where}[{i}]")


def words_in_metrics(text: str) -> Iterator[tuple[str, str, str]]:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for name, value in re.findall(r'(\w+)="([^"]*)"', line):
            if name in LABELS:
                yield LABELS[name], value, line.split("{", 1)[0]


def outside(found: Iterator[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return sorted({(kind, word, where) for kind, word, where in found if word not in WORDS[kind]})
