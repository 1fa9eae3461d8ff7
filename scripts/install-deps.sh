#!/usr/bin/env bash
# Installs what building and testing ccl needs on Debian/Ubuntu (as root), skipping whatever is
# already there. Usage: scripts/install-deps.sh [build|test]
#   build: a Rust toolchain check and a C compiler. The verbs transport (ccl-ibverbs) needs no
#          rdma-core headers: it has its own definitions and opens libibverbs at run time.
#   test:  build + what the test suite uses, including rdma-core and the verbs providers (rxe);
#          the SoftRoCE VM itself is prepared by scripts/rxe-vm-setup.sh when first used.
set -euo pipefail
what=${1:-build}
log() { echo "[install-deps] $*" >&2; }

if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /usr/local/cargo/bin; do
    [ -x "$d/cargo" ] && export PATH="$d:$PATH"
  done
fi
if ! command -v cargo >/dev/null 2>&1; then
  log "cargo not found: install a Rust toolchain (1.85 or newer), e.g. from https://rustup.rs, then rerun"
  exit 1
fi

pkgs=(gcc)
case "$what" in
  build) ;;
  # binutils: nm checks libccl.so's exports; g++: the header compiles as C++; iproute2 and
  # util-linux: the Python tests run in a loopback-only network namespace; rdma-core and the
  # providers: the verbs tests (in the SoftRoCE VM); the rdma-core headers, pkg-config and
  # libclang: ccl-ibverbs' layout check (`--features layout-check`: rdma-sys generates bindings
  # from the headers to compare with the crate's own); nftables: scripts/two-planes.sh drops a
  # plane's packets; python3-venv unless a Python with venv is already there.
  test)
    pkgs+=(procps binutils g++ iproute2 util-linux nftables rdma-core ibverbs-providers ibverbs-utils)
    pkgs+=(pkg-config libibverbs-dev librdmacm-dev libclang-dev)
    if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
      pkgs+=(python3 python3-venv python3-pip)
    fi
    ;;
  *) log "unknown mode '$what' (build|test)"; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "missing packages ${missing[*]}: run as root or install them yourself"
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get update"
  apt-get update -qq
  log "apt-get install ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
