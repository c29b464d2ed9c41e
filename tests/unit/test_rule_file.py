"""The one loader behind the diagnosis rule files: shipped once, a site's file checked the same way."""

from __future__ import annotations

import pytest

from stalwart.diagnose.cross_layer import CrossRules, load_cross_rules
from stalwart.diagnose.kill_cause import KillRules, load_kill_rules
from stalwart.errors import ConfigError


@pytest.mark.parametrize("load, model", [(load_cross_rules, CrossRules), (load_kill_rules, KillRules)])
def test_the_shipped_file_is_parsed_once(load, model):
    first = load()
    assert isinstance(first, model) and load() is first


@pytest.mark.parametrize(
    "text, message",
    [("rules: [: :", "not valid YAML"), ("rules: []\n", "rules"), ("nonsense: 1\n", "rules: Field required")],
)
@pytest.mark.parametrize("load", [load_cross_rules, load_kill_rules])
def test_a_site_file_that_is_not_in_the_format_names_the_file(tmp_path, load, text, message):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("load", [load_cross_rules, load_kill_rules])
def test_a_missing_site_file_is_a_config_error(tmp_path, load):
    with pytest.raises(ConfigError, match="missing.yaml"):
        load(tmp_path / "missing.yaml")
