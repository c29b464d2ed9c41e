"""One settings schema: the agent, the simulator and the command line share its defaults, and the
flags, their help and the file/environment names all derive from it."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
from pydantic import BaseModel

from stalwart import cli
from stalwart.commands import run as run_command
from stalwart.policy.timeouts import HANG_CAP_S, HangTimeoutPolicy
from stalwart.settings.run_config import SETTINGS, RunConfig, build, default_of
from stalwart.sim.agent_probe import MONITOR_INTERVAL_S, ProbeConfig
from stalwart.sim.config import SimConfig

# settings the simulator has under a run setting's name with another meaning, and why
SIM_MEANS_OTHERWISE = {"max_restarts": "None models a cluster manager restarting the job (no agent budget)"}


def _defaults(model: BaseModel) -> dict[str, object]:
    return model.model_dump()


def test_the_simulator_embeds_the_agents_hang_settings_with_the_same_defaults():
    run = RunConfig(script="train.py")
    sim = SimConfig()
    assert type(sim.hang) is type(run.hang)
    assert _defaults(sim.hang) == _defaults(run.hang)
    assert sim.hang.policy == run.hang_policy == HangTimeoutPolicy()
    assert run.hang.cap_s == HANG_CAP_S == 300.0  # the agent's cap, which the simulator now predicts with


def test_no_simulator_setting_shadows_a_run_setting_with_another_default():
    run = RunConfig(script="train.py")
    sim = SimConfig()
    groups = {name: getattr(run, name) for name, f in RunConfig.model_fields.items()}
    for name in SimConfig.model_fields:
        value = getattr(sim, name)
        if isinstance(value, BaseModel) and name in groups:
            assert _defaults(value) == _defaults(groups[name]), name
        elif name in SETTINGS and name not in SIM_MEANS_OTHERWISE:
            assert value == default_of(name), name


def test_the_agent_probe_runs_with_the_agents_defaults():
    run = RunConfig(script="train.py")
    probe = ProbeConfig()
    assert probe.hang_policy == run.hang_policy
    assert MONITOR_INTERVAL_S == probe.monitor_interval_s == run.monitor_interval_s
    assert (probe.hang, probe.workers, probe.checkpoint) == (run.hang, run.workers, run.checkpoint)
    assert probe.diagnosis.interval_s == 0.0  # no live diagnosis in the probe: the agent's own incidents


def test_flat_names_reach_their_nested_place():
    cfg = RunConfig(script="train.py", hang_floor_s=5, rdzv_id="job", chaos=["crash@rank=0,step=1"])
    assert (cfg.hang.floor_s, cfg.rendezvous.id, cfg.faults.specs) == (5.0, "job", ["crash@rank=0,step=1"])
    assert SimConfig(hang_cap_s=120.0).hang.cap_s == 120.0
    assert len(SETTINGS) == len({leaf.path for leaf in SETTINGS.values()})  # one place per name


def test_precedence_holds_for_nested_settings(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("hang_cap_s = 200\nhang_floor_s = 20\nrdzv_timeout_s = 1000\n")
    env = {"STALWART_HANG_CAP_S": "250", "STALWART_HANG_MULTIPLIER": "4"}
    cfg = build(
        {"script": "train.py", "hang_cap_s": 280.0, "hang_floor_s": None}, config_file=str(f), env=env
    )
    assert (cfg.hang.cap_s, cfg.hang.floor_s, cfg.hang.multiplier) == (280.0, 20.0, 4.0)
    assert cfg.rendezvous.timeout_s == 1000.0 and cfg.hang.startup_s == default_of("startup_timeout_s")


def test_an_error_names_the_setting_as_users_write_it():
    from stalwart.errors import ConfigError

    with pytest.raises(ConfigError, match="invalid setting hang_cap_s"):
        build({"script": "train.py"}, env={"STALWART_HANG_CAP_S": "-1"})
    with pytest.raises(ConfigError, match="invalid simulator setting hang_floor_s"):
        from stalwart.sim.config import make_config

        make_config(hang_floor_s=-1.0)


def _run_help(monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        cli.main(["run", "--help"])
    return out.getvalue()


def test_every_flag_comes_from_the_schema_with_its_default(monkeypatch):
    text = _run_help(monkeypatch)
    for leaf in SETTINGS.values():
        for flag in leaf.setting.flags:
            assert flag.split("/")[0] in text, flag
    assert re.search(r"--hang-cap HANG_CAP\s+Largest hang timeout, seconds\.\s+\[default: 300\]", text)
    assert re.search(r"--warm / --no-warm\s+Start workers[^[]*\[default: on\]", text)
    assert "[default: 0.05]" in text  # --monitor-interval


def test_no_help_text_repeats_its_default():
    for leaf in SETTINGS.values():
        d = leaf.field.get_default(call_default_factory=True)
        text = leaf.field.description or ""
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            shown = f"{d:g}"
            assert f"({shown})" not in text and f"default {shown}" not in text, (leaf.name, text)
        assert "(default " not in text.replace("(default hostname)", "").replace(
            "(default RUN_DIR/health)", ""
        ).replace("(default: ", ""), (leaf.name, text)


def test_command_line_names_map_back_to_settings():
    names = run_command._SETTING_OF
    assert names["hang_floor"] == "hang_floor_s" and names["stop_grace"] == "stop_grace_s"
    assert names["nproc_per_node"] == "nproc_per_node" and names["script_args"] == "script_args"
    assert set(names.values()) <= set(SETTINGS)
