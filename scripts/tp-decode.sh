#!/usr/bin/env bash
# Tensor-parallel greedy decoding through torch.distributed (python/bench/tp_decode.py; not a
# test: numbers): a Llama-shaped model at TP=2 (2 processes, 1 thread and 1 core each) with
# torch's DTensor tensor parallelism on oxccl and on Gloo, the same split by hand with an
# explicit all-reduce on oxccl, on Gloo and with DeepSpeed's shared-memory inference_all_reduce,
# and the plain model at TP=1 in one process with as many threads as the TP=2 run has in all.
# The runs are interleaved in ROUNDS rounds (the order turns by one each round, so a burst of
# outside load hits different rows); then a markdown table: tokens/s, ms/token median and
# slowest, ratios to Gloo at TP=2 (same mode) and to TP=1, and whether the generated tokens are
# identical between the backends of a mode. Tokens that differ print a FAILED line and the
# script exits 1; so does a run that fails.
#
#   scripts/tp-decode.sh [--quick] [-- extra tp_decode.py options, e.g. --hidden 2048 --layers 8]
#
# --quick (CI): the tiny model, NEW=12, WARMUP=2, one round, no waiting for a quiet machine.
#
#   ROUNDS=3          rounds
#   MODES="dtensor manual"            TP modes at TP > 1
#   BACKENDS="oxccl gloo deepspeed"   all-reduces (deepspeed: manual mode only; left out with a
#                     note when DeepSpeed is not installed in FRAMEWORKS_VENV)
#   TP=2              ranks of the parallel runs; THREADS=1 torch threads (and cores) per rank;
#                     the TP=1 run gets TP x THREADS threads
#   DTYPE=bf16        bf16 or float32
#   PROMPT=32 NEW=64 WARMUP=4   prompt tokens, tokens generated, untimed first decode steps
#   QUIET=0.5         before each run, wait (up to 120 s) until the 1-minute load average per
#                     core is below this ("off": never wait); the load is recorded either way
#   RUN_TIMEOUT=600   seconds one run may take (the ranks are killed after it)
#   OUT=file          JSON lines (default target/tp-decode/<time>.jsonl)
#   BUILD=1           first build libccl.so and reinstall the package into CCL_VENV (as
#                     scripts/torch-bench.sh does); default: the package installed there as is
#   CCL_VENV          venv with torch and oxccl (default ~/.cache/ccl/venv)
#   FRAMEWORKS_VENV   venv with DeepSpeed (default ~/.cache/ccl/frameworks-venv, made by
#                     scripts/frameworks.sh deepspeed); it borrows CCL_VENV's torch, so every
#                     row runs the same torch
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

rounds=${ROUNDS:-3}
new=${NEW:-64}
warmup=${WARMUP:-4}
quiet_limit=${QUIET:-0.5}
if [ "$quick" = 1 ]; then
  rounds=1 new=${NEW:-12} warmup=${WARMUP:-2} quiet_limit=${QUIET:-off}
  extra=(--tiny "${extra[@]}")
fi
tp=${TP:-2}
threads=${THREADS:-1}
run_timeout=${RUN_TIMEOUT:-600}

venv=${CCL_VENV:-$HOME/.cache/ccl/venv}
if [ "${BUILD:-0}" = 1 ]; then
  [ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
  cargo build --release -q -p ccl-capi
  venv=$(CCL_VENV="$venv" CCL_LIBRARY="$PWD/target/release/libccl.so" \
    CCL_TORCH="${CCL_TORCH:-torch==2.15.0}" scripts/python-setup.sh | tail -n 1)
  export CCL_LIBRARY="$PWD/target/release/libccl.so"
fi
py="$venv/bin/python"
"$py" -c "import torch, oxccl.torch" ||
  { echo "no torch with oxccl in $venv (scripts/python-setup.sh makes it)" >&2; exit 1; }

modes=(${MODES:-dtensor manual})
backends=(${BACKENDS:-oxccl gloo deepspeed})
fvenv=${FRAMEWORKS_VENV:-$HOME/.cache/ccl/frameworks-venv}
fpy="$fvenv/bin/python"
if [[ " ${backends[*]} " == *" deepspeed "* ]]; then
  if [[ " ${modes[*]} " != *" manual "* ]]; then
    backends=("${backends[@]/deepspeed/}")
  elif ! DS_ACCELERATOR=cpu "$fpy" -c "import deepspeed" >/dev/null 2>&1; then
    echo "note: DeepSpeed is not installed in $fvenv (scripts/frameworks.sh deepspeed installs it): no DeepSpeed row"
    backends=("${backends[@]/deepspeed/}")
  elif ! "$fpy" -c "import sys, torch; sys.exit(0 if torch.__file__ == sys.argv[1] else 1)" \
      "$("$py" -c 'import torch; print(torch.__file__)')"; then
    echo "note: $fvenv does not use $venv's torch: no DeepSpeed row"
    backends=("${backends[@]/deepspeed/}")
  else
    # DeepSpeed compiles its shared-memory op (g++, ninja from the venv) the first time; here,
    # once, so that no run spends its deadline on it.
    PATH="$fvenv/bin:$PATH" DS_ACCELERATOR=cpu "$fpy" -c 'from deepspeed.accelerator import get_accelerator as a
a().create_op_builder("ShareMemCommBuilder").load()' >/dev/null 2>&1 ||
      { echo "DeepSpeed's shared-memory op does not build (DS_ACCELERATOR=cpu, ShareMemCommBuilder)" >&2; exit 1; }
  fi
fi

# The rows, as "mode backend tp threads".
configs=()
for m in "${modes[@]}"; do
  for b in "${backends[@]}"; do
    [ -n "$b" ] || continue
    [ "$b" = deepspeed ] && [ "$m" != manual ] && continue
    configs+=("$m $b $tp $threads")
  done
done
configs+=("dtensor oxccl 1 $((tp * threads))")

out=${OUT:-target/tp-decode/$(date -u +%Y%m%d-%H%M%S).jsonl}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")

cpu="$(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p'), model $(lscpu | sed -n 's/^Model: *//p'))"
echo "CPU: $cpu, $(nproc) cores online; torch $("$py" -c 'import torch; print(torch.__version__)')"
echo "results in $out"

# Loopback only: oxccl and Gloo reach each other on lo; in a private network namespace nothing
# can leave the machine.
netns=()
if unshare --net true 2>/dev/null && command -v ip >/dev/null 2>&1; then
  netns=(unshare --net sh -c 'ip link set lo up && exec "$@"' sh)
else
  echo "no network namespace available: loopback addresses only"
fi
export GLOO_SOCKET_IFNAME=lo CCL_SOCKET_IFNAME="=lo" PYTHONUNBUFFERED=1

. scripts/load-wait.sh
quiet() { wait_for_load "$quiet_limit"; }

failed=()
for round in $(seq 1 "$rounds"); do
  k=$(((round - 1) % ${#configs[@]}))
  order=("${configs[@]:k}" "${configs[@]:0:k}")
  for c in "${order[@]}"; do
    read -r m b n t <<<"$c"
    quiet
    label="$m $b TP=$n"
    [ "$n" = 1 ] && label="TP=1"
    echo "== round $round: $label, $t thread(s) per rank"
    runner=("$py")
    env_extra=()
    if [ "$b" = deepspeed ]; then
      runner=("$fpy")
      env_extra=(PATH="$fvenv/bin:$PATH" DS_ACCELERATOR=cpu)
    fi
    # timeout: a second deadline above the launcher's own, for a launcher that hangs.
    if ! env "${env_extra[@]}" timeout $((run_timeout + 60)) "${netns[@]}" "${runner[@]}" \
        python/bench/tp_decode.py run --mode "$m" --backend "$b" --tp "$n" --threads "$t" \
        --dtype "${DTYPE:-bf16}" --prompt "${PROMPT:-32}" --new "$new" --warmup "$warmup" \
        --timeout "$run_timeout" --round "$round" --out "$out" "${extra[@]}" >/dev/null; then
      echo "   FAILED: $label (round $round)"
      failed+=("$label, round $round")
    fi
  done
done

rc=0
[ -s "$out" ] && { "$py" python/bench/tp_decode.py summary "$out" || rc=1; }
if [ ${#failed[@]} -gt 0 ]; then
  echo
  for f in "${failed[@]}"; do echo "FAILED: run $f"; done
  rc=1
fi
exit "$rc"
