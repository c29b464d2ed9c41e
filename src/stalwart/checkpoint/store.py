"""Where checkpoint versions live: a directory tree (memory, local, shared tiers) or an fsspec URL.

File layout per version: ``step-<NNNNNNNNN>/`` holding the torch.distributed.checkpoint files
(``__<r>_<i>.distcp``, ``.metadata``), each rank's own state (``rank-<r>.pt``) and
``MANIFEST.json``. A file store writes into ``.step-<N>.partial/``, writes the manifest into it,
then renames the directory (atomic) and fsyncs the parent, so a version is visible only complete.
An object store has no atomic rename: files go first, the manifest last; a version without a
manifest that verifies is never loaded.

A store signs the manifests it commits with the configured checkpoint key (see ``manifest``), and a
file store's root is private: created 0700, refused when another user owns it or others can write it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .manifest import (
    MANIFEST,
    Manifest,
    configured_key,
    encode,
    fsync_dir,
    make_private,
    parse_checked,
    write_durable,
)
from .tiers import check_private, private_dir

_STEP_DIR = re.compile(r"^step-(\d{9})$")
_PARTIAL = re.compile(r"^\.step-(\d{9})\.partial$")


def step_name(step: int) -> str:
    return f"step-{step:09d}"


def committed_versions(root: Path) -> list[tuple[int, Path]]:
    """The version directories (``step-<N>``) under ``root``, newest step first; a partial one, or
    one set aside as damaged (``.step-<N>.damaged``, checkpoint/scrub.py), is never listed."""
    out = []
    for p in root.iterdir() if root.exists() else ():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


class FileStore:
    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True, key: bytes | None = None) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.key = key if key is not None else configured_key()
        if self.root.exists():  # someone else's directory is refused before anything is read from it
            check_private(self.root)

    def partial(self, step: int) -> Path:
        return self.root / f".{step_name(step)}.partial"

    def final(self, step: int) -> Path:
        return self.root / step_name(step)

    def begin(self, step: int) -> Path:
        """Create an empty partial directory for ``step`` (rank 0 only)."""
        private_dir(self.root)
        work = self.partial(step)
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(mode=0o700)  # private whatever the umask: the docs promise 0700 step directories
        return work

    def commit(self, step: int, manifest: Manifest) -> Path:
        """Write the manifest last, then make the version visible with one atomic rename."""
        work = self.partial(step)
        make_private(work)
        write_durable(work / MANIFEST, encode(manifest, self.key), fsync=self.fsync)
        final = self.final(step)
        if final.exists():  # an older save of the same step: replaced only by a complete one
            # (errors ignored: the scrubber may have set it aside meanwhile; anything left fails the rename)
            shutil.rmtree(final, ignore_errors=True)
        os.replace(work, final)
        if self.fsync:
            fsync_dir(self.root)
        return final

    def discard(self, step: int) -> None:
        shutil.rmtree(self.partial(step), ignore_errors=True)

    def sweep_partials(self) -> list[Path]:
        """Remove partial directories left by a crash mid-persist (call before any save)."""
        gone = []
        for p in self.root.iterdir() if self.root.exists() else ():
            if _PARTIAL.match(p.name):
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        return gone

    def versions(self) -> list[tuple[int, Path]]:
        return committed_versions(self.root)

    def delete(self, step: int) -> None:
        shutil.rmtree(self.final(step), ignore_errors=True)


class FsspecStore:
    """A version tree on any fsspec filesystem (object stores included)."""

    def __init__(self, url: str, *, key: bytes | None = None) -> None:
        import fsspec.core  # deferred: heavy (fsspec)

        self.url = url
        self.key = key if key is not None else configured_key()
        self.fs, base = fsspec.core.url_to_fs(url)
        self.base = base.rstrip("/")

    def _dir(self, step: int) -> str:
        return f"{self.base}/{step_name(step)}"

    def upload(self, step: int, src: Path, manifest: Manifest) -> str:
        """Upload a committed local version: data files first, the manifest last."""
        dest = self._dir(step)
        if self.fs.exists(dest):
            self.fs.rm(dest, recursive=True)
        self.fs.makedirs(dest, exist_ok=True)
        for name in sorted(manifest.files):
            self.fs.put_file(str(src / name), f"{dest}/{name}")
        self.fs.pipe_file(f"{dest}/{MANIFEST}", encode(manifest, self.key))
        return dest

    def versions(self) -> list[tuple[int, str]]:
        if not self.fs.exists(self.base):
            return []
        out = []
        for entry in self.fs.ls(self.base, detail=False):
            name = str(entry).rstrip("/").rsplit("/", 1)[-1]
            m = _STEP_DIR.match(name)
            if m:
                out.append((int(m.group(1)), str(entry).rstrip("/")))
        return sorted(out, reverse=True)

    def read_manifest(self, step: int) -> Manifest:
        manifest, reason = parse_checked(self.fs.cat_file(f"{self._dir(step)}/{MANIFEST}"), self.key)
        if manifest is None:
            raise ValueError(reason)
        return manifest

    def fetch(self, step: int, dest: Path) -> Path:
        """Download a version into ``dest`` (the manifest last) so it can be verified and loaded.
        Only the files named by a manifest that parses (and, with a key, has a valid MAC) are
        fetched; a bad manifest is copied alone and verification rejects it with the reason."""
        if dest.exists():
            shutil.rmtree(dest)
        private_dir(dest.parent)
        dest.mkdir(mode=0o700)
        src = self._dir(step)
        try:
            manifest_bytes = self.fs.cat_file(f"{src}/{MANIFEST}")
        except FileNotFoundError:
            return dest  # no manifest: verification rejects it
        manifest, _ = parse_checked(manifest_bytes, self.key)
        names: list[str] = sorted(manifest.files) if manifest is not None else []
        for name in names:
            try:
                self.fs.get_file(f"{src}/{name}", str(dest / name))
            except FileNotFoundError:
                continue  # verification reports the missing file
        (dest / MANIFEST).write_bytes(manifest_bytes)
        return dest

    def delete(self, step: int) -> None:
        if self.fs.exists(self._dir(step)):
            self.fs.rm(self._dir(step), recursive=True)
