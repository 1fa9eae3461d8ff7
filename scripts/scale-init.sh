#!/usr/bin/env bash
# scale-init.sh - what starting a job costs as it grows: N local rank processes run one 8-byte
# allreduce (`ccl-bench allreduce --np N -b 8 -e 8 -n 1 -w 0 --bind none --scale-report`), and
# a row per run says, from the ranks' and the launcher's own measurements (ccl-bench's
# --scale-report: clocks and the kernel's counts, nothing estimated):
#   wall      the launcher's whole run, from its start to the last rank's exit
#   started   when the last rank process started, from the launcher's start (launching's share)
#   ready     the slowest rank's time from the launcher's start to its communicator being ready
#   first     the slowest rank's time to the result of its first allreduce (connections included)
#   done      the slowest rank's time to the end of its benchmark (the harness's barriers,
#             checks and statistics: eight more allreduces)
#   CPU       each rank process's CPU time from its start to its first result (mean, ms)
#   root in/out  bytes the launcher's process (the rendezvous root and job monitor) read and wrote;
#             root CPU: the CPU time of its root and monitor threads
#   peers     connections per rank (most, mean); fds and sockets per rank (most)
#   rss, shm  resident and shared memory per rank (most, MiB)
# With ranks as threads, descriptors and memory are the process's divided by N, read once when
# every rank has its first result.
# Not a timed test: a table for docs/scale.md. Slow: 1,024 eager ranks take about 3 minutes here.
#
#   scripts/scale-init.sh [--quick] [N ...]      default N: 64 256 1024
#   TRANSPORTS="tcp auto"   transports to run (auto: shared memory on this host)
#   MODES="eager lazy"      CCL_CONNECT values to run (every pair at set-up, or on demand)
#   AUTO_MAX=64             largest N for auto with eager connections: every pair of ranks
#                           maps its own rings, so memory grows as N^2 (about 95 MiB per rank
#                           at 64 ranks); lazy ones map the rings their operations use
#   THREAD_SIZES="256 1024 4096"  also run N ranks as threads of one process (--threads) over
#                           real TCP sockets, lazy connections (set it empty to skip). A size
#                           whose descriptors (about 18 per rank, all in one process) would
#                           pass the open-file limit is skipped with a message.
#   OUT=target/scale-init   where the reports and the table go
# --quick (CI): N = 16 over each transport, checking that every rank reported.
# Then scripts/scale-model.py fits set-up's costs to the TCP runs (three lazy sizes or more) and
# predicts 1K-32K ranks on a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
SIZES=()
QUICK=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK=1 ;;
    *[!0-9]*|"") echo "scale-init: not a rank count: $a" >&2; exit 2 ;;
    *) SIZES+=("$a") ;;
  esac
done
if [ "${#SIZES[@]}" = 0 ]; then
  if [ "$QUICK" = 1 ]; then SIZES=(16); else SIZES=(64 256 1024); fi
fi
TRANSPORTS=${TRANSPORTS:-tcp auto}
MODES=${MODES:-eager lazy}
AUTO_MAX=${AUTO_MAX:-64}
THREAD_SIZES=${THREAD_SIZES-256 1024 4096}
[ "$QUICK" = 1 ] && THREAD_SIZES=${THREAD_SIZES:+16}
OUT=${OUT:-target/scale-init}
mkdir -p "$OUT"
cargo build --release -q --workspace --bin ccl-bench
# Each rank holds a socket per peer, and the launcher one per rank: raise the limit on open
# files as far as this shell may (the ranks inherit it).
ulimit -n 1048576 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "# $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) CPUs; open files: $(ulimit -n)"
table="$OUT/table.md"
{
  echo "| ranks | transport | connect | wall s | started s | ready s | first s | done s | CPU ms per rank | root in | root out | root CPU ms | root lines | peers (most, mean) | fds | sockets | rss MiB | shm MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$table"
status=0
# Connections closed by one job stay in the kernel for a minute (TIME_WAIT: a 1,024-rank job
# leaves about 14,000) and slow the next job's connections; each job starts once they are gone.
time_wait() { awk '/^TCP:/ { for (i = 1; i <= NF; i++) if ($i == "tw") print $(i + 1) }' /proc/net/sockstat; }
settle() {
  local waited=0
  while [ "$(time_wait)" -gt 1000 ] && [ "$waited" -lt 120 ]; do sleep 2; waited=$((waited + 2)); done
}
# run NAME MODE N [ccl-bench flags...]: one job, one row of the table.
run() {
  local t=$1 mode=$2 n=$3
  shift 3
  settle
  local report="$OUT/$t-$mode-$n$SUFFIX.jsonl" log="$OUT/$t-$mode-$n$SUFFIX.log"
  rm -f "$report"
  if ! CCL_CONNECT=$mode timeout 900 ./target/release/ccl-bench allreduce --np "$n" -b 8 -e 8 -n 1 -w 0 \
      --bind none --transport "$t" --scale-report "$report" "$@" > "$log" 2>&1; then
    echo "scale-init: $n ranks over $t ($mode$SUFFIX) failed; see $log" >&2
    tail -n 5 "$log" >&2
    status=1
    return
  fi
  python3 - "$report" "$n" "$mode" >> "$table" <<'PY' || status=1
import json, sys
path, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [json.loads(l) for l in open(path)]
ranks = [l for l in lines if "rank" in l]
launcher = [l for l in lines if l.get("launcher")]
if sorted(l["rank"] for l in ranks) != list(range(n)) or len(launcher) != 1:
    sys.exit(f"scale-init: {path}: {len(ranks)} rank lines for {n} ranks, {len(launcher)} launcher lines")
la = launcher[0]
most = lambda k: max(l[k] for l in ranks)
mib = lambda kib: f"{kib / 1024:.1f}"
def size(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
peers = [l["peers"] for l in ranks]
threads = la.get("ranks_in_process", False)
transport = ranks[0]["transport"] + (", threads" if threads else "")
# With threads, the process's bytes are every rank's as well as the root's.
root = ("(one process)",) * 3 if threads else (
    size(la["root_in"]), size(la["root_out"]), f"{la['root_cpu_us'] / 1e3:.0f}")
lines = la.get("root_lines", "-")
cpu = [l["cpu_us"] for l in ranks if l.get("cpu_us") is not None]
cpu = f"{sum(cpu) / len(cpu) / 1e3:.1f}" if cpu else "-"
print(f"| {n} | {transport} | {mode} | {la['wall_us'] / 1e6:.2f} | {most('start_us') / 1e6:.2f} "
      f"| {most('init_us') / 1e6:.2f} | {most('first_us') / 1e6:.2f} "
      f"| {most('done_us') / 1e6:.2f} | {cpu} | {root[0]} | {root[1]} | {root[2]} | {lines} "
      f"| {max(peers)}, {sum(peers) / len(peers):.1f} | {most('fds')} | {most('sockets')} "
      f"| {mib(most('rss_kib'))} | {mib(most('shmem_kib'))} |")
PY
  tail -n 1 "$table"
}
SUFFIX=
for t in $TRANSPORTS; do
 for mode in $MODES; do
  for n in "${SIZES[@]}"; do
    if [ "$t" = auto ] && [ "$mode" = eager ] && [ "$n" -gt "$AUTO_MAX" ]; then
      echo "scale-init: skipping $n eager ranks over auto (above AUTO_MAX=$AUTO_MAX: its memory grows as N^2)"
      continue
    fi
    run "$t" "$mode" "$n"
  done
 done
done
SUFFIX=-threads
for n in $THREAD_SIZES; do
  if [ $((n * 18 + 100)) -gt "$(ulimit -n)" ]; then
    echo "scale-init: skipping $n ranks as threads: about $((n * 18)) descriptors in one process, past the open-file limit of $(ulimit -n) (ulimit -Hn)"
    continue
  fi
  run tcp lazy "$n" --threads
done
echo "scale-init: table in $table"
cat "$table"
if [ "$QUICK" = 0 ] && [ "$(ls "$OUT"/tcp-lazy-*.jsonl 2>/dev/null | wc -l)" -ge 3 ]; then
  python3 scripts/scale-model.py "$OUT" | tee "$OUT/model.md" || status=1
fi
exit "$status"
