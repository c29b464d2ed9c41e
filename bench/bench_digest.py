"""Digest cost of a checkpoint file: the SHA-256 the manifests use now, against the CRC32 they used
before (the baseline) and BLAKE2b, all measured in the same run on the same file.

    .venv/bin/python bench/bench_digest.py [--mib 256] [--dir /dev/shm] [--repeat 3]

Each digest reads the file in 4 MiB chunks (as ``manifest.sha256_file`` does) from the page cache
(the file was just written), so the figure is hashing plus copying, not the disk. Prints the best
of ``--repeat`` runs in GB/s and the ratio to CRC32.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
import zlib
from pathlib import Path

CHUNK = 4 << 20


def crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


def hashed(name: str):
    def run(path: Path) -> str:
        h = hashlib.new(name)
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
        return h.hexdigest()

    return run


def best(fn, path: Path, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        path = Path(d) / "blob"
        path.write_bytes(os.urandom(a.mib << 20))
        size = path.stat().st_size
        results = {
            name: best(fn, path, a.repeat)
            for name, fn in (
                ("crc32 (baseline)", crc32),
                ("sha256", hashed("sha256")),
                ("blake2b", hashed("blake2b")),
            )
        }
    base = results["crc32 (baseline)"]
    print(f"file: {a.mib} MiB in {a.dir}, best of {a.repeat}")
    for name, s in results.items():
        print(f"{name:18s} {s:7.3f} s  {size / s / 1e9:6.2f} GB/s  {s / base:5.2f}x crc32")


if __name__ == "__main__":
    main()
