#!/usr/bin/env bash
# rxe-vm-pair.sh - two SoftRoCE VMs ("two hosts") joined by a link.
#
#   scripts/rxe-vm-pair.sh 'SHELL_CMD_A' 'SHELL_CMD_B'
#
# Boots two VMs through scripts/rxe-vm.sh at the same time. Each has a
# virtio-net NIC; the two NICs are wired to each other through a pair of unix
# datagram sockets on this host (no IP traffic on the host). rxe0 sits on that
# NIC: VM A is 192.0.2.1, VM B is 192.0.2.2. Each VM runs its command with
# `bash -c` in the current directory, with RXE_PEER_IP (the other VM's address)
# and RXE_ROLE=a|b exported besides everything scripts/rxe-vm.sh exports.
# Output lines are prefixed with [A] / [B].
#
# The two boots end at slightly different times: run servers in B and let A's
# clients retry until B listens (scripts/rxe-perftest.sh does).
#
# Exit status: A's if non-zero, else B's (124 / 125 / 255 as for rxe-vm.sh).
# When one VM fails, the other is stopped.
# With CCL_RXE_VM_PLANES=2 each VM has a second NIC wired the same way (a second plane):
# rxe1 on it, VM A 192.0.3.1, VM B 192.0.3.2 (RXE_DEV2, RXE_NETDEV2, RXE_IP2, RXE_PEER_IP2).
# Env: as for scripts/rxe-vm.sh; CCL_RXE_VM_TIMEOUT applies to each VM, and
# CCL_RXE_VM_CPUS / CCL_RXE_VM_MEM default to 1 / 1G here.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${CCL_RXE_VM_HOME:-/opt/ccl-rxe-vm}
log() { echo "[ccl rxe-vm-pair] $*" >&2; }

case "${1:-}" in
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 0 ;;
esac
if [ $# -ne 2 ]; then
  log "usage: scripts/rxe-vm-pair.sh 'SHELL_CMD_A' 'SHELL_CMD_B'"
  exit 125
fi

# Prepare the host once here, not in both VM launches at the same time.
if ! "$HERE/rxe-vm-setup.sh" --check; then
  [ "${CCL_RXE_VM_AUTO_SETUP:-1}" = 1 ] || { log "host not prepared: run scripts/rxe-vm-setup.sh"; exit 125; }
  "$HERE/rxe-vm-setup.sh" || { log "scripts/rxe-vm-setup.sh failed"; exit 125; }
fi

mkdir -p "$STATE/runs" || exit 125
S=$(mktemp -d "$STATE/runs/pair.XXXXXX") || exit 125
trap 'rm -rf "$S"' EXIT

# nic SELF PEER MAC_SUFFIX [PLANE]: qemu options for a virtio NIC whose "cable" is a
# unix datagram socket bound at SELF and sending to PEER (plane 1: the second NIC). Each NIC
# reports a link speed, as a real port does (virtio reports none unless told), so that the
# verbs transport finds two NICs of one speed as two planes without CCL_IB_HCA.
nic() {
  local p=${4:-0}
  echo "-netdev dgram,id=ccl$p,local.type=unix,local.path=$S/$1$p.sock,remote.type=unix,remote.path=$S/$2$p.sock" \
       "-device virtio-net-pci,netdev=ccl$p,mac=52:54:00:12:3$((4 + p)):$3,speed=10000,duplex=full"
}
PLANES=${CCL_RXE_VM_PLANES:-1}
case "$PLANES" in 1|2) ;; *) log "CCL_RXE_VM_PLANES must be 1 or 2"; exit 125 ;; esac
# every NIC of a VM, on one line (qemu's options go through a shell)
nics() {
  local o
  o=$(nic "$@")
  [ "$PLANES" = 2 ] && o="$o $(nic "$@" 1)"
  echo $o
}
export CCL_RXE_VM_CPUS=${CCL_RXE_VM_CPUS:-1} CCL_RXE_VM_MEM=${CCL_RXE_VM_MEM:-1G}
export CCL_RXE_VM_NET=nic CCL_RXE_VM_AUTO_SETUP=0 CCL_RXE_VM_QUIET=1
extra=${CCL_RXE_VM_QEMU_OPTS:-}

T0=$SECONDS
CCL_RXE_VM_ROLE=a CCL_RXE_VM_IP=192.0.2.1 CCL_RXE_VM_PEER_IP=192.0.2.2 \
  CCL_RXE_VM_IP2=192.0.3.1 CCL_RXE_VM_PEER_IP2=192.0.3.2 \
  CCL_RXE_VM_QEMU_OPTS="$(nics a b 01) $extra" \
  "$HERE/rxe-vm.sh" bash -c "$1" </dev/null > >(sed -u 's/^/[A] /') 2>&1 &
PA=$!
CCL_RXE_VM_ROLE=b CCL_RXE_VM_IP=192.0.2.2 CCL_RXE_VM_PEER_IP=192.0.2.1 \
  CCL_RXE_VM_IP2=192.0.3.2 CCL_RXE_VM_PEER_IP2=192.0.3.1 \
  CCL_RXE_VM_QEMU_OPTS="$(nics b a 02) $extra" \
  "$HERE/rxe-vm.sh" bash -c "$2" </dev/null > >(sed -u 's/^/[B] /') 2>&1 &
PB=$!
trap 'log "interrupted: stopping both VMs"; kill -TERM "$PA" "$PB" 2>/dev/null' INT TERM HUP

rcA='' rcB=''
while [ -z "$rcA" ] || [ -z "$rcB" ]; do
  wait -n "$PA" "$PB" 2>/dev/null
  if [ -z "$rcA" ] && ! kill -0 "$PA" 2>/dev/null; then
    wait "$PA"; rcA=$?
    [ "$rcA" != 0 ] && [ -z "$rcB" ] && kill -TERM "$PB" 2>/dev/null
  fi
  if [ -z "$rcB" ] && ! kill -0 "$PB" 2>/dev/null; then
    wait "$PB"; rcB=$?
    [ "$rcB" != 0 ] && [ -z "$rcA" ] && kill -TERM "$PA" 2>/dev/null
  fi
done
trap - INT TERM HUP
sleep 0.2   # let the [A]/[B] prefixers flush
log "A exit $rcA, B exit $rcB, wall $((SECONDS - T0)) s"
[ "$rcA" != 0 ] && exit "$rcA"
exit "$rcB"
