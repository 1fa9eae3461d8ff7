#!/usr/bin/env bash
# soak.sh - the test suite under load, several times: finds the tests that race.
#
#   scripts/soak.sh [-n RUNS] [-b BUSY] [-- CARGO_TEST_ARGS...]
#
# Builds the workspace's tests once (release), then runs `cargo test --release --workspace
# --no-fail-fast` RUNS times (default 5) while BUSY processes (default: one per CPU) spin on
# the CPUs, so every test meets a machine as loaded as a CI runner sharing its cores. Nothing is
# retried or skipped: a test that fails in any run is listed with the runs it failed in, and
# each failing run's output is kept in target/soak/run-N.log. Arguments after `--` go to every
# `cargo test` (e.g. `-- --test suite` or a name filter after another `--`).
# FAULT_REPEATS defaults to 1 here (the fault trials' repetitions; scripts/test.sh uses 3).
# Ends with "soak: R runs, F failed" and the failing tests; exit status 0 when none failed.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
RUNS=5
BUSY=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    -n) RUNS=$2; shift 2 ;;
    -b) BUSY=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "soak: unknown argument $1" >&2; exit 2 ;;
  esac
done
export FAULT_REPEATS=${FAULT_REPEATS:-1}
mkdir -p target/soak
cargo test --release --workspace --no-run -q "$@" || { echo "soak: the build failed"; exit 1; }

busy=()
stop_busy() { [ ${#busy[@]} -gt 0 ] && kill "${busy[@]}" 2>/dev/null; busy=(); }
trap stop_busy EXIT
for _ in $(seq 1 "$BUSY"); do
  ( while :; do :; done ) &
  busy+=($!)
done

failed_runs=0
declare -A failures=()
for run in $(seq 1 "$RUNS"); do
  log=target/soak/run-$run.log
  t0=$SECONDS
  cargo test --release --workspace --no-fail-fast "$@" > "$log" 2>&1
  rc=$?
  # libtest prints "test NAME ... FAILED" per failing test; a binary that crashed has no such
  # line but a non-zero exit.
  names=$(sed -nE 's/^test (.*) \.\.\. FAILED$/\1/p' "$log" | sort -u)
  if [ "$rc" != 0 ]; then
    failed_runs=$((failed_runs + 1))
    [ -n "$names" ] || names="(a test binary failed without naming a test: see $log)"
    while IFS= read -r n; do failures["$n"]+=" $run"; done <<<"$names"
    echo "soak: run $run of $RUNS failed after $((SECONDS - t0)) s (log kept: $log)"
  else
    echo "soak: run $run of $RUNS passed in $((SECONDS - t0)) s"
    rm -f "$log"
  fi
done
stop_busy
echo "soak: $RUNS runs, $failed_runs failed (under $BUSY busy loops)"
for n in "${!failures[@]}"; do
  echo "  $n: failed in run(s)${failures[$n]}"
done
[ "$failed_runs" = 0 ]
