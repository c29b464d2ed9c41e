"""One loader for the diagnosis rule files (``rules.yaml``, ``kill_rules.yaml``).

A rule file is data: the shipped one in this package (parsed once per process), or a site's own
YAML file in the same format, read through the project's bounded reader and validated by the
file's pydantic model. A file that is unreadable, not YAML or not in the format is one
:class:`ConfigError` that names the file and the field.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from ..inputs import parse_yaml, read_text_file

MAX_RULE_FILE_BYTES = 1 << 20  # a rule file is a few KiB; a megabyte is no rule file
M = TypeVar("M", bound=BaseModel)

_shipped: dict[tuple[type[BaseModel], str], BaseModel] = {}


def parse_rules(model: type[M], data: object, origin: str, name: str) -> M:
    """``data`` (parsed YAML) as a ``model``; ``name`` is the shipped file that shows the format."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"{origin}: {where}: {first['msg']}", f"see src/stalwart/diagnose/{name} for the format"
        ) from None


def load_rule_file(model: type[M], name: str, what: str, path: str | Path | None = None) -> M:
    """The shipped file ``name`` of this package, or the site's file at ``path`` in its format."""
    if path is not None:
        text = read_text_file(path, MAX_RULE_FILE_BYTES, what)
        return parse_rules(model, parse_yaml(text, f"{what} {path}"), str(path), name)
    cached = _shipped.get((model, name))
    if not isinstance(cached, model):
        origin = f"diagnose/{name} (shipped)"
        text = resources.files(__package__).joinpath(name).read_text()
        cached = _shipped[(model, name)] = parse_rules(model, parse_yaml(text, origin), origin, name)
    return cached
