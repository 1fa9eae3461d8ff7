#!/usr/bin/env bash
# torch.distributed through the oxccl backend beside Gloo (not a test: numbers): all_reduce
# latency and bus bandwidth from 8 B to 64 MiB beside PyTorch's no-op "fake" backend (torch's
# own cost, the floor) and the library alone (the package's Communicator on the same tensors), and the time per step of DDP training
# (examples/python/ddp_train.py --time-steps, an MLP whose gradients are 50 MB), with 2 and 4
# ranks, in interleaved rounds (round 1 of every configuration, then round 2, ...; the backend
# that goes first alternates) so a burst of outside load hits different configurations; prints tables of the medians and whether the
# targets are met. About 10 minutes per round on a quiet 2-core machine.
#
#   ROUNDS=3        rounds
#   RANKS="2 4"     world sizes
#   AR_BACKENDS="gloo oxccl oxccl-nofr fake lib"   backends of the all_reduce runs
#   DDP_BACKENDS="gloo oxccl fake"      backends of the DDP runs (fake: no communication)
#   MAX_SIZE=64M    the largest all_reduce
#   QUIET=0.5       before each run, wait (up to 120 s) until the 1-minute load average per core
#                   is below this; the load is recorded with every result either way
#   OUT=file        JSON lines (default target/torch-bench/<time>.jsonl)
#   CCL_VENV        the venv (scripts/python-setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-capi
venv=$(CCL_LIBRARY="$PWD/target/release/libccl.so" CCL_TORCH="${CCL_TORCH:-torch==2.15.0}" \
  scripts/python-setup.sh | tail -n 1)
py="$venv/bin/python"
# The venv's installed package (with its native torch backend), not the source tree.
export CCL_LIBRARY="$PWD/target/release/libccl.so"
out=${OUT:-target/torch-bench/$(date +%Y%m%d-%H%M%S).jsonl}
mkdir -p "$(dirname "$out")"
echo "results in $out"

. scripts/load-wait.sh
quiet() { wait_for_load "${QUIET:-0.5}"; }

for round in $(seq 1 "${ROUNDS:-3}"); do
  # The order of the backends turns by one from round to round.
  ar=(${AR_BACKENDS:-gloo oxccl oxccl-nofr fake lib})
  dd=(${DDP_BACKENDS:-gloo oxccl fake})
  k=$(((round - 1) % ${#ar[@]}))
  ar=("${ar[@]:k}" "${ar[@]:0:k}")
  k=$(((round - 1) % ${#dd[@]}))
  dd=("${dd[@]:k}" "${dd[@]:0:k}")
  for n in ${RANKS:-2 4}; do
    for b in "${ar[@]}"; do
      quiet
      echo "== round $round, $n ranks, $b: all_reduce"
      "$py" python/bench/torch_bench.py allreduce --backend "$b" --ranks "$n" --round "$round" \
        -e "${MAX_SIZE:-64M}" --out "$out" >/dev/null
    done
    for b in "${dd[@]}"; do
      quiet
      echo "== round $round, $n ranks, $b: DDP"
      "$py" python/bench/torch_bench.py ddp --backend "$b" --ranks "$n" --round "$round" \
        --out "$out" >/dev/null
    done
  done
done
"$py" python/bench/torch_bench.py summary "$out"
