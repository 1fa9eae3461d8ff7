#!/usr/bin/env bash
# rxe-entropy.sh - the UDP source ports of a connection's QPs, captured on the wire.
#
#   scripts/rxe-entropy.sh [--no-build]      on the host: boots two SoftRoCE VMs and runs --guest
#   scripts/rxe-entropy.sh --guest           inside each VM of scripts/rxe-vm-pair.sh
#
# Two VMs joined by a virtual link (scripts/rxe-vm-pair.sh), one rank in each, run a checked
# 2-rank allreduce over rxe (ccl-bench, 64 KiB to 4 MiB) three times: CCL_IB_QPS_PER_CONN=1,
# =4 (pieces round-robin), =4 with CCL_IB_SPLIT_DATA_ON_QPS=1. VM A captures UDP port 4791 on
# its NIC with tcpdump during each run, and scripts/roce-flows.py counts the distinct source
# ports per connection and QP pair, matching them against the ports ccl's log announces. A run
# fails unless the N data QPs of the connection use N distinct source ports, both ways, each
# exactly the announced one. (Inside one VM rxe hands packets between its own QPs straight to
# its receive path, past the netdev: only a link between two VMs carries packets to capture.)
#
# The reports, captures (64-byte snaps) and logs are left in target/rxe-entropy/.
# Needs tcpdump on the host (scripts/rxe-vm-setup.sh installs it; the VMs share the host's
# root). Ends with "rxe-entropy: N passed, M failed" (the three runs); exit 0 if all passed.
# Env: CCL_RXE_VM_TIMEOUT (default 600) as for scripts/rxe-vm-pair.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=target/rxe-entropy
CASES=("1 0" "4 0" "4 1")   # data QPs per connection, split across QPs

guest() {
  : "${RXE_ROLE:?run inside scripts/rxe-vm-pair.sh}" "${RXE_NETDEV:?}"
  mkdir -p "$OUT"
  export CCL_WORLD_SIZE=2 CCL_SECRET=rxe-entropy CCL_TRANSPORT=ib CCL_TIMEOUT=120 \
         CCL_SOCKET_IFNAME="=$RXE_NETDEV" CCL_DEBUG=trace CCL_DEBUG_SUBSYS=net
  # Rank 0, the rendezvous root, in B; A's rank retries until B listens.
  if [ "$RXE_ROLE" = b ]; then export CCL_RANK=0; else export CCL_RANK=1; fi
  local pass=0 fail=0 i=0
  for c in "${CASES[@]}"; do
    set -- $c
    local qps=$1 split=$2 name="qps$1-split$2" tp=""
    local log=$TMPDIR/$name.log pcap=$TMPDIR/$name.pcap
    echo "== $name: CCL_IB_QPS_PER_CONN=$qps CCL_IB_SPLIT_DATA_ON_QPS=$split"
    if [ "$RXE_ROLE" = a ]; then
      tcpdump -i "$RXE_NETDEV" -Z root -U -s 64 -w "$pcap" udp dst port 4791 2> "$TMPDIR/tcpdump.err" &
      tp=$!
      for _ in $(seq 100); do grep -q "listening on" "$TMPDIR/tcpdump.err" && break; sleep 0.1; done
      grep -q "listening on" "$TMPDIR/tcpdump.err" || { cat "$TMPDIR/tcpdump.err"; echo "FAILED: tcpdump did not start"; kill "$tp"; return 1; }
    fi
    CCL_IB_QPS_PER_CONN=$qps CCL_IB_SPLIT_DATA_ON_QPS=$split CCL_COMM_ID=192.0.2.2:$((29570 + i)) \
      CCL_DEBUG_FILE="$log" timeout 300 target/release/ccl-bench allreduce -b 64K -e 4M -f 4 -n 2 -w 1 -c 1 \
      > "$TMPDIR/$name.out" 2>&1
    local rc=$?
    grep -v "is not a ccl setting" "$TMPDIR/$name.out" | grep -E "^ +[0-9]+ |ERROR|error|Out of bounds"
    if [ "$CCL_RANK" = 0 ] && ! grep -q "Out of bounds values : 0 OK" "$TMPDIR/$name.out"; then rc=1; fi
    if [ "$RXE_ROLE" = a ]; then
      sleep 1   # the peer's last acknowledgements
      kill -INT "$tp"; wait "$tp"
      tail -n 2 "$TMPDIR/tcpdump.err"
      cp "$pcap" "$log" "$OUT/" 2>/dev/null
      if [ $rc = 0 ]; then
        python3 scripts/roce-flows.py --local-ip "$RXE_IP" --expect-data-qps "$qps" "$pcap" "$log" | tee "$OUT/$name.txt"
        rc=${PIPESTATUS[0]}
      fi
    fi
    if [ $rc = 0 ]; then
      echo "PASSED: $name"; pass=$((pass + 1))
    else
      echo "FAILED: $name (exit $rc)"; fail=$((fail + 1))
    fi
    i=$((i + 1))
  done
  echo "rxe-entropy ($RXE_ROLE): $pass passed, $fail failed"
  [ $fail = 0 ]
}

case "${1:-}" in
  --guest) guest; exit ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --no-build|"") ;;
  *) echo "rxe-entropy: unknown argument $1" >&2; exit 2 ;;
esac
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ "${1:-}" != --no-build ]; then
  cargo build --release -q --workspace --bin ccl-bench || exit 1
fi
command -v tcpdump >/dev/null || { echo "rxe-entropy: tcpdump missing: run scripts/rxe-vm-setup.sh" >&2; exit 125; }
mkdir -p "$OUT"
rm -f "$OUT"/*
CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-600} scripts/rxe-vm-pair.sh \
  "scripts/rxe-entropy.sh --guest" "scripts/rxe-entropy.sh --guest" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
# A's count: it captured and checked; B's runs only have to succeed.
p=$(grep -c '^\[A\] PASSED: ' "$OUT/run.log") f=$(grep -c '^\[[AB]\] FAILED: ' "$OUT/run.log")
[ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
echo "rxe-entropy: $p passed, $f failed"
[ "$rc" = 0 ] && [ "$f" = 0 ]
