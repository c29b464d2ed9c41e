"""The fork server starts real workers warm: imports done once, exact exit codes and signals,
the worker's IPC descriptor and log in place, nothing left running after close.

The driver runs in its own process, because the agent side makes its process a child subreaper,
which a test runner should not become."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

WORKER = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    mode = sys.argv[1]
    os.write(int(os.environ["IPC_FD"]), f"hello from {os.environ['RANK']}\\n".encode())
    import signal
    print("torch preloaded:", "torch" in sys.modules, "argv:", sys.argv[1:], flush=True)
    print("signals as fresh:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
          and signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
    import gc  # the preloaded objects are frozen out of the collector's full passes; it still runs
    print("frozen:", gc.get_freeze_count() > 10000, "collector on:", gc.isenabled(), flush=True)
    if mode == "gloo":
        dist.init_process_group("gloo")
        x = torch.ones(2) * (dist.get_rank() + 1)
        dist.all_reduce(x)
        print("sum", x[0].item(), flush=True)
        dist.destroy_process_group()
    elif mode == "raise":
        raise KeyError("boom")
    elif mode == "exit":
        sys.exit(7)
    elif mode == "interrupt":  # a Ctrl-C, and a second one (passed on by the agent) in an exit function
        import atexit
        atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2), print("cleaned up")))
        raise KeyboardInterrupt
    elif mode == "sleep":
        time.sleep(60)
""")

DRIVER = textwrap.dedent("""
    import json, os, signal, socket, sys, time
    from stalwart.launch.processes.fork_server import ForkServer, WarmStart
    tmp, script = sys.argv[1], sys.argv[2]
    server = ForkServer(sys.executable, ["torch", "torch.distributed"], env=dict(os.environ, OMP_NUM_THREADS="1"))
    out = {"loaded": server.preloaded, "server_pid": server.proc.pid}
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    def start(rank, mode, world=1):
        r, w = os.pipe()
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), IPC_FD=str(w))
        log = os.path.join(tmp, f"{mode}-{rank}.log")
        pid = server.spawn(WarmStart((script, mode), False, env, tmp, log), fds=(w,))
        os.close(w)
        return pid, r, log
    def wait(pid, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        return None
    t0 = time.monotonic()
    pairs = [start(r, "gloo", 2) for r in range(2)]
    out["spawn_s"] = time.monotonic() - t0
    out["gloo"] = [wait(p) for p, _, _ in pairs]
    out["ipc"] = [os.read(r, 100).decode() for _, r, _ in pairs]
    out["gloo_log"] = open(pairs[0][2]).read()
    for mode in ("raise", "exit", "interrupt"):
        pid, _, log = start(0, mode)
        out[mode] = wait(pid)
        out[mode + "_log"] = open(log).read()
    pid, _, _ = start(0, "sleep")
    out["sleep_ppid"] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    os.kill(pid, signal.SIGKILL)
    out["killed"] = wait(pid)
    pid, _, _ = start(0, "sleep")
    out["left_pid"] = pid
    server.close()
    out["server_exit"] = server.proc.returncode
    print(json.dumps(out))
    os._exit(0)  # the agent dies: its PDEATHSIG must take the sleeping worker with it
""")


def test_fork_server_starts_workers_warm_and_exact(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    p = subprocess.run(
        [sys.executable, str(driver), str(tmp_path), str(script)], capture_output=True, text=True, timeout=240
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["loaded"] == ["torch", "torch.distributed"]
    assert out["gloo"] == [0, 0], out["gloo_log"]
    assert "torch preloaded: True argv: ['gloo']" in out["gloo_log"] and "sum 3.0" in out["gloo_log"]
    assert "signals as fresh: True" in out["gloo_log"]
    assert "frozen: True collector on: True" in out["gloo_log"]
    assert out["ipc"] == ["hello from 0\n", "hello from 1\n"]
    assert out["raise"] == 1 and "KeyError: 'boom'" in out["raise_log"] and "Traceback" in out["raise_log"]
    # the script's own frames, without the fork server's and the bootstrap's, which it says it left out
    assert "of Stalwart's worker bootstrap left out)" in out["raise_log"], out["raise_log"]
    assert "fork_server_main.py" not in out["raise_log"] and "bootstrap.py" not in out["raise_log"]
    assert out["exit"] == 7
    assert out["interrupt"] == -2, out["interrupt_log"]  # as a fresh interpreter: killed by SIGINT
    assert "cleaned up" in out["interrupt_log"] and "Exception ignored" not in out["interrupt_log"]
    assert out["killed"] == -9
    assert out["sleep_ppid"] != out["server_pid"], "the worker is re-parented away from the server"
    assert out["server_exit"] is not None
    # the driver (agent) is gone: its last worker must not outlive it
    import os
    import time

    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(f"/proc/{out['left_pid']}"):
        time.sleep(0.1)
    state = (
        open(f"/proc/{out['left_pid']}/stat").read().rsplit(")", 1)[1].split()[0]
        if os.path.exists(f"/proc/{out['left_pid']}")
        else "gone"
    )
    assert state in ("gone", "Z"), f"orphaned worker still running (state {state})"


def test_fork_server_refuses_when_an_import_started_a_thread(tmp_path):
    driver = tmp_path / "threads.py"
    driver.write_text(
        textwrap.dedent("""
        import os, sys
        from stalwart.launch.processes.fork_server import ForkServer, ForkServerError
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        env["PYTHONSTARTUP"] = ""
        open(sys.argv[1], "w").write("import threading, time\\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\\n")
        env["PYTHONPATH"] = os.path.dirname(sys.argv[1]) + os.pathsep + env.get("PYTHONPATH", "")
        try:
            ForkServer(sys.executable, ["threadstarter"], env=env)
        except ForkServerError as exc:
            print("refused:", exc)
    """)
    )
    p = subprocess.run(
        [sys.executable, str(driver), str(tmp_path / "threadstarter.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "refused:" in p.stdout and "thread" in p.stdout and "forking is unsafe" in p.stdout, p.stdout


def test_warm_pool_drops_the_scripts_imports_when_one_starts_a_thread(tmp_path):
    """The script's own import starts a thread: the pool serves warm with only the default preload."""
    (tmp_path / "threadstarter.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
    )
    (tmp_path / "train.py").write_text("import threadstarter\nprint('trained')\n")
    driver = tmp_path / "pool.py"
    driver.write_text(
        textwrap.dedent("""
        import os, sys
        from stalwart.launch.processes.fork_server import DEFAULT_PRELOAD
        from stalwart.launch.processes.warm_pool import WarmPool
        d = sys.argv[1]
        env = dict(os.environ, PYTHONPATH=d + os.pathsep + os.environ.get("PYTHONPATH", ""))
        pool = WarmPool(python=sys.executable, script=os.path.join(d, "train.py"), module=False,
                        script_args=[], env=env, cwd=d)
        assert "threadstarter" in pool.preload
        pool.launch()
        print("ready:", repr(pool.ready()), "default:", pool.preload == list(DEFAULT_PRELOAD), "starts:", pool.starts)
        pid = pool.spawn(env, (), None)
        print("exit:", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        pool.close()
    """)
    )
    p = subprocess.run(
        [sys.executable, str(driver), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert "ready: '' default: True starts: 2" in p.stdout, p.stdout + p.stderr
    assert "trained" in p.stdout and "exit: 0" in p.stdout
