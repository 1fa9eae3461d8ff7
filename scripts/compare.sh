#!/usr/bin/env bash
# Allreduce of ccl against Open MPI on one machine, side by side: ROUNDS interleaved rounds,
# median time and busbw per size, as a markdown table. Installs Open MPI if it is missing.
#   tcp: ccl over loopback TCP, Open MPI ob1 + TCP BTL
#   shm: ccl over shared memory, Open MPI ob1 + vader (its shared-memory BTL); the table also
#        gives, per size, the busbw the memory allows ccl's algorithm (see docs/performance.md)
# Ranks are bound to cores as Open MPI does by default (not when they outnumber the CPUs).
# REGISTERED=1 also runs ccl on buffers from Communicator::alloc (`ccl-bench --registered`: over
# shm, the allreduce that reads and writes the ranks' buffers in place) in the same rounds.
# Sizes up to SPLIT bytes run ITERS_SMALL timed calls after WARM_SMALL untimed ones (a few
# thousand: a call there takes well under a microsecond, and 20 of them say more about the
# clock than about the library); larger sizes run ITERS after 5. Each round runs both.
# ONECCL=1 also runs Intel oneCCL over Intel MPI (both from PyPI) in the same rounds, through
# PEERS/oneccl-bench.sh (PEERS: the directory of the peer benchmarks, default ../shared/peers
# beside the clone; it installs oneCCL on first use; shared memory only, so with shm).
# Each run first waits (up to QUIET_WAIT seconds) until the machine is less than QUIET_PCT % busy.
# Usage: scripts/compare.sh tcp|shm [NP] ; env ROUNDS (3), ITERS (20), MIN (8), MAX (256M bytes),
#        SPLIT (8192), ITERS_SMALL (3000), WARM_SMALL (200), REGISTERED (0), ONECCL (0),
#        PEERS (../shared/peers), QUIET_PCT (15), QUIET_WAIT (180)
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:?usage: scripts/compare.sh tcp|shm [NP]}
case "$KIND" in
  tcp) btl=self,tcp ;;
  shm) btl=self,vader ;;
  *) echo "compare.sh: transport '$KIND' is not tcp or shm" >&2; exit 2 ;;
esac
NP=${2:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-20}; MIN=${MIN:-8}; MAX=${MAX:-268435456}
SPLIT=${SPLIT:-8192}; ITERS_SMALL=${ITERS_SMALL:-3000}; WARM_SMALL=${WARM_SMALL:-200}
# The two passes: "first last iterations warm-up" each; sizes go up by 4 from MIN.
passes=()
big=$MIN
while [ "$big" -le "$SPLIT" ] && [ "$big" -le "$MAX" ]; do last_small=$big; big=$((big * 4)); done
[ "$MIN" -le "$SPLIT" ] && passes+=("$MIN $last_small $ITERS_SMALL $WARM_SMALL")
[ "$big" -le "$MAX" ] && passes+=("$big $MAX $ITERS 5")
ONE=${ONECCL:-0}
peers=${PEERS:-../shared/peers}
if [ "$ONE" = 1 ]; then
  [ "$KIND" = shm ] || { echo "compare.sh: ONECCL=1 runs over shared memory only (shm)" >&2; exit 2; }
  [ -f "$peers/oneccl-bench.sh" ] || { echo "compare.sh: ONECCL=1 needs $peers/oneccl-bench.sh (set PEERS)" >&2; exit 2; }
fi
scripts/install-deps.sh build
if ! command -v mpicc.openmpi >/dev/null || ! command -v mpirun.openmpi >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -q --no-install-recommends openmpi-bin libopenmpi-dev >&2
fi
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mpicc.openmpi -O2 -o "$out/mpi_allreduce" scripts/peers/mpi_allreduce.c
rates="0 0"
if [ "$KIND" = shm ]; then
  gcc -O2 -o "$out/membw" scripts/peers/membw.c
  rates=$("$out/membw" $((64 << 20)) 5)
  echo "  memory, one core: copy ${rates% *} GB/s, reduce ${rates#* } GB/s" >&2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
bind=(--bind-to core); [ "$NP" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
# Busy share of all CPUs over half a second, from /proc/stat, in percent.
busy() {
  local a b
  a=($(head -1 /proc/stat)); sleep 0.5; b=($(head -1 /proc/stat))
  local t=0 i
  for i in 1 2 3 4 5 6 7 8; do t=$((t + b[i] - a[i])); done
  local idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $(( t > 0 ? 100 * (t - idle) / t : 0 ))
}
# Wait (up to QUIET_WAIT s) until other work uses less than QUIET_PCT % of the machine.
quiet() {
  local waited=0 b
  while b=$(busy); [ "$b" -ge "${QUIET_PCT:-15}" ] && [ "$waited" -lt "${QUIET_WAIT:-180}" ]; do
    sleep 2; waited=$((waited + 3))
  done
  echo "  machine busy ${b}% before measuring (waited ${waited}s)" >&2
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r/$ROUNDS" >&2
  for p in "${!passes[@]}"; do
    read -r lo hi n w <<< "${passes[$p]}"
    quiet
    ./target/release/ccl-bench allreduce --np "$NP" --transport "$KIND" -b "$lo" -e "$hi" -f 4 \
      -n "$n" -w "$w" -c 1 --json "$out/ccl.$r.$p.json" >/dev/null
    if [ "${REGISTERED:-0}" = 1 ]; then
      quiet
      ./target/release/ccl-bench allreduce --np "$NP" --transport "$KIND" -b "$lo" -e "$hi" -f 4 \
        -n "$n" -w "$w" -c 1 --registered --json "$out/reg.$r.$p.json" >/dev/null
    fi
    quiet
    mpirun.openmpi -np "$NP" "${bind[@]}" --mca pml ob1 --mca btl "$btl" \
      "$out/mpi_allreduce" "$lo" "$hi" 4 "$n" "$w" >> "$out/mpi.$r.txt"
    if [ "$ONE" = 1 ]; then
      quiet
      bash "$peers/oneccl-bench.sh" "$NP" -b "$lo" -e "$hi" -f 4 2>/dev/null | grep '^ROW,' \
        >> "$out/one.$r.txt"
    fi
  done
done
python3 - "$out" "$ROUNDS" "$NP" "$(nproc)" $rates <<'PY'
import json, sys, statistics as st
out, rounds, np_ = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpus, copy, red = int(sys.argv[4]), float(sys.argv[5]) * 1e9, float(sys.argv[6]) * 1e9
import os
ccl, mpi, reg, one = {}, {}, {}, {}
for r in range(1, rounds + 1):
    for name, rows in (("ccl", ccl), ("reg", reg)):
        for p in range(2):
            if not os.path.exists(f"{out}/{name}.{r}.{p}.json"):
                continue
            for row in json.load(open(f"{out}/{name}.{r}.{p}.json"))["results"]:
                if row["placement"] == "out-of-place":
                    assert row["wrong"] == 0, row
                    rows.setdefault(row["size"], []).append((row["time_us"], row["busbw_gbs"]))
    for line in open(f"{out}/mpi.{r}.txt"):
        b, t, bw, ok = line.split()
        assert ok == "ok", line
        mpi.setdefault(int(b), []).append((float(t), float(bw)))
    if os.path.exists(f"{out}/one.{r}.txt"):
        for line in open(f"{out}/one.{r}.txt"):
            f = line.strip().split(",")
            one.setdefault(int(f[3]), []).append((float(f[6]), float(f[8])))
def fmt(b):
    for u, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s: return f"{b // s} {u}"
    return f"{b} B"
n = int(np_)
def limit(b):
    # The busbw the memory allows ccl's shared-memory allreduce (two-shot): each rank copies
    # (n-1)/n of its input into its slot, reduces 1/n of the buffer from n inputs (n-1 reduce
    # passes of b/n), publishes it (b/n) and copies (n-1)/n of the result out, at one core's
    # rates; ranks beyond the CPUs share them.
    t = ((n - 1) / n * b * 2 + b / n) / copy + (n - 1) * (b / n) / red
    t *= max(1.0, n / cpus)
    return 2 * (n - 1) / n * b / t / 1e9
def limit_direct(b):
    # The same for the allreduce on registered buffers read in place: each rank copies its own
    # part (b/n) of its input to its output, reduces n-1 parts of b/n from the others' inputs,
    # and copies its part into the n-1 others' outputs.
    t = (b / n + (n - 1) * b / n) / copy + (n - 1) * (b / n) / red
    t *= max(1.0, n / cpus)
    return 2 * (n - 1) / n * b / t / 1e9
shm = copy > 0
regd = bool(reg)
oned = bool(one)
print(f"| size ({np_} ranks) | ccl time (us) | ccl busbw (GB/s) |"
      + (" ccl registered time (us) | ccl registered busbw (GB/s) |" if regd else "")
      + " Open MPI time (us) | Open MPI busbw (GB/s) | ccl / Open MPI |"
      + (" registered / Open MPI |" if regd else "")
      + (" oneCCL time (us) | ccl / oneCCL |" if oned else "")
      + (" memory limit busbw (GB/s) |" if shm else "")
      + (" registered limit (GB/s) |" if shm and regd else ""))
cols = 6 + (3 if regd else 0) + (2 if oned else 0) + (1 if shm else 0) + (1 if shm and regd else 0)
print("|" + "---:|" * cols)
for b in sorted(ccl):
    ct = st.median(t for t, _ in ccl[b]); cb = st.median(x for _, x in ccl[b])
    if b in mpi:
        mt = st.median(t for t, _ in mpi[b]); mb = st.median(x for _, x in mpi[b])
        row = f"| {fmt(b)} | {ct:.2f} | {cb:.3f} |"
        if regd:
            rt = st.median(t for t, _ in reg[b]); rb = st.median(x for _, x in reg[b])
            row += f" {rt:.2f} | {rb:.3f} |"
        row += f" {mt:.2f} | {mb:.3f} | {mt / ct:.2f}x |"
        if regd:
            row += f" {mt / rt:.2f}x |"
        if oned:
            if b in one:
                ot = st.median(t for t, _ in one[b])
                row += f" {ot:.2f} | {ot / ct:.2f}x |"
            else:
                row += " - | - |"
        if shm:
            row += f" {limit(b):.2f} |"
            if regd:
                row += f" {limit_direct(b):.2f} |"
        print(row)
PY
