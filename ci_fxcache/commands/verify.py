"""`fxcache verify`: the hot-load verification matrix, each phase in a fresh process."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from ci_fxcache import cli, userfiles
from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint, interpreter, scopekey
from ci_fxcache.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError
from ci_fxcache.report import labels
from ci_fxcache.results import writer
from ci_fxcache.verify import causes, matrix, runner
from ci_fxcache.verify.forkserver import ForkServer


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
    parser.add_argument(
        "--phase",
        choices=("cold", "hot", "both", "auto"),
        default="auto",
        help="auto (default): hot-only when every combination has a recorded reference in "
        "--cache-dir, else cold and hot",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=os.environ.get("FXCACHE_VERIFY_DIR") or None,
        help="per-combination caches and references (env FXCACHE_VERIFY_DIR, which "
        "`fxcache restore` exports; default: a temporary directory)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results document (- = stdout)")
    parser.add_argument("--min-speedup", type=options.finite_float, default=2.0, metavar="X")
    parser.add_argument("--compare", choices=("bitwise", "close"), default="bitwise")
    parser.add_argument(
        "--fail-on",
        choices=tuple(causes.FAIL_ON),
        default="unsafe",
        help="exit 1 on: unsafe (default); error (unsafe or error); no-gain (unsafe, error or "
        "no-gain); never",
    )
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per phase")
    parser.add_argument("--jobs", type=int, metavar="N", help="parallel combinations")
    parser.add_argument(
        "--recheck-all",
        action="store_true",
        default=os.environ.get("FXCACHE_RECHECK_ALL") == "1",
        help="a hot-only run re-checks every combination; by default it carries the no-gain "
        "verdicts of mega and precompile from the run that built the cache (docs/verify.md; "
        "env FXCACHE_RECHECK_ALL=1)",
    )
    parser.add_argument(
        "--separate-cold",
        action="store_true",
        default=os.environ.get("FXCACHE_SEPARATE_COLD") == "1",
        help="one cold phase per combination; by default fxgraph and mega share one "
        "(docs/verify.md; env FXCACHE_SEPARATE_COLD=1)",
    )
    parser.add_argument(
        "--cache-state",
        metavar="F",
        default=os.environ.get("FXCACHE_STATE_FILE") or None,
        help="restore's state (JSON), embedded in the results (env FXCACHE_STATE_FILE)",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("FXCACHE_REDIS_URL") or None,
        help="Redis for the remote mechanism (env FXCACHE_REDIS_URL)",
    )
    options.report_id_option(
        parser,
        default="fxcache",
        help="id of this report (default: fxcache); report, comment and merge keep one sticky "
        "comment per id",
    )
    parser.add_argument("--salt", default=None, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def add_matrix_options(parser: argparse.ArgumentParser, title: str) -> None:
    """The matrix axes as flags (shared by `verify` and `plan`)."""
    axes = parser.add_argument_group(title)
    axes.add_argument("--device", dest="devices", help="auto, cpu, cuda (default: auto)")
    axes.add_argument("--dtypes", help="float32, float16, bfloat16, bfloat16-autocast")
    axes.add_argument("--dynamic", help="false, true, mark")
    axes.add_argument("--mechanisms", help="fxgraph, mega, precompile, remote")
    axes.add_argument("--training", help="true, false")
    axes.add_argument("--workloads", help="built-in names or package.module:factory")
    axes.add_argument("--matrix-file", metavar="F", help="YAML matrix file (docs/matrix-file.md)")


def _progress(total: int) -> Any:
    lock = threading.Lock()
    done = [0]

    def report(combo: dict[str, Any]) -> None:
        with lock:
            done[0] += 1
            print(f"[{done[0]}/{total}] {line(combo)}", flush=True)

    return report


def _secs(phase: dict[str, Any] | None) -> str:
    value = (phase or {}).get("compile_s")
    return "-" if value is None else f"{value:.1f}s"


def line(combo: dict[str, Any]) -> str:
    """One progress / table line for a combination."""
    label = matrix.Combo(
        combo["workload"],
        combo["device"],
        combo["dtype"],
        combo["dynamic"],
        combo["mechanism"],
        combo["training"],
    ).label
    speed = f"{combo['speedup']:.1f}x" if combo.get("speedup") is not None else "-"
    judged_at = labels.carried_from(combo)
    carried = f"[{labels.NOT_RECHECKED}, judged {judged_at}] " if judged_at else ""
    return (
        f"{label:<44} {combo['verdict']:<8} cold {_secs(combo.get('cold')):>6} "
        f"hot {_secs(combo.get('hot')):>6} {speed:>6}  {carried}{combo['reason']}"
    )


def _cache_state(path: str | None) -> Any:
    if not path:
        return None
    label = f"--cache-state {path}"
    return userfiles.parse_json(userfiles.read_text(path, label), label)


def run(args: argparse.Namespace) -> int:
    """Plan, run, judge, print, write JSON; exit status by --fail-on."""
    flags = {axis: getattr(args, axis) for axis in matrix.FLAGS}
    plan = matrix.build(flags, args.matrix_file)
    if args.phase == "hot" and not args.cache_dir:
        raise UsageError("--phase hot needs --cache-dir (where the cold phase recorded references)")
    if args.timeout <= 0 or (args.jobs is not None and args.jobs < 1) or args.min_speedup < 0:
        raise UsageError("--timeout and --jobs must be positive, --min-speedup not negative")
    if args.json and args.json != "-":
        userfiles.output_file(args.json, "--json", make_parents=True)
    cache_state = _cache_state(args.cache_state)
    python = interpreter.resolve(args.python)
    fp = fingerprint.collect(python, args.salt)
    temporary = args.cache_dir is None
    cache_dir = Path(args.cache_dir or tempfile.mkdtemp(prefix="fxcache-verify-")).absolute()
    userfiles.output_dir(cache_dir, "--cache-dir")
    cache_dir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix="fxcache-run-"))
    settings = runner.Settings(
        phase=args.phase,
        cache_dir=cache_dir,
        run_dir=run_dir,
        min_speedup=args.min_speedup,
        compare=args.compare,
        fail_on=args.fail_on,
        timeout=args.timeout,
        jobs=args.jobs,
        redis_url=args.redis_url,
        share_cold=not args.separate_cold,
        recheck_all=args.recheck_all,
    )
    try:
        server = ForkServer(python, run_dir)
        try:
            total = len(plan.combos())
            if "auto" in plan.devices:
                runner.expand_devices(plan, server.info)
                total = len(plan.combos())
            combos, phase = runner.run(server, plan, settings, _progress(total))
        finally:
            server.close()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        if temporary:
            shutil.rmtree(cache_dir, ignore_errors=True)
    settings.phase = phase
    doc = writer.document(
        fingerprint=fp.to_dict(),
        scope_key=scopekey.scope_key(fp),
        cache=cache_state,
        settings=settings.to_dict(),
        matrix=plan.to_dict(),
        combos=combos,
        report_id=args.report_id,
    )
    if args.json:
        writer.write(doc, args.json)
    if args.json != "-":
        _table(doc)
    return _exit_status(doc, args.fail_on)


def _table(doc: dict[str, Any]) -> None:
    """The run's report as `fxcache report --format text` prints it, from the same document."""
    from ci_fxcache import report
    from ci_fxcache.report import render

    print()
    print(render.text(report.from_document(doc, "the verify run")), end="", flush=True)


def _exit_status(doc: dict[str, Any], fail_on: str) -> int:
    bad = causes.failing(doc["combos"], fail_on)
    if bad:
        cli.report_failure(
            f"{len(bad)} combination(s) failed the --fail-on {fail_on} policy: "
            + ", ".join(c["id"] for c in bad)
        )
        return EXIT_CHECK_FAILED
    return EXIT_OK
