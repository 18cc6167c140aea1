#!/usr/bin/env bash
# Validate the action's inputs and resolve `auto` values and paths into step outputs; export
# what the save sub-action needs (FXCACHE_*) to later steps of the job. Inputs arrive as IN_*.
set -euo pipefail

fail() { echo "::error::fxcache: $*"; exit 2; }
one_of() { # NAME VALUE ALLOWED...
  local name="$1" value="$2"; shift 2
  local v; for v in "$@"; do [ "$value" = "$v" ] && return 0; done
  fail "input $name must be one of: $* (got '$value')"
}

one_of store "$IN_STORE" local github redis
one_of read-only "$IN_READ_ONLY" auto true false
one_of comment "$IN_COMMENT" auto true false
one_of fail-on "$IN_FAIL_ON" unsafe error no-gain never
one_of on-unsafe "$IN_ON_UNSAFE" disable keep
one_of invalidate-on-upgrade "$IN_INVALIDATE_ON_UPGRADE" true false
[[ "$IN_TIMEOUT_MINUTES" =~ ^[0-9]+([.][0-9]+)?$ ]] && [[ ! "$IN_TIMEOUT_MINUTES" =~ ^0+([.]0+)?$ ]] ||
  fail "input timeout-minutes must be a positive number of minutes (got '$IN_TIMEOUT_MINUTES')"
[[ "$IN_REPORT_ID" =~ ^[A-Za-z0-9._-]+$ ]] ||
  fail "input report-id may use only letters, digits, '.', '_' and '-' (got '$IN_REPORT_ID')"
if [ "$IN_STORE" = redis ] && [ -z "$IN_REDIS_URL" ]; then
  fail "store: redis needs the redis-url input (e.g. redis-url: \${{ secrets.FXCACHE_REDIS_URL }})"
fi
# The verification matrix, checked as verify will read it, before the store is touched
# (fxcache prints its own one-line ::error:: and exits 2).
# shellcheck source=matrix-args.sh
. "$FXCACHE_ACTION_ROOT/scripts/matrix-args.sh"
args=(plan)
matrix_args
GITHUB_OUTPUT="" "$FXCACHE" "${args[@]}" >/dev/null

# A pull request from a fork runs untrusted code with a read-only token: never let it write the
# store (cache poisoning), and leave its comment to the workflow_run follow-up.
fork=false
case "$EVENT_NAME" in
  pull_request | pull_request_target)
    if [ -n "$HEAD_REPOSITORY" ] && [ "$HEAD_REPOSITORY" != "$GITHUB_REPOSITORY" ]; then fork=true; fi ;;
esac
read_only="$IN_READ_ONLY"
[ "$read_only" = auto ] && read_only="$fork"
comment="$IN_COMMENT"
if [ "$comment" = auto ]; then
  comment=false
  case "$EVENT_NAME" in
    pull_request | pull_request_target)
      if [ "$fork" = true ] && [ "$EVENT_NAME" = pull_request ]; then
        echo "::notice::fxcache: pull request from a fork: its token cannot comment; the fxcache-comment-fork workflow posts the report"
      else
        comment=true
      fi ;;
  esac
fi

# The store's own default: the runner's tool cache (kept between jobs on self-hosted runners).
root="${IN_CACHE_ROOT:-${RUNNER_TOOL_CACHE:-$HOME/.cache}/fxcache}"
mkdir -p "$root"
root="$(cd "$root" && pwd)"
work="${RUNNER_TEMP:-/tmp}/fxcache/$IN_REPORT_ID"
mkdir -p "$work"
# For the workflow_run follow-up that comments on fork pull requests (see the README).
[ -n "${PR_NUMBER:-}" ] && echo "$PR_NUMBER" >"$work/pr-number"
timeout_s="$(awk -v m="$IN_TIMEOUT_MINUTES" 'BEGIN { printf "%d", m * 60 + 0.5 }')"
restore_store=local
[ "$IN_STORE" = redis ] && restore_store=redis

{
  echo "root=$root"
  echo "state-file=$work/restore-state.json"
  echo "results=$work/results.json"
  echo "markdown=$work/report.md"
  echo "read-only=$read_only"
  echo "comment=$comment"
  echo "restore-store=$restore_store"
  echo "timeout-s=$timeout_s"
} >>"$GITHUB_OUTPUT"

if [ "$IN_STORE" = github ]; then
  # actions/cache entries are immutable: save under a unique key (scope, suffix, run, attempt)
  # and restore the newest entry of this scope by prefix. `path` must match between the two.
  scope="$("$FXCACHE" key)"
  prefix="$scope-${IN_KEY_SUFFIX:+$IN_KEY_SUFFIX-}"
  key="${prefix}run$RUN_ID.$RUN_ATTEMPT"
  {
    echo "gha-path=$root/$scope"
    echo "gha-key=$key"
    echo "gha-restore-prefix=$prefix"
  } >>"$GITHUB_OUTPUT"
  echo "FXCACHE_GHA_PATH=$root/$scope" >>"$GITHUB_ENV"
  echo "FXCACHE_GHA_KEY=$key" >>"$GITHUB_ENV"
fi

# For the save sub-action (composite actions have no post step).
{
  echo "FXCACHE_STORE=$IN_STORE"
  echo "FXCACHE_ROOT=$root"
  echo "FXCACHE_STATE_FILE=$work/restore-state.json"
  echo "FXCACHE_PYTHON=$FXCACHE_PYTHON"
} >>"$GITHUB_ENV"
echo "fxcache: store $IN_STORE at $root, read-only $read_only, comment $comment"
