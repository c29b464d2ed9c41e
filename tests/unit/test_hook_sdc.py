"""An unchanged script's cross-replica check tells its agent what it found over the bootstrap's own
pipe (the agent quarantines its node when the finding names it: launch/attempt/sdc_quarantine.py)."""

from __future__ import annotations

from stalwart.launch.processes.hook_sdc import HookSdc
from stalwart.protocol import CorruptionFound, WorkerEnv, WorkerPlace
from stalwart.protocol.pipe import Receiver, Sender


def test_a_finding_goes_to_the_agent_over_the_bootstraps_pipe_and_without_one_nowhere():
    receiver = Receiver()
    sender = Sender(receiver.new_channel())
    wenv = WorkerEnv(run_dir="", run_id="r", node="n1", attempt=0)
    msg = CorruptionFound(1, 38, "odd_one_out", (1,), ("n1",), 0.9, 5.0, ("params[0]",))
    try:
        HookSdc(wenv, WorkerPlace(rank=1, world_size=3), None, sender)._tell(msg)
        HookSdc(wenv, WorkerPlace(rank=2, world_size=3), None)._tell(msg)  # no pipe: nothing, no error
        assert receiver.drain() == [msg]
    finally:
        sender.close()
        receiver.close()
