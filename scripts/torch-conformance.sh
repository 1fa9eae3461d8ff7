#!/usr/bin/env bash
# PyTorch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py,
# DistributedTest._DistTestBase, as PyTorch's test_distributed_spawn.py runs them) on Gloo and on
# the oxccl backend, side by side, at world sizes 2 and 4; then the comparison: every test that
# passes on Gloo must pass on ccl or be listed, with its reason, in docs/torch.md ("Known
# differences from Gloo"). Exit status 1 otherwise. Slow: every test starts its ranks as fresh
# processes, GPU tests too before they skip; on the shared 2-core machine under load (load
# average 10-15) a test took 40-70 s, about three hours for the class per backend and world
# size. Name tests to run a part; each run's report is rewritten after every test, so a run
# stopped part way keeps its results (compare them with compare.py --common).
#
#   WORLD_SIZES="2 4"   world sizes to run
#   BACKENDS="gloo oxccl" backends to run
#   OUT=dir             where results go (default target/torch-conformance/<time>); gloo-N.json,
#                       oxccl-N.json (every test's outcome, message and time) and their logs
#   CCL_VENV            the venv (scripts/python-setup.sh)
#   extra arguments     test names, to run only those (e.g. test_all_reduce_sum)
#
# Tests talk to loopback only: a private network namespace with nothing but loopback when
# unshare is allowed, file:// rendezvous (torch's TCP store does reverse-DNS lookups), Gloo and
# ccl pinned to lo.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-capi
venv=$(CCL_LIBRARY="$PWD/target/release/libccl.so" scripts/python-setup.sh | tail -n 1)
out=${OUT:-target/torch-conformance/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
out=$(cd "$out" && pwd)
echo "results in $out"

isolate() {
  if unshare --net true 2>/dev/null && command -v ip >/dev/null 2>&1; then
    unshare --net sh -c 'ip link set lo up && exec "$@"' sh "$@"
  else
    "$@"
  fi
}

for n in ${WORLD_SIZES:-2 4}; do
  for b in ${BACKENDS:-gloo oxccl}; do
    echo "== $b, world size $n ($(date +%H:%M:%S))"
    # INIT_METHOD selects the file:// variants of the tests, as PyTorch's CI does for its
    # init-file runs; each test gets its own file from the harness.
    BACKEND=$b WORLD_SIZE=$n INIT_METHOD="file://$out/unused-init" OMP_NUM_THREADS=1 \
      CCL_LIBRARY="$PWD/target/release/libccl.so" \
      isolate "$venv/bin/python" python/conformance/dist_suite.py --json "$out/$b-$n.json" "$@" \
      >"$out/$b-$n.log" 2>&1 || true
    "$venv/bin/python" - "$out/$b-$n.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["tests"]
c = {k: sum(v["outcome"] == k for v in t.values()) for k in ("pass", "fail", "skip")}
print(f"   {c['pass']} pass, {c['fail']} fail, {c['skip']} skipped")
PY
  done
done
"$venv/bin/python" python/conformance/compare.py "$out"
