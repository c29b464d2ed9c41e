"""``stalwart run`` configuration: precedence defaults < file < env < flags, and clear errors."""

from __future__ import annotations

import pytest

from stalwart.errors import ConfigError
from stalwart.settings.run_config import build, from_env, load_file

SCRIPT = {"script": "train.py"}


def test_defaults_and_resolved_fields():
    cfg = build(dict(SCRIPT), env={})
    assert cfg.restart.max_restarts == 3 and cfg.hang.floor_s == 10.0 and cfg.hang.pg_timeout_s == 600.0
    assert cfg.min_nodes == cfg.max_nodes == 1
    assert cfg.run_id and cfg.rendezvous.id == cfg.run_id and cfg.node_name
    assert cfg.run_dir.is_absolute() and cfg.run_dir.name == cfg.run_id
    assert cfg.budget.max_restarts == 3 and cfg.hang_policy.floor_s == 10.0


def test_precedence_file_then_env_then_flags(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("max-restarts: 5\nhang_floor_s: 20\nnproc_per_node: 2\n")
    env = {"STALWART_MAX_RESTARTS": "7", "STALWART_NPROC_PER_NODE": "3", "UNRELATED": "x"}
    cfg = build(dict(SCRIPT), config_file=str(f), env={})
    assert (cfg.restart.max_restarts, cfg.hang.floor_s, cfg.nproc_per_node) == (5, 20.0, 2)
    cfg = build(dict(SCRIPT), config_file=str(f), env=env)
    assert (cfg.restart.max_restarts, cfg.hang.floor_s, cfg.nproc_per_node) == (7, 20.0, 3)
    cfg = build({**SCRIPT, "max_restarts": 9, "nproc_per_node": None}, config_file=str(f), env=env)
    assert (cfg.restart.max_restarts, cfg.hang.floor_s, cfg.nproc_per_node) == (
        9,
        20.0,
        3,
    )  # None = flag not given


def test_toml_file_and_list_settings_from_env(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('max_restarts = 4\nchaos = ["crash@rank=0,step=3"]\n')
    cfg = build(dict(SCRIPT), config_file=str(f), env={})
    assert cfg.restart.max_restarts == 4 and cfg.faults.specs == ["crash@rank=0,step=3"]
    env = {"STALWART_CHAOS": "crash@rank=0,step=3;hang@rank=1,step=5", "STALWART_RUN_ID": "abc"}
    assert from_env(env) == {"chaos": ["crash@rank=0,step=3", "hang@rank=1,step=5"], "run_id": "abc"}
    cfg = build({**SCRIPT, "nproc_per_node": 2}, env=env)  # the hang targets rank 1: two ranks
    assert cfg.run_id == "abc" and cfg.rendezvous.id == "abc" and len(cfg.faults.specs) == 2


def test_script_cannot_come_from_the_environment():
    assert from_env({"STALWART_SCRIPT": "evil.py", "STALWART_SCRIPT_ARGS": "a"}) == {}


@pytest.mark.parametrize(
    "flags, env, fragment",
    [
        ({"max_restarts": -1}, {}, "invalid setting max_restarts"),
        ({}, {"STALWART_MAX_RESTARTS": "many"}, "invalid setting max_restarts"),
        ({"nproc_per_node": 0}, {}, "invalid setting nproc_per_node"),
        ({"nnodes": "two"}, {}, "--nnodes 'two' must be N or MIN:MAX"),
        ({"nnodes": "3:2"}, {}, "needs 1 <= MIN <= MAX"),
        ({"nnodes": "1:2"}, {}, "needs --rdzv-endpoint HOST:PORT"),
        ({"hang_floor_s": 0}, {}, "invalid setting hang_floor_s"),
        ({"no_such_flag": 1}, {}, "invalid setting no_such_flag"),
        ({"metrics_model": "params=7e9"}, {}, "invalid setting metrics_model: missing"),
        ({"metrics_model": "bogus=1"}, {}, "invalid setting metrics_model: bad item 'bogus=1'"),
    ],
)
def test_bad_values_give_one_clear_config_error(flags, env, fragment):
    with pytest.raises(ConfigError) as exc:
        build({**SCRIPT, **flags}, env=env)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value)


def test_multi_node_with_endpoint_is_fine():
    cfg = build({**SCRIPT, "nnodes": "1:2", "rdzv_endpoint": "127.0.0.1:29400"}, env={})
    assert (cfg.min_nodes, cfg.max_nodes) == (1, 2)


@pytest.mark.parametrize(
    "flags, fragment",
    [
        ({"pg_timeout_s": 200.0}, "hang cap (300s) must be shorter than process-group timeout (200s)"),
        (
            {"rdzv_timeout_s": 600.0},
            "process-group timeout (600s) must be shorter than rendezvous timeout (600s)",
        ),
        ({"monitor_interval_s": 15.0}, "monitor interval (15s) must be shorter than hang floor (10s)"),
        ({"hang_floor_s": 400.0}, "hang floor 400s is above the hang cap 300s"),
        (
            {"startup_timeout_s": 700.0},
            "start-up timeout (700s) must be shorter than process-group timeout (600s)",
        ),
    ],
)
def test_timeout_hierarchy_violations(flags, fragment):
    with pytest.raises(ConfigError) as exc:
        build({**SCRIPT, **flags}, env={})
    assert fragment in str(exc.value)


def test_hierarchy_violation_from_the_environment_is_caught_too():
    with pytest.raises(ConfigError, match="process-group timeout"):
        build(dict(SCRIPT), env={"STALWART_PG_TIMEOUT_S": "100"})


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file .* does not exist"):
        load_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_restarts: [1\n")
    with pytest.raises(ConfigError, match="does not parse|is not valid YAML"):
        load_file(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_file(bad)
    bad.write_text("max_restarts: 2\nmax_restart: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_file(bad)
    assert "unknown setting(s) max_restart" in exc.value.message and "--help" in exc.value.hint
    toml = tmp_path / "bad.toml"
    toml.write_text("max_restarts = = 2\n")
    with pytest.raises(ConfigError, match="does not parse|is not valid YAML"):
        load_file(toml)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_file(empty) == {}


def test_a_fault_for_a_rank_the_job_lacks_is_refused():
    from stalwart.errors import FaultPlanError

    with pytest.raises(FaultPlanError, match="targets rank 3, but the job has ranks 0..1"):
        build({**SCRIPT, "nproc_per_node": 2, "chaos": ["crash@rank=3,step=1"]}, env={})


def test_straggler_action_settings_default_to_observe_and_reject_bad_values(tmp_path):
    cfg = build(dict(SCRIPT), env={})
    assert cfg.straggler.action == "observe" and cfg.straggler.act_min_precision == 0.9
    assert cfg.straggler_policy.recovery_s == 300.0 and cfg.straggler_policy.margin == 1.5
    cfg = build({**SCRIPT, "straggler_action": "act", "straggler_recovery_s": 20}, env={})
    assert cfg.straggler_policy.recovery_s == 20.0
    with pytest.raises(ConfigError, match="must be observe, auto, act"):
        build({**SCRIPT, "straggler_action": "always"}, env={})
    with pytest.raises(ConfigError, match="straggler-history .* does not exist"):
        build({**SCRIPT, "straggler_history": tmp_path / "none"}, env={})
