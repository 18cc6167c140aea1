"""The package's layers, checked on its import statements (an `ast` walk, imports inside
functions included): data flows one way, and each rule below names where a thing may live."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ci_fxcache"

# Stages in the order data flows through them (environment -> scope key -> store -> matrix ->
# worker -> evidence -> verdict -> results -> report / comment), lowest first; a module may
# import its own stage and earlier ones only. The worker runs in the user's interpreter and is
# driven by verify (which also judges its evidence), so it sits below verify. The fleet plans the
# fan-out and merges shards after the report's environment names; the entry points come last.
# Cross-cutting helpers: the package's version, errors, Actions I/O, naming rules, user files,
# GitHub's REST API, atomic writes, the timestamp format, the secret variables, the registry of
# verification mechanisms. The package root holds only these and the entry points (cli,
# __main__, guard): 12 modules at most.
HELPERS = ("__init__", "errors", "gha", "names", "userfiles", "github_api", "atomic_write",
           "timestamps", "mechanisms")  # fmt: skip
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("helpers", HELPERS),
    ("env", ("env",)),  # fingerprint, GPUs, CPU, interpreter, probe, scope key, torch support
    ("store", ("store",)),  # local store, remote tiers (store/remote/), store.tiered over both
    ("worker", ("worker", "guard")),  # everything that imports torch
    ("verify", ("verify",)),  # matrix, runner, fork server, evidence, verdicts
    ("results", ("results",)),
    ("jobstats", ("jobstats",)),  # the job's own compiles: trace, counts, miss causes, history
    ("report", ("report",)),  # model, labels, recommendations, render, PR comment
    ("fleet", ("fleet",)),  # plan, merge, environment diff
    ("entry", ("cli", "__main__", "commands", "action")),
)
ORCHESTRATOR_FREE = ("worker",)  # imports nothing of ci_fxcache outside itself
# Inside the store: the local store's modules (ci_fxcache/store/*.py) never import the remote
# package; the remote package may use the local store's building blocks (layout, manifest,
# overlay, scopes...) but never its save or restore path, nor the module that composes both
# (store.tiered: save locally, then publish). Each backend imports no other backend, and of the
# shared remote modules only the factory picks one.
REMOTE = "ci_fxcache.store.remote"
COMPOSED = "ci_fxcache.store.tiered"
LOCAL_PATHS = ("ci_fxcache.store.save", "ci_fxcache.store.restore", COMPOSED)
BACKENDS = tuple(f"{REMOTE}.{b}" for b in ("s3", "github", "redis_cache"))
FACTORY = f"{REMOTE}.factory"
ARGPARSE_HOMES = ("commands", "cli")
TORCH_HOMES = ("worker", "guard", "env.snippets")  # the only code that runs beside torch


def _unit(module: str) -> str:
    """The top-level unit of `ci_fxcache.<unit>[...]` (a subpackage or a flat module)."""
    return module.split(".")[1] if "." in module else "__init__"


STAGE_OF = {unit: index for index, (_, units) in enumerate(STAGES) for unit in units}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        yield ".".join(rel.parts), path


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Absolute names of everything a module imports, with the line (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            yield base, node.lineno
            for alias in node.names:  # `from ci_fxcache import gha`: the module is gha
                yield f"{base}.{alias.name}", node.lineno


def _internal(imported: str) -> str | None:
    """`ci_fxcache.x.y` -> its unit `x`; None for a name outside the package or unknown to it."""
    if not imported.startswith("ci_fxcache."):
        return None
    unit = imported.split(".")[1]
    exists = (PACKAGE / unit).is_dir() or (PACKAGE / f"{unit}.py").is_file()
    return unit if exists else None


MODULES = list(_modules())


def test_every_unit_has_a_stage() -> None:
    units = {_unit(name) for name, _ in MODULES}
    assert units - STAGE_OF.keys() == set(), "give each new package or module a stage above"


def test_the_package_root_holds_only_entry_points_and_a_few_helpers() -> None:
    root = {path.stem for path in PACKAGE.glob("*.py")}
    assert root <= {*HELPERS, "cli", "__main__", "guard"}, "a new module goes in a subpackage"
    assert len(root) <= 12


def test_no_module_imports_a_later_stage() -> None:
    wrong = []
    for name, path in MODULES:
        here = STAGE_OF[_unit(name)]
        for imported, line in _imports(name, path):
            unit = _internal(imported)
            if unit is not None and STAGE_OF[unit] > here:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert wrong == []


@pytest.mark.parametrize("unit", ORCHESTRATOR_FREE)
def test_worker_imports_nothing_of_the_orchestrator(unit: str) -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
        for name, path in MODULES
        if _unit(name) == unit
        for imported, line in _imports(name, path)
        if _internal(imported) not in (None, unit)
    ]
    assert wrong == []


def _within(name: str, *parents: str) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in parents)


def _store_edges() -> Iterator[tuple[str, str, str]]:
    """(importer, imported, where) for every import of a store module by a store module."""
    for name, path in MODULES:
        if _within(name, "ci_fxcache.store"):
            for imported, line in _imports(name, path):
                if _within(imported, "ci_fxcache.store") and imported != "ci_fxcache.store":
                    yield name, imported, f"{path.relative_to(PACKAGE.parent)}:{line}"


def test_the_local_store_never_imports_the_remote_package() -> None:
    wrong = [
        f"{where} imports {imported}"
        for name, imported, where in _store_edges()
        if not _within(name, REMOTE, COMPOSED) and _within(imported, REMOTE)
    ]
    assert wrong == []


def test_the_remote_package_never_imports_the_local_save_or_restore() -> None:
    wrong = [
        f"{where} imports {imported}"
        for name, imported, where in _store_edges()
        if _within(name, REMOTE) and _within(imported, *LOCAL_PATHS)
    ]
    assert wrong == []


def test_backends_import_no_other_backend_and_only_the_factory_picks_one() -> None:
    def backend(module: str) -> str | None:
        return next((b for b in BACKENDS if _within(module, b)), None)

    wrong = [
        f"{where} imports {imported}"
        for name, imported, where in _store_edges()
        if _within(name, REMOTE)
        and backend(imported) not in (None, backend(name))
        and not (backend(name) is None and name == FACTORY)
    ]
    assert wrong == []


def test_a_tier_is_built_only_by_the_factory() -> None:
    """Issue 39: the store is chosen once and one factory (store/remote/factory.py) builds
    every remote tier; nothing outside store/remote/ constructs a backend itself."""
    import re

    built = re.compile(r"\b(S3Tier|GitHubTier)\(")
    remote = PACKAGE / "store" / "remote"
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for _name, path in MODULES
        if remote not in path.parents
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if built.search(line)
    ]
    assert wrong == []
    made = (remote / "factory.py").read_text(encoding="utf-8")
    assert "S3Tier(" in made and "GitHubTier(" in made  # the rule is not vacuous


def test_the_store_has_no_import_cycle() -> None:
    """Imports inside functions count: a function-level import does not hide a circle here."""
    modules = {name for name, _ in MODULES}

    def module_of(imported: str) -> str | None:  # `...s3.client.Bucket` -> `...s3.client`
        while imported and imported not in modules:
            if f"{imported}.__init__" in modules:
                return f"{imported}.__init__"  # a package
            imported = imported.rpartition(".")[0]
        return imported or None

    graph: dict[str, set[str]] = {}
    for name, imported, _where in _store_edges():
        target = module_of(imported)
        if target is not None and target != name:
            graph.setdefault(name, set()).add(target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    cycle = None
    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            break
    assert cycle is None, " -> ".join(cycle)


def test_only_the_command_line_imports_argparse() -> None:
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for name, path in MODULES
        if _unit(name) not in ARGPARSE_HOMES
        for imported, line in _imports(name, path)
        if imported == "argparse" or imported.startswith("argparse.")
    ]
    assert wrong == []


def test_only_the_worker_side_imports_torch() -> None:
    def beside_torch(name: str) -> bool:
        return any(
            name == f"ci_fxcache.{h}" or name.startswith(f"ci_fxcache.{h}.") for h in TORCH_HOMES
        )

    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}"
        for name, path in MODULES
        if not beside_torch(name)
        for imported, line in _imports(name, path)
        if imported.split(".")[0] in ("torch", "triton")
    ]
    assert wrong == []


def test_the_walk_sees_imports() -> None:
    # The rules above pass vacuously if the walk finds nothing: it must see known edges.
    edges = {(name, imported) for name, path in MODULES for imported, _ in _imports(name, path)}
    assert ("ci_fxcache.verify.runner", "ci_fxcache.verify.forkserver") in edges
    assert ("ci_fxcache.worker.phase", "ci_fxcache.worker.tensors") in edges
    assert ("ci_fxcache.cli", "argparse") in edges
    assert any(n.startswith("ci_fxcache.worker.") and i == "torch" for n, i in edges)
    assert (COMPOSED, "ci_fxcache.store.save") in edges
    assert (COMPOSED, f"{FACTORY}.tier_for") in edges
    assert (f"{REMOTE}.s3.fetch", f"{REMOTE}.packs") in edges
    assert (f"{REMOTE}.transfer", "ci_fxcache.store.scopes") in edges
    assert (FACTORY, f"{REMOTE}.s3.tier") in edges


def test_the_action_makes_typed_calls_never_argv() -> None:
    """Issue 39: each action step calls the toolkit's typed functions (the ones the CLI's
    commands are), never `cli.main(argv)`."""
    action = PACKAGE / "action"
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(action.glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "cli.main(" in line
    ]
    assert wrong == []
    assert any(action.glob("*.py"))


def test_every_fxcache_variable_name_is_written_once() -> None:
    """Issue 39: each `FXCACHE_*` environment name appears as a string in one place of the
    package (a constant the rest imports), never spelled again elsewhere."""
    import re
    from collections import Counter

    name = re.compile(r"FXCACHE_[A-Z0-9_]+")
    spelled: Counter[str] = Counter()
    for _module, path in MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and name.fullmatch(str(node.value)):
                spelled[str(node.value)] += 1
    assert len(spelled) > 10  # the walk sees them
    assert [n for n, count in spelled.items() if count > 1] == []


# The registry of verification mechanisms, and the worker's torch calls keyed by its names (the
# worker imports nothing of the orchestrator; tests/test_mechanisms.py checks both agree).
MECHANISM_HOMES = ("ci_fxcache.mechanisms", "ci_fxcache.worker")


def _mechanism_lists(tree: ast.AST, known: set[str]) -> Iterator[int]:
    """Lines that list two or more mechanism names (a tuple, list, set or dict's keys), or
    compare a mechanism with a name."""

    def named(nodes: Sequence[ast.expr | None]) -> int:
        return sum(1 for n in nodes if isinstance(n, ast.Constant) and n.value in known)

    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            listed = named(node.elts) >= 2
        elif isinstance(node, ast.Dict):
            listed = named(node.keys) >= 2
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            listed = bool(named(sides)) and "mechanism" in ast.unparse(node)
        else:
            continue
        if listed:
            yield node.lineno


def test_mechanism_names_are_listed_only_in_the_registry() -> None:
    """Issue 39: one record per verification mechanism (ci_fxcache/mechanisms.py); nothing
    else lists their names or branches on one, so a new record is all a new mechanism needs
    outside the worker's torch calls."""
    from ci_fxcache import mechanisms

    known = set(mechanisms.names())
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for name, path in MODULES
        if not _within(name, *MECHANISM_HOMES)
        for line in _mechanism_lists(ast.parse(path.read_text(encoding="utf-8")), known)
    ]
    assert wrong == []
    planted = (
        'A = ("mega", "precompile")\nB = {"fxgraph": 1, "aot": 2}\n'
        'if combo["mechanism"] == "remote": pass\nif "remote" in matrix.mechanisms: pass\n'
        'if lookup["cache"] != "fxgraph": pass\nC = ("fxgraph", "aotautograd")\n'
    )
    assert list(_mechanism_lists(ast.parse(planted), known)) == [1, 2, 3, 4]


STORE = "ci_fxcache.store"
# Issue 39: outside store/, code uses the store through its entry points only, so that a change
# inside (a new tier, the local store's internals) touches no caller. What may be imported:
STORE_ENTRY_POINTS = {
    # the composed restore and save ("save locally, then publish")
    "ci_fxcache.store.tiered",
    # the store choice, made once, and every backend and invalidator built from it
    FACTORY,
    # the backends' interface and its typed errors, which callers tell apart by type
    f"{REMOTE}.tier",
    # the restore state: its one reader and writer
    "ci_fxcache.store.state_file",
    # values and pure decisions, no store I/O: paths in a root, the invalidation policies and
    # their parsers, what a run's event lets it do
    "ci_fxcache.store.layout",
    "ci_fxcache.store.policies",
    "ci_fxcache.store.trust",
    # the store's file modes, which files kept beside the store (the job history) follow
    "ci_fxcache.store.modes",
    # where verify records a workload's references and which of them a run compares: the
    # save prunes the others (issue 47)
    "ci_fxcache.store.references",
    # torch's own Redis cache (not a tier): its URL checks, redaction and the job's variables,
    # for the job and for verify's remote mechanism
    f"{REMOTE}.redis_cache",
}
# Single names of other store modules that callers need: verify must never empty a directory
# holding files a store committed (only the store deletes them).
STORE_ENTRY_NAMES = {
    "ci_fxcache.store.manifest.holds_committed_files",
    # the overlay strategies `fxcache restore --overlay` offers (argparse needs them at start)
    "ci_fxcache.store.overlay.STRATEGIES",
}
STORE_IMPORT_ALLOWLIST: set[str] = set()  # files that may reach further (none)


def _store_imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(what, line) for each store module a module imports, or `module.name` where that name
    is one of STORE_ENTRY_NAMES (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names if _within(a.name, STORE))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            if base == "ci_fxcache":  # `from ci_fxcache import store`
                yield from ((STORE, node.lineno) for a in node.names if a.name == "store")
                continue
            if not _within(base, STORE):
                continue
            from_package = (PACKAGE.parent / Path(*base.split("."))).is_dir()
            for alias in node.names:  # from a package: its modules; from a module: its names
                full = f"{base}.{alias.name}"
                yield (full if from_package or full in STORE_ENTRY_NAMES else base), node.lineno


def _outside_entry_points(name: str, path: Path) -> list[str]:
    allowed = STORE_ENTRY_POINTS | STORE_ENTRY_NAMES
    found = _store_imports(name, path)
    return [f"{line} imports {what}" for what, line in found if what not in allowed]


def test_outside_the_store_only_its_entry_points_are_imported(tmp_path: Path) -> None:
    wrong, stale = [], set(STORE_IMPORT_ALLOWLIST)
    for name, path in MODULES:
        rel = str(path.relative_to(PACKAGE.parent))
        if _within(name, STORE):
            continue
        found = _outside_entry_points(name, path)
        if rel in STORE_IMPORT_ALLOWLIST and found:
            stale.discard(rel)
        elif rel not in STORE_IMPORT_ALLOWLIST:
            wrong += [f"{rel}:{where}" for where in found]
    assert wrong == []
    assert stale == set(), "these files import only the entry points now: drop them above"
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from ci_fxcache.store import scopes, tiered\n"
        "from ci_fxcache.store.remote.s3 import client\n"
        "from ci_fxcache.store.manifest import holds_committed_files, sign\n"
        "from ci_fxcache.store.layout import Layout\n"
    )
    assert _outside_entry_points("ci_fxcache.verify.planted", planted) == [
        "1 imports ci_fxcache.store.scopes",
        "2 imports ci_fxcache.store.remote.s3.client",
        "3 imports ci_fxcache.store.manifest",
    ]
