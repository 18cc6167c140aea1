# Sourced by settings.sh and verify.sh: append the verification-matrix flags given as the
# action's inputs (IN_*) to the array `args`; empty inputs leave verify's defaults.
matrix_args() {
  if [ -n "${IN_MATRIX_FILE:-}" ]; then args+=(--matrix-file "$IN_MATRIX_FILE"); fi
  if [ -n "${IN_DEVICE:-}" ]; then args+=(--device "$IN_DEVICE"); fi
  if [ -n "${IN_DTYPES:-}" ]; then args+=(--dtypes "$IN_DTYPES"); fi
  if [ -n "${IN_DYNAMIC:-}" ]; then args+=(--dynamic "$IN_DYNAMIC"); fi
  if [ -n "${IN_MECHANISMS:-}" ]; then args+=(--mechanisms "$IN_MECHANISMS"); fi
  if [ -n "${IN_TRAINING:-}" ]; then args+=(--training "$IN_TRAINING"); fi
  if [ -n "${IN_WORKLOADS:-}" ]; then args+=(--workloads "$IN_WORKLOADS"); fi
}
