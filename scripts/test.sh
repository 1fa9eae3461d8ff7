#!/usr/bin/env bash
# The whole test suite: unit, in-process multi-rank, and multi-process tests, installing what
# they need first. Release mode: the tests move hundreds of megabytes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh test
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
echo "== cargo test (workspace, release)"
cargo test --release --workspace
