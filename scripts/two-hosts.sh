#!/usr/bin/env bash
# Two "hosts" on one machine: 4 ranks, two in each of two UTS namespaces with different host
# names (so the library sees two hosts on one network). Checks that the job connects shared
# memory within each host and TCP across ("2 hosts x 2 ranks: shm within hosts, tcp across"),
# that each host's ranks share host memory, and that every collective it runs is correct:
# the default collectives as the cost model picks their algorithms, then the hierarchical
# allreduce on host memory (hiershm) forced and chosen, with odd counts, with both placements of
# ranks on hosts (0,1 | 2,3 and 0,2 | 1,3), in and out of place, sum and avg; finally a rank
# killed during hiershm allreduces must fail every survivor within the timeout, naming it.
# Needs root (unshare --uts); exits 77 (skipped) without it.
# Usage: scripts/two-hosts.sh [COLLECTIVE...] (default: allreduce broadcast allgather, then the
# hiershm cases; with collectives given, only those)
#        scripts/two-hosts.sh --bench [ROUNDS] [BENCH-ARGS...]: no checks; allreduce over the
# 2 x 2 ranks with each allreduce algorithm forced and with the automatic choice, ROUNDS
# (default 3) interleaved rounds, then `ccl-bench compare` (median out-of-place time per size;
# default sizes 8 B to 16 MiB, x8, -n 20 -w 5). Reports and table in target/two-hosts-bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! unshare --uts true 2>/dev/null; then
  echo "two-hosts: SKIPPED (unshare --uts needs root)" >&2
  exit 77
fi
cargo build --release -q --workspace --bin ccl-bench
bench=0
if [ "${1:-}" = --bench ]; then
  bench=1; shift; rounds=${1:-3}; [ $# -gt 0 ] && shift
  bargs=("$@"); [ ${#bargs[@]} -gt 0 ] || bargs=(-b 8 -e 16M -f 8 -n 20 -w 5)
  set --
fi
colls=("$@"); hier=1
if [ ${#colls[@]} -gt 0 ]; then hier=0; else colls=(allreduce broadcast allgather); fi
out=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$out"' EXIT
# A port the kernel has just found free, for each run: counting up from one collided once with
# a port the ranks of an earlier run had been given for their own connections.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start NAME PLACEMENT TIMEOUT BENCH-ARGS...: starts the 4 ranks in the background (pids in
# $pids), rank r on host0 or host1 as PLACEMENT says (block: r/2, cyclic: r%2).
start() {
  local name=$1 placement=$2 timeout=$3; shift 3
  local port
  port=$(free_port)
  pids=()
  for r in 0 1 2 3; do
    if [ "$placement" = block ]; then host=host$((r / 2)); else host=host$((r % 2)); fi
    CCL_RANK=$r CCL_WORLD_SIZE=4 CCL_COMM_ID=127.0.0.1:$port CCL_SOCKET_IFNAME==lo \
      CCL_DEBUG=info CCL_TIMEOUT=$timeout \
      unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" \
      ./target/release/ccl-bench "$@" > "$out/$name.$r.out" 2> "$out/$name.$r.err" &
    pids+=($!)
  done
}

# run NAME PLACEMENT BENCH-ARGS...: runs the 4 ranks to the end and checks the connections and
# the results.
run() {
  local name=$1 placement=$2; shift 2
  start "$name" "$placement" 60 "$@"
  local fail=0
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  pids=()
  if [ "$fail" = 1 ]; then
    tail -n 5 "$out/$name".*.err >&2
    echo "two-hosts: $name failed" >&2
    exit 1
  fi
  grep -h "communicator ready" "$out/$name".*.err | grep -q "2 hosts x 2 ranks: shm within hosts, tcp across" || {
    grep -h "communicator ready" "$out/$name".*.err >&2
    echo "two-hosts: $name did not connect shm within hosts and tcp across" >&2
    exit 1
  }
  # Every rank shares a segment with the other rank of its host.
  local shared
  shared=$(grep -l "host memory: 2 ranks of this host share a segment .*, as do every host's" "$out/$name".*.err | wc -l)
  [ "$shared" = 4 ] || {
    grep -h "host memory" "$out/$name".*.err >&2
    echo "two-hosts: $name: $shared of 4 ranks share host memory with their host" >&2
    exit 1
  }
  # Rank 0 reports the wrong elements of every rank (the benchmark sums them).
  grep -q "Out of bounds values : 0 OK" "$out/$name.0.out" || {
    cat "$out/$name.0.out" >&2
    echo "two-hosts: $name gave wrong results" >&2
    exit 1
  }
}

if [ "$bench" = 1 ]; then
  dir=target/two-hosts-bench; rm -rf "$dir"; mkdir -p "$dir"
  for round in $(seq "$rounds"); do
    for algo in ring rd tree hd hier hiershm auto; do
      a=(--algo "$algo"); [ "$algo" = auto ] && a=()
      run "bench-$algo" block allreduce "${a[@]}" "${bargs[@]}" -c 0 --json "$dir/$algo.$round.json"
    done
    echo "two-hosts: bench round $round of $rounds done" >&2
  done
  ./target/release/ccl-bench compare "$dir"/*.json | tee "$dir/table.md"
  exit 0
fi

for coll in "${colls[@]}"; do
  run "$coll" block "$coll" -b 8 -e 4M -f 8 -n 3 -w 1 -c 1
  echo "two-hosts: $coll over 2 hosts x 2 ranks (shm within, tcp across): correct"
done
[ "$hier" = 1 ] || exit 0

# Odd counts from 1 to 1953125 floats (4 B x 5^k): leader-based and every rank on the network,
# one chunk and many (2 MiB slots hold 262144 floats per half).
odd=(-b 4 -e 8M -f 5 -n 2 -w 1 -c 1)
for placement in block cyclic; do
  run "hiershm-$placement" "$placement" allreduce --algo hiershm "${odd[@]}"
  run "hiershm-$placement-avg" "$placement" allreduce --algo hiershm -o avg -d int32 "${odd[@]}"
  echo "two-hosts: allreduce hiershm forced, $placement placement, sum and avg, odd counts: correct"
done

# Chosen by the cost model: the choice table must name hiershm for some sizes.
run hiershm-auto block allreduce "${odd[@]}"
grep -h "allreduce algorithms:" "$out"/hiershm-auto.*.err | grep -q hiershm || {
  grep -h "allreduce algorithms:" "$out"/hiershm-auto.*.err >&2
  echo "two-hosts: the cost model never chooses hiershm for 2 hosts x 2 ranks" >&2
  exit 1
}
echo "two-hosts: allreduce as chosen ($(grep -h "allreduce algorithms:" "$out"/hiershm-auto.0.err | sed 's/.*algorithms: *//')): correct"

# A rank killed (SIGKILL) during hiershm allreduces: every survivor fails within the timeout,
# naming it, whether it waits in host memory or on the network.
timeout_s=20
for victim in 3 1; do
  start "kill-$victim" block $timeout_s allreduce --algo hiershm -b 16M -e 16M -n 100000 -w 0 -c 0
  sleep 3
  kill -9 "${pids[$victim]}"
  killed=$(date +%s)
  { wait "${pids[$victim]}"; } 2>/dev/null || true
  for r in 0 1 2 3; do
    [ "$r" = "$victim" ] && continue
    if wait "${pids[$r]}"; then
      echo "two-hosts: rank $r succeeded after rank $victim was killed" >&2
      exit 1
    fi
    took=$(( $(date +%s) - killed ))
    [ "$took" -le $((timeout_s + 10)) ] || {
      echo "two-hosts: rank $r took ${took}s to fail after rank $victim was killed" >&2
      exit 1
    }
    line=$(grep "^ccl-bench:" "$out/kill-$victim.$r.err" || true)
    echo "$line" | grep -Eq "peer $victim|rank $victim died" || {
      tail -n 5 "$out/kill-$victim.$r.err" >&2
      echo "two-hosts: rank $r does not name killed rank $victim" >&2
      exit 1
    }
  done
  pids=()
  echo "two-hosts: rank $victim killed during hiershm allreduces: every survivor failed naming it, e.g. $line"
done
