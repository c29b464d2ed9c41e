"""torchrun's conventions: PET_* variables, --nproc-per-node values, output routing, --rdzv-conf,
stable run ids and the run-dir claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.errors import ConfigError
from stalwart.launch.output import routes
from stalwart.settings.run_config import RunConfig, build, claim_run_dir, parse_rdzv_conf, stable_run_id
from stalwart.settings.streams import parse_streams
from stalwart.settings.torchrun_flags import pet_defaults, resolve_nproc


def test_pet_variables_stand_in_for_flags():
    env = {
        "PET_NPROC_PER_NODE": "4",
        "PET_STANDALONE": "1",
        "PET_MASTER_PORT": "29400",
        "PET_TEE": "3",
        "PET_MONITOR_INTERVAL": "0.2",
        "PET_UNKNOWN": "x",
        "NPROC_PER_NODE": "9",
    }
    assert pet_defaults(env) == {
        "nproc_per_node": "4",
        "standalone": True,
        "master_port": "29400",
        "tee": "3",
        "monitor_interval_s": "0.2",
    }


@pytest.mark.parametrize(
    "value, cpus, gpus, expected",
    [("3", 8, 0, 3), ("auto", 8, 0, 8), ("auto", 8, 2, 2), ("cpu", 6, 2, 6), ("gpu", 8, 4, 4)],
)
def test_nproc_per_node_values(value, cpus, gpus, expected):
    assert resolve_nproc(value, cpu_count=cpus, gpu_count=gpus) == expected


@pytest.mark.parametrize("value", ["gpu", "0", "-1", "many"])
def test_bad_nproc_per_node_is_a_config_error(value):
    with pytest.raises(ConfigError, match="--nproc-per-node"):
        resolve_nproc(value, cpu_count=4, gpu_count=0)


def test_streams_spec_is_torchruns():
    assert parse_streams("3", 2) == [3, 3]
    assert parse_streams("0:1,1:2", 3) == [1, 2, 0]
    for bad in ("4", "0:7", "x", "1:"):
        with pytest.raises(ValueError, match="--tee"):
            parse_streams(bad, 2, flag="--tee")


def test_routes_follow_redirects_tee_and_the_ranks_filter(tmp_path: Path):
    logs = [tmp_path / "r0.log", tmp_path / "r1.log"]
    plain = routes(nproc=2, redirects="0", tee="0", ranks_filter="", log_dir=None, run_log=logs)
    assert [r.console for r in plain] == [(True, True), (True, True)] and plain[0].log_path == logs[0]
    red = routes(nproc=2, redirects="3", tee="0", ranks_filter="", log_dir=tmp_path / "ld", run_log=logs)
    assert red[1].console == (False, False) and red[1].stream_files == (
        tmp_path / "ld/1/stdout.log",
        tmp_path / "ld/1/stderr.log",
    )
    teed = routes(nproc=2, redirects="0", tee="1", ranks_filter="1", log_dir=tmp_path / "ld", run_log=logs)
    assert teed[0].console == (False, False)  # --local-ranks-filter 1 hides rank 0 on the console
    assert teed[1].console == (True, True) and teed[1].prefix == (True, False)
    assert teed[1].stream_files == (tmp_path / "ld/1/stdout.log", None)


def test_rdzv_conf_maps_torchrun_keys():
    assert parse_rdzv_conf("join_timeout=60,last_call_timeout=2,is_host=1,close_timeout=5") == {
        "rdzv_timeout_s": "60",
        "rdzv_last_call_s": "2",
        "rdzv_host": "1",
    }
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        parse_rdzv_conf("bogus=1")


def test_rdzv_conf_read_timeout_is_the_store_timeout_and_joins_the_hierarchy(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    assert parse_rdzv_conf("read_timeout=30") == {"rdzv_read_timeout_s": "30"}
    cfg = RunConfig(script=str(script), rdzv_read_timeout_s=30)
    assert cfg.rendezvous.store_timeout_s == 30.0
    assert RunConfig(script=str(script)).rendezvous.store_timeout_s == 60.0  # torch's read_timeout
    with pytest.raises((ValueError, ConfigError), match="store timeout"):
        RunConfig(script=str(script), rdzv_read_timeout_s=2000)  # over the 900 s rendezvous timeout


def test_run_id_is_stable_and_follows_slurm_then_rdzv_id(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    cfg = RunConfig(script=str(script), script_args=["--lr", "0.1"])
    a = stable_run_id(cfg, {})
    assert a == stable_run_id(RunConfig(script=str(script), script_args=["--lr", "0.1"]), {})
    assert a.startswith("train-") and a != stable_run_id(
        RunConfig(script=str(script), script_args=["--lr", "1"]), {}
    )
    assert stable_run_id(cfg, {"SLURM_JOB_ID": "77"}) == "slurm-77"
    assert (
        stable_run_id(cfg, {"SLURM_JOB_ID": "78", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"})
        == "slurm-70_3"
    )
    assert stable_run_id(RunConfig(script=str(script), rdzv_id="job9"), {}) == "job9"
    assert stable_run_id(RunConfig(script=str(script), rdzv_id="job9", standalone=True), {}).startswith(
        "train-"
    )
    assert (
        stable_run_id(RunConfig(script=str(script), run_id="mine", rdzv_id="job9"), {"SLURM_JOB_ID": "1"})
        == "mine"
    )


def test_a_run_dir_belongs_to_one_script(tmp_path: Path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("pass\n")
    b.write_text("pass\n")
    first = build({"script": str(a), "run_id": "shared", "run_dir": tmp_path / "run"}, env={})
    claim_run_dir(first)
    claim_run_dir(first)  # the same run again (a requeue): fine
    other = build({"script": str(b), "run_id": "shared", "run_dir": tmp_path / "run"}, env={})
    with pytest.raises(ConfigError, match="belongs to another run"):
        claim_run_dir(other)


def test_two_run_dirs_of_one_script_are_two_runs(tmp_path: Path, monkeypatch):
    """Same script and arguments in two explicit run dirs: two ids, so their node-memory tiers
    (named after the id) never meet; the same run dir again is the same id (a requeue resumes)."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    one = stable_run_id(RunConfig(script=str(script), run_dir=tmp_path / "a"), {})
    assert one == stable_run_id(RunConfig(script=str(script), run_dir=tmp_path / "a"), {})
    assert one != stable_run_id(RunConfig(script=str(script), run_dir=tmp_path / "b"), {})
    assert one != stable_run_id(RunConfig(script=str(script)), {})
