"""The warm-or-cold policy and the fork server's preload list, without processes."""

from __future__ import annotations

from stalwart.launch.processes.fork_server import script_imports
from stalwart.launch.processes.warm_pool import ServerState, ServerStatus, choose_path
from stalwart.launch.processes.worker_group import StartPath, WorkerGroup


def test_warm_when_the_server_is_ready():
    c = choose_path(enabled=True, python_program=True, server_state="ready")
    assert c.warm and "fork server" in c.reason


def test_each_cold_case_names_its_reason():
    off = choose_path(enabled=False, python_program=True, server_state="ready")
    assert not off.warm and "--no-warm" in off.reason
    binary = choose_path(enabled=True, python_program=False, server_state="ready")
    assert not binary.warm and "--no-python" in binary.reason
    dead = choose_path(enabled=True, python_program=True, server_state="dead: fork server exited (code -9)")
    assert not dead.warm and "fork server exited (code -9)" in dead.reason
    none = choose_path(enabled=True, python_program=True, server_state="none")
    assert not none.warm


def test_the_server_status_and_its_text_form_say_the_same():
    dead = ServerStatus(ServerState.DEAD, "fork server exited (code -9)")
    assert str(dead) == "dead: fork server exited (code -9)" and ServerStatus.parse(str(dead)) == dead
    assert (
        ServerStatus.parse("none") == ServerStatus(ServerState.NONE)
        and str(ServerStatus(ServerState.NONE)) == "none"
    )
    assert ServerStatus.parse("ready").state is ServerState.READY
    for status in (dead, ServerStatus(ServerState.NONE), ServerStatus(ServerState.READY)):
        typed = choose_path(enabled=True, python_program=True, server_state=status)
        assert typed == choose_path(enabled=True, python_program=True, server_state=str(status))
    assert not choose_path(
        enabled=True, python_program=True, server_state=ServerStatus(ServerState.DEAD)
    ).warm


def test_a_group_names_its_start_path_and_the_ledger_action():
    group = WorkerGroup(["true"], [])
    assert group.path is StartPath.COLD and group.path == "cold" and f"{group.path}: x" == "cold: x"
    group.procs = {0: object(), 1: object()}  # type: ignore[dict-item]
    group.warm_ranks = [0]
    assert group.path is StartPath.MIXED and group.path.action == "start_cold"
    group.warm_ranks = [0, 1]
    assert group.path is StartPath.WARM and group.path.action == "start_warm"


def test_a_forced_failure_still_tries_warm_so_the_fallback_runs():
    c = choose_path(enabled=True, python_program=True, server_state="ready", forced_failure=True)
    assert c.warm and "forced" in c.reason
    # --no-warm wins over the chaos knob: nothing to fail
    assert not choose_path(enabled=False, python_program=True, server_state="ready", forced_failure=True).warm


def test_preload_list_reads_main_guard_and_try_blocks_but_not_functions(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, json\n"
        "from pathlib import Path\n"
        "from . import sibling\n"
        "try:\n    import yaml\nexcept ImportError:\n    yaml = None\n"
        "def f():\n    import secret_heavy\n"
        "if __name__ == '__main__':\n    from mypkg.train import main\n    main()\n"
    )
    assert script_imports(str(script), False) == [
        "os",
        "json",
        "pathlib",
        "pathlib:Path",
        "yaml",
        "mypkg.train",
        "mypkg.train:main",
    ]
    assert script_imports(str(tmp_path / "missing.py"), False) == []
