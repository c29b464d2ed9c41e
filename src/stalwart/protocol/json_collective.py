"""All-gather and broadcast of JSON values over tensor collectives: what ranks exchange is data.

torch's ``all_gather_object`` and ``broadcast_object_list`` pickle on send and unpickle on receive,
so any process that joins the group (a fake node slipped into a rendezvous) can run code in every
worker with a crafted object. Here a value is ``json.dumps``'d to UTF-8 bytes and sent as a uint8
tensor, after its length as an int64 tensor; the receiver checks the length against a cap and parses
with ``json.loads``. A peer's bytes are never code: a bad length or a payload that is not JSON is a
:class:`PeerDataError` naming the rank.

Every rank raises together: a rank whose value cannot be encoded (not JSON, or over the cap) still
takes part and announces the length -1, so the others fail with the same error instead of waiting
in the next collective. The tensors live where the group's backend needs them: the current CUDA
device for nccl, host memory otherwise (gloo, or a mixed ``cpu:gloo,cuda:nccl`` group).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from ..errors import StalwartError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

JSON: TypeAlias = None | bool | int | float | str | list["JSON"] | dict[str, "JSON"]

MAX_BYTES = 64 << 20  # one value; checkpoint manifests and candidate lists are far smaller
_UNENCODABLE = -1  # the length a rank announces when its own value cannot be sent


class PeerDataError(StalwartError):
    """A rank sent a length or payload that is not a JSON value within the cap (or could not send)."""


def encode(value: JSON, limit: int = MAX_BYTES) -> bytes:
    """The bytes that carry ``value``; ValueError when it is not JSON (NaN, a tuple key, an object)
    or its encoding is over ``limit`` bytes."""
    try:
        data = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a JSON value: {exc}") from None
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes encoded, over the {limit}-byte limit")
    return data


def check_length(size: int, peer: int, limit: int = MAX_BYTES) -> int:
    """``size`` if a payload of that many bytes may be received from ``peer``, else PeerDataError."""
    if size == _UNENCODABLE:
        raise PeerDataError(f"rank {peer} could not encode its value as JSON within {limit} bytes")
    if not 0 <= size <= limit:
        raise PeerDataError(f"rank {peer} announced a payload of {size} bytes, outside 0..{limit}")
    return size


def decode(data: bytes, peer: int) -> JSON:
    """The JSON value in ``data`` from ``peer``; PeerDataError when it is not UTF-8 JSON."""
    try:
        value: JSON = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PeerDataError(
            f"rank {peer} sent {len(data)} bytes that are not JSON ({exc}); refused"
        ) from None
    return value


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def device_for(backend: str) -> str:
    """Where a collective's tensors live for a group of ``backend``: nccl's on the current CUDA device,
    every other backend's (gloo, mpi, mixed ``cpu:gloo,cuda:nccl``) in host memory."""
    if backend.lower() == "nccl":
        import torch  # deferred: heavy (torch)

        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _mine(value: JSON, limit: int) -> tuple[bytes, int]:
    """This rank's bytes and the length it announces (-1 when the value cannot be sent)."""
    try:
        data = encode(value, limit)
    except ValueError:
        return b"", _UNENCODABLE
    return data, len(data)


def _payload(data: bytes, size: int, device: str) -> torch.Tensor:
    import torch  # deferred: heavy (torch)

    buf = torch.zeros(size, dtype=torch.uint8)
    if data:
        buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return buf.to(device)


def _bytes(t: torch.Tensor, n: int) -> bytes:
    return bytes(t[:n].cpu().numpy().tobytes())


def all_gather_json(value: JSON, group: ProcessGroup | None = None, *, limit: int = MAX_BYTES) -> list[JSON]:
    """Every rank's ``value``, in group-rank order (this rank's too, as its peers decode it)."""
    import torch  # deferred: heavy (torch)
    import torch.distributed as dist  # deferred: heavy (torch)

    device = device_for(str(dist.get_backend(group)))
    world = dist.get_world_size(group)
    data, n = _mine(value, limit)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([n], dtype=torch.int64, device=device), group=group)
    sizes = [int(t.item()) for t in lengths]
    for peer, size in enumerate(sizes):
        check_length(size, peer, limit)
    widest = max(sizes)
    if widest == 0:  # nothing to send: only empty payloads, which are not JSON
        return [decode(b"", peer) for peer in range(world)]
    bufs = [torch.empty(widest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(bufs, _payload(data, widest, device), group=group)
    return [decode(_bytes(b, size), peer) for peer, (b, size) in enumerate(zip(bufs, sizes, strict=True))]


def broadcast_json(
    value: JSON, src: int, group: ProcessGroup | None = None, *, limit: int = MAX_BYTES
) -> JSON:
    """Rank ``src``'s ``value`` on every rank (``src`` is a global rank, as in ``dist.broadcast``;
    the other ranks' ``value`` is ignored). ``src`` gets the decoded copy its peers get."""
    import torch  # deferred: heavy (torch)
    import torch.distributed as dist  # deferred: heavy (torch)

    device = device_for(str(dist.get_backend(group)))
    sender = dist.get_rank() == src
    data, n = _mine(value, limit) if sender else (b"", 0)
    length = torch.tensor([n], dtype=torch.int64, device=device)
    dist.broadcast(length, src, group=group)
    size = check_length(int(length.item()), src, limit)
    buf = _payload(data, size, device) if sender else torch.empty(size, dtype=torch.uint8, device=device)
    if size:
        dist.broadcast(buf, src, group=group)
    return decode(_bytes(buf, size), src)
