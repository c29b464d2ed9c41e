"""The manifest: every malformed one is "this version is bad" (never an exception), SHA-256 per
file catches corruption, and with a key the HMAC catches anyone who recomputes the digests."""

import json
import os

import pytest

from stalwart.checkpoint.manifest import (
    KEY_ENV,
    KEY_FILE_ENV,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    FileEntry,
    Manifest,
    configured_key,
    encode,
    read_manifest,
    sha256_file,
    verify,
)
from stalwart.errors import CheckpointError

KEY = b"k" * 32


def _version(tmp_path, key=None, content=b"tensor bytes" * 100):
    d = tmp_path / "step-000000007"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(content)
    m = Manifest(
        step=7,
        world_size=1,
        created=1.25,
        meta={"emergency": False, "bytes": 12},
        files={"__0_0.distcp": FileEntry(size=len(content), sha256=sha256_file(d / "__0_0.distcp"))},
    )
    (d / MANIFEST).write_bytes(encode(m, key))
    return d


def _good_doc():
    return {
        "step": 7,
        "world_size": 1,
        "created": 1.25,
        "meta": {},
        "format": "stalwart-checkpoint",
        "version": 2,
        "files": {"a.distcp": {"size": 3, "sha256": "ab" * 32}},
    }


_DELETE = object()


def _with(**changes):
    """The good document with top-level keys changed (or removed with ``_DELETE``), as JSON bytes."""
    doc = _good_doc()
    for key, value in changes.items():
        if value is _DELETE:
            del doc[key]
        else:
            doc[key] = value
    return json.dumps(doc).encode()


MALFORMED = {
    "null": b"null",
    "list": b"[]",
    "number": b"42",
    "string": b'"step-7"',
    "files is a list": b'{"files": []}',
    "not json": b"{step: 7",
    "empty": b"",
    "not utf-8": b'{"step": 7, "x": "\xff\xfe"}',
    "step is a string": _with(step="7"),
    "step is a bool": _with(step=True),
    "step is a float": _with(step=7.5),
    "step negative": _with(step=-1),
    "step huge": _with(step=10**30),
    "world size zero": _with(world_size=0),
    "missing step": _with(step=_DELETE),
    "missing files": _with(files=_DELETE),
    "wrong format": _with(format="pytorch"),
    "old version": _with(version=1),
    "future version": _with(version=3),
    "unknown key": _with(extra="x"),
    "created not a number": _with(created="yesterday"),
    "size is a string": _with(files={"a.distcp": {"size": "3", "sha256": "ab" * 32}}),
    "size huge": _with(files={"a.distcp": {"size": 1 << 62, "sha256": "ab" * 32}}),
    "size negative": _with(files={"a.distcp": {"size": -1, "sha256": "ab" * 32}}),
    "both digests": _with(files={"a.distcp": {"size": 3, "sha256": "ab" * 32, "crc32": 7}}),
    "version 1 with a MAC": _with(version=1, mac="ab" * 32, files={"a.distcp": {"size": 3, "crc32": 7}}),
    "crc32 instead of sha256": _with(files={"a.distcp": {"size": 3, "crc32": 12345}}),
    "digest not hex": _with(files={"a.distcp": {"size": 3, "sha256": "zz" * 32}}),
    "digest short": _with(files={"a.distcp": {"size": 3, "sha256": "ab"}}),
    "file entry is a list": _with(files={"a.distcp": [3, "ab" * 32]}),
    "name with slash": _with(files={"../../etc/passwd": {"size": 3, "sha256": "ab" * 32}}),
    "name is dotdot": _with(files={"..": {"size": 3, "sha256": "ab" * 32}}),
    "name is absolute": _with(files={"/tmp/x": {"size": 3, "sha256": "ab" * 32}}),
    "name with backslash": _with(files={"a\\b": {"size": 3, "sha256": "ab" * 32}}),
    "name with NUL": _with(files={"a\u0000b": {"size": 3, "sha256": "ab" * 32}}),
    "name is the manifest": _with(files={MANIFEST: {"size": 3, "sha256": "ab" * 32}}),
    "empty name": _with(files={"": {"size": 3, "sha256": "ab" * 32}}),
    "mac not hex": _with(mac="not a mac"),
    "meta not an object": _with(meta=[1, 2]),
}


@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_every_malformed_manifest_is_a_bad_version_with_a_reason(tmp_path, raw):
    d = tmp_path / "step-000000007"
    d.mkdir()
    (d / MANIFEST).write_bytes(raw)
    manifest, reason = verify(d)
    assert manifest is None
    assert reason.startswith("unreadable manifest: ") and "\n" not in reason


def test_the_well_formed_document_used_above_parses(tmp_path):
    """The malformed cases differ from this one in a single place, so each one tests that place."""
    d = tmp_path / "v"
    d.mkdir()
    (d / MANIFEST).write_bytes(_with())
    manifest, reason = read_manifest(d)
    assert reason == "" and manifest.files["a.distcp"].size == 3


def test_an_oversized_manifest_is_refused_without_parsing(tmp_path):
    d = tmp_path / "v"
    d.mkdir()
    (d / MANIFEST).write_bytes(b" " * (MAX_MANIFEST_BYTES + 1))
    assert "more than" in read_manifest(d)[1]


def test_a_manifest_that_is_a_directory_is_a_bad_version(tmp_path):
    d = tmp_path / "v"
    (d / MANIFEST).mkdir(parents=True)
    assert read_manifest(d) == (None, "no manifest (save never committed)")


def test_intact_version_verifies_and_round_trips(tmp_path):
    d = _version(tmp_path)
    manifest, reason = verify(d)
    assert reason == "" and manifest.step == 7 and manifest.meta == {"emergency": False, "bytes": 12}
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_a_flipped_byte_is_caught_by_the_digest(tmp_path):
    d = _version(tmp_path)
    f = d / "__0_0.distcp"
    raw = bytearray(f.read_bytes())
    raw[500] ^= 0x01  # same size: only the digest can tell
    f.write_bytes(bytes(raw))
    manifest, reason = verify(d)
    assert manifest is None and "__0_0.distcp checksum (SHA-256)" in reason and "corrupted" in reason


def test_a_data_file_replaced_by_a_symlink_is_rejected(tmp_path):
    d = _version(tmp_path)
    real = tmp_path / "elsewhere"
    real.write_bytes((d / "__0_0.distcp").read_bytes())
    (d / "__0_0.distcp").unlink()
    (d / "__0_0.distcp").symlink_to(real)
    assert "not a regular file" in verify(d)[1]


def test_with_a_key_a_signed_manifest_verifies(tmp_path):
    d = _version(tmp_path, key=KEY)
    manifest, reason = verify(d, KEY)
    assert reason == "" and manifest.mac is not None


def test_with_a_key_a_changed_manifest_field_is_rejected_before_any_file_is_read(tmp_path):
    d = _version(tmp_path, key=KEY)
    doc = json.loads((d / MANIFEST).read_text())
    doc["step"] = 8
    (d / MANIFEST).write_text(json.dumps(doc))
    (d / "__0_0.distcp").unlink()  # were any data file read, the reason would be "missing file"
    assert verify(d, KEY) == (None, "manifest MAC does not match (tampered, or written with another key)")


def test_with_a_key_recomputed_digests_without_the_key_are_rejected(tmp_path):
    d = _version(tmp_path, key=KEY)
    f = d / "__0_0.distcp"
    f.write_bytes(b"planted payload")
    doc = json.loads((d / MANIFEST).read_text())  # the attacker fixes size and digest, keeps the old MAC
    doc["files"]["__0_0.distcp"] = {"size": f.stat().st_size, "sha256": sha256_file(f)}
    (d / MANIFEST).write_text(json.dumps(doc))
    assert verify(d)[1] == ""  # without the key the digest alone is fooled: that is the documented limit
    assert "MAC does not match" in verify(d, KEY)[1]
    doc.pop("mac")  # or drops the MAC altogether
    (d / MANIFEST).write_text(json.dumps(doc))
    assert "no MAC but a checkpoint key is configured" in verify(d, KEY)[1]


def test_a_manifest_signed_with_another_key_is_rejected(tmp_path):
    d = _version(tmp_path, key=b"x" * 32)
    assert "MAC does not match" in verify(d, KEY)[1]


def test_key_from_the_environment_and_from_a_key_file(tmp_path):
    assert configured_key({}) is None
    assert configured_key({KEY_ENV: "s" * 20}) == b"s" * 20
    kf = tmp_path / "key"
    kf.write_bytes(b"f" * 32 + b"\n")
    kf.chmod(0o600)
    assert configured_key({KEY_ENV: "s" * 20, KEY_FILE_ENV: str(kf)}) == b"f" * 32


def test_a_key_file_others_could_read_is_refused_with_the_chmod_that_fixes_it(tmp_path):
    kf = tmp_path / "key"
    kf.write_bytes(b"f" * 32)
    kf.chmod(0o644)
    with pytest.raises(CheckpointError, match="mode 0644: others could read it") as err:
        configured_key({KEY_FILE_ENV: str(kf)})
    assert err.value.hint == f"run `chmod 600 {kf}`"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    kf = tmp_path / "key"
    kf.write_bytes(b"f" * 32)
    kf.chmod(0o600)
    os.chown(kf, 65534, 65534)
    with pytest.raises(CheckpointError, match="owned by uid 65534, not by this user"):
        configured_key({KEY_FILE_ENV: str(kf)})


def test_a_linked_key_file_is_not_followed(tmp_path):
    kf = tmp_path / "key"
    kf.write_bytes(b"f" * 32)
    kf.chmod(0o600)
    (tmp_path / "link").symlink_to(kf)
    with pytest.raises(CheckpointError, match="cannot read the checkpoint key file"):
        configured_key({KEY_FILE_ENV: str(tmp_path / "link")})


@pytest.mark.parametrize(
    "env,match",
    [
        ({KEY_ENV: "short"}, "shorter than 16"),
        ({KEY_FILE_ENV: "/nonexistent/key"}, "cannot read the checkpoint key file"),
    ],
)
def test_a_bad_key_is_one_clear_error(env, match):
    with pytest.raises(CheckpointError, match=match) as err:
        configured_key(env)
    assert err.value.hint


def test_a_signed_version_copied_under_a_newer_step_is_a_replay(tmp_path):
    d = _version(tmp_path, key=KEY)
    replay = tmp_path / "step-000000009"
    replay.mkdir()
    for f in d.iterdir():
        (replay / f.name).write_bytes(f.read_bytes())
    assert verify(d, KEY)[1] == ""
    assert verify(replay, KEY) == (
        None,
        "manifest is for step 7 but sits in step-000000009 (copied or renamed)",
    )


def test_verify_uses_the_configured_key_by_default(tmp_path, monkeypatch):
    d = _version(tmp_path)  # unsigned
    assert verify(d)[1] == ""
    monkeypatch.setenv(KEY_ENV, KEY.decode())
    assert "no MAC but a checkpoint key is configured" in verify(d)[1]
    assert verify(d, None)[1] == ""


def _version_1(tmp_path, content=b"old tensor bytes" * 64):
    """A version as the CRC32 writer before SHA-256 left it (dataclass ``asdict``, version 1)."""
    import zlib

    d = tmp_path / "step-000000005"
    d.mkdir()
    (d / "__0_0.distcp").write_bytes(content)
    doc = {
        "created": 1700000000.5,
        "files": {"__0_0.distcp": {"crc32": zlib.crc32(content), "size": len(content)}},
        "format": "stalwart-checkpoint",
        "meta": {"bytes": 9, "emergency": False},
        "step": 5,
        "version": 1,
        "world_size": 1,
    }
    (d / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True))
    return d


def test_a_version_1_checkpoint_still_resumes_without_a_key(tmp_path):
    d = _version_1(tmp_path)
    manifest, reason = verify(d, None)
    assert reason == "" and manifest.version == 1 and manifest.step == 5


def test_a_corrupted_version_1_checkpoint_is_caught_by_its_crc32(tmp_path):
    d = _version_1(tmp_path)
    f = d / "__0_0.distcp"
    raw = bytearray(f.read_bytes())
    raw[3] ^= 0x08
    f.write_bytes(bytes(raw))
    assert "checksum (CRC32)" in verify(d, None)[1]


def test_with_a_key_a_version_1_checkpoint_is_refused(tmp_path):
    assert "no MAC but a checkpoint key is configured" in verify(_version_1(tmp_path), KEY)[1]
