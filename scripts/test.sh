#!/usr/bin/env bash
# The whole test suite: unit, in-process multi-rank, and multi-process tests (the C ABI through
# the header from C, the Rust training example), a small simulator run, two "hosts" on this
# machine (shared memory within, TCP across), two network planes between two namespaces
# (scripts/two-planes.sh --quick: a plane cut, dropped, throttled, flapped), then the Python
# package, the torch.distributed backend, DDP under torchrun and a named subset of PyTorch's own
# distributed tests
# (python/tests/test_torch_conformance.py; the whole class is scripts/torch-conformance.sh),
# two training frameworks against Gloo (scripts/frameworks.sh --quick lightning torchft), small
# cases of the CPU-inference benchmarks (scripts/tp-decode.sh --quick, a bf16 compare.sh run),
# then the verbs transport on real SoftRoCE in a VM (one boot, then two VMs linked); installing
# what they need first. Release mode: the tests move hundreds of megabytes.
#
#   CCL_SKIP_PYTHON=1   skip the Python part (it installs PyTorch, several GB, into CCL_VENV)
#   CCL_SKIP_RXE=1      skip the SoftRoCE VM part (it downloads a kernel and qemu once)
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's wall time, printed at the end (also when a stage fails): where CI's time goes.
stage_names=() stage_secs=() stage_t0=$SECONDS
stage() {
  stage_end
  stage_names+=("$1")
  stage_t0=$SECONDS
  echo "== $1"
}
stage_end() {
  [ ${#stage_names[@]} -gt ${#stage_secs[@]} ] && stage_secs+=($((SECONDS - stage_t0)))
  return 0
}
stage_times() {
  local rc=$? i
  stage_end
  echo "== stage times (s)"
  for i in "${!stage_names[@]}"; do
    printf '%6d  %s\n' "${stage_secs[$i]}" "${stage_names[$i]}"
  done
  printf '%6d  total\n' "$SECONDS"
  return $rc
}
trap stage_times EXIT
stage "dependencies"
scripts/install-deps.sh test
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
stage "cargo test (workspace, release)"
# The verdict trials of ccl-bench's faults run once per fault and algorithm here (each trial
# waits out a 2 s timeout); `cargo test --release -p ccl-bench --test faults` alone runs the
# full ten, and scripts/soak.sh runs the whole suite again and again under load.
FAULT_REPEATS=${FAULT_REPEATS:-1} cargo test --release --workspace
# ccl-ibverbs' hand-written libibverbs definitions against the installed headers, which its
# build itself no longer reads.
cargo test --release -p ccl-ibverbs --features layout-check
# The reruns name their test binary with --workspace, not -p: a single package resolves
# features differently and would build the library and binary again (minutes of CI).
stage "the collectives again, with every pair connected at set-up (CCL_CONNECT=eager)"
CCL_CONNECT=eager cargo test --release --workspace --test suite -- collectives:: vcoll:: mismatch::
stage "the fault suites again, with the job monitor a tree of hubs (CCL_MONITOR_FANOUT=2: of 4 ranks, 0 and 2 are hubs)"
CCL_MONITOR_FANOUT=2 cargo test --release --workspace --test suite -- recover:: diagnosis:: errors:: lazy::
CCL_MONITOR_FANOUT=2 FAULT_REPEATS=1 cargo test --release --workspace --test faults -- \
  killing_a_rank_fails_every_survivor_naming_it survivors_of_random_kills survivors_of_rank_0 \
  named_by_every_survivors_error named_dead_by_every_survivors_error
stage "simulator: one small experiment"
scripts/sim-smoke.sh
stage "two hosts on one machine (UTS namespaces): shm within hosts, tcp across"
rc=0; scripts/two-hosts.sh || rc=$?
if [ "$rc" = 77 ]; then echo "(skipped: needs root)"; elif [ "$rc" != 0 ]; then exit "$rc"; fi
stage "two network planes between two namespaces: a plane cut, dropped, throttled and flapped under an allreduce loop (small case)"
rc=0; scripts/two-planes.sh --quick || rc=$?
if [ "$rc" = 77 ]; then echo "(skipped: needs root)"; elif [ "$rc" != 0 ]; then exit "$rc"; fi

stage "set-up at scale: a small case of scripts/scale-init.sh"
scripts/scale-init.sh --quick
python3 scripts/scale-model.py --self-test

python_tests() {
stage "python package (numpy, torch, torch.distributed backend, DDP under torchrun, PyTorch's tests)"
cargo build --release --workspace
venv=$(CCL_LIBRARY="$PWD/target/release/libccl.so" scripts/python-setup.sh | tail -n 1)
# With torch installed, the install must have compiled the native torch backend for it (the
# package's own build, not one compiled at first use), and torch must find it by name.
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
  CCL_TORCH_BUILD=0 "$venv/bin/python" -c \
    'import torch.distributed as d; d.Backend._ensure_backend_registered("oxccl"); assert "OXCCL" in d.Backend._plugins' ||
    { echo "the native torch backend was not built at install (see pip's output above)"; exit 1; }
fi
# Tests talk to loopback only. torch's TCP store (torchrun's) resolves addresses by name, so
# where possible the Python tests run in a network namespace of their own that has nothing but
# loopback: no lookup or packet can leave the machine.
if unshare --net true 2>/dev/null && command -v ip >/dev/null 2>&1; then
  echo "(in a private network namespace: loopback only)"
  unshare --net sh -c 'ip link set lo up && exec "$@"' sh "$venv/bin/pytest" -q python/tests
else
  echo "(no network namespace available; the tests use loopback addresses only)"
  "$venv/bin/pytest" -q python/tests
fi
stage "training frameworks on oxccl against Gloo: the cheapest two (scripts/frameworks.sh runs all six)"
CCL_VENV="$venv" scripts/frameworks.sh --quick lightning torchft
stage "CPU inference: tensor-parallel decoding through torch (tokens equal to Gloo's), a small model"
CCL_VENV="$venv" scripts/tp-decode.sh --quick
stage "bf16 allreduce beside Open MPI (a user-defined bf16 sum there), small sizes, results checked"
ROUNDS=1 MAX=65536 ITERS=5 ITERS_SMALL=200 WARM_SMALL=20 QUIET_WAIT=0 DTYPE=bf16 \
  scripts/compare.sh shm 2
}

if [ "${CCL_SKIP_PYTHON:-0}" = 1 ]; then
  echo "== python tests skipped (CCL_SKIP_PYTHON=1)"
else
  python_tests
fi

if [ "${CCL_SKIP_RXE:-0}" = 1 ]; then
  echo "== SoftRoCE (rxe) tests skipped (CCL_SKIP_RXE=1)"
else
  stage "SoftRoCE (rxe) tests in the VM"
  scripts/rxe-tests.sh
fi
