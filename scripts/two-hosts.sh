#!/usr/bin/env bash
# Two "hosts" on one machine: 4 ranks, two in each of two UTS namespaces with different host
# names (so the library sees two hosts on one network). Checks that the job connects shared
# memory within each host and TCP across ("2 hosts x 2 ranks: shm within hosts, tcp across")
# and that every collective it runs is correct. Needs root (unshare --uts); exits 77 (skipped)
# without it.
# Usage: scripts/two-hosts.sh [COLLECTIVE...] (default: allreduce broadcast allgather)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if ! unshare --uts true 2>/dev/null; then
  echo "two-hosts: SKIPPED (unshare --uts needs root)" >&2
  exit 77
fi
cargo build --release -q -p ccl-bench
colls=("$@"); [ ${#colls[@]} -gt 0 ] || colls=(allreduce broadcast allgather)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for coll in "${colls[@]}"; do
  pids=()
  for r in 0 1 2 3; do
    host=host$((r / 2))
    CCL_RANK=$r CCL_WORLD_SIZE=4 CCL_COMM_ID=127.0.0.1:$((port)) CCL_SOCKET_IFNAME==lo \
      CCL_DEBUG=info CCL_TIMEOUT=60 \
      unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" \
      ./target/release/ccl-bench "$coll" -b 8 -e 4M -f 8 -n 3 -w 1 -c 1 \
      > "$out/$coll.$r.out" 2> "$out/$coll.$r.err" &
    pids+=($!)
  done
  fail=0
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  if [ "$fail" = 1 ]; then
    tail -n 5 "$out/$coll".*.err >&2
    echo "two-hosts: $coll failed" >&2
    exit 1
  fi
  grep -h "communicator ready" "$out/$coll".*.err | grep -q "2 hosts x 2 ranks: shm within hosts, tcp across" || {
    grep -h "communicator ready" "$out/$coll".*.err >&2
    echo "two-hosts: $coll did not connect shm within hosts and tcp across" >&2
    exit 1
  }
  grep -q "Out of bounds values : 0 OK" "$out/$coll.0.out" || {
    cat "$out/$coll.0.out" >&2
    echo "two-hosts: $coll gave wrong results" >&2
    exit 1
  }
  echo "two-hosts: $coll over 2 hosts x 2 ranks (shm within, tcp across): correct"
  port=$((port + 1))
done
