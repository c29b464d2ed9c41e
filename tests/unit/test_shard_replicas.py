"""Which ranks are replicas of a shard (HSDP), and localisation within each replica group."""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard

from stalwart.policy.sdc import ReplayOutcome, ReplicaVerdict, localise
from stalwart.train.replica_check import Replay, ReplicaCheck
from stalwart.train.shard_replicas import groups_along, localise_groups, replicas_of, replicate_dim


def test_the_replicate_dim_is_the_one_every_dtensor_is_replicated_on():
    hsdp = (Replicate(), Shard(0))
    assert replicate_dim([hsdp, hsdp]) == 0
    assert replicate_dim([(Shard(0), Replicate()), (Shard(1), Replicate())]) == 1
    assert replicate_dim([(Shard(0),), (Shard(0),)]) is None  # plain FSDP: every rank a different shard
    assert replicate_dim([(Shard(1),), (Replicate(),)]) is None  # TP: not replicated everywhere
    assert replicate_dim([hsdp, (Shard(0), Shard(0))]) is None
    assert replicate_dim([]) is None


def test_replica_groups_are_the_ranks_differing_only_along_that_dim():
    layout = torch.arange(4).reshape(2, 2)  # mesh (replicate=2, shard=2)
    assert groups_along(layout, 0) == [[0, 2], [1, 3]]  # shard 0 on ranks 0 and 2, shard 1 on 1 and 3
    assert groups_along(layout, 1) == [[0, 1], [2, 3]]
    assert groups_along(torch.arange(8).reshape(2, 2, 2), 0) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_plain_tensors_are_replicated_on_every_rank():
    found = replicas_of([torch.zeros(3), torch.ones(2)], 3)
    assert found.groups == ((0, 1, 2),) and not found.off and not found.sharded


def test_one_replica_group_over_every_rank_is_plain_localisation():
    rows = [[1, 2], [1, 2], [1, 9]]
    found, group = localise_groups(rows, [[0, 1, 2]])
    assert found == localise(rows) and group == (0, 1, 2)


def test_a_pair_of_replicas_that_disagree_names_nobody_and_keeps_its_group():
    rows = [[1, 2], [5, 6], [1, 2], [5, 7]]  # shard 0 on ranks 0, 2; shard 1 on 1, 3 (rank 1 or 3 flipped)
    found, group = localise_groups(rows, [[0, 2], [1, 3]])
    assert found.verdict is ReplicaVerdict.PAIR and found.suspects == () and found.tensors == (1,)
    assert group == (1, 3) and "ranks 1, 3" in found.reason
    clean, none = localise_groups([[1], [5], [1], [5]], [[0, 2], [1, 3]])
    assert clean.clean and none == ()


def test_the_odd_one_out_is_named_by_global_rank_within_its_group():
    rows = [[1], [5], [1], [6], [1], [5]]  # 3 replicas of 2 shards: ranks 0, 2, 4 and 1, 3, 5
    found, group = localise_groups(rows, [[0, 2, 4], [1, 3, 5]])
    assert found.verdict is ReplicaVerdict.ODD_ONE_OUT and found.suspects == (3,) and found.confidence == 0.9
    assert group == (1, 3, 5)
    both, _ = localise_groups([[1], [5], [2], [6], [1], [5]], [[0, 2, 4], [1, 3, 5]])
    assert both.suspects == (2, 3) and both.confidence == 0.6  # several groups: a shared cause is likelier
    mixed, group = localise_groups([[1], [5], [2], [6], [1], [7]], [[0, 2, 4], [1, 3, 5]])
    assert mixed.verdict is ReplicaVerdict.SPLIT and mixed.suspects == () and group == (1, 3, 5)


def test_the_replay_is_judged_within_the_group_and_names_a_global_rank():
    first = ((1,), (9,), (1,), (5,))  # rank 1's shard differed from rank 3's
    replay = Replay(first, ("n0", "n1", "n2", "n3"), 30, (1, 3))
    found = ReplicaCheck._judge(replay, [[1], [5], [1], [5]], 31, -1)
    assert found.outcome is ReplayOutcome.TRANSIENT and found.suspects == (1,)
    assert "ranks 1, 3" in found.reason
    stopped = ReplicaCheck._judge(replay, None, 31, 30)
    assert stopped.outcome is ReplayOutcome.NOT_REACHED and stopped.suspects == ()
