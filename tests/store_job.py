"""One CI job against the local store, as a real process: restore, compile, (save).

Usage: python tests/store_job.py --root R --fns f0,f1 [--no-save] [--fail] [--read-only]
       [--python PY]

`fxcache restore` runs as a child of this process, so this process owns the job's lease, as
the runner's job worker does inside Actions. The functions compile with real torch in this
process; prints one JSON line: the restore state, fxgraph counters and the save result.
Exits 1 before saving with --fail (a failing test step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _fxcache(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ci_fxcache", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


FUNCTIONS = {
    "f0": lambda x, y: x.sin() @ y,
    "f1": lambda x, y: x.cos() @ y + 1,
    "f2": lambda x, y: (x.tanh() @ y).relu(),
    "f3": lambda x, y: x.exp() @ y.sigmoid(),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--fns", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--store", default="local", help="restore's --store (s3: FXCACHE_S3_URL)")
    parser.add_argument("--read-only", action="store_true")
    args = parser.parse_args()
    # Beside the store root (the test's own directory), never in the machine's /tmp: the
    # restore keeps the job's trace and figures beside its state file.
    where = Path(args.root).resolve().parent
    where.mkdir(parents=True, exist_ok=True)
    fd, state_file = tempfile.mkstemp(prefix="job-state-", suffix=".json", dir=where)
    os.close(fd)
    restore = _fxcache(
        "restore", "--root", args.root, "--python", args.python, "--json",
        "--state-file", state_file, "--store", args.store,
        *(["--read-only"] if args.read_only else []),
    )  # fmt: skip
    if restore.returncode != 0:
        print(restore.stderr, file=sys.stderr)
        return 3
    state = json.loads(restore.stdout)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = state["inductor_dir"]
    os.environ["TRITON_CACHE_DIR"] = state["triton_dir"]
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    import torch
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    x, y = torch.rand(32, 48), torch.rand(48, 48)
    results = {}
    for name in args.fns.split(","):
        counters.clear()
        torch._dynamo.reset()
        with torch.no_grad():
            out = torch.compile(FUNCTIONS[name])(x, y)
            eager = FUNCTIONS[name](x, y)
        results[name] = {
            "hit": counters["inductor"]["fxgraph_cache_hit"],
            "miss": counters["inductor"]["fxgraph_cache_miss"],
            "close": bool(torch.allclose(out, eager, rtol=1e-4, atol=1e-5)),
        }
    report = {"state": state, "restore_stderr": restore.stderr, "functions": results}
    if args.fail:
        print(json.dumps(report), flush=True)
        return 1
    if not args.no_save:
        saved = _fxcache("save", "--json", "--state-file", state_file)
        report["save"] = json.loads(saved.stdout) if saved.returncode == 0 else None
        report["save_stderr"] = saved.stderr
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
