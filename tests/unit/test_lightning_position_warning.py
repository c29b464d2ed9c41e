"""The warning for a Lightning training loader that cannot restore its position says precisely what
differs at a resume: the step, the batch and the epoch, what Lightning does instead, and the fix."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("lightning")

from stalwart.integrations.lightning import _position_warning  # noqa: E402


def _trainer(step: int, batches: float = 4, accumulate: int = 1) -> SimpleNamespace:
    return SimpleNamespace(global_step=step, num_training_batches=batches, accumulate_grad_batches=accumulate)


def test_a_mid_epoch_resume_names_the_position_and_what_replaces_it():
    text = _position_warning(_trainer(6))
    assert "resumed at step 6, batch 2 of epoch 1 (4 an epoch)" in text
    assert "the rest of epoch 1 (its batches 2-3) comes from the start of a new pass" in text
    assert "StatefulDataLoader" in text and "checkpoint_every a multiple of 4" in text


def test_a_fresh_start_or_an_epoch_boundary_only_says_what_would_differ():
    for step in (0, 8):
        text = _position_warning(_trainer(step))
        assert "resumed at" not in text and "would resume at another data position" in text
        assert "multiple of the epoch's 4 steps" in text


def test_accumulation_counts_optimizer_steps_and_an_endless_loader_has_no_epoch():
    assert "batch 1 of epoch 1 (2 an epoch)" in _position_warning(_trainer(3, batches=4, accumulate=2))
    endless = _position_warning(_trainer(5, batches=float("inf")))
    assert "starts the loader over" in endless and "epoch" not in endless.split(";")[0].split(":")[1]
