#!/usr/bin/env bash
# The main job: an allreduce bus-bandwidth test with 4 local ranks over the default transports
# (shared memory between ranks of one host; verbs when an active RoCE device exists, else TCP,
# between hosts), installing what it needs first.
# Extra arguments go to ccl-bench after the defaults below and override them, e.g.
# scripts/bench.sh -b 1M -e 256M -d bf16 --transport tcp; NP sets the number of ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh build
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench
exec ./target/release/ccl-bench allreduce --np "${NP:-4}" -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 "$@"
