"""The import rules of docs/architecture.md that import-linter cannot see, read from the source.

* ``policy_impurities``: ``policy/`` is pure. None of its modules imports a clock, the environment,
  files, the network, randomness, threads or ``importlib`` (at any depth, inside functions too),
  nor calls ``open``/``print``/``__import__``/``eval``/``exec``/``input``. The few exceptions are
  listed in ``POLICY_ALLOWED`` with the names they may use and why.
* ``dynamic_import_violations``: an ``importlib.import_module("stalwart...")`` or
  ``__import__(...)`` is an import edge like any other, so its target must respect the layers
  contract in pyproject's ``[tool.importlinter]``. A call whose target cannot be read from the
  source (a computed name) is allowed only where ``DYNAMIC_ALLOWED`` says why.

Both work on source text, so a test can feed them a violating module. Run as a script (as
``module_size.py`` is), this exits 1 and names every violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser under its old name (a dependency of mypy and import-linter's)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "stalwart"
PYPROJECT = ROOT / "pyproject.toml"

# module (and its submodules) -> why a policy may not import it
POLICY_FORBIDDEN = {
    "time": "a clock: a policy takes `now` as an argument",
    "datetime": "clocks (datetime.now, date.today); times are floats passed in, no type from it is needed",
    "stalwart.process_clock": "a clock",
    "os": "the environment and files",
    "pathlib": "files",
    "io": "files",
    "tempfile": "files",
    "glob": "files",
    "shutil": "files",
    "sqlite3": "files",
    "logging": "output: a decision carries its reason instead",
    "socket": "the network",
    "ssl": "the network",
    "urllib": "the network",
    "http": "the network",
    "requests": "the network",
    "aiohttp": "the network",
    "subprocess": "processes",
    "multiprocessing": "processes",
    "threading": "threads",
    "asyncio": "an event loop",
    "random": "nondeterminism: randomness is passed in",
    "secrets": "nondeterminism",
    "uuid": "nondeterminism (uuid1/uuid4)",
    "sys": "argv, the environment, stdout",
    "importlib": "an import the layers contract cannot see",
}
POLICY_FORBIDDEN_CALLS = {"open", "print", "input", "__import__", "eval", "exec", "compile", "breakpoint"}

# module -> (the names a policy may use from it, why)
POLICY_ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "signal": (
        frozenset({"Signals", "SIGINT", "SIGTERM"}),
        "job.py names the signal in a verdict and tells Ctrl-C from other signals; no handler is installed",
    ),
}

# module -> why it may import a name computed at run time (the check cannot read the target)
DYNAMIC_ALLOWED = {
    "stalwart.cli": "discovers its sub-commands in `stalwart.commands`, the layer just below it",
    "stalwart.launch.processes.fork_server_main": "preloads the module names the agent hands the fork server "
    "(torch, the SDK: layers below launch) so forked workers start warm",
}


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names, for relative ones too."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, name or None) for every import statement at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            for alias in node.names:
                # `from . import x` may name a module: check both the package and package.x
                yield node.lineno, target, alias.name
                yield node.lineno, f"{target}.{alias.name}", None


def _matches(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _forbidden(name: str) -> str | None:
    return next((why for mod, why in POLICY_FORBIDDEN.items() if _matches(name, mod)), None)


def _allowed_use(tree: ast.AST, module: str, names: frozenset[str], line: int) -> list[str]:
    """Attributes used off ``module`` (``signal.X``) that are not among ``names``."""
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == module
            and node.attr not in names
        ):
            out.append(f"{node.lineno}: uses {module}.{node.attr} (only {', '.join(sorted(names))} allowed)")
    return out


def impurities(source: str, module: str, is_package: bool = False) -> list[str]:
    """Why the policy module ``module`` with this source is not pure ([] when it is)."""
    tree = ast.parse(source)
    out = []
    for line, name, imported in _imports(tree, module, is_package):
        allowed = POLICY_ALLOWED.get(name)
        if allowed is not None:
            if imported is None:
                out += _allowed_use(tree, name, allowed[0], line)
            elif imported not in allowed[0]:
                out.append(
                    f"{line}: imports {imported} from {name} (only {', '.join(sorted(allowed[0]))} allowed)"
                )
            continue
        why = _forbidden(name)
        if why is not None:
            out.append(f"{line}: imports {name}: {why}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in POLICY_FORBIDDEN_CALLS
        ):
            out.append(f"{node.lineno}: calls {node.func.id}()")
    return sorted(set(out), key=lambda s: int(s.split(":")[0]))


def _modules(root: Path, package: str) -> Iterator[tuple[str, bool, Path]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        is_package = rel[-1] == "__init__"
        parts = rel[:-1] if is_package else rel
        yield ".".join((package, *parts)), is_package, path


def policy_impurities(root: Path = SRC / "policy", package: str = "stalwart.policy") -> list[str]:
    out = []
    for module, is_package, path in _modules(root, package):
        out += [f"{module}:{v}" for v in impurities(path.read_text(), module, is_package)]
    return out


# --- importlib edges against the layers contract ----------------------------------------------


def layers(pyproject: Path = PYPROJECT) -> list[list[str]]:
    """The package-wide layers contract of pyproject's [tool.importlinter] (the one without
    ``containers``: the others order the modules inside one package), top first, each a list of
    packages."""
    config = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers" and not c.get("containers")]
    return [[p.strip() for p in layer.split("|")] for layer in contract["layers"]]


def _place(module: str, stack: list[list[str]]) -> tuple[int, str] | None:
    """(layer index, top package) of ``module``, or None if it is in no layer."""
    for i, layer in enumerate(stack):
        for pkg in layer:
            if _matches(module, pkg):
                return i, pkg
    return None


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in {"__import__", "import_module"}
    return isinstance(func, ast.Attribute) and func.attr in {"import_module", "__import__"}


def _strings(node: ast.expr | None) -> list[str] | None:
    """The strings a constant str, tuple or list holds; None if it is anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_strings(e) for e in node.elts]
        return None if any(i is None for i in items) else [s for i in items for s in i or []]
    return None


def dynamic_imports(source: str) -> list[tuple[int, list[str] | None]]:
    """(line, the module names it may import, or None when they are computed) per dynamic import."""
    tree = ast.parse(source)
    constants: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            found = _strings(node.value)
            if found is not None:
                constants[node.targets[0].id] = found
    loops: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            found = _strings(node.iter)
            if found is None and isinstance(node.iter, ast.Name):
                found = constants.get(node.iter.id)
            if found is not None:
                loops[node.target.id] = found
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            arg = node.args[0]
            names = _strings(arg)
            if names is None and isinstance(arg, ast.Name):
                names = loops.get(arg.id, constants.get(arg.id))
            out.append((node.lineno, names))
    return out


def edge_violations(source: str, module: str, stack: list[list[str]]) -> list[str]:
    """The dynamic imports in ``module`` that go up or sideways in the layers, or are unreadable."""
    here = _place(module, stack)
    out = []
    for line, names in dynamic_imports(source):
        if names is None:
            if module not in DYNAMIC_ALLOWED:
                out.append(
                    f"{line}: imports a computed module name (list the module in DYNAMIC_ALLOWED with a reason)"
                )
            continue
        for name in names:
            there = _place(name, stack)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] < here[0]:
                out.append(f"{line}: imports {name}, a layer above {here[1]}")
            elif there[0] == here[0]:
                out.append(f"{line}: imports {name}, a sibling of {here[1]} on its layer")
    return out


def dynamic_import_violations(root: Path = SRC, package: str = "stalwart") -> list[str]:
    stack = layers()
    out = []
    for module, _, path in _modules(root, package):
        out += [f"{module}:{v}" for v in edge_violations(path.read_text(), module, stack)]
    return out


def stale_exceptions(root: Path = SRC, package: str = "stalwart") -> list[str]:
    """Entries of DYNAMIC_ALLOWED whose module no longer imports a computed name."""
    computed = {
        module
        for module, _, path in _modules(root, package)
        if any(names is None for _, names in dynamic_imports(path.read_text()))
    }
    return sorted(set(DYNAMIC_ALLOWED) - computed)


if __name__ == "__main__":
    found = policy_impurities() + dynamic_import_violations() + [f"{m}: stale" for m in stale_exceptions()]
    for line in found:
        print(line, file=sys.stderr)
    sys.exit(1 if found else 0)
