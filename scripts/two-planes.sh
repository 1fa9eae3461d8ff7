#!/usr/bin/env bash
# Two "hosts" joined by two network planes, and what a plane's failure costs a running job.
#
# Two network namespaces, one rank in each (TCP), joined by two veth pairs: plane 0 (p0,
# 10.77.1.0/24; the rendezvous goes over it too) and plane 1 (p1, 10.77.2.0/24), each limited by
# tc (tbf, RATE each way) so that the link, not the CPU, is the limit. The ranks run
# examples/src/bin/allreduce_loop.rs (an allreduce of BYTES in a loop, every result checked,
# every iteration's time printed) while the script:
#   one    one plane only (CCL_SOCKET_IFNAME==p0): the baseline
#   two    both planes, healthy
#   auto   both planes found without CCL_SOCKET_IFNAME (the rendezvous's interface and its
#          sibling of the same speed, paired by network): must run over two planes
#   cut    plane 1 taken down (ip link set down) for CUT seconds mid-loop, then back
#   drop   plane 0 (the rendezvous plane) dropping every packet (nft) for CUT seconds
#   half   plane 1 throttled to half its rate mid-loop
#   flaps  plane 1 cut and restored FLAPS times in a row (down 1 s, up 1 s)
#   reset  plane 1's sockets destroyed in A (ss -K: an error at both ends, not a silent cut)
#          RESETS times, 2 s apart: each time the plane's socket is made again
# and reports, from the iteration times and the logs: two planes against one, how long a cut
# caused, busbw while a plane was out against one plane's, how long after a plane returned
# its share came back, the half-rate time against healthy. Fails when any rank fails or any
# result is wrong; the figures are measurements, reported, not pass/fail.
#
# Needs root (ip netns, tc, nft; nftables is installed if missing); exits 77 (skipped) without.
# Usage: scripts/two-planes.sh [--quick]   (--quick: 16 MiB, short phases, 5 flaps: for CI)
# Settings: RATE (800mbit), BYTES (64M), CUT (4 s), FLAPS (100), RESETS (10), PHASES (the cases
# to run, default all: "one two auto cut drop half flaps reset"). Report: target/two-planes/.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if [ "$(id -u)" != 0 ] || ! ip netns list >/dev/null 2>&1; then
  echo "two-planes: SKIPPED (needs root for ip netns)" >&2
  exit 77
fi
quick=0
[ "${1:-}" = --quick ] && quick=1
RATE=${RATE:-800mbit}
if [ $quick = 1 ]; then
  BYTES=${BYTES:-16M}; CUT=${CUT:-2}; FLAPS=${FLAPS:-5}; ITERS=${ITERS:-6}; PHASE=${PHASE:-2}
  RESETS=${RESETS:-3}
else
  BYTES=${BYTES:-64M}; CUT=${CUT:-4}; FLAPS=${FLAPS:-100}; ITERS=${ITERS:-12}; PHASE=${PHASE:-4}
  RESETS=${RESETS:-10}
fi
if ! command -v nft >/dev/null; then
  (apt-get install -y -q nftables || { apt-get update -q && apt-get install -y -q nftables; }) >/dev/null
fi
cargo build --release -q --workspace --bin allreduce_loop
out=target/two-planes
mkdir -p "$out"
rm -f "$out"/*.out "$out"/*.err "$out"/*.events
A=ccl2pA B=ccl2pB
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  ip netns del $A 2>/dev/null || true
  ip netns del $B 2>/dev/null || true
  # A run stopped between creating a pair and moving it leaves it in this namespace.
  ip link del ccl2pa0 2>/dev/null || true
  ip link del ccl2pa1 2>/dev/null || true
}
trap cleanup EXIT
cleanup

half_rate() { python3 -c "import re,sys; m=re.match(r'(\d+)(\w*)', '$RATE'); print(f'{int(m[1])//2}{m[2]}')"; }
shape() { # shape PLANE RATE: both ends of a plane
  for ns in $A $B; do
    tc -n $ns qdisc replace dev "p$1" root tbf rate "$2" burst 256kb latency 50ms
  done
}
ip netns add $A
ip netns add $B
for k in 0 1; do
  ip link add ccl2pa$k type veth peer name ccl2pb$k
  ip link set ccl2pa$k netns $A name p$k
  ip link set ccl2pb$k netns $B name p$k
  ip -n $A addr add 10.77.$((k + 1)).1/24 dev p$k
  ip -n $B addr add 10.77.$((k + 1)).2/24 dev p$k
  ip -n $A link set p$k up
  ip -n $B link set p$k up
  shape $k "$RATE"
done
ip -n $A link set lo up
ip -n $B link set lo up
for ns in $A $B; do
  ip netns exec $ns nft add table inet ccl
  ip netns exec $ns nft add chain inet ccl in '{ type filter hook input priority 0; }'
  ip netns exec $ns nft add chain inet ccl out '{ type filter hook output priority 0; }'
done

now() { date +%s.%N; }
port=29700
# start NAME IFSPEC LOOP-ENV...: rank 0 in A, rank 1 in B, in the background.
start() {
  local name=$1 spec=$2; shift 2
  port=$((port + 1))
  pids=()
  local r ns
  for r in 0 1; do
    if [ $r = 0 ]; then ns=$A; else ns=$B; fi
    ip netns exec $ns env CCL_RANK=$r CCL_WORLD_SIZE=2 CCL_COMM_ID=10.77.1.1:$port \
      ${spec:+CCL_SOCKET_IFNAME=$spec} CCL_TRANSPORT=tcp CCL_TIMEOUT=120 LOOP_BYTES="$BYTES" "$@" \
      ./target/release/allreduce_loop > "$out/$name.$r.out" 2> "$out/$name.$r.err" &
    pids+=($!)
  done
}
finish() {
  local name=$1 fail=0 p
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  pids=()
  if [ $fail = 1 ] || ! grep -q "wrong 0 " "$out/$name.0.out"; then
    tail -n 5 "$out/$name".*.err "$out/$name.0.out" >&2
    echo "two-planes: $name FAILED (a rank failed or a result was wrong)" >&2
    exit 1
  fi
}
event() { echo "$(now) $*" >> "$out/$1.events"; }
# wait_iters NAME N: until rank 0 printed N iterations (the loop is under way).
wait_iters() {
  local i=0
  local n
  while n=$(grep -c '^iter' "$out/$1.0.out" 2>/dev/null); [ "${n:-0}" -lt "$2" ]; do
    sleep 0.1; i=$((i + 1))
    [ $i -lt 1200 ] || { echo "two-planes: $1 never started" >&2; exit 1; }
  done
}

PHASES=${PHASES:-one two auto cut drop half flaps reset}
want() { [[ " $PHASES " == *" $1 "* ]]; }
echo "two-planes: $BYTES allreduce, 2 ranks, planes of $RATE each way ($(lscpu | sed -n 's/^Model name: *//p'))"
want one && { start one "=p0" LOOP_ITERS=$ITERS; finish one; }
want two && { start two p LOOP_ITERS=$ITERS; finish two; }
want auto && { start auto "" LOOP_ITERS=$ITERS CCL_DEBUG=info; finish auto; }
want auto && for r in 0 1; do
  if ! grep -q "over 2 planes" "$out/auto.$r.err"; then
    grep -i "planes\|tcp" "$out/auto.$r.err" | tail -n 5 >&2
    echo "two-planes: auto FAILED: rank $r did not find both planes without CCL_SOCKET_IFNAME" >&2
    exit 1
  fi
done

secs=$(python3 -c "print(3 * $PHASE + $CUT)")
if want cut; then
  start cut p LOOP_SECONDS="$secs"
  wait_iters cut 2; sleep "$PHASE"
  event cut down; ip -n $A link set p1 down
  sleep "$CUT"
  event cut up; ip -n $A link set p1 up
  finish cut
fi

if want drop; then
  start drop p LOOP_SECONDS="$secs"
  wait_iters drop 2; sleep "$PHASE"
  event drop down
  ip netns exec $A nft add rule inet ccl in iifname p0 drop
  ip netns exec $A nft add rule inet ccl out oifname p0 drop
  sleep "$CUT"
  event drop up; ip netns exec $A nft flush chain inet ccl in; ip netns exec $A nft flush chain inet ccl out
  finish drop
fi

if want half; then
  start half p LOOP_SECONDS="$(python3 -c "print(3 * $PHASE)")"
  wait_iters half 2; sleep "$PHASE"
  event half half; shape 1 "$(half_rate)"
  finish half
fi
shape 1 "$RATE"

if want flaps; then
  start flaps p LOOP_SECONDS="$(python3 -c "print($FLAPS * 2 + 2 * $PHASE)")"
  wait_iters flaps 2
  for i in $(seq "$FLAPS"); do
    event flaps down; ip -n $A link set p1 down; sleep 1
    event flaps up; ip -n $A link set p1 up; sleep 1
  done
  finish flaps
fi

if want reset; then
  start reset p LOOP_SECONDS="$(python3 -c "print($RESETS * 2 + 2 * $PHASE)")"
  wait_iters reset 2; sleep "$PHASE"
  killed=0
  for i in $(seq "$RESETS"); do
    event reset reset
    # ss -K lists what it destroyed; a kernel without CONFIG_INET_DIAG_DESTROY destroys nothing.
    k=$(ip netns exec $A ss -K -t -H dst 10.77.2.2 | wc -l)
    killed=$((killed + k)); sleep 2
  done
  finish reset
fi

python3 - "$out" "$BYTES" "$RATE" "$CUT" "$FLAPS" <<'EOF' | tee "$out/report.md"
import statistics as st, sys, glob, os, re
out, size, rate, cut, flaps = sys.argv[1:]
ran = lambda name: os.path.exists(f"{out}/{name}.0.out")
def iters(name):
    rows = []
    for line in open(f"{out}/{name}.0.out"):
        f = line.split()
        if f[0] == "iter":
            end, ms, bw = float(f[3]), float(f[5]), float(f[7])
            rows.append((end - ms / 1e3, end, ms, bw))
    return rows
def events(name):
    p = f"{out}/{name}.events"
    return [(float(l.split()[0]), l.split()[2]) for l in open(p)] if os.path.exists(p) else []
med = lambda xs: st.median(xs) if xs else float("nan")
nan = float("nan")
one = med([r[3] for r in iters("one")]) if ran("one") else nan
one_ms = med([r[2] for r in iters("one")]) if ran("one") else nan
two = med([r[3] for r in iters("two")]) if ran("two") else nan
two_ms = med([r[2] for r in iters("two")]) if ran("two") else nan
print(f"| measure | value |\n|---|---|")
if ran("one"):
    print(f"| one plane, busbw (GB/s) | {one:.3f} |")
if ran("two"):
    print(f"| two planes, busbw (GB/s) | {two:.3f} ({two / one:.2f}x one plane) |")
if ran("auto"):
    auto = med([r[3] for r in iters("auto")])
    print(f"| two planes found without a setting, busbw (GB/s) | {auto:.3f} ({auto / one:.2f}x one plane) |")
for name, what in (("cut", "plane 1 link down"), ("drop", "plane 0 (rendezvous plane) dropping all")):
    if not ran(name):
        continue
    rows, ev = iters(name), events(name)
    t_down = next(t for t, e in ev if e == "down"); t_up = next(t for t, e in ev if e == "up")
    # How long the plane's bytes went unread before it was declared down (each rank's log).
    found = [int(m[1]) for f in glob.glob(f"{out}/{name}.*.err")
             for m in re.finditer(r"is down: \d+ bytes unread for (\d+) ms", open(f).read())]
    # The iterations under way when the plane went out or started in the next 2 s.
    hit = [r for r in rows if r[1] >= t_down and r[0] <= t_down + 2]
    longest = max(r[2] for r in hit) if hit else 0.0
    during = [r[3] for r in rows if r[0] >= t_down + 1.5 and r[1] <= t_up]
    healthy = 0.9 * med([r[3] for r in rows if r[1] < t_down])
    back = next((r[1] - t_up for r in rows if r[0] >= t_up and r[3] >= healthy), nan)
    print(f"| {what} {cut} s: bytes unread until the plane was declared down (s) | "
          f"{max(found) / 1e3 if found else nan:.2f} |")
    print(f"| {what}: longest iteration in the 2 s after (ms) | {longest:.0f} "
          f"(healthy {two_ms:.0f}, one plane {one_ms:.0f}) |")
    print(f"| {what}: busbw while out (GB/s) | {med(during):.3f} ({med(during) / one:.2f}x one plane) |")
    print(f"| {what}: back to 0.9x of before, after the plane returned (s) | {back:.2f} |")
if ran("half"):
    rows, ev = iters("half"), events("half")
    t_half = ev[0][0]
    before = med([r[2] for r in rows if r[1] < t_half]); after = med([r[2] for r in rows if r[0] > t_half + 1])
    print(f"| plane 1 at half rate: iteration time (ms) | {after:.0f} ({after / before:.2f}x healthy, {before:.0f}) |")
if ran("flaps"):
    rows = iters("flaps")
    n_down = sum(1 for _, e in events("flaps") if e == "down")
    print(f"| {n_down} cuts of plane 1 in a row: iterations, all right | {len(rows)} |")
    print(f"| ... longest iteration (ms) | {max(r[2] for r in rows):.0f} |")
if ran("reset"):
    rows = iters("reset")
    n_reset = sum(1 for _, e in events("reset") if e == "reset")
    made = sum(open(f).read().count("is made again") for f in glob.glob(f"{out}/reset.*.err"))
    print(f"| {n_reset} resets of plane 1's sockets: made again (both ranks' count) | {made} |")
    print(f"| ... iterations, all right; longest (ms) | {len(rows)}; {max(r[2] for r in rows):.0f} |")
EOF
for n in cut drop flaps reset; do
  want $n || continue
  echo "$n: planes declared down $(cat "$out/$n".*.err | grep -c 'is down' || true), failed $(cat "$out/$n".*.err | grep -c 'failed (' || true), back $(cat "$out/$n".*.err | grep -c 'delivers again' || true), made again $(cat "$out/$n".*.err | grep -c 'is made again' || true)"
done
# Every reset must have been followed by the plane's socket made again at both ranks.
made=$(cat "$out"/reset.*.err 2>/dev/null | grep -c 'is made again' || true)
if want reset && [ "$killed" = 0 ]; then
  echo "two-planes: reset SKIPPED: ss -K destroyed no socket (kernel without CONFIG_INET_DIAG_DESTROY?)" >&2
elif want reset && [ "$made" -lt $((2 * RESETS)) ]; then
  echo "two-planes: reset FAILED: plane 1 made again $made times over both ranks, $((2 * RESETS)) expected" >&2
  exit 1
fi
echo "two-planes: every result right, no rank failed (report in $out/report.md)"
