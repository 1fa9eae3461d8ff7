#!/usr/bin/env bash
# The algorithm crossover table of docs/algorithms.md: one ccl-bench sweep per allreduce
# algorithm and one with the automatic choice, then `ccl-bench compare` over them.
#   scripts/crossover.sh [COLLECTIVE] [NP]        (default: allreduce 4)
# Env: TRANSPORT (tcp), MIN (8), MAX (64M), ITERS (20), WARMUP (5), REPEAT (3),
#      OUT (target/crossover).
# The sweeps are interleaved REPEAT times (ring, rd, ..., auto, ring, rd, ...) so a burst of
# load elsewhere hits every algorithm alike; the table shows each one's median per size.
set -euo pipefail
cd "$(dirname "$0")/.."
COLL=${1:-allreduce}
NP=${2:-4}
OUT=${OUT:-target/crossover}/$COLL-$NP
case $COLL in
  allreduce) ALGOS="ring rd tree hd hier" ;;
  broadcast|reduce) ALGOS="ring tree" ;;
  allgather|reducescatter) ALGOS="ring pairwise" ;;
  *) echo "crossover.sh: no algorithm choice for $COLL" >&2; exit 2 ;;
esac
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench
mkdir -p "$OUT"
run() { # name, extra args...
  local name=$1; shift
  echo "== $COLL --np $NP $name" >&2
  ./target/release/ccl-bench "$COLL" --np "$NP" --transport "${TRANSPORT:-tcp}" \
    -b "${MIN:-8}" -e "${MAX:-64M}" -f 2 -n "${ITERS:-20}" -w "${WARMUP:-5}" -c 0 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.txt"
}
files=()
for r in $(seq "${REPEAT:-3}"); do
  for a in $ALGOS; do
    run "$a.$r" --algo "$a"
    files+=("$OUT/$a.$r.json")
  done
  run "auto.$r"
  files+=("$OUT/auto.$r.json")
done
./target/release/ccl-bench plot "$OUT/busbw.svg" "$OUT"/*.1.json
./target/release/ccl-bench compare "${files[@]}" | tee "$OUT/table.md"
echo "(reports, table and busbw.svg in $OUT)" >&2
