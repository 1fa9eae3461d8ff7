#!/usr/bin/env bash
# rxe-setup.sh - create a SoftRoCE (rdma_rxe) device on a Linux host whose
# kernel has rdma_rxe, or report the one that is already there.
#
#   scripts/rxe-setup.sh [-d RDMA_DEV] [-t SECONDS] [NETDEV]
#
#   NETDEV      network device to put rxe on. Default: the first interface that
#               is up, is not loopback and has an IPv4 address; else `lo`.
#   -d NAME     RDMA device name (default rxe0)
#   -t SECONDS  how long to wait for PORT_ACTIVE and the GID (default 10)
#
# Steps: modprobe rdma_rxe; `rdma link add NAME type rxe netdev NETDEV`; wait
# until port 1 is ACTIVE and has an IPv4 RoCE v2 GID. If NAME already exists
# nothing is changed (no root needed then): it is only reported.
#
# stdout: one `export ...` line, so `eval "$(scripts/rxe-setup.sh)"` exports
#   RXE_DEV RXE_PORT RXE_GID_INDEX RXE_GID RXE_IP RXE_NETDEV
# stderr: a one-line summary.
# Exit status: 0 ok; 1 failure; 2 usage; 3 this kernel cannot load rdma_rxe
# (run under scripts/rxe-vm.sh instead, which boots a kernel that can).
#
# scripts/rxe-vm.sh runs this same script inside its guest to bring rxe0 up.
set -uo pipefail

DEV=rxe0
WAIT=10
NETDEV=

log() { echo "[ccl rxe-setup] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; }

while getopts ":d:t:h" opt; do
  case "$opt" in
    d) DEV=$OPTARG ;;
    t) WAIT=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -le 1 ] || { usage; exit 2; }
NETDEV=${1:-}
[[ "$WAIT" =~ ^[0-9]+$ ]] || { log "-t needs a whole number of seconds"; exit 2; }

[ "$(uname -s)" = Linux ] || die "SoftRoCE needs Linux"
SYS=/sys/class/infiniband/$DEV
PORT=$SYS/ports/1

# gid_to_ipv4 GID: print the IPv4 address of an IPv4-mapped GID as sysfs shows
# it (0000:0000:0000:0000:0000:ffff:c000:0201 -> 192.0.2.1), or fail.
gid_to_ipv4() {
  local hi lo
  case "$1" in
    0000:0000:0000:0000:0000:ffff:????:????) ;;
    *) return 1 ;;
  esac
  hi=${1:30:4}
  lo=${1:35:4}
  echo "$((16#${hi:0:2})).$((16#${hi:2:2})).$((16#${lo:0:2})).$((16#${lo:2:2}))"
}

# find_gid: set GID_INDEX and GID to the first IPv4 RoCE v2 entry of port 1.
# The table has up to 1024 slots; look at the first 16 only (the rest are
# empty on rxe, and reading them all is slow in an emulated guest).
find_gid() {
  local i g t
  for i in $(seq 0 15); do
    g=$(cat "$PORT/gids/$i" 2>/dev/null) || continue
    # gid_attrs/types/N gives EINVAL for empty slots
    t=$(cat "$PORT/gid_attrs/types/$i" 2>/dev/null) || continue
    if [ "$t" = "RoCE v2" ] && gid_to_ipv4 "$g" >/dev/null; then
      GID_INDEX=$i
      GID=$g
      return 0
    fi
  done
  return 1
}

port_active() { grep -q ACTIVE "$PORT/state" 2>/dev/null; }

# netdev_of_dev: the netdev the existing RDMA device sits on
netdev_of_dev() {
  local n
  if command -v rdma >/dev/null; then
    n=$(rdma link show "$DEV/1" 2>/dev/null | sed -n 's/.* netdev \([^ ]*\).*/\1/p')
    [ -n "$n" ] && { echo "$n"; return; }
  fi
  cat "$PORT/gid_attrs/ndevs/0" 2>/dev/null
}

report() {
  local ip
  ip=$(gid_to_ipv4 "$GID")
  printf 'export RXE_DEV=%q RXE_PORT=1 RXE_GID_INDEX=%q RXE_GID=%q RXE_IP=%q RXE_NETDEV=%q\n' \
    "$DEV" "$GID_INDEX" "$GID" "$ip" "$NETDEV"
  log "$1 $DEV: port 1 $(sed 's/^[0-9]*: *//' "$PORT/state"), netdev $NETDEV (mtu $(cat "/sys/class/net/$NETDEV/mtu" 2>/dev/null || echo '?')), RoCE v2 GID index $GID_INDEX = $GID ($ip)"
}

wait_ready() {
  local deadline=$((SECONDS + WAIT))
  while :; do
    port_active && find_gid && return 0
    [ "$SECONDS" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}

# --- an existing device: only report it ----------------------------------------
if [ -e "$SYS" ]; then
  existing=$(netdev_of_dev)
  if [ -n "$NETDEV" ] && [ -n "$existing" ] && [ "$NETDEV" != "$existing" ]; then
    log "warning: $DEV already exists on netdev $existing (not $NETDEV); leaving it as it is"
  fi
  NETDEV=$existing
  if ! wait_ready; then
    die "$DEV exists but port 1 is not ACTIVE with an IPv4 RoCE v2 GID (state: $(cat "$PORT/state" 2>/dev/null || echo none); does netdev '$NETDEV' have an IPv4 address and is it up?)"
  fi
  report "existing"
  exit 0
fi

# --- create it ------------------------------------------------------------------
no_rxe() {
  log "ERROR: kernel $(uname -r) cannot load rdma_rxe${1:+: $1}"
  log "This kernel has no SoftRoCE (CONFIG_RDMA_RXE). Run the command in a VM that has it:"
  log "  scripts/rxe-vm.sh CMD [ARGS...]   (see docs/rxe.md)"
  exit 3
}
if [ ! -d /sys/module/rdma_rxe ]; then
  command -v modprobe >/dev/null || die "modprobe not found (Debian: apt-get install kmod)"
  # modinfo also knows built-in modules, and needs no root
  err=$(modinfo rdma_rxe 2>&1 >/dev/null) || no_rxe "$err"
  [ "$(id -u)" = 0 ] || die "rdma_rxe is not loaded and loading it needs root"
  err=$(modprobe rdma_rxe 2>&1) || no_rxe "$err"
fi
[ "$(id -u)" = 0 ] || die "creating $DEV needs root"
command -v rdma >/dev/null || die "the 'rdma' tool is missing (Debian: apt-get install iproute2)"
command -v ip >/dev/null || die "the 'ip' tool is missing (Debian: apt-get install iproute2)"

if [ -z "$NETDEV" ]; then
  # first interface that is up, not loopback, with an IPv4 address; else lo
  NETDEV=$(ip -o -4 addr show up scope global 2>/dev/null | awk '$2 != "lo" { print $2; exit }')
  NETDEV=${NETDEV:-lo}
fi
[ -e "/sys/class/net/$NETDEV" ] || die "no network device '$NETDEV'"
if [ "$NETDEV" = lo ]; then
  ip link set lo up || die "cannot bring lo up"
fi
ip -o -4 addr show dev "$NETDEV" | grep -q inet ||
  die "netdev $NETDEV has no IPv4 address: rxe takes its RoCE v2 GIDs from the netdev's addresses"

rdma link add "$DEV" type rxe netdev "$NETDEV" || die "rdma link add $DEV type rxe netdev $NETDEV failed"
if ! wait_ready; then
  die "$DEV on $NETDEV: no ACTIVE port 1 with an IPv4 RoCE v2 GID after ${WAIT}s (state: $(cat "$PORT/state" 2>/dev/null || echo none)); is $NETDEV up?"
fi
report "created"
