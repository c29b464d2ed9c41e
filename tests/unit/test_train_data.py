"""ElasticDistributedSampler under torchdata's StatefulDataLoader: exactly once across resizes."""

from __future__ import annotations

import io
from collections import Counter

import pytest
import torch

from stalwart.errors import CheckpointError
from stalwart.train.data import ElasticDistributedSampler
from stalwart.train.state import check_plain

StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

N = 48


def loaders(world: int, batch: int = 2, seed: int = 7):
    data = list(range(N))
    out = []
    for r in range(world):
        s = ElasticDistributedSampler(N, rank=r, world_size=world, seed=seed)
        out.append(StatefulDataLoader(data, batch_size=batch, sampler=s))
    return out


def take(its, steps: int) -> list[int]:
    seen = []
    for _ in range(steps):
        for it in its:
            seen += next(it).tolist()
    return seen


def through_a_file(state):
    """What a checkpoint does with the loader state: plain data, read back with weights_only."""
    check_plain(state, "data")
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_one_epoch_is_a_permutation_split_over_ranks():
    seen = []
    for ld in loaders(4):
        seen += [i for b in ld for i in b.tolist()]
    assert sorted(seen) == list(range(N))
    assert ElasticDistributedSampler(N, seed=7).permutation(0) != list(range(N))  # shuffled
    assert ElasticDistributedSampler(N, seed=7).permutation(1) != ElasticDistributedSampler(
        N, seed=7
    ).permutation(0)


@pytest.mark.parametrize("new_world", [4, 2, 3, 1])
def test_resuming_at_another_world_size_consumes_every_sample_once(new_world):
    first = loaders(4)
    its = [iter(ld) for ld in first]
    seen = take(its, 3)  # 3 steps x 4 ranks x 2 samples
    saved = [through_a_file(ld.state_dict()) for ld in first]
    seen += take(its, 1)  # consumed after the checkpoint: lost with the crash, must come again
    assert len(seen) == 32
    seen = seen[:24]
    second = loaders(new_world)
    for r, ld in enumerate(second):
        ld.load_state_dict(saved[r % 4])
    for ld in second:
        seen += [i for b in ld for i in b.tolist()]
    counts = Counter(seen)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}


def test_state_is_global_and_names_the_epoch():
    ld = loaders(2)
    its = [iter(x) for x in ld]
    take(its, 2)
    s0, s1 = ld[0].state_dict(), ld[1].state_dict()
    assert s0["_sampler_iter_state"]["sampler_state"] == s1["_sampler_iter_state"]["sampler_state"]
    assert s0["_sampler_iter_state"]["sampler_state"]["consumed"] == 8


def test_next_epoch_starts_over_with_a_new_order():
    s = ElasticDistributedSampler(N, seed=1)
    first = list(s)
    s.set_epoch(1)
    second = list(s)
    assert sorted(first) == sorted(second) == list(range(N)) and first != second


def test_a_position_for_another_dataset_is_refused():
    s = ElasticDistributedSampler(N, seed=1)
    with pytest.raises(CheckpointError, match="same dataset"):
        s.load_state_dict({"epoch": 0, "consumed": 4, "num_samples": N + 1, "seed": 1})
    with pytest.raises(CheckpointError, match="invalid sampler layout"):
        ElasticDistributedSampler(N, rank=2, world_size=2)


def test_drop_last_never_duplicates():
    seen = []
    for r in range(5):
        seen += list(ElasticDistributedSampler(N, rank=r, world_size=5, drop_last=True))
    assert len(seen) == 45 and len(set(seen)) == 45
