#!/usr/bin/env bash
# rxe-planes.sh - verbs over two ports (two planes): one link cut under a running allreduce loop.
#
#   scripts/rxe-planes.sh [--no-build]   on the host: boots two SoftRoCE VMs with two links each
#   scripts/rxe-planes.sh --guest        inside each VM of CCL_RXE_VM_PLANES=2 scripts/rxe-vm-pair.sh
#   scripts/rxe-planes.sh --check LOG    on the host: the verdict from such a pair's output
#                                        (scripts/rxe-tests.sh runs --guest in a boot of its own)
#
# Each VM has two NICs wired to the other VM's (plane 0: 192.0.2.x, rxe0; plane 1: 192.0.3.x,
# rxe1). One rank per VM (rank 0 in B, which hosts the rendezvous) runs
# examples/src/bin/allreduce_loop.rs (LOOP_BYTES, default 4M, every result checked) over verbs
# without CCL_IB_HCA: the transport must find both ports itself (two NICs of one speed), open a
# verbs connection on each and stripe across them (PLANES_HCA=1 names them in CCL_IB_HCA
# instead). Once the job is moving, VM A sets its plane-1 NIC down for CUT_S
# seconds (default 6) and up again. Passes when both ranks exit 0 with no wrong result, the
# loop completed iterations while the link was down, at least one rank logged plane 1 down or
# failed (the cut hit a plane in use), and every rank that did saw it come back once the link
# returned: made again (new queue pairs over the plane's side channel, when its queue pairs had
# failed) or delivering again (they outlasted the cut); A prints how long after. Each VM prints "PASSED: planes, rank R" or "FAILED:
# planes, rank R" and rank 0 the iterations around the cut; the host ends with "rxe-planes:
# passed" or "rxe-planes: FAILED".
# Env: LOOP_BYTES, LOOP_SECONDS (default 40), CUT_AT_S (seconds of loop before the cut,
# default 8), CUT_S; CCL_RXE_VM_TIMEOUT (default 600) as for scripts/rxe-vm-pair.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=target/rxe-planes
# What a rank logs of plane 1: going away, and coming back either way.
GONE='verbs plane 1 .*(is down|failed)'
MADE='verbs plane 1 .* is made again'
RESUMED='verbs plane 1 .* delivers again'
BACK="$MADE|$RESUMED"

guest() {
  : "${RXE_ROLE:?run inside scripts/rxe-vm-pair.sh}" "${RXE_DEV2:?run with CCL_RXE_VM_PLANES=2}"
  export CCL_WORLD_SIZE=2 CCL_COMM_ID=192.0.2.2:29561 CCL_SECRET=rxe-planes CCL_TRANSPORT=ib \
         CCL_SOCKET_IFNAME="=$RXE_NETDEV" CCL_TIMEOUT=60 \
         CCL_DEBUG=info LOOP_BYTES=${LOOP_BYTES:-4M} LOOP_SECONDS=${LOOP_SECONDS:-40}
  if [ "${PLANES_HCA:-0}" = 1 ]; then export CCL_IB_HCA="$RXE_DEV,$RXE_DEV2"; else unset CCL_IB_HCA; fi
  local rank=1 t=0
  # A boots later: B starts its rank (and the rendezvous) once A is about to start its own.
  if [ "$RXE_ROLE" = b ]; then
    rank=0
    until [ -e "$DIR/a-ready" ]; do
      sleep 0.2; t=$((t + 1))
      [ $t -lt 600 ] || { echo "FAILED: planes (VM A never started its rank)"; return 1; }
    done
  else
    touch "$DIR/a-ready"
  fi
  # Each log line with its time, so the failover and the redial can be placed against the cut.
  CCL_RANK=$rank timeout 300 target/release/allreduce_loop > "$TMPDIR/out" \
    2> >(while IFS= read -r l; do echo "$EPOCHREALTIME $l"; done > "$TMPDIR/err") &
  local pid=$! cut=
  if [ "$RXE_ROLE" = a ]; then
    t=0
    until grep -q '^iter' "$TMPDIR/out" 2>/dev/null || grep -q 'communicator ready' "$TMPDIR/err" 2>/dev/null; do
      sleep 0.5; t=$((t + 1))
      [ $t -lt 240 ] || { echo "FAILED: planes (the job did not connect)"; kill $pid; return 1; }
    done
    sleep "${CUT_AT_S:-8}"
    cut=$(date +%s.%N)
    ip link set dev "$RXE_NETDEV2" down || return 1
    echo "plane 1 ($RXE_NETDEV2, $RXE_DEV2) down at $cut"
    echo "$cut" > "$DIR/cut"
    sleep "${CUT_S:-6}"
    ip link set dev "$RXE_NETDEV2" up || return 1
    local up=$(date +%s.%N)
    echo "plane 1 up again at $up"
    t=0
    # Back either way: made again (its queue pairs had failed) or delivering again (they
    # outlasted the cut). A rank that never saw the cut has nothing to wait for.
    until grep -qE "$BACK" "$TMPDIR/err" || ! grep -qE "$GONE" "$TMPDIR/err"; do
      sleep 0.1; t=$((t + 1))
      [ $t -lt 600 ] || break
    done
    local back
    back=$(grep -m1 -E "$BACK" "$TMPDIR/err" | cut -d' ' -f1)
    [ -n "$back" ] && echo "plane 1 back $(python3 -c "print(f'{$back - $up:.1f}')") s after the link returned"
  fi
  wait $pid
  local rc=$?
  sleep 0.5   # the time-stamping reader writes the last lines
  local bad=0
  echo "rank $rank exit $rc"
  grep -E 'planes|plane [0-9].* (is down|failed|delivers again|made again)|ERROR|error' "$TMPDIR/err" \
    | grep -v "is not a ccl setting" | head -20
  if [ "$rc" != 0 ]; then
    bad=1
    echo "rank $rank's last words:"; grep -v "is not a ccl setting" "$TMPDIR/err" | tail -8
  fi
  if ! grep -q 'verbs transport: 2 planes' "$TMPDIR/err"; then
    echo "rank $rank did not take both ports as planes"; bad=1
  fi
  local downs
  downs=$(grep -cE "$GONE" "$TMPDIR/err")
  echo "rank $rank: plane 1 declared down or failed $downs time(s), made again $(grep -cE "$MADE" "$TMPDIR/err"), delivering again $(grep -cE "$RESUMED" "$TMPDIR/err")"
  if [ "$downs" -gt 0 ] && ! grep -qE "$BACK" "$TMPDIR/err"; then
    echo "plane 1 did not come back"; bad=1
  fi
  if [ "$rank" = 0 ]; then
    t=0
    until [ -e "$DIR/cut" ]; do sleep 0.2; t=$((t + 1)); [ $t -lt 100 ] || break; done
    cut=$(cat "$DIR/cut" 2>/dev/null || echo 0)
    grep '^summary' "$TMPDIR/out"
    grep -q '^summary .* wrong 0 ' "$TMPDIR/out" || { echo "wrong results or no summary"; bad=1; }
    # Iterations that ended while the link was down, and the longest around the cut.
    python3 - "$TMPDIR/out" "$cut" "${CUT_S:-6}" <<'PY' || bad=1
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("iter")]
cut, cut_s = float(sys.argv[2]), float(sys.argv[3])
it = [(float(r[3]), float(r[5])) for r in rows]  # (end, ms)
before = sorted(ms for end, ms in it if end < cut)
during = [ms for end, ms in it if cut < end <= cut + cut_s]
after = [ms for end, ms in it if end > cut + cut_s]
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
print(f"iterations: {len(before)} before the cut (median {med(before):.0f} ms), "
      f"{len(during)} ended while plane 1 was down (longest {max(during, default=0):.0f} ms), "
      f"{len(after)} after (median {med(after):.0f} ms)")
sys.exit(0 if during else 1)
PY
  fi
  if [ $bad = 0 ]; then echo "PASSED: planes, rank $rank"; else echo "FAILED: planes, rank $rank"; fi
  return $bad
}

# check LOG: both ranks passed, and at least one saw plane 1 go (the other may only have found
# it failed later, or not at all if the cut came between its uses of the plane).
check() {
  local log=$1 pass downs
  pass=$(grep -c '^\[[AB]\] PASSED: planes, rank' "$log")
  downs=$(sed -nE 's/^\[[AB]\] rank [01]: plane 1 declared down or failed ([0-9]+) time.*/\1/p' "$log" \
    | awk '{ s += $1 } END { print s + 0 }')
  if [ "$pass" = 2 ] && [ "$downs" -ge 1 ]; then
    echo "rxe-planes: passed (plane 1 declared down or failed $downs time(s) in all)"
    return 0
  fi
  echo "rxe-planes: FAILED ($pass of 2 ranks passed; plane 1 declared down or failed $downs time(s))"
  return 1
}

case "${1:-}" in
  --guest) guest; exit ;;
  --check) check "${2:?--check LOG}"; exit ;;
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
  --no-build) ;;
  "") cargo build --release -q --workspace --bin allreduce_loop || exit 1 ;;
  *) echo "rxe-planes: unknown argument $1" >&2; exit 2 ;;
esac
mkdir -p "$DIR"
rm -f "$DIR"/a-ready "$DIR"/cut
CCL_RXE_VM_PLANES=2 CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-600} scripts/rxe-vm-pair.sh \
  "scripts/rxe-planes.sh --guest" "scripts/rxe-planes.sh --guest" 2>&1 | tee "$DIR/pair.log"
check "$DIR/pair.log"
