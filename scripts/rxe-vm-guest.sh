#!/usr/bin/env bash
# rxe-vm-guest.sh - runs INSIDE the VM that scripts/rxe-vm.sh boots (as root):
# prepares the network device, brings rxe0 up with scripts/rxe-setup.sh (the
# same script a host with rdma_rxe uses), then runs the command.
#
#   rxe-vm-guest.sh CMD [ARGS...]
#
# Env (set by rxe-vm.sh / rxe-vm-pair.sh):
#   CCL_RXE_VM_NET   dummy: rxe0 on a dummy netdev "rxenet0" with 192.0.2.1/24
#                    lo:    rxe0 on the loopback device (127.0.0.1)
#                    nic:   rxe0 on the virtio NIC whose MAC starts with
#                           52:54:00:12:34, address CCL_RXE_VM_IP (pair mode)
#   CCL_RXE_VM_MTU   MTU of the dummy/virtio netdev (9000 -> rxe active_mtu 4096)
#   CCL_RXE_VM_IP, CCL_RXE_VM_PEER_IP, CCL_RXE_VM_ROLE   pair mode
#   CCL_RXE_VM_PLANES=2   a second plane: rxe1 on a second netdev (dummy: "rxenet1" with
#                    192.0.3.1/24; nic: the virtio NIC whose MAC starts with 52:54:00:12:35,
#                    address CCL_RXE_VM_IP2)
#   CCL_RXE_VM_CMD_TIMEOUT   seconds after which the command is killed (124)
# Exports for the command: RXE_DEV RXE_PORT RXE_GID_INDEX RXE_GID RXE_IP
#   RXE_NETDEV (and RXE_PEER_IP RXE_ROLE in pair mode; RXE_DEV2 RXE_NETDEV2 RXE_IP2
#   (RXE_PEER_IP2) with a second plane); UCX_NET_DEVICES and
#   UCX_UD_ETH_DGID_CHECK=n (UCX's UD drops everything on rxe without it);
#   OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1; TMPDIR on a guest-only tmpfs.
# Exit status: the command's; 125 if the VM or rxe0 could not be set up.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "[ccl rxe-vm] $*" >&2; }
die() { log "ERROR: $*"; exit 125; }

NET=${CCL_RXE_VM_NET:-dummy}
MTU=${CCL_RXE_VM_MTU:-9000}
[ $# -gt 0 ] || die "no command given"

# Verbs register (pin) memory: lift the locked-memory limit.
ulimit -l unlimited 2>/dev/null || log "warning: cannot raise the locked-memory limit"
# The cwd (and the host's /tmp when the cwd is below it) is shared over 9p,
# and qemu's 9p refuses sockets and FIFOs ("attempt to open special file").
# Give temporary files a guest-local tmpfs.
if mkdir -p /run/ccl-rxe-vm/tmp && mount -t tmpfs -o mode=1777 ccl-rxe-tmp /run/ccl-rxe-vm/tmp; then
  export TMPDIR=/run/ccl-rxe-vm/tmp
else
  log "warning: no guest tmpfs for TMPDIR"
fi

# find_nic PREFIX: the netdev whose MAC starts with PREFIX (the NICs may take a moment to appear)
find_nic() {
  for _ in $(seq 1 50); do
    for n in /sys/class/net/*; do
      case "$(cat "$n/address" 2>/dev/null)" in
        "$1":*) echo "${n##*/}"; return 0 ;;
      esac
    done
    sleep 0.1
  done
  return 1
}
# up NETDEV ADDR/PREFIX: MTU, address, up
up() {
  ip link set "$1" mtu "$MTU" || die "cannot set mtu $MTU on $1"
  ip addr add "$2" dev "$1" || die "cannot add $2 to $1"
  ip link set "$1" up || die "cannot bring $1 up"
}

ip link set lo up || die "cannot bring lo up"
case "$NET" in
  dummy)
    NETDEV=rxenet0
    ip link add "$NETDEV" type dummy || die "ip link add $NETDEV type dummy failed"
    up "$NETDEV" 192.0.2.1/24
    ;;
  lo)
    NETDEV=lo
    ;;
  nic)
    ip4=${CCL_RXE_VM_IP:?CCL_RXE_VM_IP is needed with CCL_RXE_VM_NET=nic}
    modprobe virtio_net 2>/dev/null
    NETDEV=$(find_nic 52:54:00:12:34) || die "no virtio NIC with MAC 52:54:00:12:34:xx"
    up "$NETDEV" "$ip4/24"
    ;;
  *) die "CCL_RXE_VM_NET must be dummy, lo or nic (got '$NET')" ;;
esac

env_line=$("$HERE/rxe-setup.sh" "$NETDEV") || die "rxe-setup.sh failed (see above)"
eval "$env_line"
[ -n "${RXE_GID_INDEX:-}" ] || die "rxe-setup.sh reported no GID"
if [ "${CCL_RXE_VM_PLANES:-1}" = 2 ]; then
  case "$NET" in
    dummy)
      NETDEV2=rxenet1
      ip link add "$NETDEV2" type dummy || die "ip link add $NETDEV2 type dummy failed"
      up "$NETDEV2" 192.0.3.1/24
      ;;
    nic)
      NETDEV2=$(find_nic 52:54:00:12:35) || die "no second virtio NIC (MAC 52:54:00:12:35:xx)"
      up "$NETDEV2" "${CCL_RXE_VM_IP2:?CCL_RXE_VM_IP2 is needed for a second plane}/24"
      export RXE_PEER_IP2=${CCL_RXE_VM_PEER_IP2:-}
      ;;
    *) die "a second plane needs CCL_RXE_VM_NET=dummy or nic" ;;
  esac
  line2=$("$HERE/rxe-setup.sh" -d rxe1 "$NETDEV2") || die "rxe-setup.sh for rxe1 failed (see above)"
  # Only the second device's names: RXE_* stay the first's.
  export RXE_DEV2=rxe1 RXE_NETDEV2=$NETDEV2
  RXE_IP2=$(sed -n 's/.*RXE_IP=\([^ ]*\).*/\1/p' <<<"$line2")
  export RXE_IP2
fi
if [ "$NET" = nic ]; then
  export RXE_PEER_IP=${CCL_RXE_VM_PEER_IP:-} RXE_ROLE=${CCL_RXE_VM_ROLE:-}
fi
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-$RXE_DEV:$RXE_PORT}
export UCX_UD_ETH_DGID_CHECK=${UCX_UD_ETH_DGID_CHECK:-n}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log "SoftRoCE up after $(cut -d' ' -f1 /proc/uptime) s of guest uptime: $(nproc) vCPU, $(awk '/MemTotal/ { print int($2 / 1024) " MiB" }' /proc/meminfo), kernel $(uname -r)"

if [ -n "${CCL_RXE_VM_CMD_TIMEOUT:-}" ]; then
  timeout -k 5 "$CCL_RXE_VM_CMD_TIMEOUT" "$@"
  rc=$?
  [ "$rc" = 124 ] && log "the command timed out in the guest after ${CCL_RXE_VM_CMD_TIMEOUT}s"
  exit "$rc"
fi
exec "$@"
