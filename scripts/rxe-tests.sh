#!/usr/bin/env bash
# rxe-tests.sh - the verbs-transport tests on a real SoftRoCE device.
#
#   scripts/rxe-tests.sh [--no-pair] [--full]
#
# --full runs the 1M+3-element and 64 MiB sweeps with every pairing of 2 and 4 ranks and 1
# and 4 QPs (CI runs two of the four), and the allreduce under 1% loss up to 2 MiB (otherwise
# up to 256 KiB, where losses already cost retransmissions: a 2 MiB allreduce under loss takes
# about 12 s an iteration on SoftRoCE under TCG).
#
# Builds the test binaries on the host (release, `cargo test --no-run`), then
#  1. one VM boot (scripts/rxe-vm.sh) runs every `ib` test: ccl's allreduce over ib with
#     threads as ranks (2 and 4 ranks, 1 and 4 QPs, every dtype and op, counts 0/1/7/1M+3 and
#     64 MiB, in and out of place, a peer that goes away), ccl-bench's multi-process ones
#     (--np runs with -c 1, SIGKILL of a rank mid-collective), every other collective and
#     allreduce algorithm (the `ib_` tests of ccl's collectives and algos suites: 1-5 ranks,
#     every dtype, op, placement and root), the registered-buffer sweep (zero-copy sends and
#     receives: every collective and algorithm, 2 and 3 ranks, bit for bit against plain
#     buffers; ranks mixing registered and plain; received bytes counted in place) and
#     ccl-ibverbs' endpoint tests (the Endpoint conformance suite every transport runs, with
#     1 and 4 QPs, round-robin and split, and over two ports striped (rxe0 and rxe1); grants
#     larger and smaller than a send);
#  2. unless --no-pair, two VMs joined by a link (scripts/rxe-vm-pair.sh), one rank in each,
#     run a checked allreduce over rxe between the two "hosts", then two ranks in each VM
#     (shared memory inside each, verbs across) a checked hiershm allreduce with odd
#     counts, then in the same boot the
#     runs of scripts/rxe-entropy.sh (1 and 4 QPs per connection, round-robin and split,
#     captured with tcpdump: each data QP must leave with its own UDP source port); then,
#     in a second boot, a checked allreduce with 1% packet loss (netem) each way, and the
#     link set down mid-run, which must fail both ranks naming the other within the timeout;
#     before those, in the same boot, four ranks (two per VM) whose link between the VMs stops
#     delivering (netem delay) must each fail with a verdict naming that pair
#     (scripts/rxe-link-verdict.sh), and before that, with a second link and rxe1 in each VM,
#     a checked allreduce loop over verbs on both ports while one link is cut for 6 s: no
#     error, nothing wrong (scripts/rxe-planes.sh).
# On a host whose kernel has rdma_rxe and an rxe device up (scripts/rxe-setup.sh), set
# CCL_RXE_TESTS_DIRECT=1 to run step 1 without a VM.
# The verbs tests are #[ignore]d on a host without a device; step 1 runs them with
# --include-ignored, and fails if a test binary is missing or runs no test.
# Ends with "rxe-tests: N passed, M failed", counting the tests of step 1 and the runs of step 2
# (the two-VM allreduce, each entropy run, the link faults, the link verdict);
# exit status 0 when everything passed.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
PAIR=1
FULL=0
for a in "$@"; do
  case "$a" in
    --no-pair) PAIR=0 ;;
    --full) FULL=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "rxe-tests: unknown argument $a" >&2; exit 2 ;;
  esac
done
log() { echo "[rxe-tests] $*" >&2; }

mkdir -p target/rxe-tests
LIST=target/rxe-tests/bins
log "building test binaries (release)"
# The whole workspace, as the test script's `cargo test --release --workspace` builds it: the
# same features, so after that run nothing is built again (a build of only the three packages
# resolves features differently and recompiled everything, about 6 minutes of CI).
if ! cargo test --release --no-run --workspace --message-format=json 2>target/rxe-tests/build.log \
  | python3 -c '
import sys, json
for l in sys.stdin:
    try:
        m = json.loads(l)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        t = m["target"]
        print(t["name"], t["kind"][0], m["executable"])
' > "$LIST"; then
  cat target/rxe-tests/build.log >&2
  log "build failed"
  exit 1
fi
# --workspace, as above: `-p ccl-bench` would build a second copy of the library.
cargo build --release -q --workspace --bin ccl-bench --bin allreduce_loop || exit 1

# The guest part: run the ib tests of each binary, one test at a time (the VM has 2 vCPUs).
# They are #[ignore]d (they need a device), hence --include-ignored. A binary that runs no test
# fails, and so does a missing one: a run that executed nothing must not pass. The guest leaves
# its test counts in target/rxe-tests/guest-counts for the closing line.
cat > target/rxe-tests/guest.sh <<GUEST
#!/usr/bin/env bash
set -u
$([ "$FULL" = 1 ] && echo "export CCL_IB_FULL=1")
GUEST
cat >> target/rxe-tests/guest.sh <<'GUEST'
out=${TMPDIR:-/tmp}/rxe-test.out
tests_ok=0 tests_bad=0 bad=0 ran=""
failed_list=target/rxe-tests/guest-failed
: > "$failed_list"
run() {
  local name=$1; shift
  echo "== $name"
  local t0=$(date +%s)
  # Only stdout is kept for the summary: libtest writes "test result: ok" in pieces, and a
  # warning another thread writes to stderr in between would hide the counts.
  "$@" | tee "$out"
  local rc=${PIPESTATUS[0]}
  # libtest's summary: "test result: ok. 3 passed; 0 failed; 0 ignored; ..."
  local sum=$(grep -E '^test result: ' "$out" | tail -n 1)
  local p=$(sed -nE 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\1/p' <<<"$sum")
  local f=$(sed -nE 's/.* ([0-9]+) passed; ([0-9]+) failed.*/\2/p' <<<"$sum")
  p=${p:-0} f=${f:-0}
  if [ -z "$sum" ]; then
    echo "FAILED: $name: exit $rc without a test summary"; f=$((f + 1))
  elif [ $((p + f)) = 0 ]; then
    echo "FAILED: $name ran no test"; bad=1
  elif [ "$rc" != 0 ]; then
    echo "FAILED: $name"; [ "$f" = 0 ] && bad=1
  fi
  tests_ok=$((tests_ok + p)) tests_bad=$((tests_bad + f))
  # The failing tests' names, for the closing line: CI shows only the end of the output.
  sed -nE 's/^test (.*) \.\.\. FAILED$/\1/p' "$out" >> "$failed_list"
  [ "$rc" != 0 ] && [ "$f" = 0 ] && echo "$name (exit $rc)" >> "$failed_list"
  echo "== $name: $p ran and passed, $f failed ($(( $(date +%s) - t0 )) s)"
}
while read -r name kind exe; do
  case "$name/$kind" in
    ib/test) run "$name ($exe)" "$exe" --include-ignored --test-threads=1 ;;
    suite/test) run "$name (ib_*)" "$exe" --include-ignored --test-threads=1 ib_ ;;
    endpoint/test) run "$name" "$exe" --include-ignored --test-threads=1 ;;
    *) continue ;;
  esac
  ran="$ran $name"
done < target/rxe-tests/bins
# ccl's suite (its ib module and the ib_ sweeps of collectives, algos and registered buffers),
# ccl-bench's ib tests, the endpoint tests.
if [ "$(tr ' ' '\n' <<<"$ran" | sort | xargs)" != "endpoint ib suite" ]; then
  echo "FAILED: expected the test binaries endpoint ib suite, ran:$ran"; bad=1
fi
echo "$tests_ok $tests_bad" > target/rxe-tests/guest-counts
echo "guest tests: $tests_ok passed, $tests_bad failed"
[ "$tests_bad" = 0 ] && [ "$bad" = 0 ]
GUEST
chmod +x target/rxe-tests/guest.sh

# Counted in the closing line: every test the guest ran, then each two-VM run.
pass=0 fail=0
rm -f target/rxe-tests/guest-counts target/rxe-tests/guest-failed
failed=""
# Every failure is named in the closing line, which is what CI's log keeps.
failed() { fail=$((fail + 1)); failed="$failed; $1"; log "$1 FAILED"; }
t0=$(date +%s)
if [ "${CCL_RXE_TESTS_DIRECT:-0}" = 1 ]; then
  target/rxe-tests/guest.sh
else
  # rxe1 beside rxe0 (each on a dummy netdev): the two-port endpoint test stripes across both.
  CCL_RXE_VM_PLANES=2 CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-900} scripts/rxe-vm.sh target/rxe-tests/guest.sh
fi
guest_rc=$?
if read -r gp gf < target/rxe-tests/guest-counts 2>/dev/null; then
  pass=$((pass + gp)) fail=$((fail + gf))
  [ -f target/rxe-tests/guest-failed ] && while read -r t; do failed="$failed; in the VM: $t"; done < target/rxe-tests/guest-failed
  # A failure the test counts do not show: a binary that ran no test or is missing.
  [ "$guest_rc" != 0 ] && [ "$gf" = 0 ] && failed "the single-VM run (exit $guest_rc)"
else
  failed "the single-VM run (no test counts, exit $guest_rc)"
fi
log "single-VM tests: $(( $(date +%s) - t0 )) s"

if [ "$PAIR" = 1 ]; then
  t0=$(date +%s)
  # Rank 0 (the rendezvous root) in VM B, rank 1 in VM A; A's bootstrap retries until B is up.
  # Then, in the same boot, the source-port captures of scripts/rxe-entropy.sh.
  cmd='export CCL_WORLD_SIZE=2 CCL_COMM_ID=192.0.2.2:29555 CCL_SECRET=rxe-pair CCL_TRANSPORT=ib \
         CCL_SOCKET_IFNAME="=$RXE_NETDEV" CCL_TIMEOUT=120 CCL_DEBUG=info;
       if [ "$RXE_ROLE" = b ]; then export CCL_RANK=0; else export CCL_RANK=1; fi;
       timeout 240 target/release/ccl-bench allreduce -b 8 -e 1M -f 8 -n 2 -w 1 -c 1 > $TMPDIR/out 2> $TMPDIR/err;
       rc=$?; grep -v "is not a ccl setting" $TMPDIR/err | grep -E "ERROR|error|ready|verbs" ; cat $TMPDIR/out;
       if [ "$CCL_RANK" = 0 ]; then grep -q "Out of bounds values : 0 OK" $TMPDIR/out || rc=1; fi;
       echo "RESULT two-VM allreduce: exit $rc";
       h=2; [ "$RXE_ROLE" = b ] && h=0; hp=();
       for i in 0 1; do
         CCL_WORLD_SIZE=4 CCL_RANK=$((h + i)) CCL_COMM_ID=192.0.2.2:29558 CCL_SECRET=rxe-pair4 CCL_TRANSPORT=auto \
           timeout 300 target/release/ccl-bench allreduce --algo hiershm -b 4 -e 2M -f 5 -n 2 -w 1 -c 1 \
           > $TMPDIR/h$i.out 2> $TMPDIR/h$i.err & hp+=($!);
       done;
       hrc=0; for p in "${hp[@]}"; do wait $p || hrc=1; done;
       for i in 0 1; do
         grep -q "2 hosts x 2 ranks: shm within hosts, ib across" $TMPDIR/h$i.err || { echo "not shm within, ib across"; hrc=1; };
         grep -q "host memory: 2 ranks of this host share a segment" $TMPDIR/h$i.err || { echo "no host memory"; hrc=1; };
         grep -E "ERROR|error|ready|host memory" $TMPDIR/h$i.err | grep -v "is not a ccl setting";
       done;
       if [ $h = 0 ]; then cat $TMPDIR/h0.out; grep -q "Out of bounds values : 0 OK" $TMPDIR/h0.out || hrc=1; fi;
       echo "RESULT two-VM 2x2 hiershm allreduce: exit $hrc"; [ $hrc = 0 ] || rc=1;
       (unset CCL_COMM_ID CCL_SECRET CCL_DEBUG CCL_RANK; scripts/rxe-entropy.sh --guest); e=$?;
       [ $rc = 0 ] && [ $e = 0 ]'
  CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-900} scripts/rxe-vm-pair.sh "$cmd" "$cmd" 2>&1 \
    | tee target/rxe-tests/pair.log
  pair_rc=${PIPESTATUS[0]}
  if [ "$(grep -c 'RESULT two-VM allreduce: exit 0$' target/rxe-tests/pair.log)" = 2 ]; then
    pass=$((pass + 1))
  else
    failed "two-VM allreduce"
  fi
  # Two ranks per VM: shared memory inside each VM, verbs across, hiershm forced.
  if [ "$(grep -c 'RESULT two-VM 2x2 hiershm allreduce: exit 0$' target/rxe-tests/pair.log)" = 2 ]; then
    pass=$((pass + 1))
  else
    failed "two-VM 2 ranks per VM (hiershm)"
  fi
  # VM A captured and checked each entropy run; B's side of a run only has to succeed.
  ep=$(grep -c '^\[A\] PASSED: qps' target/rxe-tests/pair.log)
  ef=$(grep -c '^\[[AB]\] FAILED: qps' target/rxe-tests/pair.log)
  if [ "$ep" != 3 ] && [ "$ef" = 0 ]; then
    ef=1; log "the entropy runs did not all report (exit $pair_rc)"
  fi
  pass=$((pass + ep)) fail=$((fail + ef))
  [ "$ef" = 0 ] || { failed="$failed; $ef entropy run(s) (see target/rxe-entropy/)"; log "entropy runs FAILED: see target/rxe-entropy/"; }
  log "two-VM allreduce and entropy: $(( $(date +%s) - t0 )) s"

  # Faults on the link between the two VMs (one boot). First a link that stops delivering
  # while every rank is healthy (netem delay on one VM's RoCE packets, four ranks): every
  # rank's verdict names the pair across the link (scripts/rxe-link-verdict.sh). Then 1% packet
  # loss each way must leave results correct (RC retransmits); the link set down mid-run must
  # fail both ranks with an error naming the other, within the timeout, not hang.
  # First, in the same boot (each VM with a second NIC and rxe1 on it), verbs over both ports
  # while one link is cut (scripts/rxe-planes.sh).
  t0=$(date +%s)
  mkdir -p target/rxe-link-verdict target/rxe-planes
  rm -f target/rxe-link-verdict/a-ready target/rxe-planes/a-ready target/rxe-planes/cut
  if [ "$FULL" = 1 ]; then loss_max=4M; else loss_max=512K; fi
  cmd='LOSS_MAX='$loss_max';
       (scripts/rxe-planes.sh --guest);
       (scripts/rxe-link-verdict.sh --guest); echo "RESULT link verdict: exit $?";
       [ "$RXE_ROLE" = a ] && tc qdisc del dev "$RXE_NETDEV" root 2>/dev/null;
       export CCL_WORLD_SIZE=2 CCL_SECRET=rxe-faults CCL_TRANSPORT=ib CCL_SOCKET_IFNAME="=$RXE_NETDEV" \
         CCL_IB_HCA="=$RXE_DEV";
       if [ "$RXE_ROLE" = b ]; then export CCL_RANK=0; else export CCL_RANK=1; fi;
       modprobe sch_netem || exit 1;
       tc qdisc add dev "$RXE_NETDEV" root netem loss 1% || exit 1;
       echo "netem: $(tc qdisc show dev $RXE_NETDEV)";
       CCL_COMM_ID=192.0.2.2:29556 CCL_TIMEOUT=120 timeout 400 target/release/ccl-bench allreduce \
         -b 8 -e $LOSS_MAX -f 8 -n 3 -w 1 -c 1 > $TMPDIR/loss 2>&1; rc=$?;
       cat $TMPDIR/loss | grep -v "is not a ccl setting";
       if [ "$CCL_RANK" = 0 ]; then grep -q "Out of bounds values : 0 OK" $TMPDIR/loss || rc=1; fi;
       [ $rc = 0 ] || { echo "FAILED: allreduce under 1% loss (rc $rc)"; exit 1; };
       echo "PASSED: allreduce under 1% loss, results checked";
       tc qdisc del dev "$RXE_NETDEV" root;
       if [ "$RXE_ROLE" = a ]; then (sleep 8; ip link set dev "$RXE_NETDEV" down; echo "link down at $(date +%s)") & fi;
       t=$(date +%s);
       CCL_COMM_ID=192.0.2.2:29557 CCL_TIMEOUT=10 timeout 150 target/release/ccl-bench allreduce \
         -b 1M -e 1M -n 1000000 -w 0 -c 1 > $TMPDIR/down 2>&1; rc=$?;
       grep -v "is not a ccl setting" $TMPDIR/down | tail -5;
       echo "exit $rc after $(( $(date +%s) - t )) s";
       if [ $rc = 0 ] || [ $rc = 124 ]; then echo "FAILED: link down gave exit $rc"; exit 1; fi;
       peer=$(( 1 - CCL_RANK ));
       grep -q "peer $peer" $TMPDIR/down || { echo "FAILED: the error does not name peer $peer"; exit 1; };
       echo "PASSED: link down failed rank $CCL_RANK naming peer $peer"'
  CCL_RXE_VM_PLANES=2 CCL_RXE_VM_TIMEOUT=${CCL_RXE_VM_TIMEOUT:-900} \
    scripts/rxe-vm-pair.sh "$cmd" "$cmd" 2>&1 | tee target/rxe-tests/faults.log
  if scripts/rxe-planes.sh --check target/rxe-tests/faults.log; then
    pass=$((pass + 1))
  else
    failed "two-VM planes (a link cut under verbs on two ports)"
  fi
  if [ "$(grep -c '^\[[AB]\] PASSED: link verdict' target/rxe-tests/faults.log)" = 4 ]; then
    pass=$((pass + 1))
  else
    failed "two-VM link verdict"
  fi
  if [ "$(grep -c '^\[[AB]\] PASSED: link down failed rank' target/rxe-tests/faults.log)" = 2 ]; then
    pass=$((pass + 1))
  else
    failed "two-VM link faults"
  fi
  log "two-VM planes, link verdict and link faults: $(( $(date +%s) - t0 )) s"
fi
echo "rxe-tests: $pass passed, $fail failed${failed:+ (${failed#; })}"
[ "$fail" = 0 ]
