#!/usr/bin/env bash
# Shows that popular training frameworks run on the "oxccl" torch.distributed backend and train
# exactly as on Gloo: each framework's script (python/frameworks/NAME_train.py) runs at every
# world size on "oxccl" and on "gloo" from the same seeds, and python/frameworks/compare.py
# compares the per-step losses (rtol 1e-4). One line per framework and size; a closing
# "frameworks: N passed, N failed" line; exit status 1 if any comparison failed.
#
#   scripts/frameworks.sh [--quick] [NAME...]
#
# NAMEs: lightning accelerate transformers deepspeed torchft ray (default: all of them).
# --quick runs world size 2 only (for CI).
#
# The frameworks go into a venv of their own that borrows torch and the oxccl package from the
# Python tests' venv (a .pth file), so torch is never downloaded twice; pip runs with torch (and
# numpy) pinned to the versions found there, so it can never replace them. Only what the named
# frameworks need is installed. Everything runs on loopback, in a private network namespace
# when the machine allows one.
#
#   CCL_VENV            the venv with torch and oxccl (default ~/.cache/ccl/venv; made by
#                       scripts/python-setup.sh when missing)
#   FRAMEWORKS_VENV     the frameworks' venv (default ~/.cache/ccl/frameworks-venv)
#   FRAMEWORKS_SIZES    world sizes (default "2 4"; --quick: "2")
#   FRAMEWORKS_STEPS    optimizer steps per run (default 20)
#   FRAMEWORKS_TIMEOUT  seconds one run may take before it counts as failed (default 600)
#   FRAMEWORKS_OUT      where results and logs go (default target/frameworks/<time>)
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "[frameworks] $*" >&2; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f\n", b - a }'; }

all=(lightning accelerate transformers deepspeed torchft ray)
quick=0
names=()
for a in "$@"; do
  case "$a" in
    --quick) quick=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    lightning|accelerate|transformers|deepspeed|torchft|ray) names+=("$a") ;;
    *) echo "unknown framework or option: $a (known: ${all[*]}, --quick)" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")
sizes=${FRAMEWORKS_SIZES:-2 4}
[ "$quick" = 1 ] && sizes=2
steps=${FRAMEWORKS_STEPS:-20}
run_timeout=${FRAMEWORKS_TIMEOUT:-600}
out=${FRAMEWORKS_OUT:-target/frameworks/$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)

base=${CCL_VENV:-$HOME/.cache/ccl/venv}
if ! "$base/bin/python" -c "import torch, oxccl.torch" 2>/dev/null; then
  log "no torch with oxccl in $base: running scripts/python-setup.sh"
  base=$(CCL_VENV="$base" scripts/python-setup.sh | tail -n 1)
fi
bpy="$base/bin/python"
fvenv=${FRAMEWORKS_VENV:-$HOME/.cache/ccl/frameworks-venv}
[ -x "$fvenv/bin/python" ] || { log "creating $fvenv"; "$bpy" -m venv "$fvenv"; }
fpy="$fvenv/bin/python"
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
bsite=$("$bpy" -c "$purelib")
fsite=$("$fpy" -c "$purelib")
# Appended to sys.path after the venv's own site-packages: the frameworks' packages come first,
# torch, numpy and oxccl come from the base venv.
echo "$bsite" > "$fsite/_ccl_base_venv.pth"
"$bpy" -c 'import importlib.metadata as m
for p in ("torch", "numpy"): print(f"{p}=={m.version(p)}")' >"$fvenv/constraints.txt"
export PIP_CONSTRAINT="$fvenv/constraints.txt" PIP_DISABLE_PIP_VERSION_CHECK=1

# What each framework needs from PyPI (and how pip must install it).
reqs() {
  case "$1" in
    lightning) echo "pytorch-lightning==2.6.*" ;;
    accelerate) echo "accelerate==1.15.*" ;;
    transformers) echo "transformers==5.* accelerate==1.15.*" ;;
    # DeepSpeed is a source distribution whose setup.py imports torch: building it in pip's
    # isolated environment would make pip fetch a torch of its own.
    deepspeed) echo "--no-build-isolation deepspeed==0.19.*" ;;
    # parameterized: torchft's own process-group tests (reused for the collective checks)
    # import it.
    torchft) echo "torchft==0.2.0 parameterized" ;;
    ray) echo "ray[train]==2.60.*" ;;
  esac
}
installed() {
  case "$1" in
    lightning) "$fpy" -c "import pytorch_lightning" ;;
    accelerate) "$fpy" -c "import accelerate" ;;
    transformers) "$fpy" -c "import transformers, accelerate" ;;
    deepspeed) "$fpy" -c "import deepspeed" ;;
    torchft) "$fpy" -c "import torchft, parameterized" ;;
    ray) "$fpy" -c "import ray.train.torch" ;;
  esac
} >/dev/null 2>&1

for name in "${names[@]}"; do
  installed "$name" && continue
  before=$(du -sm "$fsite" | cut -f1)
  t0=$EPOCHREALTIME
  log "pip install $(reqs "$name")"
  # shellcheck disable=SC2046
  DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$fpy" -m pip install -q $(reqs "$name") >&2
  log "installed $name in $(since "$t0") s, +$(( $(du -sm "$fsite" | cut -f1) - before )) MB"
done
# The packages must not have brought a torch of their own.
"$fpy" -c "import sys, torch; sys.exit(0 if torch.__file__.startswith('$bsite/') else 1)" ||
  { log "a torch other than $base's is visible in $fvenv"; exit 1; }

# Loopback only; DeepSpeed's JIT op build finds ninja on PATH; nothing may reach a model hub.
export OMP_NUM_THREADS=1 CCL_SOCKET_IFNAME="=lo" GLOO_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
export PATH="$fvenv/bin:$PATH" DS_ACCELERATOR=cpu
if [[ " ${names[*]} " == *" deepspeed "* ]]; then
  # DeepSpeed's communication layer compiles its shared-memory op (deepspeed_shm_comm, used for
  # inference all-reduces only) with g++ and ninja the first time it starts on CPU, whatever
  # the backend; built here, once, so that the timed runs do not include it.
  t0=$EPOCHREALTIME
  "$fpy" -c 'from deepspeed.accelerator import get_accelerator as a
a().create_op_builder("ShareMemCommBuilder").load()' >"$out/deepspeed-op-build.log" 2>&1 || { log "DeepSpeed's op build failed: $out/deepspeed-op-build.log"; exit 1; }
  log "DeepSpeed's deepspeed_shm_comm op ready in $(since "$t0") s"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0

# torch's TCPStore resolves host names: in a namespace with nothing but loopback no lookup or
# packet can leave the machine, and every port is free.
netns=()
if unshare --net true 2>/dev/null && command -v ip >/dev/null 2>&1; then
  netns=(unshare --net sh -c 'ip link set lo up && exec "$@"' sh)
  log "runs in private network namespaces (loopback only); results and logs in $out"
else
  log "no network namespace available: loopback addresses only; results and logs in $out"
fi
free_port() {
  if [ ${#netns[@]} -gt 0 ]; then echo 29500; return; fi
  "$fpy" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs one framework at one size on one backend; prints the wall time in seconds.
run() {
  local name=$1 n=$2 backend=$3 script="python/frameworks/${1}_train.py" cmd
  local res="$out/$name-$n-$backend.json" logf="$out/$name-$n-$backend.log"
  rm -f "$res"
  case "$name" in
    # Each of these starts its own ranks.
    torchft|ray) cmd=("$fpy" "$script" --world-size "$n") ;;
    *) cmd=("$fpy" -m torch.distributed.run --nnodes 1 --nproc-per-node "$n" --master-addr 127.0.0.1
         --master-port "$(free_port)" "$script" --world-size "$n") ;;
  esac
  local t0=$EPOCHREALTIME rc=0
  timeout "$run_timeout" "${netns[@]}" "${cmd[@]}" --backend "$backend" --steps "$steps" --out "$res" \
    >"$logf" 2>&1 || rc=$?
  [ "$rc" = 0 ] || log "$name $n ranks on $backend: exit status $rc (log: $logf)"
  since "$t0"
}

passed=0 failed=0
for name in "${names[@]}"; do
  for n in $sizes; do
    t_ox=$(run "$name" "$n" oxccl)
    t_gl=$(run "$name" "$n" gloo)
    if "$fpy" python/frameworks/compare.py "$name" "$n" "$out/$name-$n-oxccl.json" "$out/$name-$n-gloo.json" \
      "$t_ox" "$t_gl"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
    fi
  done
done
echo "frameworks: $passed passed, $failed failed"
[ "$failed" = 0 ]
