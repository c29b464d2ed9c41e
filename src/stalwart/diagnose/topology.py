"""Where each node sits: rack, leaf switch, PDU, cooling loop. Validated on load.

Formats (see docs/diagnosis.md):

- YAML: ``nodes: {node1: {rack: r1, leaf_switch: sw1, pdu: p1, cooling_loop: loopA}, ...}``
- CSV: a header ``node,rack,leaf_switch,pdu,cooling_loop`` and one row per node (empty cell = unknown).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ..errors import ConfigError

DOMAINS = ("leaf_switch", "pdu", "cooling_loop", "rack")  # most specific shared cause first


class Place(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    rack: str = ""
    leaf_switch: str = ""
    pdu: str = ""
    cooling_loop: str = ""

    @field_validator("rack", "leaf_switch", "pdu", "cooling_loop", mode="before")
    @classmethod
    def _text(cls, v: object) -> str:
        return "" if v is None else str(v).strip()


class Topology(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: dict[str, Place]

    def place(self, node: str) -> Place | None:
        return self.nodes.get(node)

    def domain_of(self, node: str, kind: str) -> str:
        p = self.nodes.get(node)
        return getattr(p, kind) if p is not None else ""

    def members(self, kind: str, value: str) -> tuple[str, ...]:
        return tuple(sorted(n for n, p in self.nodes.items() if value and getattr(p, kind) == value))


def _validated(data: object, origin: str) -> Topology:
    if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), Mapping) or not data["nodes"]:
        raise ConfigError(
            f"{origin}: a topology needs a non-empty 'nodes' mapping",
            "write nodes: {node1: {rack: r1, leaf_switch: sw1, pdu: p1, cooling_loop: l1}}",
        )
    try:
        return Topology.model_validate({"nodes": {str(k): (v or {}) for k, v in data["nodes"].items()}})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"{origin}: {where}: {first['msg']}", f"each node may have only {', '.join(DOMAINS)}"
        ) from None


def parse_topology_csv(text: str, origin: str = "topology CSV") -> Topology:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames or "node" not in reader.fieldnames:
        raise ConfigError(
            f"{origin}: the first line must be a header with a 'node' column",
            f"e.g. node,{','.join(DOMAINS)}",
        )
    nodes: dict[str, dict[str, str]] = {}
    for lineno, row in enumerate(reader, start=2):
        name = (row.pop("node") or "").strip()
        if not name:
            raise ConfigError(f"{origin}:{lineno}: empty node name")
        if name in nodes:
            raise ConfigError(f"{origin}:{lineno}: node {name!r} listed twice")
        nodes[name] = {k: v for k, v in row.items() if k is not None}
    return _validated({"nodes": nodes}, origin)


def load_topology(path: str | Path) -> Topology:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read topology file {p}: {exc.strerror}") from exc
    if p.suffix.lower() == ".csv":
        return parse_topology_csv(text, str(p))
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
    return _validated(data, str(p))
