#!/usr/bin/env bash
# Install the fxcache toolkit into its own virtual environment, leaving the job's Python and
# torch untouched; or use a toolkit already installed in the runner image.
#
# Dependencies come from the hash-locked toolkit/requirements*.txt (pip --require-hashes,
# wheels only; pip's own configuration, e.g. a mirror, applies); the toolkit itself is copied
# from the action's directory (no build step, nothing else fetched). The venv lives in the
# runner's tool cache under an id that hashes the toolkit's sources, the lock files, the extras
# and the base interpreter; it is reused only when a hash of all its files matches the one
# recorded when it was installed: a check against corruption (an install cut short, a disk
# error), not against the job's user, who can rewrite the venv and its record alike. Every
# Python here runs isolated (-I, the toolkit's own `fxcache` too): nothing in the job's
# working directory, PYTHONPATH or user site runs inside the toolkit; the base interpreter
# also runs without its site (-S), so no .pth file or sitecustomize of the job's interpreter
# runs here. Tools are taken from /usr/bin and /bin only, never from the job's PATH (which
# any step can prepend to); only the base interpreter is looked up there. Untrusted events
# (forks, pull_request_target, ...) never reuse a venv: they install into a private one
# under $RUNNER_TEMP.
#
# env: FXCACHE_ACTION_ROOT  the action's root directory
#      FXCACHE_BASE_PYTHON  interpreter to build the venv from (else $FXCACHE_PYTHON, python3)
#      FXCACHE_STORE        redis / s3 / object: install the redis / s3 / s3 and gcs extras too
#      FXCACHE_TOOLKIT      absolute path of an installed fxcache to use instead (same
#                           version): the action's `toolkit` input, never the job's variable
#      FXCACHE_RUN_EVENT    the runner's record of the event (the action's run-event input)
# out: step output `fxcache` (path of the fxcache executable) when $GITHUB_OUTPUT is set
set -euo pipefail
job_path="${PATH:-}"
PATH=/usr/bin:/bin
export PATH

root="${FXCACHE_ACTION_ROOT:?FXCACHE_ACTION_ROOT is not set}"
fail() { echo "::error::fxcache: $*"; exit 2; }
publish() {
  "$1" --version
  if [ -n "${GITHUB_OUTPUT:-}" ]; then
    printf 'fxcache<<fxcache_%s\n%s\nfxcache_%s\n' "$2" "$1" "$2" >>"$GITHUB_OUTPUT"
  fi
}
delimiter="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
wanted="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/ci_fxcache/__init__.py")"

if [ -n "${FXCACHE_TOOLKIT:-}" ]; then
  [ "${FXCACHE_TOOLKIT#/}" != "$FXCACHE_TOOLKIT" ] ||
    fail "toolkit $FXCACHE_TOOLKIT: give the absolute path of an installed fxcache"
  found="$("$FXCACHE_TOOLKIT" --version 2>/dev/null)" ||
    fail "toolkit $FXCACHE_TOOLKIT does not run: leave the toolkit input empty to install one"
  [ "$found" = "fxcache $wanted" ] ||
    fail "toolkit $FXCACHE_TOOLKIT is $found, this action needs fxcache $wanted"
  echo "fxcache: using the installed toolkit $FXCACHE_TOOLKIT"
  publish "$FXCACHE_TOOLKIT" "$delimiter"
  exit 0
fi

# The toolkit needs Python 3.11 (pyproject.toml's requires-python; tests/test_repo_files.py).
fit() { "$1" -I -S -c 'import sys, venv; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }
base=""
for candidate in "${FXCACHE_BASE_PYTHON:-}" "${FXCACHE_PYTHON:-}" python3; do
  [ -n "$candidate" ] || continue
  found="$(PATH="$job_path" command -v -- "$candidate" || true)"
  if [ -n "$found" ] && fit "$found"; then base="$found"; break; fi
done
[ -n "$base" ] || fail "no Python >= 3.11 with the venv module found: set the action's python input"

requirements=("$root/toolkit/requirements.txt")
if [ "${FXCACHE_STORE:-}" = redis ]; then requirements+=("$root/toolkit/requirements-redis.txt"); fi
if [ "${FXCACHE_STORE:-}" = s3 ] || [ "${FXCACHE_STORE:-}" = object ]; then requirements+=("$root/toolkit/requirements-s3.txt"); fi
# store: object may name a gs:// bucket whose credentials only google-auth reads (gcs extra).
if [ "${FXCACHE_STORE:-}" = object ]; then requirements+=("$root/toolkit/requirements-gcs.txt"); fi
pip_args=()
for file in "${requirements[@]}"; do pip_args+=(-r "$file"); done

# Trust is the toolkit's decision (ci_fxcache/store/trust.py, standard library only).
untrusted="$("$base" -I -S - "$root" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from ci_fxcache.store import trust
print(trust.install_reason() or "")
PY
)"

id="$("$base" -I -S - "$root" "${requirements[@]}" <<'PY'
import hashlib, os, sys
root = sys.argv[1]
h = hashlib.sha256(("%s|%s" % (os.path.realpath(sys.executable), sys.version)).encode())
paths = sys.argv[2:]
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

# A hash of every file of the venv (names, link targets, contents).
digest() {
  "$base" -I -S - "$1" <<'PY'
import hashlib, os, sys
venv = sys.argv[1]
h = hashlib.sha256()
for top, dirs, files in os.walk(venv):
    dirs.sort()
    for name in sorted(files):
        path = os.path.join(top, name)
        h.update(os.path.relpath(path, venv).encode() + b"\0")
        if os.path.islink(path):
            h.update(b"link:" + os.readlink(path).encode())
        else:
            with open(path, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
print(h.hexdigest())
PY
}

install() { # VENV
  rm -rf "$1"
  "$base" -I -S -m venv "$1"
  "$1/bin/python" -I -m pip install --quiet --disable-pip-version-check --require-hashes \
    --only-binary=:all: "${pip_args[@]}" ||
    fail "could not install the toolkit's locked dependencies (see pip's message above); on an air-gapped runner point pip at a mirror (PIP_INDEX_URL) or preinstall the toolkit (the toolkit input)"
  site="$("$1/bin/python" -I -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  (cd "$root" && find ci_fxcache -name __pycache__ -prune -o -type f ! -name '*.pyc' -print0 |
    xargs -0 cp --parents -t "$site")
  "$1/bin/python" -I -m compileall -q "$site/ci_fxcache" >/dev/null
  printf '#!%s -I\nfrom ci_fxcache.cli import entry\nentry()\n' \
    "$1/bin/python" >"$1/bin/fxcache"
  chmod +x "$1/bin/fxcache"
}

if [ -n "$untrusted" ]; then
  venv="${RUNNER_TEMP:-/tmp}/fxcache-toolkit-$id"
  echo "fxcache: $untrusted: installing a private toolkit into $venv (a shared one is never reused)"
  install "$venv"
  publish "$venv/bin/fxcache" "$delimiter"
  exit 0
fi

store="${RUNNER_TOOL_CACHE:-${RUNNER_TEMP:-/tmp}}/fxcache-toolkit"
if ! mkdir -p "$store" 2>/dev/null || [ ! -w "$store" ]; then
  echo "::warning::fxcache: $store is not writable; installing the toolkit under \$RUNNER_TEMP"
  store="${RUNNER_TEMP:-/tmp}/fxcache-toolkit"
  mkdir -p "$store"
fi
venv="$store/$id"
record="$store/$id.sha256"
intact() { [ -f "$record" ] && [ -x "$venv/bin/fxcache" ] && [ "$(digest "$venv")" = "$(cat "$record")" ]; }

# Jobs on one runner host may share the tool cache: one installs, the others wait and reuse.
# (A venv hard-codes its own path, so it is built in place, under the lock.)
exec 9>"$store/.install-$id.lock"
if command -v flock >/dev/null; then flock 9; fi
if intact; then
  echo "fxcache: reusing toolkit $venv (unchanged since its install)"
else
  if [ -e "$venv" ]; then
    echo "::warning::fxcache: toolkit $venv changed since its install (corrupted?); reinstalling it"
  fi
  echo "fxcache: installing toolkit into $venv (base interpreter: $base)"
  rm -f "$record"
  install "$venv"
  digest "$venv" >"$record"
fi
exec 9>&-
publish "$venv/bin/fxcache" "$delimiter"
