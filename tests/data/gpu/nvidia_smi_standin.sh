# Stand-in for `nvidia-smi` (sourced by a generated wrapper that sets QUERY): `-L` lists GPUs and
# MIG devices, `--query-gpu=...` prints the CSV rows; like the real tool it ignores
# CUDA_VISIBLE_DEVICES.
case "$*" in
  -L) cat "$DATA/nvidia-smi-L.txt" ;;
  *--query-gpu=index,uuid,name,compute_cap,driver_version*) cat "$DATA/$QUERY" ;;
  *) echo "Invalid combination of input arguments." >&2; exit 2 ;;
esac
