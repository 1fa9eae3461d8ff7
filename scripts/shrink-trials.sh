#!/usr/bin/env bash
# Surviving a rank's death, measured: 100 randomised trials per transport and rendezvous
# placement on 4-8 local ranks (ccl-bench's ccl-shrink-trials). Each trial SIGKILLs a rank
# inside random checked collectives (every third trial a second rank a moment later, during the
# shrink); every survivor must shrink, finish checked allreduces on the shrunk communicator and
# destroy its communicators. Prints each trial and, per first victim and overall, the median
# and maximum time from the kill to the last survivor's first good allreduce after the shrink.
#
# Placements (ROOTS):
#   launcher  the rendezvous runs in the launcher, which outlives every rank; random victims
#   rank0     it runs in rank 0's process (torchrun, MPI, an application's rank 0); random
#             victims, rank 0 among them
#   rank0-v0  as rank0, and rank 0 always dies first: the job's monitor dies with it
#
#   TRIALS=100 TRANSPORTS="tcp shm" ROOTS="launcher rank0 rank0-v0" scripts/shrink-trials.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q --workspace --bin ccl-shrink-trials
lscpu | sed -n 's/^Model name: *//p' | sed 's/^/# CPU: /'
for root in ${ROOTS:-launcher rank0 rank0-v0}; do
  case "$root" in
    launcher) args=(--root launcher) ;;
    rank0) args=(--root rank0) ;;
    rank0-v0) args=(--root rank0 --victim 0) ;;
    *) echo "shrink-trials: unknown placement '$root' (launcher, rank0, rank0-v0)" >&2; exit 2 ;;
  esac
  for t in ${TRANSPORTS:-tcp shm}; do
    target/release/ccl-shrink-trials --trials "${TRIALS:-100}" --np-min 4 --np-max 8 \
      --transport "$t" --second-every 3 "${args[@]}" 2>/dev/null
  done
done
