"""Read DCP checkpoints without running code from them.

torch.distributed.checkpoint reads its ``.metadata`` file with ``pickle.load`` and the non-tensor
values of a state dict with ``torch.load(weights_only=False)``: a planted file runs arbitrary code
on load. Here ``.metadata`` goes through an unpickler that resolves only the globals DCP metadata
needs (found by saving a two-tensor state, a DDP model + Adam, a DTensor state and an FSDP2 model +
AdamW with torch 2.13 and listing the globals every ``.metadata`` referenced), and non-tensor
values go through ``torch.load(weights_only=True)``. Anything else is refused with an
``UnsafeCheckpoint`` that names the global, before it is resolved, so nothing executes.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from ..errors import CheckpointError

METADATA = ".metadata"
MAX_METADATA_BYTES = 1 << 30

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_DCP_METADATA, "Metadata"),
        (_DCP_METADATA, "StorageMeta"),
        (_DCP_METADATA, "MetadataIndex"),
        (_DCP_METADATA, "TensorStorageMetadata"),
        (_DCP_METADATA, "BytesStorageMetadata"),
        (_DCP_METADATA, "ChunkStorageMetadata"),
        (_DCP_METADATA, "TensorProperties"),
        (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # looks a layout up by name in a fixed table
        ("torch", "Size"),
        ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
    }
)


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint file asks for code to run (a global outside the allow-list) or is not a pickle."""


# read from the module dict: getattr(torch, name) would run torch's lazy-import __getattr__
_DTYPES = frozenset(n for n, v in vars(torch).items() if isinstance(v, torch.dtype))


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and name in _DTYPES


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only :data:`ALLOWED_GLOBALS` and torch dtypes; refuses everything else by name."""

    # Any: pickle.Unpickler.find_class returns any object
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS or _is_dtype(module, name):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(
            f"checkpoint metadata asks for the global {module}.{name}, which is not "
            "DCP metadata (refused without running it)",
            "the file was planted or damaged; the load falls back to an older version",
        )

    def persistent_load(self, pid: Any) -> Any:  # Any: pickle.Unpickler.persistent_load's signature
        raise UnsafeCheckpoint(
            "checkpoint metadata uses pickle persistent ids (refused)", "the file was planted or damaged"
        )


def load_metadata(data: bytes) -> Metadata:
    """Unpickle DCP ``.metadata`` bytes with the restricted unpickler; it must yield a Metadata."""
    try:
        obj = RestrictedUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint:
        raise
    except Exception as exc:  # a truncated or garbled pickle raises almost anything
        raise UnsafeCheckpoint(
            f"checkpoint metadata does not unpickle: {type(exc).__name__}: {exc}",
            "the file is damaged; the load falls back to an older version",
        ) from None
    if not isinstance(obj, Metadata):
        raise UnsafeCheckpoint(
            f"checkpoint metadata holds a {type(obj).__name__}, not DCP Metadata",
            "the file was planted or damaged",
        )
    return obj


def check_metadata_file(path: Path) -> str:
    """ "" if ``path`` is DCP metadata that loads without running code, else the reason (one line)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_METADATA_BYTES + 1)
    except OSError as exc:
        return f"cannot read {path.name}: {exc.strerror or exc}"
    if len(data) > MAX_METADATA_BYTES:
        return f"{path.name} is larger than {MAX_METADATA_BYTES} bytes"
    try:
        load_metadata(data)
    except UnsafeCheckpoint as exc:
        return exc.message
    return ""


def check_metadata(directory: Path, names: list[str]) -> str:
    """The metadata check for one rank's share of the files: only the rank holding ``.metadata``."""
    return check_metadata_file(directory / METADATA) if METADATA in names else ""


def refusal_line(exc: BaseException) -> str:
    """One line from torch's many-line weights-only refusal: the one naming the global, if any."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return next((ln for ln in lines if "GLOBAL" in ln), lines[0] if lines else type(exc).__name__)[:200]


def load_torch_file(path: Path) -> Any:  # Any: torch.load/pickle return arbitrary objects
    """``torch.load(weights_only=True)`` of a ``.pt`` file from a checkpoint, with a refusal (a
    global outside torch's weights-only allow-list) raised as one-line ``UnsafeCheckpoint`` so the
    caller can reject the version and fall back instead of crashing."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(
            f"{path.name} was refused by torch.load(weights_only=True): {refusal_line(exc)}",
            "the file was planted or damaged; the load falls back to an older version",
        ) from None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with ``read_metadata`` through the restricted unpickler. DCP turns a
    failed metadata read into an AssertionError holding only the text, so the refusal is also
    kept in ``refusal``."""

    refusal = ""

    # Any: forwarded to torch's FileSystemReader.read_metadata
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path: str | os.PathLike[str]
        if hasattr(self, "_get_metadata_path"):
            path = self._get_metadata_path(kwargs.get("rank"))
        else:  # torch 2.6: one metadata file, named as DCP's own reader of that release names it
            path = self.fs.concat_path(self.path, ".metadata")
        with self.fs.create_stream(path, "rb") as fh:
            data = fh.read(MAX_METADATA_BYTES + 1)
        try:
            if len(data) > MAX_METADATA_BYTES:
                raise UnsafeCheckpoint(
                    f"checkpoint metadata is larger than {MAX_METADATA_BYTES} bytes",
                    "the file was planted or damaged",
                )
            metadata = load_metadata(data)
        except UnsafeCheckpoint as exc:
            self.refusal = self.refusal or exc.message
            raise
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values load with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise UnsafeCheckpoint(
                f"checkpoint value {read_item.dest_index.fqn} was refused by "
                f"torch.load(weights_only=True): {refusal_line(exc)}",
                "the file was planted or damaged",
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def refused(exc: BaseException) -> str:
    """The refusal behind a failed ``dcp.load`` (DCP wraps each rank's error), or "" if none."""
    if isinstance(exc, UnsafeCheckpoint):
        return exc.message
    if isinstance(exc, pickle.UnpicklingError):  # torch.load(weights_only=True) on a tensor file
        return f"a tensor file was refused by torch.load(weights_only=True): {refusal_line(exc)}"
    if isinstance(exc, CheckpointException):
        for err, _ in exc.failures.values():
            if why := refused(err):
                return why
    cause = exc.__cause__ or exc.__context__
    return refused(cause) if cause is not None and cause is not exc else ""


class SafeLoad:
    """One ``dcp.load`` of ``path`` that runs nothing from it::

    safe = SafeLoad(path)
    try:
        dcp.load(state, **safe.kwargs)
    except (Exception, CheckpointException) as exc:
        if why := safe.refused(exc): ...   # a planted or damaged file: fall back
    """

    def __init__(self, path: Path) -> None:
        self.reader = SafeFileSystemReader(path)
        self.planner = SafeLoadPlanner()

    @property
    def kwargs(self) -> dict[str, Any]:  # Any: torch.load's keyword arguments
        return {"storage_reader": self.reader, "planner": self.planner}

    def refused(self, exc: BaseException) -> str:
        """Why the load was refused (here, or on another rank as DCP reports it), or ""."""
        return self.reader.refusal or refused(exc)


def safe_load_kwargs(path: Path) -> dict[str, Any]:  # Any: torch.load's keyword arguments
    """What to pass to ``dcp.load`` so that nothing in ``path`` runs code."""
    return SafeLoad(path).kwargs


def _without_tensors(obj: Any) -> Any:  # Any: torch.load/pickle return arbitrary objects
    if isinstance(obj, torch.Tensor):
        return None
    if isinstance(obj, dict):
        return {k: _without_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_without_tensors(v) for v in obj]
    return obj


def _weights_only_refusal(obj: Any) -> str:  # Any: torch.load/pickle return arbitrary objects
    buf = io.BytesIO()
    try:
        torch.save(obj, buf)
        buf.seek(0)
        torch.load(buf, weights_only=True)
    except pickle.UnpicklingError as exc:
        return refusal_line(exc)
    except Exception as exc:  # not picklable at all: DCP's save reports that itself
        return f"{type(exc).__name__}: {exc}"[:200]
    return ""


# Any: torch state_dict values (tensors, nested containers, user objects)
def unsafe_values(state: dict[str, Any]) -> str:
    """ "" if every non-tensor value of ``state`` loads back with ``torch.load(weights_only=True)``
    (as :class:`SafeLoadPlanner` will load it), else which value does not and why. Checked before a
    save, so that a version that could only be loaded by running its pickles is never committed."""
    if not _weights_only_refusal(_without_tensors(state)):
        return ""

    def first_bad(obj: Any, where: str) -> str:  # Any: torch.load/pickle return arbitrary objects
        if isinstance(obj, dict):
            return next(
                (b for k, v in obj.items() if (b := first_bad(v, f"{where}.{k}" if where else str(k)))), ""
            )
        if isinstance(obj, list | tuple) and any(isinstance(v, dict | list | tuple) for v in obj):
            return next((b for i, v in enumerate(obj) if (b := first_bad(v, f"{where}[{i}]"))), "")
        why = "" if isinstance(obj, torch.Tensor) else _weights_only_refusal(_without_tensors(obj))
        return f"state value {where or '<root>'} would not load back safely ({why})" if why else ""

    return first_bad(state, "") or "the state's non-tensor values would not load back with weights_only=True"
