#!/usr/bin/env bash
# bench-rxe.sh - ccl allreduce over SoftRoCE against the link's limit, in ONE VM boot.
#
#   scripts/bench-rxe.sh [--mpi] [-b MIN] [-e MAX] [-n ITERS]
#
# In one scripts/rxe-vm.sh boot (2 vCPUs, rxe0 on a dummy netdev, MTU 9000):
#  1. perftest's ib_write_bw on rxe0 for every size (server and client pinned to vCPU 0 and 1,
#     as scripts/rxe-perftest.sh does), about 32 MiB per size;
#  2. ccl-bench allreduce --np 2 --transport ib -b MIN -e MAX -f 2 (default 64K .. 64M);
#  3. with --mpi (needs scripts/rxe-vm-setup.sh --with-mpi): Open MPI + UCX (rc_verbs on rxe0)
#     MPI_Allreduce of the same sizes, np=2 (scripts/peers/mpi_allreduce.c).
# Then prints, per size: ib_write_bw, ccl busbw (out-of-place, in-place), their ratio
# (best of the two over ib_write_bw), and with --mpi the MPI busbw and ccl/MPI.
# Units: MB/s = 1e6 bytes/s (perftest's MB/sec, 2^20 bytes, is converted). ccl settings travel
# from the environment (e.g. CCL_IB_SLOT_SIZE=1M scripts/bench-rxe.sh).
# Build happens on the host first (cargo build --release -p ccl-bench).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
MIN=65536 MAX=67108864 ITERS=5 MPI=0
while [ $# -gt 0 ]; do
  case "$1" in
    --mpi) MPI=1 ;;
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
echo "== ccl-bench allreduce --np 2 --transport ib"
timeout 900 target/release/ccl-bench allreduce --np 2 --transport ib -b $MIN -e $MAX -f 2 -n $ITERS -w 1 \
  | tee \$OUT/ccl.txt
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

python3 - "$OUT" "$MPI" <<'PY'
import sys, os
out, mpi = sys.argv[1], sys.argv[2] == "1"
ib = {}
for l in open(os.path.join(out, "ibbw.txt")):
    f = l.split()
    if len(f) >= 4 and f[0].isdigit():
        ib[int(f[0])] = float(f[3]) * 1.048576  # perftest MB = 2^20 bytes
ccl = {}
for l in open(os.path.join(out, "ccl.txt")):
    f = l.split()
    if len(f) == 13 and f[0].isdigit():
        # From the time columns (us): busbw = bytes / time x 2(n-1)/n, n = 2; more digits than
        # the printed GB/s.
        size = int(f[0])
        ccl[size] = (size / float(f[5]), size / float(f[9]))
mp = {}
if mpi and os.path.exists(os.path.join(out, "mpi.txt")):
    for l in open(os.path.join(out, "mpi.txt")):
        f = l.split()
        if len(f) >= 3 and f[0].isdigit():
            mp[int(f[0])] = float(f[2]) * 1000  # GB/s (1e9) -> MB/s
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
