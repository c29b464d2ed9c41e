"""The SDK recipes of docs/recipes.md: each one, crashed and resumed, ends bit-identical to the
same recipe run without interruption (in-process, world size 1, no agent)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from stalwart.train import Session


class Crash(Exception):
    pass


def model_and_opt(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


DATA = TensorDataset(
    torch.randn(64, 6, generator=torch.Generator().manual_seed(1)),
    torch.randn(64, 1, generator=torch.Generator().manual_seed(2)),
)


def epoch_loader(sess: Session, seed: int, crash_at: int | None):
    """Recipe: epochs over a DataLoader with a DistributedSampler; the step says where to resume."""
    model, opt = model_and_opt(seed)
    sampler = DistributedSampler(DATA, num_replicas=sess.world_size, rank=sess.rank, shuffle=True, seed=3)
    loader = DataLoader(DATA, batch_size=8, sampler=sampler)
    per_epoch = len(loader)
    batches, current = None, -1
    for step in sess.loop(3 * per_epoch, {"model": model, "optimizer": opt}, checkpoint_every=4):
        epoch, index = divmod(step, per_epoch)
        if epoch != current:  # a new epoch, or the first step after a resume: position the loader
            sampler.set_epoch(epoch)
            batches, current = itertools.islice(iter(loader), index, None), epoch
        x, y = next(batches)  # fetched inside the loop, after the resume
        if step == crash_at:
            raise Crash
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def grad_accumulation(sess: Session, seed: int, crash_at: int | None, micro: int = 4):
    """Recipe: one SDK step = one optimizer step over ``micro`` micro-batches."""
    model, opt = model_and_opt(seed)
    for step in sess.loop(10, {"model": model, "optimizer": opt}, checkpoint_every=3):
        opt.zero_grad()
        for m in range(micro):
            i = (step * micro + m) % 8
            x, y = DATA.tensors[0][i * 8 : (i + 1) * 8], DATA.tensors[1][i * 8 : (i + 1) * 8]
            (torch.nn.functional.mse_loss(model(x), y) / micro).backward()
            if step == crash_at and m == 2:
                raise Crash  # mid-accumulation: the partial gradients are thrown away
        opt.step()
    return model


def mixed_precision(sess: Session, seed: int, crash_at: int | None):
    """Recipe: autocast (bf16 on CPU) with a GradScaler kept in the state, so its scale resumes too."""
    model, opt = model_and_opt(seed)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    for step in sess.loop(9, {"model": model, "optimizer": opt, "scaler": scaler}, checkpoint_every=2):
        i = step % 8
        x, y = DATA.tensors[0][i * 8 : (i + 1) * 8], DATA.tensors[1][i * 8 : (i + 1) * 8]
        if step == crash_at:
            raise Crash
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    model.scale = scaler.get_scale()  # for the assertion
    return model


def ddp_module(sess: Session, seed: int, crash_at: int | None):
    """Recipe: wrap in DDP for training, give the SDK the wrapped module (``ddp.module``)."""
    model, opt = model_and_opt(seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for step in sess.loop(8, {"model": ddp.module, "optimizer": opt}, checkpoint_every=3):
        i = step % 8
        x, y = DATA.tensors[0][i * 8 : (i + 1) * 8], DATA.tensors[1][i * 8 : (i + 1) * 8]
        if step == crash_at:
            raise Crash
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return model


def run(recipe, tmp_path, *, seed: int, crash_at: int | None = None, name: str = "run"):
    with Session({"STALWART_W_RUN_DIR": str(tmp_path / name)}) as sess:  # restores its process hooks
        try:
            return recipe(sess, seed, crash_at)
        except Crash:
            return None
        finally:
            sess.finish()


@pytest.fixture
def process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "recipe, crash_at",
    [(epoch_loader, 13), (grad_accumulation, 7), (mixed_precision, 5)],
    ids=["epoch-loader", "grad-accumulation", "mixed-precision"],
)
def test_recipe_resumes_bit_identical(recipe, crash_at, tmp_path):
    reference = run(recipe, tmp_path, seed=0, name="reference")
    assert run(recipe, tmp_path, seed=0, crash_at=crash_at) is None
    resumed = run(recipe, tmp_path, seed=99)  # a fresh process: other initial weights
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    if recipe is mixed_precision:
        assert resumed.scale == reference.scale and reference.scale != 2.0**8  # the scale moved and resumed


def test_ddp_recipe_resumes_bit_identical(tmp_path, process_group):
    reference = run(ddp_module, tmp_path, seed=0, name="reference")
    assert run(ddp_module, tmp_path, seed=0, crash_at=5) is None
    resumed = run(ddp_module, tmp_path, seed=99)
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


# --- a script that keeps its own checkpoint ----------------------------------------------------


def own_snapshot_trainer(sess: Session, seed: int, crash_at: int | None, snap, seen: list[int]):
    """A script with its own snapshot (pytorch/examples style: model, optimizer and the step count
    in one file, written after every step) that also runs the SDK's loop. The snapshot is loaded
    first; then ``session.loop`` resumes from the SDK's checkpoint and overwrites the state."""
    model, opt = model_and_opt(seed)
    if snap.exists():
        own = torch.load(snap, weights_only=True)
        model.load_state_dict(own["model"])
        opt.load_state_dict(own["optimizer"])
    for step in sess.loop(10, {"model": model, "optimizer": opt}, checkpoint_every=3):
        seen.append(step)
        i = step % 8
        x, y = DATA.tensors[0][i * 8 : (i + 1) * 8], DATA.tensors[1][i * 8 : (i + 1) * 8]
        if step == crash_at:
            raise Crash
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, snap)
    return model


def test_own_snapshot_and_sdk_checkpoint_the_sdk_wins(tmp_path):
    """The script's snapshot is newer (7 steps) than the SDK's checkpoint (6 steps): the SDK's
    checkpoint wins, step 6 is trained again from the SDK's state, and the run ends bit-identical to
    one without a crash."""

    def go(seed, crash_at=None, name="run", seen=None):
        def recipe(sess, seed, crash_at):
            return own_snapshot_trainer(sess, seed, crash_at, tmp_path / f"{name}-snapshot.pt", seen)

        return run(recipe, tmp_path, seed=seed, crash_at=crash_at, name=name)

    reference = go(0, name="reference", seen=[])
    assert go(0, crash_at=7, seen=[]) is None
    assert torch.load(tmp_path / "run-snapshot.pt", weights_only=True)["step"] == 7
    seen: list[int] = []
    resumed = go(99, seen=seen)
    assert seen[0] == 6  # resumed at the SDK's step, not the snapshot's
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def handed_over_trainer(sess: Session | None, seed: int, crash_at: int | None, snap, total: int = 10):
    """The hand-over recipe. Without ``sess``: the script as it was (own snapshot, no SDK), which
    stops after ``crash_at`` steps. With ``sess``: the first and every later run with the SDK. The
    snapshot is read once more on every start, never written again; its step count is the offset of
    the SDK's steps, and ``session.loop`` overwrites its state once the SDK has a checkpoint."""
    model, opt = model_and_opt(seed)
    done = 0
    if snap.exists():
        own = torch.load(snap, weights_only=True)
        model.load_state_dict(own["model"])
        opt.load_state_dict(own["optimizer"])
        done = own["step"]

    def train(step):
        i = step % 8
        x, y = DATA.tensors[0][i * 8 : (i + 1) * 8], DATA.tensors[1][i * 8 : (i + 1) * 8]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    if sess is None:
        for step in range(done, total if crash_at is None else crash_at):
            train(step)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1}, snap)
        return model
    for i in sess.loop(total - done, {"model": model, "optimizer": opt}, checkpoint_every=2):
        step = done + i  # the script's own step count
        if step == crash_at:
            raise Crash
        train(step)
    return model


def test_handing_over_an_own_snapshot_to_the_sdk_resumes_bit_identical(tmp_path):
    snap = tmp_path / "snapshot.pt"
    reference = handed_over_trainer(None, 0, None, tmp_path / "reference-snapshot.pt")
    handed_over_trainer(None, 0, 4, snap)  # the old script ran 4 steps and stopped

    def with_sdk(sess, seed, crash_at):
        return handed_over_trainer(sess, seed, crash_at, snap)

    assert run(with_sdk, tmp_path, seed=99, crash_at=7) is None  # first SDK run: saves at 6, dies at 7
    assert torch.load(snap, weights_only=True)["step"] == 4  # the snapshot is left as it was
    resumed = run(with_sdk, tmp_path, seed=98)
    for a, b in zip(resumed.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


# --- fetching a batch before or after the resume ---------------------------------------------


def prefetching_trainer(sess: Session, seed: int, crash_at: int | None, *, fetch: str):
    """``fetch="after"``: the recipe, each batch fetched inside the loop from the step index.
    ``fetch="before"``: the first batch fetched before ``session.loop``, the next one at the end of
    each step (a common prefetch); after a resume that first batch is the batch of step 0."""
    model, opt = model_and_opt(seed)
    loader = DataLoader(DATA, batch_size=8)
    per_epoch = len(loader)
    batches = iter(loader)
    x, y = next(batches) if fetch == "before" else (None, None)
    current = -1
    for step in sess.loop(12, {"model": model, "optimizer": opt}, checkpoint_every=4):
        epoch, index = divmod(step, per_epoch)
        if fetch == "after":
            if epoch != current:
                batches, current = itertools.islice(iter(loader), index, None), epoch
            x, y = next(batches)
        if step == crash_at:
            raise Crash
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if fetch == "before":
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(loader)
                x, y = next(batches)
    return model


@pytest.mark.parametrize("fetch", ["after", "before"])
def test_batch_fetched_after_the_resume_is_exact_before_is_not(fetch, tmp_path):
    def recipe(sess, seed, crash_at):
        return prefetching_trainer(sess, seed, crash_at, fetch=fetch)

    reference = run(recipe, tmp_path, seed=0, name="reference")
    # checkpoint after 4 steps, crash at step 6: the resume starts at step 4, whose batch is not step 0's
    assert run(recipe, tmp_path, seed=0, crash_at=6) is None
    resumed = run(recipe, tmp_path, seed=99)
    same = all(torch.equal(a, b) for a, b in zip(resumed.parameters(), reference.parameters(), strict=True))
    assert same is (fetch == "after")
