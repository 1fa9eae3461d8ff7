#!/usr/bin/env bash
# Surviving a rank's death, measured: 100 randomised trials per transport on 4-8 local ranks
# (ccl-bench's ccl-shrink-trials). Each trial SIGKILLs a random rank inside random checked
# collectives (every third trial a second rank a moment later, during the shrink); every
# survivor must shrink and finish checked allreduces on the shrunk communicator. Prints each
# trial and the median and maximum time from the kill to the last survivor's first good
# allreduce after the shrink.
#
#   TRIALS=100 TRANSPORTS="tcp shm" scripts/shrink-trials.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench --bin ccl-shrink-trials
for t in ${TRANSPORTS:-tcp shm}; do
  target/release/ccl-shrink-trials --trials "${TRIALS:-100}" --np-min 4 --np-max 8 \
    --transport "$t" --second-every 3 2>/dev/null
done
