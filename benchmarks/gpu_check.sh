#!/usr/bin/env bash
# The prepared GPU check (issue 9 section 5, issue 15 sections 3-5): one run on one CUDA machine.
#
#   PYTHON=python3 OUT_DIR=DIR benchmarks/gpu_check.sh
#
# Installs nothing: it needs an interpreter with a CUDA torch (PYTHON, default python3, which on
# a bare CUDA machine is the one holding torch; the toolkit's own needs, pyyaml, jinja2
# and requests, come with such images) and this checkout, run from PYTHONPATH.
# It runs, pinned by CUDA_VISIBLE_DEVICES to GPU 0's UUID (so the UUID slot path is exercised):
#   1. `fxcache fingerprint --probe`, by index and by UUID: the no-import view of the GPU
#      against `import torch`, and one scope key for both selections;
#   2. the CUDA half of the default matrix (sin_matmul; float32, bfloat16; static, dynamic;
#      fxgraph, mega, precompile; training), compile workers counted while it runs;
#   3. transformer_block in bfloat16 + dynamic + precompile (the combination PyTorch disabled
#      upstream), training and inference;
# and writes to OUT_DIR (default $OUT, else ./gpu-check-out): gpu_check.log, fingerprint.json,
# default-cuda.json / .md, transformer-bf16.json / .md and checks.json (benchmarks/gpu_check.py
# check: phases on the given UUID, hot on cold's device, skip causes, compile-worker bound).
# Sized for 8 minutes on one H200. Without a GPU the same runs skip every CUDA combination
# (cause no-device) and the same files are written: the CPU fallback the tests run.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
out=${OUT_DIR:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
exec > >(tee "$out/gpu_check.log") 2>&1

fx() { "$python" -m ci_fxcache "$@"; }
started=$SECONDS
echo "== gpu_check: $("$python" --version 2>&1) at $python; output in $out"
nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not available"

uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0 2>/dev/null | head -n 1 || true)
fx fingerprint --python "$python" --json --probe >"$out/fingerprint.json" || echo "probe: fields disagree (exit $?)"
if [ -n "$uuid" ]; then
  export CUDA_VISIBLE_DEVICES="$uuid"
fi
fx fingerprint --python "$python" --json >"$work/fingerprint-uuid.json"
echo "uuid=${uuid:-none}" >"$work/uuid"

verify() {  # name, then verify's matrix options
  local name=$1
  shift
  echo "== verify $name ($((SECONDS - started)) s so far)"
  "$python" "$root/benchmarks/gpu_check.py" watch "$work/$name.peak.json" -- \
    "$python" -m ci_fxcache verify --python "$python" --device cuda "$@" \
    --cache-dir "$work/$name" --json "$out/$name.json" --fail-on never --timeout 300 ||
    echo "verify $name: exit $?"
  fx report "$out/$name.json" --format md -o "$out/$name.md" || echo "report $name: exit $?"
}
verify default-cuda
verify transformer-bf16 --workloads transformer_block --dtypes bfloat16 --dynamic true \
  --mechanisms precompile --training true,false

# -- env checks (issue 28 §2-4) --
echo "== env checks: no-import GPU view vs torch.cuda ($((SECONDS - started)) s so far)"
timeout 300 "$python" "$root/benchmarks/gpu_check.py" env-checks "$work" || echo "env checks: exit $?"
# -- end env checks --

echo "== checks ($((SECONDS - started)) s so far)"
status=0
"$python" "$root/benchmarks/gpu_check.py" check "$out" "$work" || status=$?
echo "== done in $((SECONDS - started)) s (exit $status)"
exit "$status"
