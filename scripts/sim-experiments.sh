#!/usr/bin/env bash
# The experiments of docs/scale.md: each writes its table to OUT/NAME.txt, its runs to
# OUT/NAME.json and its plot to OUT/NAME.svg (OUT defaults to docs/img/scale). Pass names to
# run some: qps qps-scattered hashing crossover slow. Minutes on an idle 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench
OUT=${OUT:-docs/img/scale}
mkdir -p "$OUT"
B=target/release/ccl-bench
F=scripts/sim/zone.fabric
want() { [ -z "$NAMES" ] || [[ " ${NAMES} " == *" $1 "* ]]; }
NAMES="$*"
run() { # NAME ARGS...: the table, JSON and plot of one sweep
    local name=$1; shift
    echo "== $name: ccl-bench sim $*"
    $B sim --fabric "${FAB:-$F}" "$@" --json "$OUT/$name.json" --plot "$OUT/$name.svg" | tee "$OUT/$name.txt"
}
sweep_qps="-b 256M -e 256M --racks 8,32,128 --oversub 1,2 --qps 1,2,4,8,16 --seeds 1,2,3 --x qps"
if want qps; then
    run qps-ring --algo ring $sweep_qps \
        --title "ring allreduce 256 MiB vs QPs per connection: racks known to the library, ECMP"
    # The 16K-rank tree takes the library minutes to build: 1K and 4K here.
    run qps-tree --algo tree ${sweep_qps/8,32,128/8,32} \
        --title "tree allreduce 256 MiB vs QPs per connection: racks known to the library, ECMP"
fi
if want qps-scattered; then
    run qps-scattered-ring --algo ring --placement scattered $sweep_qps \
        --title "ring allreduce 256 MiB vs QPs per connection: hosts scattered over racks, ECMP"
    # Scattered hosts make the tree's flows cross racks: many more rate recomputations; 1K.
    run qps-scattered-tree --algo tree --placement scattered ${sweep_qps/8,32,128/8} \
        --title "tree allreduce 256 MiB vs QPs per connection: hosts scattered over racks, ECMP"
fi
if want hashing; then
    run hashing --algo ring --placement scattered -b 256M -e 256M --racks 32 --oversub 2 \
        --qps 1,4,16 --hashing ecmp,dqp,spray --seeds 1,2,3 --x qps \
        --title "ring, 4K ranks scattered, 2:1: ECMP (a port per QP), enhanced ECMP, spray"
    run hashing-one-port --algo ring --placement scattered --ports per-conn -b 256M -e 256M \
        --racks 32 --oversub 2 --qps 1,4,16 --hashing ecmp --seeds 1,2,3 --x qps \
        --title "ring, 4K ranks scattered, 2:1: one UDP port per connection"
fi
if want crossover; then
    # On a fabric the cost model can describe (its fixed reduction rate, 100G NICs).
    FAB=scripts/sim/cpu.fabric run crossover-128 --algo all -b 8 -e 256M -f 8 --racks 1 \
        --y time --title "allreduce, 128 ranks: every algorithm"
fi
if want slow; then
    run slow --algo ring,tree -b 1M -e 256M -f 4 --racks 8 --slow-host 37:0.5 --x size \
        --title "one host's NIC at half rate (1K ranks)"
    run slow-base --algo ring,tree -b 1M -e 256M -f 4 --racks 8 --x size \
        --title "all NICs at full rate (1K ranks)"
fi
