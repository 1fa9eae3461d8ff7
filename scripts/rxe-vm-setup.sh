#!/usr/bin/env bash
# rxe-vm-setup.sh - prepare this host for scripts/rxe-vm.sh (idempotent).
#
#   scripts/rxe-vm-setup.sh [--with-mpi] [--check]
#
# For Debian 12 (bookworm), run as root; needs only Debian's package archive
# and PyPI. It installs or unpacks:
#   * apt packages: the verbs userspace the guest uses (the guest sees this
#     host's / read-only, so tools and libraries must be installed HERE):
#     rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev
#     perftest; iproute2 (`rdma`), kmod, udev (virtme-ng's guest init needs
#     systemd-udevd), busybox-static (virtme-ng's initramfs), file, cpio,
#     zstd, python3-venv, seabios, ipxe-qemu; tcpdump (scripts/rxe-entropy.sh
#     captures RoCE packets between two VMs).
#     --with-mpi (or CCL_RXE_VM_WITH_MPI=1) adds openmpi-bin libopenmpi-dev
#     libucx0 ucx-utils libfabric-bin, to compare against Open MPI + UCX.
#   * $CCL_RXE_VM_HOME/kernel: Debian's 6.1 kernel image package (the one
#     linux-image-amd64 depends on now; it ships rdma_rxe.ko), unpacked and
#     depmod'ed. Nothing is installed over the host's kernel.
#   * $CCL_RXE_VM_HOME/qemu: qemu-system-x86 7.2 from bookworm, unpacked (it
#     cannot be installed next to a backported qemu-utils), plus the runtime
#     libraries its packages depend on (installed with apt).
#   * $CCL_RXE_VM_HOME/venv: virtme-ng, pinned, in a Python venv.
#
# --check: change nothing; exit 0 if everything is in place, 1 if not.
#
# Env: CCL_RXE_VM_HOME (default /opt/ccl-rxe-vm), CCL_RXE_VM_WITH_MPI=0|1,
#      CCL_RXE_VM_VIRTME_NG (default 1.42, the tested version),
#      CCL_RXE_VM_KERNEL_PKG (default: what linux-image-amd64 depends on).
set -euo pipefail

STATE=${CCL_RXE_VM_HOME:-/opt/ccl-rxe-vm}
VIRTME_NG=${CCL_RXE_VM_VIRTME_NG:-1.42}
WITH_MPI=${CCL_RXE_VM_WITH_MPI:-0}
CHECK=0
export DEBIAN_FRONTEND=noninteractive

log() { echo "[ccl rxe-vm-setup] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --with-mpi) WITH_MPI=1 ;;
    --check) CHECK=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage; exit 2 ;;
  esac
  shift
done

PKGS=(
  rdma-core ibverbs-utils ibverbs-providers libibverbs-dev librdmacm-dev perftest
  iproute2 kmod udev busybox-static file cpio zstd python3-venv
  seabios ipxe-qemu tcpdump
)
MPI_PKGS=(openmpi-bin libopenmpi-dev libucx0 ucx-utils libfabric-bin)
[ "$WITH_MPI" = 1 ] && PKGS+=("${MPI_PKGS[@]}")
QEMU_PKGS=(qemu-system-x86 qemu-system-common qemu-system-data)
QEMU_BIN=$STATE/qemu/usr/bin/qemu-system-x86_64

# missing_pkgs PKG... : print the ones that are not installed
missing_pkgs() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
kernel_ok() { compgen -G "$STATE/kernel/boot/vmlinuz-*" >/dev/null; }
qemu_ok() { [ -x "$QEMU_BIN" ] && ! ldd "$QEMU_BIN" 2>/dev/null | grep -q "not found"; }
venv_ok() {
  [ -x "$STATE/venv/bin/vng" ] &&
    [ "$(cat "$STATE/venv/.virtme-ng-version" 2>/dev/null)" = "$VIRTME_NG" ]
}

if [ "$CHECK" = 1 ]; then
  [ -z "$(missing_pkgs "${PKGS[@]}")" ] && kernel_ok && qemu_ok && venv_ok && exit 0
  exit 1
fi

[ "$(id -u)" = 0 ] || die "must run as root (it installs Debian packages)"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian 12 (bookworm)"
mkdir -p "$STATE"
# rxe-vm-pair.sh may start two VMs at once: serialise the setup.
exec 9>"$STATE/.setup.lock"
flock 9

apt_updated=0
apt_update() {
  [ "$apt_updated" = 1 ] && return 0
  log "apt-get update"
  apt-get update -qq >&2
  apt_updated=1
}
apt_install() {
  [ $# -gt 0 ] || return 0
  apt_update
  log "apt-get install $*"
  apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "$@" >&2
}
# fetch PKG... : apt-get download into $STATE/debs (as root, so no sandbox user)
fetch() {
  apt_update
  mkdir -p "$STATE/debs"
  (cd "$STATE/debs" && apt-get download -q -o APT::Sandbox::User=root "$@" >&2)
}

T0=$SECONDS

# --- 1. apt packages ----------------------------------------------------------
mapfile -t missing < <(missing_pkgs "${PKGS[@]}")
apt_install "${missing[@]}"

# --- 2. guest kernel: unpacked, never installed -------------------------------
if ! kernel_ok; then
  apt_update
  kpkg=${CCL_RXE_VM_KERNEL_PKG:-$(apt-cache depends linux-image-amd64 |
    awk '/Depends: linux-image-[0-9]/ { print $2; exit }')}
  [ -n "$kpkg" ] || die "cannot tell which kernel package linux-image-amd64 depends on"
  log "downloading $kpkg"
  rm -f "$STATE"/debs/linux-image-*.deb
  fetch "$kpkg"
  rm -rf "$STATE/kernel.tmp"
  dpkg-deb -x "$STATE"/debs/"$kpkg"_*.deb "$STATE/kernel.tmp"
  kver=$(basename "$(compgen -G "$STATE/kernel.tmp/lib/modules/*" | head -1)")
  # the .deb ships no modules.dep (the maintainer script builds it)
  depmod -b "$STATE/kernel.tmp" "$kver"
  [ -f "$STATE/kernel.tmp/lib/modules/$kver/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
    die "kernel $kver ships no rdma_rxe.ko"
  case "$kver" in 6.1.*) ;; *) log "warning: kernel $kver is not the tested 6.1 series" ;; esac
  rm -rf "$STATE/kernel"
  mv "$STATE/kernel.tmp" "$STATE/kernel"
  rm -f "$STATE"/debs/"$kpkg"_*.deb
  log "kernel $kver unpacked into $STATE/kernel"
fi

# --- 3. qemu-system-x86: unpacked, its runtime libraries installed -----------
if ! qemu_ok; then
  log "downloading ${QEMU_PKGS[*]}"
  rm -f "$STATE"/debs/qemu-system-*.deb
  fetch "${QEMU_PKGS[@]}"
  # Install what the three packages depend on, less qemu's own packages: the
  # first alternative of each dependency, without version constraints.
  mapfile -t deps < <(
    for f in "$STATE"/debs/qemu-system-*.deb; do dpkg-deb -f "$f" Depends; done |
      tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/[[:space:]]//g' |
      grep -v -e '^$' -e '^qemu-' | sort -u)
  mapfile -t missing < <(missing_pkgs "${deps[@]}")
  apt_install "${missing[@]}"
  rm -rf "$STATE/qemu.tmp"
  for f in "$STATE"/debs/qemu-system-*.deb; do dpkg-deb -x "$f" "$STATE/qemu.tmp"; done
  if ldd "$STATE/qemu.tmp/usr/bin/qemu-system-x86_64" | grep "not found" >&2; then
    die "the unpacked qemu has unresolved libraries (above)"
  fi
  rm -rf "$STATE/qemu"
  mv "$STATE/qemu.tmp" "$STATE/qemu"
  rm -f "$STATE"/debs/qemu-system-*.deb
  log "unpacked $("$QEMU_BIN" --version | head -1)"
fi
rmdir "$STATE/debs" 2>/dev/null || true

# --- 4. virtme-ng in a venv ----------------------------------------------------
if ! venv_ok; then
  log "installing virtme-ng==$VIRTME_NG into $STATE/venv"
  rm -rf "$STATE/venv"
  py=python3
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3   # Debian's, which has venv
  "$py" -m venv "$STATE/venv"
  "$STATE/venv/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VIRTME_NG" >&2
  echo "$VIRTME_NG" > "$STATE/venv/.virtme-ng-version"
fi

mkdir -p "$STATE/runs"
log "ready in $((SECONDS - T0)) s: virtme-ng $VIRTME_NG, kernel $(basename "$(compgen -G "$STATE/kernel/lib/modules/*" | head -1)"), $("$QEMU_BIN" --version | head -1), state in $STATE"
