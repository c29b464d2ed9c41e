"""The worker bootstrap: what runs in every worker, warm or cold, between its start and its script.

It gives an unchanged script (no Stalwart import) what the SDK gives, through torch's public hooks
and nothing patched:

* **steps**: the global optimizer step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook``
  and ``register_optimizer_step_post_hook``) mark step boundaries. Each step of the first optimizer
  that steps (a GAN's second optimizer does not count twice) goes to the agent as the SDK's own
  ``StepDone`` record over the worker's pipe: a heartbeat, a step time for the calibrated hang timeout
  and the straggler scores, a step for the account. A step lasts from the end of the previous one to
  the end of this one (data loading, forward and backward included); the first from its optimizer
  step's start. Its ``sections`` name :data:`HOOK_SECTION`, so the agent drops these records from a
  rank that runs the SDK's Session (the SDK's own records count; nothing is counted twice).
* **own work**: in data parallelism every rank's step lasts as long as the slowest rank's (the
  others wait for it in the gradient all-reduce), so step times alone cannot score a straggler. The
  leading optimizer's parameters get ``Tensor.register_post_accumulate_grad_hook`` (public): the time
  from this rank's last gradient to its optimizer step is its wait for the all-reduce (section
  :data:`WAIT_SECTION`, a communication section to the straggler scores). After
  :data:`GRAD_WATCH_STEPS` steps only the parameters whose gradient came last stay hooked, so the
  cost is one call per step. Where gradients are not accumulated through autograd (FSDP2 assigns its
  reduced shards) no hook fires and the wait is 0: the step is the rank's own work.
* **chaos**: with a fault plan (``--chaos``), the steps the hooks count fire this rank's faults
  (``hook_chaos.py``), unless a Session in the process fires them.
* **stacks**: ``faulthandler`` on the agent's stack-dump signal writes every thread's stack to the
  rank's stack file, so a hang's stacks reach the ledger without the SDK.
* **names**: the process title carries the script's command line and the rank, local rank and
  attempt (``pgrep -f train.py`` finds ranks, as under torchrun).

Collective completion: torch (2.13) has no public hook for it; the candidates are private
(``ProcessGroup._register_on_completion_hook``, NCCL only; ``_get_sequence_number_for_group``; the
flight recorder's ``_dump_fr_trace``), so a job that never steps an optimizer falls back to the agent's
process-state evidence (``cpu_progress.py``).

What the script sees is what torchrun's ``python train.py`` gives it: ``sys.argv``, ``sys.path[0]``
(the script's directory; the current directory for ``-m``), ``__main__`` (the script, run by
``runpy``) and the environment are left as a fresh interpreter would have them (``prepare_main``).
The cold path runs ``python -u -c "from stalwart.launch.processes.bootstrap import main; main()" [-m]
<script> <args>``; the warm path (``forkserver_main.py``) calls :func:`install` and :func:`run_main`.
An exception that ends the script is printed as the interpreter prints it, through ``sys.excepthook``
(the SDK records it there), less the bootstrap's own frames above the script's (:func:`print_uncaught`).
"""

from __future__ import annotations

import atexit
import builtins
import ctypes
import faulthandler
import importlib.machinery
import os
import runpy
import signal
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, NoReturn, TypeVar

from ...protocol import STACK_DUMP_SIGNAL, StepDone, WorkerEnv, WorkerPlace
from ...protocol.pipe import Sender
from ...protocol.run_dir import RunDir
from ...protocol.step_history import StepHistory, session_owns_steps
from ...terminal import plural
from .hook_chaos import HookChaos
from .hook_ledger import HookLedger
from .hook_sdc import HookSdc

if TYPE_CHECKING:
    from .step_locator import StepLocator

T = TypeVar("T")
HOOK_SECTION = "hook.optimizer"  # the optimizer step's own seconds, in a StepDone the hooks sent
WAIT_SECTION = "sync"  # from this rank's last gradient to its optimizer step: the all-reduce's wait
GRAD_WATCH_STEPS = 3  # steps with every parameter hooked before keeping only the last-ready ones
BOOT_CODE = "from stalwart.launch.processes.bootstrap import main; main()"


@dataclass
class StepObserver:
    """The optimizer step hooks' state: one per worker process."""

    rank: int
    sender: Sender | None
    clock: Callable[[], float] = time.time
    steps: int = 0
    lead: int = 0  # id() of the optimizer whose steps count (the first one that stepped)
    last_end: float = 0.0
    began: float = 0.0
    waited: float = 0.0
    grad_at: float = 0.0  # when this step's latest gradient was accumulated (0: none seen)
    grad_last: int = -1  # which watched parameter that gradient belonged to
    # Any: torch's RemovableHandle (torch is imported lazily here: heavy)
    grad_hooks: dict[int, Any] = field(default_factory=dict)  # parameter index -> hook handle
    grad_lasts: set[int] = field(default_factory=set)  # parameters seen last in a watched step
    chaos: HookChaos | None = None  # the fault plan's faults for this rank (``hook_chaos.py``)
    locator: StepLocator | None = None  # the script's own step numbers (``step_locator.py``)
    sdc: HookSdc | None = None  # the cross-replica state check (``hook_sdc.py``)
    base: int = 0  # the script's step number of this process's first step (the locator's)

    def pre(self, optimizer: object, args: object, kwargs: object) -> None:
        if not self.lead:
            self.lead = id(optimizer)
            self._watch_grads(optimizer)
        if id(optimizer) != self.lead:
            return
        if self.steps == 0 and self.locator is not None and not session_owns_steps():
            self.base = self._guarded(lambda: self.locator.first(optimizer) if self.locator else 0, 0)
        if self.chaos is not None and self.steps == 0:
            # the first step starts at its optimizer step; the others at the previous end
            self.chaos.began(self.base)
        self.began = self.clock()
        fresh = self.grad_at > self.last_end and self.grad_last >= 0
        self.waited = max(0.0, self.began - self.grad_at) if fresh else 0.0
        if fresh and self.steps < GRAD_WATCH_STEPS:
            self.grad_lasts.add(self.grad_last)
        if self.steps == GRAD_WATCH_STEPS and len(self.grad_hooks) > len(self.grad_lasts):
            self._keep_last_grads()

    def post(self, optimizer: object, args: object, kwargs: object) -> None:
        if id(optimizer) != self.lead:
            return
        end = self.clock()
        start = self.last_end if self.last_end else self.began
        self.last_end = end
        if self.sender is not None:
            sections = {HOOK_SECTION: end - self.began}
            if self.waited > 0:
                sections[WAIT_SECTION] = self.waited
            self.sender.send(StepDone(self.rank, self.base + self.steps, start, end - start, sections))
        self.steps += 1
        step = self.base + self.steps - 1
        if self.locator is not None and not session_owns_steps():
            self._guarded(lambda: self.locator.done(step) if self.locator else None, None)
        if self.sdc is not None:
            self.sdc.after(optimizer, self.base, self.steps)  # its own guard; a corruption found raises
        if self.chaos is not None:
            self.chaos.ended(step, end - start)
            self.chaos.began(step + 1)

    def _guarded(self, work: Callable[[], T], fallback: T) -> T:
        """The locator's work inside the script's optimizer step: a failure of ours must never fail
        the script's step. It turns the locator off (steps counted from this process's start) and
        says so once."""
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - any failure of the locator: the script goes on
            self.locator = None
            print(
                f"stalwart: the step locator is off ({type(exc).__name__}: {exc})",
                file=sys.stderr,
                flush=True,
            )
            return fallback

    def grad_ready(self, index: int) -> None:
        self.grad_at = self.clock()
        self.grad_last = index

    def _watch_grads(self, optimizer: object) -> None:
        """Hook every trainable parameter of the leading optimizer (public tensor hooks)."""
        groups = getattr(optimizer, "param_groups", ())
        params = [p for g in groups for p in g.get("params", ()) if getattr(p, "requires_grad", False)]
        for i, p in enumerate(params):
            try:
                self.grad_hooks[i] = p.register_post_accumulate_grad_hook(lambda _p, i=i: self.grad_ready(i))
            except RuntimeError:  # not a leaf (a parameter view): no gradient accumulated there
                continue

    def _keep_last_grads(self) -> None:
        """Only the parameters whose gradient came last in the watched steps stay hooked."""
        for i in [i for i in self.grad_hooks if i not in self.grad_lasts]:
            self.grad_hooks.pop(i).remove()


@dataclass
class Instrumentation:
    """What :func:`install` installed in this process (installed once; a second call returns it)."""

    observer: StepObserver
    handles: list[Any] = field(default_factory=list)  # Any: torch's RemovableHandles, as above
    stack_file: IO[str] | None = None
    title: str = ""


_INSTALLED: Instrumentation | None = None


def installed() -> Instrumentation | None:
    return _INSTALLED


def install(
    env: Mapping[str, str], argv: list[str], *, python: str = "python", forked: bool = False
) -> Instrumentation:
    """Install the observers for this worker (idempotent: a second call changes nothing).
    ``forked``: a warm worker, whose /proc/PID/environ still shows the fork server's environment."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    place = WorkerPlace.from_env(env)
    wenv = WorkerEnv.from_env(env)
    sender = None
    if wenv is not None and wenv.ipc_fd >= 0:
        try:
            sender = Sender(os.dup(wenv.ipc_fd))  # our own descriptor: a Session closing its own is no harm
        except OSError:
            sender = None
    run = RunDir(_path(wenv.run_dir)) if wenv is not None and wenv.run_dir else None
    ledger = (
        HookLedger(run.hook_ledger(wenv.node, place.attempt, place.rank, os.getpid()), place.rank)
        if run and wenv
        else None
    )
    observer = StepObserver(place.rank, sender, chaos=HookChaos.for_worker(wenv, place, ledger))
    if wenv is not None:
        observer.sdc = HookSdc(wenv, place, ledger if place.rank == 0 else None, sender)
    inst = Instrumentation(observer)
    _hook_steps(inst)
    if run is not None and wenv is not None and inst.handles:
        observer.locator = _locator(run, wenv, place, ledger if place.rank == 0 else None)
    if wenv is not None and wenv.run_dir:
        inst.stack_file = _stacks(RunDir(_path(wenv.run_dir)), wenv.node, place.attempt, place.rank)
    inst.title = set_title(python, argv, place, env if forked else None)
    _INSTALLED = inst
    return inst


def _path(text: str) -> Path:
    return Path(text)


def _locator(run: RunDir, wenv: WorkerEnv, place: WorkerPlace, ledger: HookLedger | None) -> StepLocator:
    from .step_locator import Place, StepLocator  # deferred: heavy (torch), only once the step hooks are in

    where = Place(wenv.run_id, wenv.node, place.attempt, place.rank)
    return StepLocator(
        StepHistory(run.step_history(place.rank)), ledger.append if ledger else None, where, time.time
    )


def _hook_steps(inst: Instrumentation) -> None:
    """The global optimizer step hooks (torch is imported here if the script did not preload it)."""
    try:
        from torch.optim.optimizer import (  # deferred: heavy (torch)
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )
    except ImportError:  # not a torch script, or no torch here: nothing to observe
        return
    inst.handles.append(register_optimizer_step_pre_hook(inst.observer.pre))
    inst.handles.append(register_optimizer_step_post_hook(inst.observer.post))


def _stacks(run: RunDir, node: str, attempt: int, rank: int) -> IO[str] | None:
    path = run.stack_file(node, attempt, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fh = os.fdopen(fd, "a")  # private as every file of the run; kept open for faulthandler
    except OSError:
        return None
    faulthandler.register(STACK_DUMP_SIGNAL, file=fh, all_threads=True)
    return fh


def title_of(python: str, argv: list[str], place: WorkerPlace) -> str:
    """The process title: the worker's command line as torchrun starts it, then its place."""
    cmd = " ".join([os.path.basename(python), *argv])
    return f"{cmd} [stalwart rank {place.rank} local_rank {place.local_rank} attempt {place.attempt}]"


def set_title(python: str, argv: list[str], place: WorkerPlace, env: Mapping[str, str] | None = None) -> str:
    """Name the process (setproctitle); a forked worker also shows its own environment in
    /proc/PID/environ (:func:`publish_environ`), as a worker torchrun started would."""
    title = title_of(python, argv, place)
    try:
        import setproctitle  # deferred: optional (a worker without setproctitle runs untitled)
    except ImportError:
        return ""
    setproctitle.setproctitle(title)
    if env is not None:
        publish_environ(env)
    return title


_TORCHRUN_FIRST = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")


def environ_block(env: Mapping[str, str], size: int) -> bytes:
    """``env`` as /proc/PID/environ lays it out, torchrun's variables and Stalwart's first, cut at a
    variable's end to fit ``size`` bytes and padded with NULs."""
    first = [k for k in _TORCHRUN_FIRST if k in env]
    ours = sorted(k for k in env if k.startswith("STALWART_W_") or k.startswith("TORCHELASTIC_"))
    rest = [k for k in env if k not in first and k not in ours]
    out = bytearray()
    for k in (*first, *ours, *rest):
        item = f"{k}={env[k]}".encode(errors="replace") + b"\0"
        if len(out) + len(item) > size:
            break
        out += item
    return bytes(out) + bytes(size - len(out))


def publish_environ(env: Mapping[str, str]) -> bool:
    """Write a forked worker's environment into the memory /proc/PID/environ shows (the fork server's
    environment block, inherited). Only after setproctitle has moved the C library's environment
    strings out of that block (nothing else points into it then); False when it cannot."""

    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5)
    except (OSError, IndexError, ValueError):
        return False
    if env_end <= env_start:
        return False
    block = environ_block(env, env_end - env_start)
    ctypes.memmove(env_start, block, len(block))
    return True


# --- running the script as torchrun's worker would ----------------------------------------------------


def prepare_main(argv: list[str], module: bool, cwd: str) -> tuple[list[str], str]:
    """``sys.argv`` and ``sys.path[0]`` of ``python <script> <args>`` (or ``python -m <module>``)."""
    if module:
        return list(argv), cwd
    return list(argv), os.path.dirname(os.path.abspath(os.path.join(cwd, argv[0])))


def run_main(argv: list[str], module: bool) -> None:
    """Run the script as ``__main__`` with the ``sys.argv`` and ``sys.path[0]`` a fresh interpreter gives."""

    sys.argv, path0 = prepare_main(argv, module, os.getcwd())
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.append(path0)
    if module:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    else:
        _run_file(argv[0])


def _run_file(path: str) -> None:
    """Run a script file as ``__main__`` the way ``python <path>`` does: ``__file__`` and the code's
    file name absolute, ``sys.argv[0]`` as given (``runpy.run_path`` would change one or the other)."""

    full = os.path.abspath(path)
    with open(full, "rb") as fh:
        code = compile(fh.read(), full, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=full,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", full),
        __spec__=None,
        __package__=None,
        __cached__=None,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _bootstrap_frame(tb: TracebackType) -> bool:
    """A frame of the way into the script: this package (the bootstrap, the fork server), ``runpy``
    (``-m``) or the cold path's ``-c`` line."""
    name = tb.tb_frame.f_code.co_filename
    return os.path.dirname(name) == os.path.dirname(__file__) or name in (
        "<string>",
        runpy.__file__,
        "<frozen runpy>",
    )


def user_traceback(tb: TracebackType | None) -> tuple[TracebackType | None, int]:
    """``tb`` from the script's first frame on, and how many of the bootstrap's frames came before it
    (an error in the bootstrap itself keeps its innermost frame)."""
    hidden = 0
    while tb is not None and tb.tb_next is not None and _bootstrap_frame(tb):
        tb, hidden = tb.tb_next, hidden + 1
    return tb, hidden


def print_uncaught(exc: BaseException) -> None:
    """Print an exception that ended the script as the interpreter would, through ``sys.excepthook``,
    without the frames of Stalwart's bootstrap above the script's, saying how many it left out."""
    tb, hidden = user_traceback(exc.__traceback__)
    if hidden:
        print(f"({plural(hidden, 'frame')} of Stalwart's worker bootstrap left out)", file=sys.stderr)
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the interpreter's prints __traceback__


def die_interrupted(exc: KeyboardInterrupt) -> NoReturn:
    """End the script on a KeyboardInterrupt as the interpreter does (its traceback, the exit
    functions, then killed by SIGINT), with SIGINT ignored from the start: one Ctrl-C reaches a
    worker twice (from the terminal, and passed on by the agent to a script without the SDK, as
    torchrun does), and the second must not break an exit function ("Exception ignored in atexit
    callback ... KeyboardInterrupt")."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print_uncaught(exc)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to say
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        os._exit(128 + signal.SIGINT)  # not reached: the signal ends the process


def main() -> None:
    """The cold path's entry: ``python -c BOOT_CODE [-m] <script> <args>``."""
    args = sys.argv[1:]
    module = bool(args) and args[0] == "-m"
    if module:
        args = args[1:]
    if not args:
        raise SystemExit("worker_boot: no script given")
    install(os.environ, (["-m"] if module else []) + args, python=sys.executable)
    try:
        run_main(args, module)
    except SystemExit:
        raise  # as the interpreter ends on it
    except KeyboardInterrupt as exc:
        die_interrupted(exc)
    except BaseException as exc:  # noqa: BLE001 - as the interpreter would: printed, exit 1
        print_uncaught(exc)
        sys.exit(1)
