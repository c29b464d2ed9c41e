"""Set-up shared by several test packages."""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import netutil
import warm


@pytest.fixture(scope="session", autouse=True)
def job_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One job key for every agent the suite starts (multi-node runs refuse to start without one), and
    a private config home, so no test makes ``~/.config/stalwart/job.key``. Every agent and worker
    inherits the environment."""
    home = tmp_path_factory.mktemp("config-home")
    home.chmod(0o700)
    key = home / "job.key"
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(os.urandom(32).hex())
    os.environ.setdefault("STALWART_JOB_KEY_FILE", str(key))
    os.environ["XDG_CONFIG_HOME"] = str(home)
    return Path(os.environ["STALWART_JOB_KEY_FILE"])


@pytest.fixture(scope="session", autouse=True)
def private_shm() -> Iterator[Path]:
    """Each test process (each pytest-xdist worker) its own base for node-memory tiers: a tier is
    named after its run id and node, and two files' jobs may share both while running at once.
    A namespaced host gets the directory made again in its own /dev/shm (the tier creates it)."""
    if "STALWART_SHM_DIR" in os.environ:  # the person running the tests chose one
        yield Path(os.environ["STALWART_SHM_DIR"])
        return
    base = (
        Path("/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
        / f"stalwart-tests-{os.getpid()}"
    )
    base.mkdir(mode=0o700)
    os.environ["STALWART_SHM_DIR"] = str(base)
    try:
        yield base
    finally:
        os.environ.pop("STALWART_SHM_DIR", None)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (tests that need several: ``netutil``)."""
    return netutil.free_port()


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``scontrol`` and ``sinfo`` on PATH that only append their argv to the returned file.

    ``sinfo`` prints one idle node ``n1`` so read-backs after a drain find something. A test that
    must prove no Slurm command ran asserts the file does not exist.
    """
    bindir = tmp_path / "fake-slurm-bin"
    bindir.mkdir()
    record = tmp_path / "slurm-calls.txt"
    for tool, answer in (("scontrol", ""), ("sinfo", "n1|idle|none")):
        script = bindir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{record}"\necho "{answer}"\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return record


# --- where the suite's time goes, per tier (printed after the slowest-30 list) ---------------------

_TIER_SECONDS: dict[str, dict[str, float]] = {}  # tier -> test id -> seconds


def tier_of(nodeid: str) -> str:
    """The tier of a test by its folder: unit, integration, e2e (anything else: other)."""
    top = nodeid.split("/", 2)[1] if nodeid.startswith("tests/") and nodeid.count("/") >= 2 else ""
    return top if top in ("unit", "integration", "e2e") else "other"


_CPU_SECONDS: dict[str, float] = {}  # test file -> CPU seconds of the test and the processes it ran
_CPU_MARK = pytest.StashKey[float]()  # a test's CPU reading at the end of its previous phase


def _cpu_now() -> float:
    """CPU seconds used so far by this process and every child it has waited for (their children
    included, once waited for): what a test's real processes cost the machine."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + warm.server_cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201 - a hook wrapper
    outcome = yield
    report = outcome.get_result()
    now = _cpu_now()
    last = item.stash.get(_CPU_MARK, None)
    if last is not None:  # the CPU since the previous phase of this test (set-up counts from start)
        report.user_properties.append(("cpu_s", now - last))
    item.stash[_CPU_MARK] = now


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_MARK] = _cpu_now()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # set-up, call and tear-down all count: a module-scoped fixture's start is the first test's set-up
    tests = _TIER_SECONDS.setdefault(tier_of(report.nodeid), {})
    tests[report.nodeid] = tests.get(report.nodeid, 0.0) + report.duration
    path = report.nodeid.split("::", 1)[0]
    for key, value in report.user_properties:  # sent back by pytest-xdist's workers too
        if key == "cpu_s":
            _CPU_SECONDS[path] = _CPU_SECONDS.get(path, 0.0) + float(value)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's own reporter type
    if not _TIER_SECONDS:
        return
    terminalreporter.section("time per tier")
    for tier in ("unit", "integration", "e2e", "other"):
        spent = _TIER_SECONDS.get(tier)
        if spent:
            terminalreporter.write_line(f"{tier:12s} {sum(spent.values()):8.1f}s over {len(spent)} tests")
    if _CPU_SECONDS:  # on a machine with few cores, CPU is what parallel workers compete for
        terminalreporter.section("CPU per test file (the 15 costliest)")
        total = sum(_CPU_SECONDS.values())
        for path, cpu in sorted(_CPU_SECONDS.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{cpu:8.1f}s  {100 * cpu / total:4.1f}%  {path}")
        terminalreporter.write_line(f"{total:8.1f}s  in all")
