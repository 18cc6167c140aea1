#!/usr/bin/env bash
# Install the fxcache toolkit from the action's own directory into its own virtual environment,
# leaving the job's Python and torch untouched. The venv lives in the runner's tool cache (kept
# between jobs on self-hosted runners) under an id that hashes the toolkit's sources and the
# base interpreter, so it is reused until the action version changes.
#
# env: FXCACHE_ACTION_ROOT  the action's root directory (holds pyproject.toml)
#      FXCACHE_BASE_PYTHON  interpreter to build the venv from (the job's python; python3 if unfit)
# out: step output `fxcache` (path of the fxcache executable) when $GITHUB_OUTPUT is set
set -euo pipefail

root="${FXCACHE_ACTION_ROOT:?FXCACHE_ACTION_ROOT is not set}"
store="${RUNNER_TOOL_CACHE:-${RUNNER_TEMP:-/tmp}}/fxcache-toolkit"

fit() { "$1" -c 'import sys, venv; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }
base=""
for candidate in "${FXCACHE_BASE_PYTHON:-}" "${FXCACHE_PYTHON:-}" python3; do
  if [ -n "$candidate" ] && fit "$candidate"; then base="$candidate"; break; fi
done
if [ -z "$base" ]; then
  echo "::error::fxcache: no Python >= 3.10 with the venv module found (tried '${FXCACHE_BASE_PYTHON:-}' and python3): set the action's python input"
  exit 2
fi

id="$("$base" - "$root" <<'PY'
import hashlib, os, sys
root = sys.argv[1]
h = hashlib.sha256(("%s|%s" % (os.path.realpath(sys.executable), sys.version)).encode())
paths = [os.path.join(root, "pyproject.toml")]
for top, dirs, files in os.walk(os.path.join(root, "ci_fxcache")):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    paths += [os.path.join(top, f) for f in sorted(files) if not f.endswith(".pyc")]
for path in paths:
    h.update(os.path.relpath(path, root).encode() + b"\0")
    with open(path, "rb") as fh:
        h.update(hashlib.sha256(fh.read()).digest())
print(h.hexdigest()[:16])
PY
)"
venv="$store/$id"

installed() { [ -f "$venv/.fxcache-installed" ] && "$venv/bin/fxcache" --version >/dev/null 2>&1; }
if installed; then
  echo "fxcache: reusing toolkit $venv"
else
  mkdir -p "$store"
  # Jobs on one runner host may share the tool cache: one installs, the others wait and reuse.
  # (A venv hard-codes its own path, so it is built in place, under the lock.)
  exec 9>"$store/.install-$id.lock"
  if command -v flock >/dev/null; then flock 9; fi
  if ! installed; then
    echo "fxcache: installing toolkit into $venv (base interpreter: $base)"
    rm -rf "$venv"
    "$base" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$root"
    touch "$venv/.fxcache-installed"
  fi
  exec 9>&-
fi

exe="$venv/bin/fxcache"
"$exe" --version
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  echo "fxcache=$exe" >>"$GITHUB_OUTPUT"
fi
