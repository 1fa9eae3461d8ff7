#!/usr/bin/env bash
# bench-rxe.sh - ccl allreduce over SoftRoCE against the link's limit, in ONE VM boot.
#
#   scripts/bench-rxe.sh [--mpi] [--registered] [-b MIN] [-e MAX] [-n ITERS]
#
# In one scripts/rxe-vm.sh boot (2 vCPUs, rxe0 on a dummy netdev, MTU 9000):
#  1. perftest's ib_write_bw on rxe0 for every size (server and client pinned to vCPU 0 and 1,
#     as scripts/rxe-perftest.sh does), about 32 MiB per size;
#  2. ccl-bench allreduce --np 2 --transport ib -b MIN -e MAX -f 2 (default 64K .. 64M);
#  3. with --mpi (needs scripts/rxe-vm-setup.sh --with-mpi): Open MPI + UCX (rc_verbs on rxe0)
#     MPI_Allreduce of the same sizes, np=2 (scripts/peers/mpi_allreduce.c).
#  4. with --registered: also `ib_write_bw -b` (both directions at once; perftest reports the
#     sum, the table shows it per direction) and ccl-bench --registered (buffers from
#     Communicator::alloc: zero-copy sends), same sizes. A 2-rank allreduce moves busbw bytes
#     per second each way at once, so its limit is the two-way rate per direction.
# Then prints, per size: ib_write_bw, ccl busbw (out-of-place, in-place), their ratio
# (best of the two over ib_write_bw), with --registered the per-direction `-b` rate, ccl's
# registered busbw and its ratio to the `-b` rate (and the plain one's), and with --mpi the
# MPI busbw and ccl/MPI.
# Units: MB/s = 1e6 bytes/s (perftest's MB/sec, 2^20 bytes, is converted). ccl settings travel
# from the environment (e.g. CCL_IB_SLOT_SIZE=1M scripts/bench-rxe.sh).
# Build happens on the host first (cargo build --release -p ccl-bench).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
MIN=65536 MAX=67108864 ITERS=5 MPI=0 REG=0
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi) MPI=1 ;;
    --registered) REG=1 ;;
    -b) MIN=$2; shift ;;
    -e) MAX=$2; shift ;;
    -n) ITERS=$2; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "bench-rxe: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release -q -p ccl-bench || exit 1
mkdir -p target/bench-rxe
OUT=target/bench-rxe
rm -f "$OUT"/*.txt
if [ "$MPI" = 1 ]; then
  command -v mpicc.openmpi >/dev/null || { echo "bench-rxe: --mpi needs Open MPI (scripts/rxe-vm-setup.sh --with-mpi)" >&2; exit 2; }
  mpicc.openmpi -O2 -o "$OUT/mpi_allreduce" scripts/peers/mpi_allreduce.c || exit 1
fi

cat > "$OUT/guest.sh" <<GUEST
#!/usr/bin/env bash
cd "$PWD"
OUT=$OUT
echo "== ib_write_bw"
for ((s = $MIN; s <= $MAX; s *= 2)); do
  n=\$(( 33554432 / s )); [ \$n -lt 5 ] && n=5; [ \$n -gt 1000 ] && n=1000
  scripts/rxe-perftest.sh -n \$n \$s | grep -E '^ *[0-9]' | tee -a \$OUT/ibbw.txt
done
if [ $REG = 1 ]; then
  echo "== ib_write_bw -b"
  for ((s = $MIN; s <= $MAX; s *= 2)); do
    n=\$(( 33554432 / s )); [ \$n -lt 5 ] && n=5; [ \$n -gt 1000 ] && n=1000
    scripts/rxe-perftest.sh -b -n \$n \$s | grep -E '^ *[0-9]' | tee -a \$OUT/ibbw-bidir.txt
  done
fi
echo "== ccl-bench allreduce --np 2 --transport ib"
timeout 900 target/release/ccl-bench allreduce --np 2 --transport ib -b $MIN -e $MAX -f 2 -n $ITERS -w 1 \
  | tee \$OUT/ccl.txt
if [ $REG = 1 ]; then
  echo "== ccl-bench allreduce --np 2 --transport ib --registered"
  timeout 900 target/release/ccl-bench allreduce --np 2 --transport ib -b $MIN -e $MAX -f 2 -n $ITERS -w 1 \
    --registered | tee \$OUT/ccl-reg.txt
fi
if [ $MPI = 1 ]; then
  echo "== Open MPI + UCX (rc_verbs on rxe0) MPI_Allreduce np=2"
  timeout 900 mpirun.openmpi --oversubscribe -np 2 --mca pml ucx --mca btl ^vader,tcp,openib,uct,ofi \
    --mca osc ^ucx -x UCX_NET_DEVICES -x UCX_UD_ETH_DGID_CHECK -x UCX_TLS=self,rc \
    --bind-to core \$OUT/mpi_allreduce $MIN $MAX 2 $ITERS 1 | tee \$OUT/mpi.txt
fi
GUEST
chmod +x "$OUT/guest.sh"
CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-1500} scripts/rxe-vm.sh "$OUT/guest.sh"
rc=$?
[ "$rc" = 0 ] || { echo "bench-rxe: the VM run failed ($rc)" >&2; exit "$rc"; }

python3 - "$OUT" "$MPI" "$REG" <<'PY'
import sys, os
out, mpi, reg = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
def perftest(name, div):
    r = {}
    for l in open(os.path.join(out, name)):
        f = l.split()
        if len(f) >= 4 and f[0].isdigit():
            r[int(f[0])] = float(f[3]) * 1.048576 / div  # perftest MB = 2^20 bytes
    return r
def bench(name):
    r = {}
    for l in open(os.path.join(out, name)):
        f = l.split()
        if len(f) == 13 and f[0].isdigit():
            # From the time columns (us): busbw = bytes / time x 2(n-1)/n, n = 2; more digits
            # than the printed GB/s.
            size = int(f[0])
            r[size] = (size / float(f[5]), size / float(f[9]))
    return r
ib = perftest("ibbw.txt", 1)
ccl = bench("ccl.txt")
mp = {}
if mpi and os.path.exists(os.path.join(out, "mpi.txt")):
    for l in open(os.path.join(out, "mpi.txt")):
        f = l.split()
        if len(f) >= 3 and f[0].isdigit():
            mp[int(f[0])] = float(f[2]) * 1000  # GB/s (1e9) -> MB/s
if reg:
    bidir = perftest("ibbw-bidir.txt", 2)  # the sum of both directions -> per direction
    cr = bench("ccl-reg.txt")
    print("# MB/s (1e6 B/s); ib -b is ib_write_bw -b per direction; ccl columns are the better of")
    print("# out-of-place and in-place busbw, plain and registered buffers")
    hdr = f"{'bytes':>10} {'ib one-way':>10} {'ib -b':>7} {'ccl plain':>9} {'ccl reg':>8} {'plain/-b':>8} {'reg/-b':>7} {'reg/plain':>9}"
    if mpi:
        hdr += f" {'mpi':>7} {'reg/mpi':>7}"
    print(hdr)
    for s in sorted(ccl):
        p, r, b, o = max(ccl[s]), max(cr.get(s, (float('nan'),))), bidir.get(s, float('nan')), ib.get(s, float('nan'))
        line = f"{s:>10} {o:>10.1f} {b:>7.1f} {p:>9.1f} {r:>8.1f} {p / b:>8.2f} {r / b:>7.2f} {r / p:>9.2f}"
        if mpi:
            m = mp.get(s, float('nan'))
            line += f" {m:>7.1f} {r / m:>7.2f}"
        print(line)
    sys.exit(0)
hdr = f"{'bytes':>10} {'ib_write_bw':>11} {'ccl oop':>9} {'ccl ip':>9} {'ccl/ib':>7}"
if mpi:
    hdr += f" {'mpi':>9} {'ccl/mpi':>8}"
print("# busbw and ib_write_bw in MB/s (1e6 B/s); ccl/ib uses the better of out-of-place and in-place")
print(hdr)
for s in sorted(ccl):
    o, i = ccl[s]
    best = max(o, i)
    b = ib.get(s)
    line = f"{s:>10} {b if b else float('nan'):>11.1f} {o:>9.1f} {i:>9.1f} {best / b if b else float('nan'):>7.2f}"
    if mpi:
        m = mp.get(s)
        line += f" {m if m else float('nan'):>9.1f} {best / m if m else float('nan'):>8.2f}"
    print(line)
PY
