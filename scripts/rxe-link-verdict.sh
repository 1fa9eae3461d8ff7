#!/usr/bin/env bash
# rxe-link-verdict.sh - a stalled link between two hosts is named as the pair, not as a rank.
#
#   scripts/rxe-link-verdict.sh [--no-build]   on the host: boots two SoftRoCE VMs, runs --guest
#   scripts/rxe-link-verdict.sh --guest        inside each VM of scripts/rxe-vm-pair.sh
#
# Four ranks over verbs, ranks 0 and 1 in VM B (B hosts the rendezvous), 2 and 3 in VM A, run
# 16 MiB ring allreduces with CCL_TIMEOUT=20. Once both of A's ranks are connected and moving,
# A puts a 60 s netem delay on the RoCE packets (UDP port 4791) it sends to B: every process
# stays healthy and the job's monitor (TCP, not delayed) keeps answering, but the bytes rank 3
# writes to rank 0 stop arriving. Every rank must then fail with the verdict "stuck on the link
# from rank X (...) to rank Y (...)" with X in one VM and Y in the other. (Two ranks per VM:
# with one each, a stalled link and a stalled peer leave the same trace.) Between the ranks of
# one VM rxe hands packets over past the netdev, so only the link between the VMs is delayed.
# Prints "PASSED: link verdict, rank R" per rank and ends with "rxe-link-verdict: N passed,
# M failed" (of the four ranks); exit 0 when all four passed.
# Env: CCL_RXE_VM_TIMEOUT (default 600) as for scripts/rxe-vm-pair.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
# Also how long the rendezvous waits for every rank: VMs under TCG start slowly.
TIMEOUT_S=20

guest() {
  : "${RXE_ROLE:?run inside scripts/rxe-vm-pair.sh}" "${RXE_NETDEV:?}"
  export CCL_WORLD_SIZE=4 CCL_COMM_ID=192.0.2.2:29558 CCL_SECRET=rxe-link-verdict \
         CCL_TRANSPORT=ib CCL_TIMEOUT=$TIMEOUT_S CCL_SOCKET_IFNAME="=$RXE_NETDEV" \
         CCL_ALGO=allreduce:ring CCL_DEBUG=info
  # One port: in a boot with a second NIC the transport would otherwise stripe over both and
  # route around the link this test stops (scripts/rxe-planes.sh tests that).
  export CCL_IB_HCA="=$RXE_DEV"
  local ranks pids=() r t=0
  # The rendezvous waits only CCL_TIMEOUT for every rank, and A boots later: B starts its
  # ranks (and the root) once A is about to start its own (the directory is shared).
  if [ "$RXE_ROLE" = b ]; then
    ranks="0 1"
    until [ -e target/rxe-link-verdict/a-ready ]; do
      sleep 0.2; t=$((t + 1))
      [ $t -lt 600 ] || { echo "FAILED: VM A never started its ranks"; return 1; }
    done
  else
    ranks="2 3"
    touch target/rxe-link-verdict/a-ready
  fi
  for r in $ranks; do
    CCL_RANK=$r timeout 300 target/release/ccl-bench allreduce -b 16M -e 16M -n 1000000 \
      -w 0 -c 0 > /dev/null 2> "$TMPDIR/rank$r.err" &
    pids+=($!)
  done
  if [ "$RXE_ROLE" = a ]; then
    t=0
    until [ "$(cat $TMPDIR/rank2.err $TMPDIR/rank3.err 2>/dev/null | grep -c 'communicator ready')" = 2 ]; do
      sleep 0.5; t=$((t + 1))
      [ $t -lt 240 ] || { echo "FAILED: the job did not connect"; kill "${pids[@]}"; return 1; }
    done
    sleep 3   # a few allreduces in: every rank is inside one, headers exchanged
    modprobe sch_netem && modprobe sch_prio && modprobe cls_u32 || return 1
    tc qdisc add dev "$RXE_NETDEV" root handle 1: prio &&
      tc qdisc add dev "$RXE_NETDEV" parent 1:3 handle 30: netem delay 60s &&
      tc filter add dev "$RXE_NETDEV" parent 1:0 protocol ip prio 1 u32 \
        match ip protocol 17 0xff match ip dport 4791 0xffff flowid 1:3 || return 1
    echo "netem: RoCE packets from A delayed 60 s from $(date +%s.%N)"
  fi
  local t0=$SECONDS
  wait "${pids[@]}"
  [ "$RXE_ROLE" = a ] && echo "A's ranks exited $((SECONDS - t0)) s after the delay began"
  local bad=0 line from to
  for r in $ranks; do
    line=$(grep -m1 '^ccl-bench:' "$TMPDIR/rank$r.err")
    echo "rank $r: $line"
    if [[ $line =~ verdict:\ .*\ is\ stuck\ on\ the\ link\ from\ rank\ ([0-9]+)\ \(.*\)\ to\ rank\ ([0-9]+)\ \( ]]; then
      from=${BASH_REMATCH[1]} to=${BASH_REMATCH[2]}
      if [ $((from / 2)) != $((to / 2)) ]; then
        echo "PASSED: link verdict, rank $r (the link from rank $from to rank $to)"
        continue
      fi
    fi
    echo "FAILED: link verdict, rank $r does not name a link between the VMs"
    grep -v "is not a ccl setting" "$TMPDIR/rank$r.err" | tail -5
    bad=1
  done
  return $bad
}

case "${1:-}" in
  --guest) guest; exit ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --no-build) ;;
  "") cargo build --release -q --workspace --bin ccl-bench || exit 1 ;;
  *) echo "rxe-link-verdict: unknown argument $1" >&2; exit 2 ;;
esac
mkdir -p target/rxe-link-verdict
rm -f target/rxe-link-verdict/a-ready
CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-600} scripts/rxe-vm-pair.sh \
  "scripts/rxe-link-verdict.sh --guest" "scripts/rxe-link-verdict.sh --guest" 2>&1 \
  | tee target/rxe-link-verdict/pair.log
pass=$(grep -c '^\[[AB]\] PASSED: link verdict' target/rxe-link-verdict/pair.log)
echo "rxe-link-verdict: $pass passed, $((4 - pass)) failed"
[ "$pass" = 4 ]
