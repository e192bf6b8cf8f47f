# Sourced by the benchmarks/gpu_session*.sh device calls: the shared set-up.
#   $OUT        where logs land (the device tool's output folder; benchmarks/results here)
#   PYTHONPATH  the repo, and humming-kernels from the carried .whl/ (shared/GPU.md) if any
#   step NAME   prints "== NAME (+seconds since the start)"
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/results}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:.
else
  export PYTHONPATH=.
fi
T0=$(date +%s)
step() { echo "== $1 (+$(( $(date +%s) - T0 ))s)"; }
