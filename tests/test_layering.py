"""The house rules of docs/architecture.md, checked on the source itself.

* every public name of ``leaseq`` is in ``__all__`` (and nothing else is public);
* imports point down the layers; only ``_db`` imports the driver;
* the worker reaches the database only through the clients (one door);
* SQL lives in ``.sql`` files, read through ``_statement.sql_text`` by the store;
* the demo imports only public names; the CLI too, but for the few internals
  named here (secret redaction, logging, durations as text, the ``--processes``
  supervisor);
* the dashboard (``leaseq.web``) imports only public names of ``leaseq``, its own
  modules and leaseq's scrubbing logger, and never the driver: it reads and acts
  through the client.
"""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest

import leaseq

SOURCE = Path(leaseq.__file__).resolve().parent

#: Lower layers first; a module imports only modules of lower layers (modules of
#: one package, like _worker's, may import each other).
LAYERS: list[set[str]] = [
    {
        "_errors",
        "_types",
        "_health_types",
        "_job_ids",
        "_redact",
        "_statement",
        "_waiting",
        "_durations",
        "_lends",
    },
    {"_json_text", "_payload_masking", "_secret_fields", "_timeline"},
    {"_validate", "_decoding", "_logs", "_health", "_tracing"},
    {"_validate_payloads"},
    {"_embedded", "_retry", "_gauges", "_validate_settings", "_validate_operators"},
    {"_config", "_store", "_db", "_metrics"},
    {"_migrate", "_steps", "_client_base"},
    {"_async_operators", "_sync_operators"},
    {"_async_client", "_sync_client"},
    {"_maintenance"},
    {"_worker"},
    {"_cli", "__init__", "testing"},
    {"__main__"},
]
#: The database layer, below the clients: the worker goes through the clients.
BEHIND_THE_CLIENTS = {"_db", "_store", "_statement", "_steps", "_migrate", "_client_base"}
#: What the CLI may take from the internals besides the public API (_embedded:
#: `leaseq embedded status|stop`, the server of a folder, not the library's API).
#: _durations: settings in seconds as text, shared with the dashboard; _secret_fields
#: and _timeline: a job shown as the dashboard shows it (`leaseq job`), the same
#: mask of its payload's secret fields and the same run history.
#: _worker.settings_check: a worker's settings refused in the parent, before any
#: child of --processes or the embedded server starts.
CLI_INTERNALS = {
    "_config",
    "_durations",
    "_embedded",
    "_logs",
    "_redact",
    "_secret_fields",
    "_timeline",
    "_worker.settings_check",
    "_worker.supervisor",
}
DRIVERS = {"psycopg", "psycopg_pool"}


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name below ``leaseq``."""
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path) -> list[str]:
    """The absolute names a module imports (``leaseq.x`` as ``leaseq.x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ["leaseq", *name.split(".")[:-1]]
    if path.name == "__init__.py":
        package = ["leaseq", *name.split(".")[:-1]]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.append(module)
            # `from . import _db` imports a module, not a name
            names += [
                f"{module}.{alias.name}" for alias in node.names if alias.name.startswith("_")
            ]
    return names


def _top(module: str) -> str:
    """The layer unit of ``leaseq.x.y``: ``x`` (a subpackage counts as one)."""
    return module.split(".")[1] if module.count(".") >= 1 else "__init__"


def _layer(unit: str) -> int:
    for level, units in enumerate(LAYERS):
        if unit in units:
            return level
    raise AssertionError(f"module {unit} has no layer in LAYERS: add it")


#: What the dashboard may take from the internals besides the public API: the
#: logger that scrubs secrets (every leaseq logger must) and the scrubbing of
#: password shapes in what it renders (as the CLI uses it); settings in seconds as
#: the text the CLI shows too (one formatter, so the two never disagree); a job's
#: secret fields and run history as `leaseq job` shows them too.
WEB_INTERNALS = {
    "leaseq._durations",
    "leaseq._logs",
    "leaseq._redact",
    "leaseq._secret_fields",
    "leaseq._timeline",
}
#: Public subpackages that sit on the public API only (checked by their own tests).
ON_THE_PUBLIC_API = ("demo", "web", "contrib")
LIBRARY = {n: p for n, p in _modules().items() if not n.startswith(ON_THE_PUBLIC_API)}


def test_every_public_name_is_exported() -> None:
    """httpx's rule: the public names of the package are exactly ``__all__``."""
    public_modules = {
        name
        for name, value in vars(leaseq).items()
        if isinstance(value, types.ModuleType) and not name.startswith("_")
    }
    assert public_modules <= {"testing", "demo", "web", "contrib"}, public_modules
    exported = {
        name
        for name in vars(leaseq)
        if not name.startswith("_") and name not in public_modules | {"annotations"}
    }
    assert exported == set(leaseq.__all__) - {"__version__"}
    assert leaseq.__all__ == sorted(leaseq.__all__, key=str.casefold) or sorted(leaseq.__all__)


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_imports_point_down_and_only_the_db_module_imports_the_driver(name: str) -> None:
    unit = _top(f"leaseq.{name}") if "." in name else name
    for imported in _imports(name, LIBRARY[name]):
        root = imported.split(".")[0]
        if root in DRIVERS:
            assert unit == "_db", f"{name} imports {imported}: only _db talks to the driver"
        if root != "leaseq" or imported == "leaseq":
            continue
        target = _top(imported)
        if target == unit:
            continue  # within one package (the worker's modules)
        if unit == "_cli":
            inner = imported.removeprefix("leaseq.")
            assert not target.startswith("_") or inner in CLI_INTERNALS, (
                f"the CLI imports {imported}: only public names and {sorted(CLI_INTERNALS)}"
            )
            continue
        if unit == "_worker":
            assert target not in BEHIND_THE_CLIENTS, (
                f"{name} imports {imported}: the worker reaches the database through the clients"
            )
        assert _layer(target) < _layer(unit), f"{name} imports {imported}, a higher layer"


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n.startswith("demo")))
def test_the_demo_imports_only_public_names(name: str) -> None:
    path = _modules()[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("leaseq"):
            assert node.module in {"leaseq", "leaseq.demo", "leaseq.web"}, node.module
            if node.module == "leaseq":
                assert {a.name for a in node.names} <= set(leaseq.__all__)
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("leaseq.") or alias.name in {
                    "leaseq.demo",
                    "leaseq.web",
                }
    text = path.read_text(encoding="utf-8")
    used = set(re.findall(r"\bleaseq\.([A-Za-z_]+)", text))
    assert used <= set(leaseq.__all__) | {"demo", "web"}, used - set(leaseq.__all__)


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n.startswith("web")))
def test_the_dashboard_imports_only_public_names(name: str) -> None:
    path = _modules()[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # relative: one of its own modules
                continue
            if node.level == 2:  # relative, from leaseq itself
                assert f"leaseq.{node.module}" in WEB_INTERNALS, f"{name} imports {node.module}"
                continue
            module = node.module or ""
            assert module.split(".")[0] not in DRIVERS, f"{name} imports the driver"
            if module.startswith("leaseq"):
                assert module == "leaseq" or module.startswith("leaseq.web"), module
                if module == "leaseq":
                    assert {a.name for a in node.names} <= set(leaseq.__all__)
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert alias.name.split(".")[0] not in DRIVERS, f"{name} imports the driver"
                assert alias.name == "leaseq" or not alias.name.startswith("leaseq."), alias.name
    text = path.read_text(encoding="utf-8")
    used = set(re.findall(r"\bleaseq\.([A-Za-z_]+)", text))
    assert used <= set(leaseq.__all__) | {"web"}, used - set(leaseq.__all__)


#: What the framework integrations may take from the internals besides the public
#: API: the logger that scrubs secrets.
CONTRIB_INTERNALS = {"leaseq._logs"}


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n.startswith("contrib")))
def test_the_integrations_import_only_public_names(name: str) -> None:
    """leaseq.contrib sits on the public API, like a user's code: the fence, the
    outcomes and the claims are the library's, never re-done by an integration
    (the driver is allowed: a caller's transaction is a psycopg connection)."""
    path = _modules()[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["leaseq", *name.split(".")[:-1]]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            if module.startswith("leaseq"):
                assert (
                    module in {"leaseq", "leaseq.testing"}
                    or module.startswith("leaseq.contrib")
                    or module in CONTRIB_INTERNALS
                ), f"{name} imports {module}"
                if module == "leaseq":
                    assert {a.name for a in node.names} <= set(leaseq.__all__)
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("leaseq.") or alias.name.startswith(
                    ("leaseq.contrib", "leaseq.testing")
                ), alias.name


_SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|VACUUM|TRUNCATE)\b.*"
    r"\b(FROM|INTO|SET|TABLE|SCHEMA|INDEX|FUNCTION|AS|WHERE|VALUES)\b",
    re.DOTALL,
)


@pytest.mark.parametrize("name", sorted(_modules()))
def test_sql_lives_in_sql_files(name: str) -> None:
    path = _modules()[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    strings = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]
    for string in strings:
        assert not _SQL.match(string), f"{name}: SQL in Python: {string[:60]!r}"
    text = path.read_text(encoding="utf-8")
    if name not in {"_statement", "_store.base", "demo.sql"}:
        assert "sql_text(" not in text, f"{name} reads SQL files: only _store does"
        assert 'joinpath("sql"' not in text, f"{name} reads SQL files: only _statement does"
