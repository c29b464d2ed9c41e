"""Whether an optimizer's update landed in the step in progress: the one rule every holder of a rank's
live state applies before handing that state on (train/reform.py, train/left_state.py,
integrations/left_files.py).

A rank's objects are the state after N completed steps only while no update of step N+1 has landed.
A collective after the optimizer step (a loss all-reduce for logging, a step-end check) can fail
after the update: the objects are then past the step's start, and handing them on as the state after
N steps would apply the step twice. torch's global optimizer step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``, public; every optimizer of the process)
tells when an update lands.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.optim.optimizer import register_optimizer_step_post_hook


class UpdateWatch:
    """When an optimizer's update last landed, on a count of step boundaries: the owner's own (the
    steps completed, ``count``) or, without one, the calls of :meth:`boundary`."""

    def __init__(self, count: Callable[[], int] | None = None) -> None:
        self._marks = 0
        self._count = count if count is not None else (lambda: self._marks)
        self._at: int | None = None
        self._handle = register_optimizer_step_post_hook(self._note)

    def _note(self, *_: object) -> None:
        self._at = self._count()

    def boundary(self) -> None:
        """A step boundary (without a ``count``): updates before it no longer count."""
        self._marks += 1

    def forget(self) -> None:
        """New objects (a re-formed group's): no update of theirs has landed."""
        self._at = None

    def landed(self, at: int | None = None) -> bool:
        """Whether an update landed at ``at`` on the count (by default now: since the last boundary)."""
        return self._at is not None and self._at == (self._count() if at is None else at)

    def close(self) -> None:
        self._handle.remove()
