#!/usr/bin/env bash
# Every publishable crate packages and builds from its package alone, as crates.io would take
# it (`cargo publish --workspace --dry-run`: the crates are verified against each other's
# packages, not the source tree), and the default build needs no rdma-core headers. Not a
# test of behaviour: it rebuilds the workspace in debug mode (several minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
if cargo tree --workspace -e normal,build --prefix none | grep -q '^rdma-sys '; then
  echo "rdma-sys (libibverbs headers at build time) is a dependency of the default build"; exit 1
fi
cargo publish --workspace --dry-run --allow-dirty "$@"
echo "publish-check: every publishable crate packaged and verified"
