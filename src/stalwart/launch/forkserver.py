"""Warm worker starts: a fork server that has already imported torch and the script's imports.

A cold restart pays, per worker, the interpreter start and ``import torch`` (about 2 s of CPU
each; four workers on two cores take ~14 s before the first step). The fork server is one process
per agent that imports those modules once and then forks a worker per request, so a replacement
worker starts in milliseconds with the imports already done. What stays per worker: running the
script from its top (model construction, ``init_process_group``, the checkpoint load).

How a worker becomes the agent's child. The server forks an intermediate child which forks the
worker and exits at once; the agent is a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so the
orphaned worker is re-parented to the agent, which then waits for it like any child of its own
(``os.waitpid``): exit codes and signals are exact, and PDEATHSIG ties the worker to the agent
again once it is re-parented.

Forking is only safe from a single-threaded process: the server checks ``/proc/self/task`` before
every fork and refuses (the agent then falls back to a cold start, with the reason) if any import
started a thread. A server that dies, hangs (every request has a deadline) or fails a request
gives a ``ForkServerError``; the agent falls back to cold starts with that reason in the ledger.

Wire format: one JSON object per line each way on a Unix socket pair; the worker's inherited file
descriptors (its IPC pipe) travel with the request as SCM_RIGHTS.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..protocol.lifetime import become_subreaper, die_with_parent

DEFAULT_PRELOAD = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.distributed",
    "torch.optim",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict",
    "torch.nn.parallel",
    "numpy",
    "stalwart.train",
    "stalwart.train.session",  # what a Session imports lazily: the checkpoint engine, pydantic, sqlite
    "stalwart.checkpoint.engine",
    "stalwart.ledger",
)


class ForkServerError(RuntimeError):
    """The warm path failed; the caller falls back to a cold start."""


def script_imports(script: str, module: bool) -> list[str]:
    """Top-level modules a script imports (parsed, not run), for the server to preload."""
    import ast
    import importlib.util

    path: str | None = script
    if module:
        try:
            spec = importlib.util.find_spec(script)
        except (ImportError, ValueError):
            return []
        path = spec.origin if spec is not None else None
    if not path or not path.endswith(".py"):
        return []
    try:
        tree = ast.parse(Path(path).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in _module_level(tree.body):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return list(dict.fromkeys(n for n in names if n != "__future__"))


def _module_level(body: list) -> list:
    """Statements run at import time: the module body and the bodies of its top-level ``if``/``try``
    blocks (``if __name__ == "__main__":`` included), not function or class bodies."""
    import ast

    out = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out.extend(_module_level(node.body + node.orelse))
        elif isinstance(node, ast.Try):
            out.extend(_module_level(node.body + node.orelse + node.finalbody))
    return out


@dataclass(frozen=True)
class WarmStart:
    """What a request asks the server to start."""

    argv: tuple[str, ...]  # the script path (or module with ``-m``) and its arguments, no interpreter
    module: bool
    env: dict[str, str]
    cwd: str
    log: str = ""  # file for stdout and stderr; "" keeps the server's (the agent's) streams


class ForkServer:
    """The agent's handle on one fork-server process."""

    def __init__(
        self,
        python: str,
        preload: list[str],
        *,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 120.0,
        wait: bool = True,
        label: str = "",
    ) -> None:
        if not become_subreaper():
            raise ForkServerError(
                "this kernel does not let the agent adopt forked workers (PR_SET_CHILD_SUBREAPER)"
            )
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._buf = b""
        self._ready_timeout_s = ready_timeout_s
        self._ready = False
        self.preloaded: list[str] = []
        self.failed_imports: dict[str, str] = {}
        self.files: dict[str, float] = {}  # the script's own preloaded modules and their mtimes
        self.ready_s = 0.0
        self._started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                python,
                "-c",
                "from stalwart.launch.forkserver import _serve; _serve()",
                str(child.fileno()),
                json.dumps(preload),
                label,  # not read: names the server in ps and /proc (e.g. its run directory)
            ],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait (bounded) for the server's imports to finish; raise ForkServerError if it cannot serve."""
        if self._ready:
            return
        try:
            hello = self._reply(self._ready_timeout_s if timeout_s is None else timeout_s)
        except ForkServerError:
            self.close(grace_s=0.0)
            raise
        if not hello.get("ok"):
            self.close()
            raise ForkServerError(f"fork server did not start: {hello.get('error', 'no reason given')}")
        self.preloaded = hello.get("loaded", [])
        self.failed_imports = hello.get("failed", {})
        self.files = {str(k): float(v) for k, v in hello.get("files", {}).items()}
        self.ready_s = time.monotonic() - self._started
        self._ready = True

    def _reply(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ForkServerError(f"fork server gave no answer within {timeout_s:.0f}s")
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                continue
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ForkServerError(f"fork server exited (code {self.proc.poll()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError as exc:
            raise ForkServerError(f"fork server sent garbage: {line[:80]!r}") from exc

    def spawn(
        self,
        start: WarmStart,
        *,
        fds: tuple[int, ...] = (),
        stdio: tuple[int, int] | None = None,
        timeout_s: float = 10.0,
    ) -> int:
        """Start one worker; return its pid (a child of this process once re-parented).

        ``fds`` are descriptors the worker keeps at the same numbers (its IPC pipe); ``stdio`` are
        the write ends that become its stdout and stderr (the agent's output pipes)."""
        if self.proc.poll() is not None:
            raise ForkServerError(f"fork server is gone (exit code {self.proc.returncode})")
        self.wait_ready()
        msg = (
            json.dumps(
                {
                    "argv": list(start.argv),
                    "module": start.module,
                    "env": start.env,
                    "cwd": start.cwd,
                    "log": start.log,
                    "fds": list(fds),
                    "stdio": stdio is not None,
                }
            ).encode()
            + b"\n"
        )
        try:
            socket.send_fds(self._sock, [msg], list(fds) + list(stdio or ()))
        except OSError as exc:
            raise ForkServerError(f"cannot reach the fork server: {exc}") from exc
        reply = self._reply(timeout_s)
        if not reply.get("ok"):
            raise ForkServerError(str(reply.get("error", "the fork server refused the request")))
        return int(reply["pid"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the server (chaos: the warm path forced to fail); its workers are not its children."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the server (its idle state holds memory and a process)."""
        try:
            self._sock.close()
        except OSError:
            pass
        if grace_s <= 0 and self.proc.poll() is None:
            self.proc.kill()  # not waited for: reaped by subprocess's own clean-up or at this process's exit
            return
        if self.proc.poll() is None:
            try:
                self.proc.wait(grace_s)  # it exits when its socket closes
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- the server process -------------------------------------------------------------------------


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
_AGENT_PID = 0  # the server's parent: the agent that adopts its workers


def _serve() -> None:
    global _AGENT_PID
    _AGENT_PID = os.getppid()
    fd, preload = int(sys.argv[1]), json.loads(sys.argv[2])
    sock = socket.socket(fileno=fd)
    die_with_parent()  # never outlive the agent
    # a Ctrl-C or a scheduler's signal to the whole process group is the agent's to handle; the server
    # ends when the agent closes its socket or dies (PDEATHSIG). Workers get the defaults back.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    loaded, failed = [], {}
    for name in preload:
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


def _warm_up_torch() -> None:
    """Run one tiny CPU training step so torch's lazy imports happen here, once, not in every worker:
    the first optimizer step imports torch._dynamo and sympy (~800 modules, seconds of CPU). Each
    worker reseeds its generators after the fork (``_reseed``), as a fresh interpreter would."""
    import torch

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


def _send(sock: socket.socket, obj: dict) -> None:
    sock.sendall(json.dumps(obj).encode() + b"\n")


def _fork_worker(req: dict, fds: list[int], sock: socket.socket) -> dict:
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


def _become_worker(req: dict, fds: list[int], sock: socket.socket) -> None:
    import runpy

    code = 1
    try:
        sock.close()
        agent = _AGENT_PID
        deadline = time.monotonic() + 5.0
        while agent and os.getppid() != agent and time.monotonic() < deadline:
            time.sleep(0.001)  # wait to be adopted by the agent (the subreaper)
        die_with_parent()
        if agent and os.getppid() != agent:
            os._exit(70)  # the agent died meanwhile
        # move every received fd above the numbers in play first, so no dup2 below overwrites another
        import fcntl

        high = [fcntl.fcntl(f, fcntl.F_DUPFD, 1000) for f in fds]
        for f in fds:
            os.close(f)
        wanted = list(req.get("fds", []))
        # the fds the worker expects (its IPC pipe) at the numbers named in its environment
        for want, got in zip(wanted, high, strict=False):
            os.dup2(got, want)
        if req.get("stdio"):
            out, err = high[len(wanted)], high[len(wanted) + 1]
            os.dup2(out, 1)
            os.dup2(err, 2)
        for f in high:
            os.close(f)
        if req.get("log"):
            out = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for sig in _STOP_SIGNALS:  # what a fresh interpreter starts with
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        _match_threads(req["env"])
        _reseed()
        argv = list(req["argv"])
        sys.argv = argv[:]
        sys.path[0] = "" if req["module"] else os.path.dirname(os.path.abspath(argv[0]))
        if req["module"]:
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as the interpreter would: print through the excepthook, exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        import atexit

        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001
                    pass
            os._exit(code)
