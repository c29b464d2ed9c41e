"""The fork server's own process (started by :class:`~stalwart.launch.processes.fork_server.ForkServer`), and
each worker between its fork and its script.

The server imports the preload list once, warms torch up, freezes what it holds out of the
collector's reach and reports; then it forks one worker per request (through an intermediate child,
so the worker is re-parented to the agent, a child subreaper). A worker waits to be adopted, puts its
inherited descriptors at the numbers it expects, restores what a fresh interpreter starts with and
runs the script as ``__main__``.
"""

from __future__ import annotations

import atexit
import fcntl
import gc
import json
import os
import signal
import socket
import sys
import time
from typing import Any

import setproctitle

from ...protocol.lifetime import die_with_parent
from .bootstrap import die_interrupted, install, print_uncaught, run_main


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
_AGENT_PID = 0  # the server's parent: the agent that adopts its workers


def _take_attribute(module: str, attr: str) -> None:
    """``from module import attr`` ahead of the script (the module is already imported, or failed and
    was said so): only a speed-up, so a failure here is silent and the worker meets it itself."""
    mod = sys.modules.get(module)
    if mod is None:
        return
    try:
        getattr(mod, attr)
    except BaseException:  # noqa: BLE001 - a name that is a submodule, or fails: the worker's to meet
        pass


def serve() -> None:
    """The server's main: ``argv`` holds the socket's descriptor and the JSON list to preload."""
    global _AGENT_PID
    _AGENT_PID = os.getppid()
    fd, preload = int(sys.argv[1]), json.loads(sys.argv[2])
    sock = socket.socket(fileno=fd)
    die_with_parent()  # never outlive the agent
    # a Ctrl-C or a scheduler's signal to the whole process group is the agent's to handle; the server
    # ends when the agent closes its socket or dies (PDEATHSIG). Workers get the defaults back.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    loaded: list[str] = []
    failed: dict[str, str] = {}
    for name in preload:
        if ":" in name:  # ``from M import a``: the attribute, loaded now where M loads it lazily
            _take_attribute(*name.split(":", 1))
            continue
        try:
            __import__(name)
            loaded.append(name)
        except BaseException as exc:  # noqa: BLE001 - a module that fails here fails in the worker, visibly
            failed[name] = f"{type(exc).__name__}: {exc}"[:200]
    if "torch" in loaded:
        try:
            _warm_up_torch()
        except BaseException as exc:  # noqa: BLE001 - only a lost speed-up; the worker pays it instead
            failed["(torch warm-up)"] = f"{type(exc).__name__}: {exc}"[:200]
    # the preloaded modules live as long as the workers: freeze them out of the collector's reach, so a
    # worker's full collections walk only what it made itself (with torch loaded a full collection
    # took 0.19 s, and beside a CPU hog over 3 s: long enough to be declared a hang), and its pages
    # stay shared with the server (the fork-server recipe of the gc module's documentation)
    if "setproctitle" in loaded:
        _title_ready()
    gc.collect()
    gc.freeze()
    if _threads() > 1:
        _send(
            sock,
            {
                "ok": False,
                "error": f"an import started {_threads() - 1} thread(s); forking is unsafe "
                f"(preloaded: {', '.join(loaded)})",
            },
        )
        return
    _send(sock, {"ok": True, "loaded": loaded, "failed": failed, "files": _own_files(loaded)})
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    buf = b""
    pending_fds: list[int] = []
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 16)
        except OSError:
            return
        if not data:
            return  # the agent closed its end: done
        buf += data
        pending_fds.extend(fds)
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            req = json.loads(line)
            count = len(req.get("fds", [])) + (2 if req.get("stdio") else 0)
            mine, pending_fds = pending_fds[:count], pending_fds[count:]
            _send(sock, _fork_worker(req, mine, sock))
            for f in mine:
                os.close(f)


def _title_ready() -> None:
    """Let setproctitle find the argument and environment memory now, while the C library's
    environment is the original one (a worker clears and refills it before naming itself). The
    server keeps its own command line as its title."""

    setproctitle.setproctitle(setproctitle.getproctitle())


def _warm_up_torch() -> None:
    """Run one tiny CPU training step so torch's lazy imports happen here, once, not in every worker:
    the first optimizer step imports torch._dynamo and sympy (~800 modules, seconds of CPU). Each
    worker reseeds its generators after the fork (``_reseed``), as a fresh interpreter would."""
    import torch  # deferred: heavy (torch)

    layer = torch.nn.Linear(4, 4)
    for opt in (torch.optim.AdamW(layer.parameters()), torch.optim.SGD(layer.parameters(), lr=0.1)):
        layer(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def _own_files(loaded: list[str]) -> dict[str, float]:
    """Source files of preloaded modules outside the interpreter's installation (the script's own
    modules): the agent compares their mtimes before each warm start, so an edited one goes cold."""
    prefixes = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    out: dict[str, float] = {}
    for name in loaded:
        path = getattr(sys.modules.get(name), "__file__", None)
        if not path:
            continue
        real = os.path.realpath(path)
        if real.startswith(prefixes) or "site-packages" in real or "dist-packages" in real:
            continue
        try:
            out[real] = os.stat(real).st_mtime
        except OSError:
            pass
    return out


def _send(sock: socket.socket, obj: dict[str, object]) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


# Any: a message of the fork server's JSON protocol (json.loads/json.dumps)
def _fork_worker(req: dict[str, Any], fds: list[int], sock: socket.socket) -> dict[str, Any]:
    if _threads() > 1:
        return {"ok": False, "error": "the fork server has started threads; forking is unsafe"}
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return {
            "ok": False,
            "error": "CUDA was initialised in the fork server; a forked worker cannot use it",
        }
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the intermediate child: fork the worker, report its pid, exit
        os.close(r)
        try:
            pid = os.fork()
            if pid == 0:
                os.close(w)
                _become_worker(req, fds, sock)  # never returns
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    raw = b""
    while chunk := os.read(r, 64):
        raw += chunk
    os.close(r)
    os.waitpid(middle, 0)
    if not raw:
        return {"ok": False, "error": "the worker could not be forked"}
    return {"ok": True, "pid": int(raw)}


def _reseed() -> None:
    """torch and numpy seed their default generators from the OS at import, so each fresh worker
    draws its own numbers; forked ones would all share the server's state. Seed them from the OS
    again (Python's ``random`` reseeds itself after a fork). A script that seeds is unaffected."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _match_threads(env: dict[str, str]) -> None:
    """torch read OMP_NUM_THREADS (1) when the server imported it; give the worker its own value."""
    torch = sys.modules.get("torch")
    want = env.get("OMP_NUM_THREADS", "")
    if torch is None or not want.isdigit() or int(want) < 1:
        return
    if torch.get_num_threads() != int(want):
        torch.set_num_threads(int(want))


def _await_adoption() -> None:
    """Wait (bounded) to be re-parented to the agent (the subreaper), then die with it."""
    agent = _AGENT_PID
    deadline = time.monotonic() + 5.0
    while agent and os.getppid() != agent and time.monotonic() < deadline:
        time.sleep(0.001)
    die_with_parent()
    if agent and os.getppid() != agent:
        os._exit(70)  # the agent died meanwhile


# Any: a message of the fork server's JSON protocol (json.loads/json.dumps)
def _place_fds(req: dict[str, Any], fds: list[int]) -> None:
    """The received descriptors at the numbers the worker expects: its IPC pipe at the numbers named
    in its environment, the output pipes (or the log) as stdout and stderr, /dev/null as stdin."""

    # move every received fd above the numbers in play first, so no dup2 below overwrites another
    high = [fcntl.fcntl(f, fcntl.F_DUPFD, 1000) for f in fds]
    for f in fds:
        os.close(f)
    wanted = list(req.get("fds", []))
    for want, got in zip(wanted, high, strict=False):
        os.dup2(got, want)
    if req.get("stdio"):
        out, err = high[len(wanted)], high[len(wanted) + 1]
        os.dup2(out, 1)
        os.dup2(err, 2)
    for f in high:
        os.close(f)
    if req.get("log"):
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


# Any: a message of the fork server's JSON protocol (json.loads/json.dumps)
def _become_worker(req: dict[str, Any], fds: list[int], sock: socket.socket) -> None:

    code = 1
    try:
        sock.close()
        _await_adoption()
        _place_fds(req, fds)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sig in _STOP_SIGNALS:  # what a fresh interpreter starts with
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _match_threads(req["env"])
        _reseed()
        argv = list(req["argv"])
        if req.get("instrument"):
            install(req["env"], (["-m"] if req["module"] else []) + argv, python=sys.executable, forked=True)
        run_main(argv, bool(req["module"]))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt as exc:
        die_interrupted(exc)  # killed by SIGINT, as a fresh interpreter
    except BaseException as exc:  # noqa: BLE001 - as the interpreter would: print through the excepthook, exit 1
        print_uncaught(exc)
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            os._exit(code)
