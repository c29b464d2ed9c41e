"""The worker bootstrap leaves the script what ``python train.py`` gives it (``sys.argv``,
``sys.path[0]``, ``__main__``, the environment), cold and warm, while its process title names the
rank, and a warm worker's /proc/PID/environ holds its own RANK.

The warm driver runs in its own process: the agent side makes its process a child subreaper."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stalwart.launch.processes.bootstrap import BOOT_CODE

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent("""
    import json, os, sys, __main__
    def proc(name):
        with open(f"/proc/self/{name}", "rb") as fh:
            return fh.read().decode(errors="replace")
    out = {
        "argv": sys.argv, "path0": sys.path[0], "name": __name__,
        "main_file": __main__.__file__, "main_is_me": sys.modules["__main__"] is __main__
        and hasattr(__main__, "proc"),
        "env": {k: v for k, v in os.environ.items() if k != "PROBE_OUT"},
        "cmdline": proc("cmdline").replace("\\0", " "),
        "environ": [kv for kv in proc("environ").split("\\0") if kv.startswith(("RANK=", "LOCAL_RANK="))],
    }
    with open(os.environ["PROBE_OUT"], "w") as fh:
        json.dump(out, fh)
""")

DRIVER = textwrap.dedent("""
    import os, sys, time
    from stalwart.launch.processes.fork_server import ForkServer, WarmStart
    tmp, script, env_json = sys.argv[1], sys.argv[2], sys.argv[3]
    import json
    env = json.loads(env_json)
    server = ForkServer(sys.executable, ["torch", "stalwart.launch.processes.bootstrap", "setproctitle"],
                        env=dict(os.environ, OMP_NUM_THREADS="1"))
    pid = server.spawn(WarmStart((script, "a b", "--x"), False, env, tmp, instrument=True))
    end = time.time() + 60
    while time.time() < end and os.waitpid(pid, os.WNOHANG) == (0, 0):
        time.sleep(0.05)
    server.close()
""")


def _env(tmp: Path, name: str) -> dict[str, str]:
    return dict(os.environ, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", PROBE_X="y", PROBE_OUT=str(tmp / name))


def _read(tmp: Path, name: str) -> dict:
    return json.loads((tmp / name).read_text())


def test_cold_and_warm_workers_see_what_python_script_py_sees(tmp_path: Path):
    sub = tmp_path / "sub"
    sub.mkdir()
    script = sub / "probe.py"
    script.write_text(PROBE)
    args = ["sub/probe.py", "a b", "--x"]
    subprocess.run([sys.executable, *args], env=_env(tmp_path, "plain.json"), cwd=tmp_path, check=True)
    cold = [sys.executable, "-u", "-c", BOOT_CODE, *args]
    subprocess.run(cold, env=_env(tmp_path, "cold.json"), cwd=tmp_path, check=True, timeout=120)
    warm_env = json.dumps(_env(tmp_path, "warm.json"))
    subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path), "sub/probe.py", warm_env],
        cwd=tmp_path,
        check=True,
        timeout=180,
    )
    plain, cold_seen, warm_seen = (_read(tmp_path, f"{n}.json") for n in ("plain", "cold", "warm"))
    for seen in (cold_seen, warm_seen):
        for key in ("argv", "name", "main_is_me", "env"):
            assert seen[key] == plain[key], key
        assert Path(seen["path0"]).resolve() == Path(plain["path0"]).resolve() == sub.resolve()
        assert seen["main_file"] == plain["main_file"]
        # findable: the title carries the script and the rank (pgrep -f probe.py finds it)
        assert "probe.py a b --x" in seen["cmdline"] and "rank 1 local_rank 1 attempt 0" in seen["cmdline"]
    assert plain["env"]["RANK"] == "1" and plain["env"]["PROBE_X"] == "y"
    assert "RANK=1" in warm_seen["environ"] and "LOCAL_RANK=1" in warm_seen["environ"]


def test_a_scripts_traceback_is_what_python_prints_less_the_bootstraps_frames(tmp_path: Path):
    (tmp_path / "boom.py").write_text("def f():\n    raise KeyError('boom')\n\n\nf()\n")
    env = _env(tmp_path, "unused.json")
    run = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 120}
    plain = subprocess.run([sys.executable, "boom.py"], **run)  # type: ignore[call-overload]
    cold = subprocess.run([sys.executable, "-u", "-c", BOOT_CODE, "boom.py"], **run)  # type: ignore[call-overload]
    assert cold.returncode == plain.returncode == 1, cold.stderr
    said, traceback = cold.stderr.split("\n", 1)
    assert said == "(3 frames of Stalwart's worker bootstrap left out)", cold.stderr  # main, run_main, exec
    assert traceback == plain.stderr


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


CTRL_C_TWICE = textwrap.dedent("""
    import atexit, os, signal, time

    def cleanup():  # the second Ctrl-C (the agent passes the signal on) lands in an exit function
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        print("cleaned up", flush=True)

    atexit.register(cleanup)
    os.kill(os.getpid(), signal.SIGINT)  # the first, from the terminal
    time.sleep(5)
""")


def test_a_second_ctrl_c_during_the_exit_functions_breaks_nothing(tmp_path: Path):
    """Python alone: the second SIGINT breaks the exit function ("Exception ignored in atexit
    callback ... KeyboardInterrupt"). Under the bootstrap the worker ends as the interpreter would
    (one traceback, the exit functions run to their end, killed by SIGINT) and says nothing more."""
    (tmp_path / "twice.py").write_text(CTRL_C_TWICE)
    # as from a terminal: a test run started in the background (nohup, CI) ignores SIGINT, and a
    # child inherits that, so Python would never raise KeyboardInterrupt at all
    run = {
        "cwd": tmp_path,
        "env": _env(tmp_path, "unused.json"),
        "capture_output": True,
        "text": True,
        "preexec_fn": _sigint_default,
    }
    plain = subprocess.run([sys.executable, "twice.py"], timeout=60, **run)  # type: ignore[call-overload]
    assert "Exception ignored in atexit callback" in plain.stderr  # what one Ctrl-C added
    cold = subprocess.run([sys.executable, "-u", "-c", BOOT_CODE, "twice.py"], timeout=120, **run)  # type: ignore[call-overload]
    assert cold.returncode == -2 and "cleaned up" in cold.stdout, cold.stderr
    assert "Exception ignored" not in cold.stderr and cold.stderr.count("KeyboardInterrupt") == 1, cold.stderr
