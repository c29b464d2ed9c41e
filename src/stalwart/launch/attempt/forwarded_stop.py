"""torchrun's signal semantics for scripts without the SDK's Session (a monitor, pure).

A signal to the agent (SIGTERM, SIGUSR1, SIGINT and ``--signals-to-handle``) when no rank runs a
Session is passed to every worker at once, as torchrun does, so the script's own handler runs (it
may save its own checkpoint and exit, or finish its loop). The verdict then follows what the workers
did, never a claim about checkpoints Stalwart cannot see:

* every worker exited 0: the job **succeeded** (exit 0): it finished, or its handler chose to end it;
* a worker exited otherwise (killed by the signal, or its handler's own exit code): **stopped**, the
  preemption verdict (exit 76: the script's own checkpoints decide where a requeue resumes), or
  **interrupted** for SIGINT, the operator's;
* workers still running ``deadline_s`` after the signal (``--emergency-deadline``): stopped within the
  stop grace, as torchrun's shutdown timeout does.

A signal in an attempt's first ``STARTUP_GRACE_S`` seconds, before any rank said Hello or stepped,
waits for that (bounded) while a worker runs: forwarding it then would kill an SDK worker still
importing instead of letting its Session save.

A Session coordinates its own emergency save (``SignalMonitor`` in ``monitors.py``); this monitor
stands aside as soon as any rank said Hello.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from ...policy.job import AttemptStatus
from ..decision import AttemptOutcome, Decision, DecisionKind
from ..processes.worker_group import describe_exit
from ..snapshot import Snapshot


def _name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# A signal in the first seconds of an attempt may land before the workers said whether they run a
# Session (a warm worker says Hello within a second; a cold one after its imports): until one says so,
# a step is seen, or this grace has passed, the signal waits. Forwarded too early, it would kill an SDK
# worker still importing instead of letting its Session save an emergency checkpoint.
STARTUP_GRACE_S = 10.0


@dataclass(frozen=True)
class ForwardedStop:
    deadline_s: float  # how long the script's own handler may take before the workers are stopped
    startup_grace_s: float = STARTUP_GRACE_S

    def __call__(self, s: Snapshot) -> Decision | None:
        if s.signal is None or s.session_ranks:
            return None
        name = _name(s.signal)
        unknown = not s.sdk_ranks and not s.steps_seen  # no rank has said anything yet (step hooks, Hello)
        waiting = not s.all_exited and s.now - s.started < self.startup_grace_s  # workers that may yet say
        if s.stop_requested_at is None and unknown and waiting:
            return Decision(
                DecisionKind.HOLD,
                f"{name} during start-up: waiting for the workers to say whether they run a Session",
            )
        if s.stop_requested_at is None:
            return Decision(
                DecisionKind.FORWARD_SIGNAL,
                f"{name} passed to every worker at once (no SDK Session in the script, as torchrun does)",
            )
        stopped = AttemptStatus.INTERRUPTED if s.signal == _signal.SIGINT else AttemptStatus.STOPPED
        if s.all_exited:
            codes = [c for c in s.codes.values() if c is not None]
            if all(c == 0 for c in codes):
                return Decision(
                    DecisionKind.FINISHED,
                    f"every worker exited 0 after {name} was passed to it",
                    AttemptOutcome(AttemptStatus.SUCCEEDED),
                )
            exits = ", ".join(sorted({describe_exit(c) for c in codes}))
            return Decision(
                DecisionKind.STOPPED_EXIT,
                f"the workers stopped on {name} ({exits}); the script's own checkpoints decide "
                "where a requeue resumes",
                AttemptOutcome(stopped, detail=exits),
            )
        if s.now - s.stop_requested_at > self.deadline_s:
            return Decision(
                DecisionKind.PASS_STOP,
                f"workers still running {self.deadline_s:g}s after {name} (--emergency-deadline): "
                "stopping them",
                AttemptOutcome(stopped, detail=f"still running {self.deadline_s:g}s after {name}"),
            )
        return Decision(DecisionKind.HOLD, f"waiting for the workers to act on {name}")
