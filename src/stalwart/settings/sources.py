"""Where a run's settings come from: the ``--config`` file, ``STALWART_<NAME>`` variables and flags.

Every setting has one flat name (``hang_floor_s``), the key users write in a file, after
``STALWART_`` in the environment, and in the flags passed to :func:`stalwart.settings.run_config.build`;
the schema (``settings/schema.py``) places it in its nested model (``hang.floor_s``). The readers
here turn flat names into nested dicts, and pydantic-settings merges them in the order of
precedence (``RunConfig.sources``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from ..errors import ConfigError
from ..inputs import parse_yaml, read_text_file
from .panels import Group, Panel
from .schema import Setting

ENV_PREFIX = "STALWART_"
_NOT_FROM_ENV = {"script", "script_args"}  # the environment never names the program to run


@dataclass(frozen=True)
class Leaf:
    """One setting: its flat name, where it sits in the schema, its field and its flags (and the
    ``Group`` marker of the settings group it is in, if any)."""

    name: str
    path: tuple[str, ...]
    field: FieldInfo
    setting: Setting
    group: Group | None = None

    @property
    def panel(self) -> Panel | None:
        """Its heading in ``stalwart run --help``: its own, else its group's."""
        return self.setting.panel or (self.group.panel if self.group else None)

    @property
    def needs_sdk(self) -> bool:
        return self.setting.sdk or (self.group is not None and self.group.sdk)

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    @property
    def is_list(self) -> bool:
        return get_origin(self.field.annotation) is list


def _group(annotation: object) -> type[BaseModel] | None:
    """The nested model a field holds, if it is one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def leaves(
    model: type[BaseModel], prefix: tuple[str, ...] = (), marker: Group | None = None
) -> dict[str, Leaf]:
    """Every setting of ``model`` by flat name, nested models walked (schema order)."""
    out: dict[str, Leaf] = {}
    for name, field in model.model_fields.items():
        group = _group(field.annotation)
        if group is not None:
            inner = next((m for m in field.metadata if isinstance(m, Group)), marker)
            out.update(leaves(group, (*prefix, name), inner))
            continue
        meta = next((m for m in field.metadata if isinstance(m, Setting)), Setting(name))
        out[meta.name] = Leaf(meta.name, (*prefix, name), field, meta, marker)
    return out


# Any: settings before pydantic validates them (nested dicts of any values)
def nest(flat: Mapping[str, Any], table: Mapping[str, Leaf]) -> dict[str, Any]:
    """``{"hang_floor_s": 5}`` -> ``{"hang": {"floor_s": 5}}``; unknown names are kept as they are
    (the model refuses them with their name); nested groups given as dicts are merged."""
    out: dict[str, Any] = {}  # Any: settings before pydantic validates them
    for key, value in flat.items():
        leaf = table.get(key)
        path = leaf.path if leaf is not None else (key,)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        if isinstance(value, Mapping) and isinstance(node.get(path[-1]), dict):
            node[path[-1]].update(value)
        else:
            node[path[-1]] = value
    return out


def flat_name(loc: tuple[int | str, ...], table: Mapping[str, Leaf]) -> str:
    """The flat setting name of a pydantic error location (``("hang", "floor_s")``)."""
    dotted = ".".join(str(x) for x in loc)
    for leaf in table.values():
        if dotted == leaf.dotted or dotted.startswith(leaf.dotted + "."):
            return leaf.name + dotted[len(leaf.dotted) :]
    return dotted


# Any: tomllib/YAML output before validation
def load_file(path: str | Path, table: Mapping[str, Leaf]) -> dict[str, Any]:
    """A ``--config`` file (YAML, or TOML by its suffix) as flat settings."""
    p = Path(path)
    text = read_text_file(p, 1 << 20, "config file")  # a regular UTF-8 file of at most 1 MiB
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:
            raise ConfigError(f"config file {p} does not parse: {str(exc).splitlines()[0]}") from None
    else:
        data = parse_yaml(text, f"config file {p}")
    data = data or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of settings")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"config file {p}: setting names must be text, got {bad[0]!r}")
    data = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = set(data) - set(table)
    if unknown:
        raise ConfigError(
            f"config file {p}: unknown setting(s) {', '.join(sorted(unknown))}",
            "see 'stalwart run --help' for the settings",
        )
    return data


def from_env(env: Mapping[str, str], table: Mapping[str, Leaf]) -> dict[str, str | list[str]]:
    """``STALWART_<NAME>`` variables as flat settings (lists separated by ``;``)."""
    out: dict[str, str | list[str]] = {}
    for name, leaf in table.items():
        key = ENV_PREFIX + name.upper()
        if name not in _NOT_FROM_ENV and key in env:
            out[name] = env[key].split(";") if leaf.is_list else env[key]
    return out


class _FlatSource(PydanticBaseSettingsSource):
    """A layer of flat settings handed to pydantic-settings as the nested dict it merges."""

    # Any: settings before pydantic validates them
    def __init__(self, settings_cls: type[BaseSettings], flat: Mapping[str, Any], table: Mapping[str, Leaf]):
        super().__init__(settings_cls)
        self._values = nest(flat, table)

    # Any: pydantic-settings' own signatures for a source
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    # Any: pydantic-settings' own signatures for a source
    def __call__(self) -> dict[str, Any]:
        return self._values


class FlagSource(_FlatSource):
    """Flags given on the command line (None: not given)."""

    def __init__(
        self, settings_cls: type[BaseSettings], flags: Mapping[str, object], table: Mapping[str, Leaf]
    ):
        super().__init__(settings_cls, {k: v for k, v in flags.items() if v is not None}, table)


class EnvSource(_FlatSource):
    """``STALWART_<NAME>`` variables."""

    def __init__(
        self, settings_cls: type[BaseSettings], env: Mapping[str, str] | None, table: Mapping[str, Leaf]
    ):
        super().__init__(settings_cls, from_env(os.environ if env is None else env, table), table)


class FileSource(_FlatSource):
    """The ``--config`` file, if any."""

    def __init__(self, settings_cls: type[BaseSettings], path: str | Path | None, table: Mapping[str, Leaf]):
        super().__init__(settings_cls, load_file(path, table) if path else {}, table)


# Any: a class or a typing form (list[str]), as typer takes a parameter's annotation
def cli_type(leaf: Leaf) -> Any:
    """The Python type a flag of this setting parses to (``int | None`` -> ``int``)."""
    if leaf.setting.cli_type is not None:
        return leaf.setting.cli_type
    annotation = leaf.field.annotation
    if get_origin(annotation) is list:
        return annotation  # a repeatable flag, or the script's arguments
    args = [a for a in get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation
