# Sourced by the device-call scripts (benchmarks/gpu_session*.sh, benchmarks/sessions/*.sh): the shared set-up.
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
# Which card ran the call (H100 or H200 may come): kept with the logs.
nvidia-smi -L > "$OUT/card.txt" 2>&1 || true
step() { echo "== $1 (+$(( $(date +%s) - T0 ))s)"; }
# Shared by the session scripts from session 32 on:
#   T SECONDS CMD...        the command under a timeout (SIGINT, then SIGKILL 5 s later)
#   gpu_tests LIMIT EXPR FILES...   the @pytest.mark.gpu tests of FILES matching -k EXPR,
#                           log in $OUT/tests.log, the summary printed
#   MOE                     bench_moe.py's resident-chain flags
T() { local t=$1; shift; timeout -k 5 -s INT "$t" "$@"; }
MOE="--chain resident --span --calls 10 --repeats 2"
gpu_tests() {
  local limit=$1 expr=$2; shift 2
  T "$limit" python3 -m pytest -p no:cacheprovider -o addopts= --tb=short -rA \
    -W ignore::DeprecationWarning -m gpu -s "$@" -k "$expr" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|^E |passed|failed" \
    "$OUT/tests.log" | cut -c1-250 | tail -40
}
#   bench_ab VAR LOG SPECS "shape:tokens"...   bench_moe at each point with VAR=1 (and
#                           Humming) then VAR=0, logs in $OUT/LOG.log and LOG_*.json
bench_ab() {
  local var=$1 log=$2 specs=$3 spec on; shift 3
  for spec in "$@"; do
    for on in 1 0; do
      echo "== ${spec} $var=$on" >> "$OUT/$log.log"
      env "$var=$on" timeout -k 5 -s INT ${ST:-240} python3 benchmarks/bench_moe.py \
        --shapes ${spec%%:*} --tokens ${spec##*:} --specs "$specs" $MOE \
        $([ $on = 1 ] && echo --humming) --no-baselines \
        --json "$OUT/${log}_${spec%%:*}_${spec##*:}_$on.json" >> "$OUT/$log.log" 2>&1
      echo "${spec} $var=$on rc=$?"; grep -E "T=|rror" "$OUT/$log.log" | tail -1 | cut -c1-600
    done
  done
}
