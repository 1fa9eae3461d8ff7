#!/usr/bin/env bash
# rxe-vm.sh - run a command with a real SoftRoCE (rdma_rxe) device, in a VM.
#
#   scripts/rxe-vm.sh CMD [ARGS...]
#
# For hosts whose kernel has no rdma_rxe. Boots Debian's 6.1 kernel in qemu
# (TCG) through virtme-ng with this host's / shared read-only, creates rxe0
# (scripts/rxe-setup.sh, RoCE v2 GID index 1) and runs CMD in the current
# directory, which is shared read-write. Binaries built on the host run as
# they are. Runs scripts/rxe-vm-setup.sh first when something is missing.
# stdin is not read; the guest's stdout/stderr are ours. See docs/rxe.md.
#
# In the guest: RXE_DEV RXE_PORT RXE_GID_INDEX RXE_GID RXE_IP RXE_NETDEV,
# UCX_NET_DEVICES, UCX_UD_ETH_DGID_CHECK=n, TMPDIR on a tmpfs, ulimit -l
# unlimited. Forwarded from here: every CCL_*, RUST_*, CARGO_*, UCX_*, OMPI_*
# and FI_* variable, PATH HOME LANG LC_ALL USER LOGNAME TERM, and the names in
# CCL_RXE_VM_PASS_ENV.
#
# Exit status: CMD's; 124 timeout; 125 setup failure (host or guest);
# 255 the guest died without reporting a status.
#
# Env knobs:
#   CCL_RXE_VM_TIMEOUT    wall-clock limit in seconds, boot included (900)
#   CCL_RXE_VM_CPUS       vCPUs (2)            CCL_RXE_VM_MEM   guest RAM (2G)
#   CCL_RXE_VM_NET        dummy (rxe0 on a dummy netdev, 192.0.2.1) | lo
#   CCL_RXE_VM_MTU        netdev MTU (9000 -> active_mtu 4096; 1500 -> 1024)
#   CCL_RXE_VM_PASS_ENV   more variable names to forward (space separated)
#   CCL_RXE_VM_CWD_MODE   rw (default: the guest writes into this dir) | ro
#   CCL_RXE_VM_VERBOSE=1  show the guest's kernel console and boot
#   CCL_RXE_VM_QUIET=1    no closing "exit status, wall time" line
#   CCL_RXE_VM_QEMU_OPTS  extra qemu arguments (split on spaces)
#   CCL_RXE_VM_ACCEL      tcg (default) | kvm
#   CCL_RXE_VM_HOME       state dir (/opt/ccl-rxe-vm)
#   CCL_RXE_VM_AUTO_SETUP=0  fail (125) instead of running rxe-vm-setup.sh
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${CCL_RXE_VM_HOME:-/opt/ccl-rxe-vm}
TIMEOUT=${CCL_RXE_VM_TIMEOUT:-900}
CPUS=${CCL_RXE_VM_CPUS:-2}
MEM=${CCL_RXE_VM_MEM:-2G}
NET=${CCL_RXE_VM_NET:-dummy}
MTU=${CCL_RXE_VM_MTU:-9000}
ACCEL=${CCL_RXE_VM_ACCEL:-tcg}
CWD_MODE=${CCL_RXE_VM_CWD_MODE:-rw}

log() { echo "[ccl rxe-vm] $*" >&2; }
fail() { log "ERROR: $*"; exit 125; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; }

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  "") usage; exit 125 ;;
esac
if ! [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || [ "$TIMEOUT" -lt 10 ]; then
  fail "CCL_RXE_VM_TIMEOUT must be a number of seconds >= 10"
fi
case "$NET" in dummy|lo|nic) ;; *) fail "CCL_RXE_VM_NET must be dummy or lo" ;; esac
[[ "$MTU" =~ ^[0-9]+$ ]] || fail "CCL_RXE_VM_MTU must be a number"

# --- the host side: kernel, qemu, virtme-ng -----------------------------------
for tool in timeout mkfifo udevadm modprobe; do
  command -v "$tool" >/dev/null || { NEED_SETUP=1; break; }
done
if [ -n "${NEED_SETUP:-}" ] || ! "$HERE/rxe-vm-setup.sh" --check; then
  [ "${CCL_RXE_VM_AUTO_SETUP:-1}" = 1 ] || fail "host not prepared: run scripts/rxe-vm-setup.sh"
  log "preparing the host (scripts/rxe-vm-setup.sh)"
  "$HERE/rxe-vm-setup.sh" || fail "scripts/rxe-vm-setup.sh failed"
fi
KERNEL=$(compgen -G "$STATE/kernel/boot/vmlinuz-*" | sort -V | tail -1)
QEMU=$STATE/qemu/usr/bin/qemu-system-x86_64

# vng passes --rwdir to virtme-run through an unquoted shell string, and qemu's
# -fsdev path= cannot hold commas: refuse paths it would mangle.
path_ok() { [[ "$1" =~ ^[A-Za-z0-9._/+@:-]+$ ]]; }
for p in "$STATE" "$HERE"; do
  path_ok "$p" || fail "unsupported character (space, comma, ...) in path '$p'"
done

# --- the per-run script the guest executes (it sees this host's /) -----------
mkdir -p "$STATE/runs" || fail "cannot create $STATE/runs"
RUN=$(mktemp -d "$STATE/runs/run.XXXXXX") || fail "mktemp failed"
trap 'rm -rf "$RUN"' EXIT

# leave a margin for the boot and the shutdown
if [ "$TIMEOUT" -gt 180 ]; then GUEST_TIMEOUT=$((TIMEOUT - 90)); else GUEST_TIMEOUT=$((TIMEOUT * 2 / 3)); fi
{
  echo '#!/usr/bin/env bash'
  for v in PATH HOME LANG LC_ALL USER LOGNAME TERM ${CCL_RXE_VM_PASS_ENV:-} \
           $(compgen -e | grep -E '^(CCL|RUST|CARGO|UCX|OMPI|FI)_'); do
    [[ "$v" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
    [ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
  done
  printf 'export CCL_RXE_VM_NET=%q CCL_RXE_VM_MTU=%q CCL_RXE_VM_CMD_TIMEOUT=%q\n' "$NET" "$MTU" "$GUEST_TIMEOUT"
  printf 'cd %q || { echo "[ccl rxe-vm] ERROR: no directory %q in the guest" >&2; exit 125; }\n' "$PWD" "$PWD"
  printf 'exec %q' "$HERE/rxe-vm-guest.sh"
  printf ' %q' "$@"
  echo
} > "$RUN/guest.sh" || fail "cannot write $RUN/guest.sh"

VNG=(
  "$STATE/venv/bin/vng"
  --run "$KERNEL"
  --qemu "$QEMU"
  --name ccl-rxe-vm
  --cpus "$CPUS" --memory "$MEM"
  # qemu 7.2 unpacked outside /usr needs its own data dir and the firmware
  --qemu-opts "-L $STATE/qemu/usr/share/qemu -L /usr/share/seabios -L /usr/lib/ipxe/qemu ${CCL_RXE_VM_QEMU_OPTS:-}"
)
case "$ACCEL" in
  tcg) VNG+=(--disable-kvm) ;;
  kvm) ;;
  *) fail "CCL_RXE_VM_ACCEL must be tcg or kvm" ;;
esac
case "$CWD_MODE" in
  rw)
    path_ok "$PWD" || fail "the current directory '$PWD' has characters vng cannot pass (space, comma, ...); use CCL_RXE_VM_CWD_MODE=ro or another directory"
    [ "$PWD" != / ] && VNG+=(--rwdir "$PWD")
    ;;
  ro) ;;
  *) fail "CCL_RXE_VM_CWD_MODE must be rw or ro" ;;
esac
# $HOME (/root) is not one of virtme-ng's writable overlays: give it a
# throw-away one, so tools that write there (cargo, mpirun) work.
home=${HOME:-/root}
case "$home" in
  /home/*|/tmp/*) ;;
  *) [ -d "$home" ] && [ "$PWD" != "$home" ] && path_ok "$home" && VNG+=(--overlay-rwdir "$home") ;;
esac
[ "${CCL_RXE_VM_VERBOSE:-0}" = 1 ] && VNG+=(--verbose)
VNG+=(--exec "bash $RUN/guest.sh")

# qemu reopens /proc/self/fd/1 and /proc/self/fd/2 for the guest's streams: if
# those are regular files, each open has its own offset and the streams
# overwrite each other (`> log 2>&1`). Hand qemu FIFOs and copy them out.
mkfifo "$RUN/out" "$RUN/err" || fail "mkfifo failed"
cat "$RUN/out" &
CAT_OUT=$!
cat "$RUN/err" >&2 &
CAT_ERR=$!

T0=$(date +%s%N)
# timeout(1) puts vng -> virtme-run -> qemu in a process group of their own and
# signals all of it; -k escalates to SIGKILL. TMPDIR keeps virtme-run's
# temporary files in $RUN.
TMPDIR=$RUN PATH="$STATE/venv/bin:$PATH" \
  timeout -k 15 "$TIMEOUT" "${VNG[@]}" </dev/null >"$RUN/out" 2>"$RUN/err" &
PID=$!
trap 'log "interrupted: stopping the VM"; kill -TERM "$PID" 2>/dev/null' INT TERM HUP
while :; do
  wait "$PID"
  rc=$?
  kill -0 "$PID" 2>/dev/null || break   # wait was cut short by a trapped signal
done
trap - INT TERM HUP
# timeout(1) returns when vng does; wait for the rest of its process group
# (qemu) to be gone too, so no VM outlives this script.
for _ in $(seq 1 150); do
  kill -0 -- "-$PID" 2>/dev/null || break
  sleep 0.1
done
kill -KILL -- "-$PID" 2>/dev/null
wait "$CAT_OUT" "$CAT_ERR" 2>/dev/null   # they end when qemu has gone
ms=$((($(date +%s%N) - T0) / 1000000))
case "$rc" in
  124) log "timed out (CCL_RXE_VM_TIMEOUT=$TIMEOUT s; the command itself gets $GUEST_TIMEOUT s)" ;;
  255) log "the guest ended without reporting a status (kernel panic, qemu killed?); rerun with CCL_RXE_VM_VERBOSE=1" ;;
esac
[ "${CCL_RXE_VM_QUIET:-0}" = 1 ] || log "exit status $rc, wall $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
exit "$rc"
