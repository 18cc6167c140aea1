#!/usr/bin/env bash
# The prepared GPU check (issues 9, 15 and 28): one run on one CUDA machine, maximal evidence.
#
#   PYTHON=python3 OUT_DIR=DIR benchmarks/gpu_check.sh [--dry-run]
#
# Installs nothing and needs no network: the toolkit runs from this checkout on PYTHONPATH with
# the interpreter PYTHON (default python3), which must hold torch and the toolkit's own needs
# (pyyaml, jinja2, requests; GPU images have them). `--dry-run` prints the plan and the time
# budget and runs nothing.
#
# Every step runs under its own `timeout`, within a budget (STEPS_BUDGET_S, 360 s, the preflight included) that keeps
# the whole run under 8 minutes; a step that no longer fits is skipped with a line saying so.
# A failing step says so and the run goes on (no `set -e`). Whether there is a GPU is decided
# by torch (the preflight), not by nvidia-smi. Without torch the run stops after the preflight;
# without CUDA only the CPU fallback runs (the GPU-only steps are skipped with a line); both
# still write checks.json and the table. The test suite runs the fallback and the preflight.
#
# Writes to OUT_DIR (default $OUT, else ./gpu-check-out) at most 5 files: gpu_check.log,
# preflight.json, checks.json, table.txt and evidence.tar.gz (results JSON, markdown reports,
# phase logs, references, cache listings with *.cubin, *.best_config, cuda_utils*.so).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; fi
steps_budget=${STEPS_BUDGET_S:-360}
finish_budget=80 # evidence, checks, archive, table: each under its own timeout (+10 s grace)
phase_timeout=150
out=${OUT_DIR:-${OUT:-$PWD/gpu-check-out}}
if [ "$dry" = 0 ]; then
  mkdir -p "$out" || { echo "gpu_check: cannot create $out"; exit 1; }
  out=$(cd "$out" && pwd)
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d) || { echo "gpu_check: mktemp failed"; exit 1; }
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/results" "$work/reports" "$work/logs"
if [ "$dry" = 0 ]; then
  exec > >(tee "$out/gpu_check.log") 2>&1
fi

started=$SECONDS
gpu=0
stop=0
planned=0
helper() { "$python" "$root/benchmarks/gpu_check.py" "$@"; }

# step NAME CAP_S NEEDS CMD...: run CMD under `timeout` (CAP_S, or what is left of the budget);
# NEEDS: gpu (skipped in the CPU fallback), any, or always (finishing steps: never skipped,
# outside the steps budget).
step() {
  local name=$1 cap=$2 needs=$3
  shift 3
  if [ "$dry" = 1 ]; then
    printf '  %-20s up to %3d s  %s\n' "$name" "$cap" "$needs"
    if [ "$needs" != always ]; then planned=$((planned + cap)); fi
    return 0
  fi
  local limit=$cap
  if [ "$needs" != always ]; then
    local left=$((steps_budget - (SECONDS - started)))
    if [ "$stop" = 1 ]; then
      echo "== $name: skipped (the preflight stopped the run)"
      echo "$name skipped-stop" >>"$work/steps"
      return 0
    fi
    if [ "$needs" = gpu ] && [ "$gpu" != 1 ]; then
      echo "== $name: skipped (needs a GPU: CPU fallback)"
      echo "$name skipped-no-gpu" >>"$work/steps"
      return 0
    fi
    if [ "$left" -lt 15 ]; then
      echo "== $name: skipped (the ${steps_budget} s budget is spent)"
      echo "$name skipped-budget" >>"$work/steps"
      return 0
    fi
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
  fi
  echo "== $name (timeout ${limit} s; $((SECONDS - started)) s so far)"
  timeout -k 10 "$limit" "$@"
  local rc=$?
  case $rc in
    0) ;;
    3) if [ "$name" != preflight ]; then echo "== $name: failed (exit 3)"; fi ;;
    124 | 137) echo "== $name: TIMED OUT after ${limit} s" ;;
    *) echo "== $name: failed (exit $rc)" ;;
  esac
  echo "$name $rc" >>"$work/steps"
  return 0
}

# verify_step NAME CAP_S NEEDS, then verify's options: compile workers counted, phase logs kept
verify_step() {
  local name=$1 cap=$2 needs=$3
  shift 3
  mkdir -p "$work/tmp-$name"
  step "$name" "$cap" "$needs" "$python" "$root/benchmarks/gpu_check.py" watch \
    "$work/$name.peak.json" --logs "$work/tmp-$name" "$work/logs/$name" -- \
    env TMPDIR="$work/tmp-$name" "$python" -m ci_fxcache verify --python "$python" "$@" \
    --json "$work/results/$name.json" --fail-on never --timeout "$phase_timeout"
}

if [ "$dry" = 1 ]; then
  echo "gpu_check plan (PYTHON=$python, output in $out):"
else
  echo "== gpu_check: $("$python" --version 2>&1) at $python; output in $out"
fi
step preflight 90 always "$python" "$root/benchmarks/gpu_check.py" preflight "$work"
if [ "$dry" = 0 ]; then
  case $(tail -n 1 "$work/steps" | cut -d' ' -f2) in
    0) gpu=1 ;;
    3) echo "== no GPU seen by torch: CPU fallback (GPU-only steps are skipped)" ;;
    *)
      stop=1
      echo "== STOP: torch or the toolkit is missing for $python (see the preflight above); writing checks.json"
      ;;
  esac
  cp "$work/preflight.json" "$out/preflight.json" 2>/dev/null || echo '{}' >"$out/preflight.json"
  uuid=$("$python" -c 'import json,sys; g=json.load(open(sys.argv[1])).get("gpus") or [{}]; print(g[0].get("uuid",""))' "$work/preflight.json" 2>/dev/null || true)
  echo "uuid=${uuid:-none}" >"$work/uuid"
fi

fp='"$1" -m ci_fxcache fingerprint --python "$1" --json "${@:3}" >"$2"'
step fingerprint 45 any bash -c "$fp" _ "$python" "$work/fingerprint.json" --probe
visible_before=${CUDA_VISIBLE_DEVICES:-}
visible_was_set=${CUDA_VISIBLE_DEVICES+1}
if [ -n "${uuid:-}" ]; then export CUDA_VISIBLE_DEVICES="$uuid"; fi # the UUID slot path
step fingerprint-uuid 45 any bash -c "$fp" _ "$python" "$work/fingerprint-uuid.json"

# -- env checks (issue 28 §2-4) --
# Scope key vs torch's keys, libcuda without nvidia-smi, visible devices: functions in
# gpu_check.py behind its `env-checks WORK` subcommand, which writes what `check` reads.
if [ "$dry" = 1 ] || helper has env-checks 2>/dev/null; then
  step env-checks 60 any "$python" "$root/benchmarks/gpu_check.py" env-checks "$work"
fi
# -- end env checks --

# The default matrix with --device auto (CUDA stage, then CPU stage: issue 28 §1); the CPU
# fallback runs its CUDA half only (every combination skipped, nothing compiled).
auto=auto
if [ "$dry" = 0 ] && [ "$gpu" != 1 ]; then auto=cuda; fi
verify_step default-auto 200 any --device "$auto" --cache-dir "$work/default-auto"
# Issue 46: max-autotune and reduce-overhead on the GPU, and 2 ranks where there are 2 GPUs
# (gpu_check.py extra_steps decides which; the ranks see every device, not the one UUID).
while read -r name cap args <&3; do
  [ -n "$name" ] || continue
  if [ "$name" = ranks-2 ] && [ "$dry" = 0 ]; then
    if [ -n "$visible_was_set" ]; then export CUDA_VISIBLE_DEVICES="$visible_before"; else unset CUDA_VISIBLE_DEVICES; fi
  fi
  # shellcheck disable=SC2086 # ARGS are plain words (gpu_check.py MODES_STEP, RANKS_STEP)
  verify_step "$name" "$cap" gpu $args --cache-dir "$work/$name"
  if [ -n "${uuid:-}" ]; then export CUDA_VISIBLE_DEVICES="$uuid"; fi
done 3< <(helper extra-steps "$work")
# The fxgraph CUDA combinations alone on the machine: their times beside the auto run's
verify_step cuda-alone 90 gpu --device cuda --mechanisms fxgraph --cache-dir "$work/cuda-alone"
# A second hot process on the cache the auto run built
verify_step second-hot 60 gpu --device cuda --mechanisms fxgraph --phase hot \
  --cache-dir "$work/default-auto"
# The combination PyTorch disabled upstream: bf16 + dynamic + caching precompile
verify_step transformer-bf16 100 any --device cuda --workloads transformer_block \
  --dtypes bfloat16 --dynamic true --mechanisms precompile --training true,false \
  --cache-dir "$work/transformer-bf16"
# Nondeterministic kernels (atomics in attention and conv backward): judged fairly (§5)
verify_step nondeterminism 80 gpu --device cuda --workloads attention,conv --dtypes float32 \
  --dynamic false --mechanisms fxgraph --training true --cache-dir "$work/nondeterminism"
# Real models from the image's own packages (random weights, nothing downloaded)
verify_step real-models 120 gpu --device cuda \
  --workloads benchmarks.gpu_models:resnet18,benchmarks.gpu_models:gpt2_small \
  --dtypes bfloat16 --dynamic false --mechanisms fxgraph --training false \
  --cache-dir "$work/real-models"

# Finishing steps: always run, each under its own timeout, outside the steps budget.
if [ "$dry" = 1 ]; then
  echo "finishing steps (always run, outside the steps budget, ${finish_budget} s in all):"
fi
step evidence 30 always "$python" "$root/benchmarks/gpu_check.py" evidence "$work" "$python"
step checks 15 always "$python" "$root/benchmarks/gpu_check.py" check "$out" "$work"
step archive 15 always "$python" "$root/benchmarks/gpu_check.py" archive "$work" \
  "$out/evidence.tar.gz"
if [ "$dry" = 1 ]; then
  step table 10 always true
  echo "budget: the steps (preflight included) list up to $((planned + 90)) s and stop at"
  echo "${steps_budget} s (a step that no longer fits is skipped, with a line); the finishing"
  echo "steps take at most ${finish_budget} s: the whole run ends within $((steps_budget + 10 + finish_budget)) s (8 minutes: 480 s)"
  exit 0
fi
[ -e "$out/checks.json" ] || echo '{"checks": [], "failed": ["checks did not run"]}' >"$out/checks.json"
status=$("$python" -c 'import json,sys; print(1 if json.load(open(sys.argv[1]))["failed"] else 0)' "$out/checks.json" 2>/dev/null || echo 1)
echo "== done in $((SECONDS - started)) s (exit $status)"
step table 10 always "$python" "$root/benchmarks/gpu_check.py" table "$work" "$out/table.txt"
exit "$status"
