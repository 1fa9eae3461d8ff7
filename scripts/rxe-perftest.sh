#!/usr/bin/env bash
# rxe-perftest.sh - perftest baseline on a SoftRoCE device: server and client
# of one perftest tool, for each message size.
#
#   scripts/rxe-vm.sh scripts/rxe-perftest.sh [-t TOOL] [-n ITERS] [-b] [SIZE...]
#   scripts/rxe-vm-pair.sh 'scripts/rxe-perftest.sh' 'scripts/rxe-perftest.sh'
#
#   -t TOOL   ib_write_bw (default), ib_read_bw, ib_send_bw, ib_write_lat, ...
#   -n ITERS  iterations (default 1000 below 64 KiB, 200 from 64 KiB on)
#   -b        bidirectional (perftest's -b: both sides send at once; the *_bw tools then
#             report the sum of both directions)
#   SIZE      message sizes in bytes (default 65536 1048576)
#
# Needs RXE_DEV and RXE_GID_INDEX (set by scripts/rxe-vm.sh, or
# `eval "$(scripts/rxe-setup.sh)"` on a host with rdma_rxe).
# One machine: server pinned to CPU 0, client to CPU 1, over RXE_IP. perftest
# times with rdtsc and the TSCs of emulated vCPUs are not in sync, so an
# unpinned process that migrates can report 0.00 MB/s.
# Two VMs (RXE_ROLE=a|b and RXE_PEER_IP set by rxe-vm-pair.sh): B runs the
# servers, A the clients, retrying until B listens.
# Prints perftest's header and result line per size, then "N passed, M failed".
set -uo pipefail

TOOL=ib_write_bw
ITERS=
BIDIR=()
while getopts ":t:n:bh" opt; do
  case "$opt" in
    t) TOOL=$OPTARG ;;
    n) ITERS=$OPTARG ;;
    b) BIDIR=(-b) ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
       [ "$opt" = h ]; exit $? ;;
  esac
done
shift $((OPTIND - 1))
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(65536 1048576)

DEV=${RXE_DEV:?RXE_DEV is not set: run under scripts/rxe-vm.sh or eval "\$(scripts/rxe-setup.sh)"}
GIDX=${RXE_GID_INDEX:?RXE_GID_INDEX is not set}
ROLE=${RXE_ROLE:-}
command -v "$TOOL" >/dev/null || { echo "rxe-perftest: $TOOL not found (Debian: perftest)" >&2; exit 1; }
if [ -n "$ROLE" ]; then
  PEER=${RXE_PEER_IP:?RXE_PEER_IP is not set}
else
  PEER=${RXE_IP:-127.0.0.1}
fi
PIN_S=() PIN_C=()
if [ -z "$ROLE" ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  PIN_S=(taskset -c 0)
  PIN_C=(taskset -c 1)
fi
W=$(mktemp -d "${TMPDIR:-/tmp}/rxe-perftest.XXXXXX") || exit 1
trap 'rm -rf "$W"' EXIT

# client ARGS...: run the client, retrying while the server is not listening yet
# (and, on one machine, while the server process is still alive).
client() {
  local rc=1
  for _ in $(seq 1 60); do
    timeout 120 "${PIN_C[@]}" "$TOOL" "$@" "$PEER" >"$W/cli" 2>&1
    rc=$?
    [ "$rc" = 0 ] && break
    grep -qiE "couldn't connect|unable to (open|init) .*socket" "$W/cli" || break
    [ -n "${SERVER_PID:-}" ] && ! kill -0 "$SERVER_PID" 2>/dev/null && break
    sleep 0.5
  done
  return "$rc"
}

pass=0 fail=0 port=18600 header=
for s in "${SIZES[@]}"; do
  n=${ITERS:-1000}
  [ -z "$ITERS" ] && [ "$s" -ge 65536 ] && n=200
  port=$((port + 1))
  args=(-d "$DEV" -x "$GIDX" -s "$s" -n "$n" -F -p "$port" "${BIDIR[@]}")
  t0=$(date +%s%N)
  case "$ROLE" in
    b)
      if timeout 180 "$TOOL" "${args[@]}" >"$W/srv" 2>&1; then
        pass=$((pass + 1))
      else
        fail=$((fail + 1)); echo "FAIL server $TOOL $s B:"; tail -5 "$W/srv"
      fi
      continue
      ;;
    a) SERVER_PID=''; client "${args[@]}"; crc=$?; src=0 ;;
    *)
      timeout 150 "${PIN_S[@]}" "$TOOL" "${args[@]}" >"$W/srv" 2>&1 &
      SERVER_PID=$!
      sleep 0.5
      client "${args[@]}"; crc=$?
      [ "$crc" = 0 ] || kill "$SERVER_PID" 2>/dev/null
      wait "$SERVER_PID"; src=$?
      ;;
  esac
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ "$crc" = 0 ] && [ "$src" = 0 ]; then
    pass=$((pass + 1))
    [ -n "$header" ] || { header=1; grep -m1 '#bytes' "$W/cli"; }
    echo "$(awk -v s="$s" '$1 == s { print; exit }' "$W/cli")   (${ms} ms wall)"
  else
    fail=$((fail + 1))
    echo "FAIL $TOOL $s B (client $crc, server $src):"
    tail -5 "$W/cli"
    [ -f "$W/srv" ] && tail -5 "$W/srv"
  fi
done
echo "rxe-perftest: $pass passed, $fail failed"
[ "$fail" = 0 ]
