"""A Session's checkpoints: the engine (built on first use, so a script that never saves pays
nothing), the node's memory tier under the agent, and what this process resumed from and saved.

The engine saves and loads on every rank (see train/state.py for what ``state`` may hold); this
class only tracks steps: the last one saved, the last one known durable, the one resumed at.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError
from ..events import Event
from ..protocol import WorkerEnv, WorkerPlace
from ..protocol.run_dir import DISK_TIER, MEMORY_TIER, MemDir

if TYPE_CHECKING:
    from ..checkpoint.engine import CheckpointEngine, EngineLoad
    from ..checkpoint.node_tier import NodeLink
    from ..checkpoint.tiers import TierConfig


class Checkpoints:
    def __init__(
        self,
        *,
        place: WorkerPlace,
        node: str,
        worker_env: WorkerEnv | None,
        directory: str,
        keep: int,
        tiers: tuple[TierConfig, ...] = (),
        memory_tier: bool = True,
        sink: Callable[[Event], None],
    ) -> None:
        self._place = place
        self._node = node
        self._wenv = worker_env
        self._dir = directory
        self._keep = keep
        self._tiers = tiers  # extra tiers (stalwart.checkpoint.tiers.TierConfig)
        self._memory_tier = memory_tier  # under the agent: the node's memory tier, replicated to a peer
        self._sink = sink
        self._engine: CheckpointEngine | None = None
        self.last_saved = -1
        self.durable_step = -1  # a step known to be on a durable tier: loaded from one, or committed
        self.loaded_step = -1  # the step this process resumed at (loaded, not saved by it)

    @property
    def built(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> CheckpointEngine:
        self.prepare()
        assert self._engine is not None
        return self._engine

    def prepare(self) -> None:
        """Collective: build the engine now, if it is not built. Building forms its process group
        (``new_group``), which waits on the store for every rank with no regard for a dead one: a
        survivor that first builds it at its next save, after a peer died, waits there instead of
        failing, and never joins the re-formed group. Built right after a step, every rank has just
        met in that step's collectives; a save later finds the group formed, and its collectives fail
        at once on a dead peer's closed connections."""
        if self._engine is None:
            self._engine = self._build()

    def _build(self) -> CheckpointEngine:
        from ..checkpoint.engine import CheckpointEngine  # deferred: heavy (torch)
        from ..checkpoint.tiers import TierConfig  # deferred: heavy (pydantic)

        if self._keep < 1:
            raise CheckpointError(
                f"keep_checkpoints={self._keep} would delete every checkpoint", "use keep >= 1"
            )
        local = TierConfig(name=DISK_TIER, kind="local", location=str(self._dir), keep=self._keep)
        tiers: list[TierConfig] = [local, *self._tiers]
        link = None
        if self._memory_tier and self._wenv is not None and self._wenv.mem_dir:
            tiers, link = self._node_memory(tiers, self._wenv)
        return CheckpointEngine(
            tiers,
            rank=self._place.rank,
            world_size=self._place.world_size,
            sink=self._sink,
            on_busy="wait",
            link=link,
        )

    def _node_memory(
        self, tiers: list[TierConfig], wenv: WorkerEnv
    ) -> tuple[list[TierConfig], NodeLink | None]:
        """The agent's node memory tier (newest version only) and this rank's link to the peers."""
        from ..checkpoint.node_tier import NodeLink  # deferred: heavy (aiohttp)
        from ..checkpoint.peer_store import PeerClient, parse_peers  # deferred: heavy (aiohttp)
        from ..checkpoint.tiers import TierConfig  # deferred: heavy (pydantic)

        if any(t.kind == "memory" for t in tiers):  # the script configured its own memory tier
            return tiers, None
        mem_dir = MemDir(Path(wenv.mem_dir))
        mem = TierConfig(name=MEMORY_TIER, kind="memory", location=str(mem_dir.own), keep=1, node_local=True)
        peers = parse_peers(wenv.peers) if wenv.peers else ()
        client = PeerClient(wenv.peer_key) if peers and wenv.peer_key else None
        link = NodeLink(
            local_rank=self._place.local_rank,
            local_world=self._place.local_world_size,
            node_index=self._place.group_rank,
            node=self._node,
            peers=peers,
            held=mem_dir.held,
            client=client,
        )
        return [*tiers, mem], link

    # --- load and save ------------------------------------------------------------------------

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def resume(self, state: dict[str, Any], max_step: int | None = None) -> EngineLoad | None:
        """Load the newest good checkpoint into ``state`` (collective), of a step no later than
        ``max_step`` when given; None when there is none."""
        from . import state as state_io  # deferred: heavy (torch)

        targets = state_io.load_targets(state)
        found = self.engine.load_latest(targets.tensors, max_step)
        if found is None:
            state_io.forget_init(targets.fresh)
            return None
        place = self._place
        own = found.rank_state_from == place.rank and found.world_size == place.world_size
        state_io.apply(state, targets, found.rank_state or {}, own_rng=own)
        self.last_saved = self.loaded_step = found.step
        tiers = {t.name: t for t in self.engine.tiers}
        if found.tier in tiers and tiers[found.tier].durable:
            self.durable_step = found.step  # resumed at the end: nothing new to make durable
        return found

    # Any: the user's training state (torch modules, optimizers, tensors, any object)
    def save(self, state: dict[str, Any], step: int, *, emergency: bool = False) -> None:
        """Stage ``state`` as the checkpoint after ``step`` steps (collective); the persist runs on."""
        from . import state as state_io  # deferred: heavy (torch)

        cap = state_io.capture(state)
        self.engine.save(step, cap.sharded, cap.extras, force=True, emergency=emergency)
        self.last_saved = step

    def wait_durable(self, step: int) -> str:
        """Wait for the persist in flight: "" once a durable tier committed ``step``, else why not."""
        engine = self.engine
        res = engine.wait()
        if res is None:
            return "nothing was persisted"
        if res.step == step and any(engine.tier(name).durable for name in res.committed):
            self.durable_step = step
            return ""
        return "; ".join(f"{c.tier}: {c.reason}" for c in res.commits if not c.ok) or "no durable tier"

    def wait(self) -> None:
        """Wait for a persist in flight, if the engine was ever built."""
        if self._engine is not None:
            self._engine.wait()

    def abandon(self, timeout_s: float) -> None:
        """In-place recovery: drop the engine built on the abandoned process group (a later save builds
        one on the new group). Its persist in flight is waited for at most ``timeout_s``: with the
        group's connections severed, a collective it was in fails at once. What it had not committed
        is not counted as saved; what it committed stays."""

        engine, self._engine = self._engine, None
        if engine is None:
            return

        def close() -> None:
            try:
                engine.close()
            except Exception:  # noqa: BLE001 - the persist failed with the group it ran on: not committed
                pass

        t = threading.Thread(target=close, name="abandon-checkpoint-engine", daemon=True)
        t.start()
        t.join(timeout_s)
        if self.last_saved > self.durable_step:
            self.last_saved = self.durable_step

    def move(self, place: WorkerPlace) -> None:
        """The group shrank in place: later saves and loads are this rank's in the new world (the
        engine built on the old group was abandoned; the next save builds one with this place)."""
        self._place = place

    def close(self) -> None:
        """Wait for background persists and release the engine (a later save builds a new one)."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.close()
