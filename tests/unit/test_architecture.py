"""The architecture rules that CI checks (docs/architecture.md), and that the checks can fail."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contracts  # noqa: E402
from module_size import LIMIT, oversized  # noqa: E402

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # import-linter, in the same environment


def test_no_module_in_src_is_over_the_limit():
    assert oversized() == []


def test_the_size_check_names_a_module_over_the_limit(tmp_path):
    pkg = tmp_path / "stalwart"
    pkg.mkdir()
    (pkg / "small.py").write_text("x = 1\n")
    (pkg / "big.py").write_text("x = 1\n" * (LIMIT + 1))
    assert oversized(pkg) == [("stalwart/big.py", LIMIT + 1)]


# --- policy/ is pure --------------------------------------------------------------------------


def test_no_policy_module_imports_a_clock_the_environment_files_or_the_network():
    assert contracts.policy_impurities() == []


@pytest.mark.parametrize(
    "source, named",
    [
        ("import time\n", "imports time"),
        ("from datetime import datetime\n", "imports datetime"),
        ("def now():\n    import os.path\n    return os.path.getmtime('x')\n", "imports os.path"),
        ("from pathlib import Path\n", "imports pathlib"),
        ("import urllib.request\n", "imports urllib.request"),
        ("import random\n", "imports random"),
        ("from ..process_clock import process_start_time\n", "imports stalwart.process_clock"),
        ("import importlib\n", "imports importlib"),
        ("def f():\n    return __import__('os')\n", "calls __import__()"),
        ("def f(p):\n    return open(p).read()\n", "calls open()"),
        ("import signal\nsignal.signal(signal.SIGTERM, print)\n", "uses signal.signal"),
        ("from signal import alarm\n", "imports alarm from signal"),
    ],
)
def test_the_purity_check_names_an_impure_policy(source, named):
    found = contracts.impurities(source, "stalwart.policy.synthetic")
    assert any(named in v for v in found), found


def test_the_purity_check_lets_signal_names_through():
    assert (
        contracts.impurities("import signal\nx = signal.Signals(signal.SIGINT).name\n", "stalwart.policy.s")
        == []
    )


# --- importlib edges respect the layers -------------------------------------------------------


def test_no_dynamic_import_in_src_goes_up_a_layer():
    assert contracts.dynamic_import_violations() == []


def test_every_computed_dynamic_import_is_listed_and_every_listing_is_used():
    assert contracts.stale_exceptions() == []


STACK = [["stalwart.launch"], ["stalwart.health", "stalwart.checkpoint"], ["stalwart.events"]]

EVENTS_REACHING_UP = textwrap.dedent(
    """
    import importlib
    _EXTENSION_MODULES = ("stalwart.health.events", "stalwart.checkpoint.events")
    def _load():
        for name in _EXTENSION_MODULES:
            importlib.import_module(name)
    """
)


@pytest.mark.parametrize(
    "source, module, named",
    [
        (EVENTS_REACHING_UP, "stalwart.events", "imports stalwart.health.events, a layer above"),
        (EVENTS_REACHING_UP, "stalwart.events", "imports stalwart.checkpoint.events, a layer above"),
        ("__import__('stalwart.launch.agent')\n", "stalwart.health.x", "a layer above"),
        (
            "from importlib import import_module\nimport_module('stalwart.checkpoint')\n",
            "stalwart.health.x",
            "sibling",
        ),
        ("import importlib\ndef f(n):\n    importlib.import_module(n)\n", "stalwart.health.x", "computed"),
    ],
)
def test_the_edge_check_names_a_dynamic_import_against_the_layers(source, module, named):
    found = contracts.edge_violations(source, module, STACK)
    assert any(named in v for v in found), found


def test_the_edge_check_lets_a_downward_dynamic_import_through():
    assert contracts.edge_violations("__import__('stalwart.events')\n", "stalwart.launch.x", STACK) == []


def test_the_checks_read_the_layers_of_pyproject():
    stack = contracts.layers()
    assert stack[0] == ["stalwart.cli"] and ["stalwart.policy", "stalwart.protocol"] in stack


# --- the layers contract itself (import-linter) runs with the tests ---------------------------


def _lint_imports(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layers_contract_holds():
    done = _lint_imports(cwd=contracts.ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_layers_contract_fails_on_an_upward_import(tmp_path):
    pkg = tmp_path / "layered"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from . import high\n")  # lazy, inside a function
    config = tmp_path / "contract.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "layered"\n\n[[tool.importlinter.contracts]]\n'
        'name = "high over low"\ntype = "layers"\nlayers = ["layered.high", "layered.low"]\n'
    )
    done = _lint_imports(
        "--config", str(config), cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)}
    )
    assert done.returncode != 0 and "layered.low -> layered.high" in done.stdout, done.stdout + done.stderr


def test_every_module_of_launch_and_settings_is_on_the_architecture_page():
    """docs/architecture.md lists every module of launch/ and settings/ with its role: a module added
    or moved without the page fails here."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "architecture.md").read_text()
    src = root / "src" / "stalwart"
    modules = [
        p.relative_to(src).as_posix()
        for base in ("launch", "settings")
        for p in (src / base).rglob("*.py")
        if p.name != "__init__.py"
    ]
    missing = [m for m in modules if f"`{m}`" not in page]
    assert modules and missing == [], missing
