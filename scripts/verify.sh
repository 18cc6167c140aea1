#!/usr/bin/env bash
# Run `fxcache verify` with the action's inputs (IN_*). A usage error (exit 2) or a crash stops
# the action here; a failed fail-on check (exit 1) is recorded as output `rc` so that the report
# and the comment are still written, and the last step fails the action.
set -uo pipefail

args=(verify --phase auto --json "$RESULTS" --timeout "$TIMEOUT_S" --report-id "$IN_REPORT_ID")
[ -n "$VERIFY_DIR" ] && args+=(--cache-dir "$VERIFY_DIR")
[ -n "$STATE_FILE" ] && [ -f "$STATE_FILE" ] && args+=(--cache-state "$STATE_FILE")
# shellcheck source=matrix-args.sh
. "$(dirname "$0")/matrix-args.sh"
matrix_args
[ -n "$IN_MIN_SPEEDUP" ] && args+=(--min-speedup "$IN_MIN_SPEEDUP")
args+=(--fail-on "$IN_FAIL_ON")

"$FXCACHE" "${args[@]}"
rc=$?
if [ "$rc" = 1 ] && [ -s "$RESULTS" ]; then
  echo "rc=1" >>"$GITHUB_OUTPUT"
elif [ "$rc" != 0 ]; then
  exit "$rc"
fi
echo "report-json=$RESULTS" >>"$GITHUB_OUTPUT"
