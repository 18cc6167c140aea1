"""`fxcache verify`: the hot-load verification matrix, each phase in a fresh process."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import cli, errors, gha, userfiles
from ci_fxcache import mechanisms as mechanism_registry
from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint, interpreter, scopekey, torch_support
from ci_fxcache.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from ci_fxcache.report import labels
from ci_fxcache.results import writer
from ci_fxcache.store import state_file
from ci_fxcache.store.layout import VERIFY_DIR_ENV
from ci_fxcache.store.remote import redis_cache
from ci_fxcache.verify import causes, matrix, runner, versions
from ci_fxcache.verify.forkserver import ForkServer

# Environment defaults of --recheck-all and --separate-cold ("1": on).
RECHECK_ALL_ENV = "FXCACHE_RECHECK_ALL"
SEPARATE_COLD_ENV = "FXCACHE_SEPARATE_COLD"


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `verify` subcommand."""
    parser = sub.add_parser(
        "verify",
        parents=[parent],
        help="run the hot-load verification matrix (cold and hot phases in fresh processes)",
        description="For each dtype / dynamic-shape / cache-mechanism combination: compile "
        "cold in a fresh process, hot-load in another, compare outputs and counters, and give "
        "a verdict (safe, no-gain, unsafe, error, skipped).",
    )
    options.python_option(parser)
    add_matrix_options(parser, "matrix (comma-separated; override --matrix-file)")
    _where_options(parser)
    _verdict_options(parser)
    _run_options(parser)
    parser.add_argument(
        "--cache-state",
        metavar="F",
        default=os.environ.get(state_file.STATE_FILE_ENV) or None,
        help="restore's state (JSON), embedded in the results (env FXCACHE_STATE_FILE, which "
        "`fxcache restore` exports; default: none)",
    )
    options.redis_url_option(parser, "Redis for the remote mechanism")
    options.report_id_option(
        parser,
        default="fxcache",
        help="id of this report (default: fxcache); report, comment and merge keep one sticky "
        "comment per id",
    )
    parser.add_argument("--salt", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run, request=Request)


def _where_options(parser: argparse.ArgumentParser) -> None:
    """Which phases run, where their caches live, where the results go."""
    parser.add_argument(
        "--phase",
        choices=("cold", "hot", "both", "auto"),
        default="auto",
        help="auto (default): per combination, hot only when --cache-dir holds its recorded "
        "reference, else cold and hot",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=os.environ.get(VERIFY_DIR_ENV) or None,
        help="per-combination caches and references (env FXCACHE_VERIFY_DIR, which "
        "`fxcache restore` exports; default: a temporary directory)",
    )
    parser.add_argument(
        "--json",
        dest="json_path",
        metavar="PATH",
        help="write the results document (- = stdout; default: none, the table only)",
    )


def _verdict_options(parser: argparse.ArgumentParser) -> None:
    """What counts as safe, and what fails the command."""
    parser.add_argument(
        "--min-speedup",
        type=options.finite_float,
        default=None,
        metavar="X",
        help="a policy: a complete hot load must also be X times faster than cold to count as "
        "safe (default: none; the verdict rests on what the hot process compiled, and the "
        "speedup, which moves with the runner's load, is reported)",
    )
    parser.add_argument(
        "--compare",
        choices=("bitwise", "close"),
        default="bitwise",
        help="hot vs cold outputs: bitwise (default) or within the dtype tolerance (close)",
    )
    parser.add_argument(
        "--fail-on",
        choices=tuple(causes.FAIL_ON),
        default="unsafe",
        help="exit 1 on: unsafe (default); error (unsafe or error); no-gain (unsafe, error or "
        "no-gain); never",
    )


def _run_options(parser: argparse.ArgumentParser) -> None:
    """How the phases run: time bound, determinism, parallelism, shared work."""
    parser.add_argument(
        "--timeout",
        type=options.seconds,
        default=600.0,
        metavar="S",
        help="seconds per phase before it counts as a hang (default: 600)",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="compile and run with torch's deterministic algorithms and Inductor's deterministic "
        "mode, for bitwise checks of models with atomics; part of torch's cache key: the job "
        "that uses the cache must set them too (docs/verify.md)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="phases at once (default: one per usable CPU; one per GPU for CUDA combinations)",
    )
    parser.add_argument(
        "--recheck-all",
        action="store_true",
        default=os.environ.get(RECHECK_ALL_ENV) == "1",
        help="a hot-only run re-checks every combination; by default it carries the no-gain "
        "verdicts of mega and precompile from the run that built the cache (docs/verify.md; "
        "env FXCACHE_RECHECK_ALL=1)",
    )
    parser.add_argument(
        "--separate-cold",
        action="store_true",
        default=os.environ.get(SEPARATE_COLD_ENV) == "1",
        help="every phase does all its own work: one cold phase per combination, and no C++ "
        "kernel build copied from another phase of the run; by default fxgraph and mega share "
        "one cold phase and a kernel is compiled once per run (docs/verify.md; env "
        "FXCACHE_SEPARATE_COLD=1)",
    )


def add_matrix_options(parser: argparse.ArgumentParser, title: str) -> None:
    """The matrix axes as flags (shared by `verify` and `plan`)."""
    axes = parser.add_argument_group(title)
    axes.add_argument("--device", dest="devices", help="auto, cpu, cuda (default: auto)")
    axes.add_argument("--dtypes", help="float32, float16, bfloat16, bfloat16-autocast")
    axes.add_argument("--dynamic", help="false, true, mark")
    axes.add_argument("--mechanisms", help=", ".join(mechanism_registry.names()))
    axes.add_argument("--training", help="true, false")
    axes.add_argument("--workloads", help="built-in names or package.module:factory")
    axes.add_argument("--modes", help="torch.compile modes: " + ", ".join(matrix.MODES))
    axes.add_argument(
        "--ranks",
        help="processes per phase under torch.distributed, each optionally :shared or "
        ":one-rank (the cache layout; docs/verify.md)",
    )
    axes.add_argument("--matrix-file", metavar="F", help="YAML matrix file (docs/matrix-file.md)")
    for action in axes._group_actions:  # each axis's default, from the one place that has them
        if action.dest in matrix.DEFAULTS and "default" not in str(action.help):
            shown = ",".join(str(v).lower() for v in matrix.DEFAULTS[action.dest])
            action.help = f"{action.help} (default: {shown}, or the matrix file's)"
        elif action.dest == "matrix_file":
            action.help = f"{action.help}; default: none"


def matrix_flags(
    devices: str | None,
    dtypes: str | None,
    dynamic: str | None,
    mechanisms: str | None,
    training: str | None,
    workloads: str | None,
    modes: str | None,
    ranks: str | None = None,
) -> dict[str, str | None]:
    """The axes flags of `add_matrix_options` as `matrix.build` takes them (keys: matrix.FLAGS)."""
    flags = {
        "devices": devices,
        "dtypes": dtypes,
        "dynamic": dynamic,
        "mechanisms": mechanisms,
        "training": training,
        "workloads": workloads,
        "modes": modes,
        "ranks": ranks,
    }
    assert flags.keys() == matrix.FLAGS.keys()
    return flags


def _progress(total: int) -> Any:
    lock = threading.Lock()
    done = [0]

    def report(combo: dict[str, Any]) -> None:
        with lock:
            done[0] += 1
            gha.print_untrusted(f"[{done[0]}/{total}] {line(combo)}\n")

    return report


def _secs(phase: dict[str, Any] | None) -> str:
    value = (phase or {}).get("compile_s")
    if value is None or (phase or {}).get("kernels_from_memo"):
        return "-"  # none, or not the phase's own (kernels copied from the run's build memo)
    return f"{value:.1f}s"


def line(combo: dict[str, Any]) -> str:
    """One progress / table line for a combination."""
    label = matrix.Combo(
        combo["workload"],
        combo["device"],
        combo["dtype"],
        combo["dynamic"],
        combo["mechanism"],
        combo["training"],
        combo.get("mode") or "default",
        int(combo.get("ranks") or 1),
        str(combo.get("rank_layout") or "shared"),
    ).label
    speed = "-"
    if combo.get("speedup") is not None:
        speed = labels.fmt_speedup(combo["speedup"], str(combo.get("cause")))
    judged_at = labels.carried_from(combo)
    carried = (
        f"[{labels.NOT_RECHECKED}, judged {judged_at}{labels.carried_age(combo)}] "
        if judged_at
        else ""
    )
    why = labels.changed_why(combo)
    changed = (
        f"[{versions.changed_note_text(why, labels.changed_unchecked(combo))}] " if why else ""
    )
    return (
        f"{label:<44} {combo['verdict']:<8} cold {_secs(combo.get('cold')):>6} "
        f"hot {_secs(combo.get('hot')):>6} {speed:>6}  {carried}{changed}{combo['reason']}"
    )


def _cache_state(path: str | None) -> Any:
    """The restore state the results embed (`cache`), read through its type (a file that is
    not one is a usage error)."""
    from ci_fxcache.store import state_file

    if not path:
        return None
    label = f"--cache-state {path}"
    data = userfiles.parse_json(userfiles.read_text(path, label), label)
    return state_file.parse(data, label).to_json()


@dataclass(frozen=True, kw_only=True)
class Request:
    """One `fxcache verify` run, as argparse (`register`) and the action (`action/steps.py`)
    both build it: the options' dests, one field each, and no default besides the parser's."""

    python: str
    # the matrix axes (matrix.FLAGS) and the matrix file
    devices: str | None
    dtypes: str | None
    dynamic: str | None
    mechanisms: str | None
    training: str | None
    workloads: str | None
    modes: str | None
    ranks: str | None
    matrix_file: str | None
    # which phases run, where their caches and the results go
    phase: str
    cache_dir: str | None
    json_path: str | None
    # what counts as safe, what fails the command
    min_speedup: float | None
    compare: str
    fail_on: str
    # how the phases run
    timeout: float
    jobs: int | None
    recheck_all: bool
    separate_cold: bool
    deterministic: bool
    # what the results embed and where the remote mechanism's Redis is
    cache_state: str | None
    redis_url: str | None
    report_id: str
    salt: str | None

    @property
    def flags(self) -> dict[str, str | None]:
        """The axes as `matrix.build` takes them."""
        return matrix_flags(
            self.devices, self.dtypes, self.dynamic, self.mechanisms, self.training,
            self.workloads, self.modes, self.ranks,
        )  # fmt: skip


@errors.signals_interrupt()  # an interrupt stops the phases, writes no results: exit 130 / 143
def run(request: Request) -> int:
    """Plan, run, judge, print, write JSON; exit status by --fail-on."""
    from ci_fxcache.jobstats.trace import keep_out_of_job_trace

    r = request
    keep_out_of_job_trace()
    plan = matrix.build(r.flags, r.matrix_file)
    _check_flags(r.phase, r.cache_dir, r.jobs, r.min_speedup, r.json_path)
    state = _cache_state(r.cache_state)
    interpreter_path = interpreter.resolve(r.python)
    fp = fingerprint.collect(interpreter_path, r.salt)
    torch_support.announce_newer(fp.torch_version)
    temporary = r.cache_dir is None
    cache_path, run_dir = _cache_path(r.cache_dir), Path(tempfile.mkdtemp(prefix="fxcache-run-"))
    settings = runner.Settings(
        phase=r.phase, cache_dir=cache_path, run_dir=run_dir, min_speedup=r.min_speedup,
        compare=r.compare, fail_on=r.fail_on, timeout=r.timeout, jobs=r.jobs,
        redis_url=redis_cache.configured_url(r.redis_url), share_cold=not r.separate_cold,
        recheck_all=r.recheck_all, deterministic=r.deterministic,
        scope_key=scopekey.scope_key(fp),
    )  # fmt: skip
    try:
        combos, settings.phase = _phases(interpreter_path, plan, settings)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if temporary:
            shutil.rmtree(cache_path, ignore_errors=True)
    doc = writer.document(
        fingerprint=fp.to_dict(), scope_key=settings.scope_key, cache=state,
        settings=settings.to_dict(), matrix=plan.to_dict(), combos=combos,
        report_id=r.report_id,
    )  # fmt: skip
    if r.json_path:
        writer.write(doc, r.json_path)
    if r.json_path != "-":
        _table(doc)
    return _exit_status(doc, r.fail_on)


def _check_flags(
    phase: str, cache_dir: str | None, jobs: int | None, min_speedup: float | None,
    json_path: str | None,
) -> None:  # fmt: skip
    """UsageError for flags that do not go together, before anything runs."""
    if phase == "hot" and not cache_dir:
        raise UsageError("--phase hot needs --cache-dir (where the cold phase recorded references)")
    if (jobs is not None and jobs < 1) or (min_speedup is not None and min_speedup < 0):
        raise UsageError("--jobs must be positive, --min-speedup not negative")
    if json_path and json_path != "-":
        userfiles.output_file(json_path, "--json", make_parents=True)


def _cache_path(cache_dir: str | None) -> Path:
    """--cache-dir (a directory we can write), else a new temporary one."""
    cache_path = Path(cache_dir or tempfile.mkdtemp(prefix="fxcache-verify-")).absolute()
    userfiles.output_dir(cache_path, "--cache-dir")
    cache_path.mkdir(parents=True, exist_ok=True)
    return cache_path


def _phases(
    interpreter_path: str, plan: matrix.Matrix, settings: runner.Settings
) -> tuple[list[dict[str, Any]], str]:
    """Every combination's phases through one fork server in the user's interpreter: the
    results, and which phases ran."""
    server = ForkServer(interpreter_path, settings.run_dir)
    try:
        total = len(plan.combos())
        if "auto" in plan.devices:
            runner.expand_devices(plan, server.info)
            total = len(plan.combos())
        return runner.run(server, plan, settings, _progress(total))
    finally:
        server.close()


def _table(doc: dict[str, Any]) -> None:
    """The run's report as `fxcache report --format text` prints it, from the same document."""
    from ci_fxcache import report
    from ci_fxcache.report import render

    print()
    gha.print_untrusted(render.text(report.from_document(doc, "the verify run")))


def _exit_status(doc: dict[str, Any], fail_on: str) -> int:
    bad = causes.failing(doc["combos"], fail_on)
    if bad:
        cli.report_failure(
            f"{len(bad)} combination(s) failed the --fail-on {fail_on} policy: "
            + ", ".join(c["id"] for c in bad)
        )
        return EXIT_CHECK_FAILED
    return EXIT_OK
