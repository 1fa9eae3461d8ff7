#!/usr/bin/env bash
# Checks the simulator against what runs here: a small two-tier tree of network namespaces
# (hosts under two rack bridges, the racks under a spine bridge), veth pairs, and `tc` rate
# limits on every host link and on each rack's uplink. ccl-bench measures allreduce over TCP
# with one rank per namespace; `ccl-bench sim` predicts the same jobs on the same fabric. Prints
# a Markdown table of measured and simulated time per operation (docs/scale.md).
#
#   sudo scripts/sim-validate.sh              # 4 and 8 ranks, ring/tree/rd, 3 sizes
#   RANKS="4" ALGOS="ring tree" SIZES="1M 4M" scripts/sim-validate.sh
#
# Needs root, iproute2 (ip, tc, bridge) and a built target/release/ccl-bench. Everything it
# creates is named ccl-sv-* and removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS=${RANKS:-"4 8"}
ALGOS=${ALGOS:-"ring tree rd"}
SIZES=${SIZES:-"1M 4M 16M"}
NIC_MBIT=${NIC_MBIT:-400}      # every host link, each direction
UPLINK_MBIT=${UPLINK_MBIT:-200} # each rack's uplink to the spine, each direction
ITERS=${ITERS:-5}
BENCH=${BENCH:-target/release/ccl-bench}
OUT=${OUT:-/tmp/ccl-sim-validate}
PREFIX=ccl-sv

if [ "$(id -u)" != 0 ]; then
    echo "sim-validate: needs root (network namespaces)" >&2
    exit 2
fi
for t in ip tc; do
    command -v $t >/dev/null || { echo "sim-validate: needs $t (iproute2)" >&2; exit 2; }
done
[ -x "$BENCH" ] || cargo build --release -p ccl-bench
mkdir -p "$OUT"

cleanup() {
    for ns in $(ip netns list | awk '{print $1}' | grep "^$PREFIX-" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
cleanup

# Shapes both directions of a veth pair (one end in each namespace) to RATE Mbit/s. A token
# bucket with a queue of about 20 ms at the rate (deep enough for TCP to fill the link).
shape() {
    local ns=$1 dev=$2 rate=$3
    # A packet larger than the bucket is dropped, and veths pass 64 KiB segments: the bucket
    # holds at least two of them.
    local burst=$((rate * 125)) # 1 ms of bytes
    [ $burst -lt 131072 ] && burst=131072
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${rate}mbit" burst "$burst" latency 20ms
}

# hosts: h0..h(H-1), racks r0, r1 (H/2 hosts each), spine s.
build_net() {
    local hosts=$1
    ip netns add $PREFIX-s
    ip netns exec $PREFIX-s ip link add name sw type bridge
    ip netns exec $PREFIX-s ip link set sw up
    for r in 0 1; do
        ip netns add $PREFIX-r$r
        ip netns exec $PREFIX-r$r ip link add name sw type bridge
        ip netns exec $PREFIX-r$r ip link set sw up
        # Rack uplink: r$r/up <-> s/r$r, shaped both ways.
        ip link add $PREFIX-u$r type veth peer name $PREFIX-d$r
        ip link set $PREFIX-u$r netns $PREFIX-r$r
        ip link set $PREFIX-d$r netns $PREFIX-s
        ip netns exec $PREFIX-r$r ip link set $PREFIX-u$r master sw up
        ip netns exec $PREFIX-s ip link set $PREFIX-d$r master sw up
        shape $PREFIX-r$r $PREFIX-u$r "$UPLINK_MBIT"
        shape $PREFIX-s $PREFIX-d$r "$UPLINK_MBIT"
    done
    for ((h = 0; h < hosts; h++)); do
        local r=$((h * 2 / hosts))
        ip netns add $PREFIX-h$h
        ip netns exec $PREFIX-h$h ip link set lo up
        ip link add $PREFIX-e$h type veth peer name $PREFIX-p$h
        ip link set $PREFIX-e$h netns $PREFIX-h$h
        ip link set $PREFIX-p$h netns $PREFIX-r$r
        ip netns exec $PREFIX-h$h ip addr add 10.77.0.$((h + 1))/24 dev $PREFIX-e$h
        ip netns exec $PREFIX-h$h ip link set $PREFIX-e$h up
        ip netns exec $PREFIX-r$r ip link set $PREFIX-p$h master sw up
        shape $PREFIX-h$h $PREFIX-e$h "$NIC_MBIT"
        shape $PREFIX-r$r $PREFIX-p$h "$NIC_MBIT"
    done
}

# One measurement: ALGO over HOSTS ranks (one per namespace), every size; JSON to $3.
measure() {
    local algo=$1 hosts=$2 json=$3
    local topo="$OUT/topo-$hosts.txt"
    : > "$topo"
    for ((h = 0; h < hosts; h++)); do
        echo "$h h$h r$((h * 2 / hosts)) z" >> "$topo"
    done
    local port=$((29500 + RANDOM % 1000))
    local pids=()
    local min max
    min=$(echo $SIZES | awk '{print $1}')
    max=$(echo $SIZES | awk '{print $NF}')
    for ((h = 0; h < hosts; h++)); do
        local extra=()
        [ $h = 0 ] && extra=(--json "$json")
        ip netns exec $PREFIX-h$h env CCL_RANK=$h CCL_WORLD_SIZE=$hosts \
            CCL_COMM_ID=10.77.0.1:$port CCL_SOCKET_IFNAME==$PREFIX-e$h CCL_TOPO_FILE="$topo" \
            CCL_TIMEOUT=120 "$BENCH" allreduce --transport tcp --algo "$algo" -b "$min" -e "$max" -f 4 \
            -n "$ITERS" -w 2 -c 0 "${extra[@]}" > "$OUT/rank$h.log" 2>&1 &
        pids+=($!)
    done
    local ok=0
    for p in "${pids[@]}"; do wait "$p" || ok=1; done
    if [ $ok != 0 ]; then
        echo "sim-validate: $algo over $hosts ranks failed:" >&2
        cat "$OUT/rank0.log" >&2
        return 1
    fi
}

# tc counts whole frames: TCP carries 1448 payload bytes per 1514-byte frame at MTU 1500.
GOODPUT=$(awk 'BEGIN{print 1448/1514}')

# The fabric the simulator gets: the same tree and rates, this machine's measured
# small-message cost as the per-op overhead, its measured reduction rate.
fabric() {
    local hosts=$1 overhead_us=$2
    cat <<EOF
ranks-per-host 1
hosts-per-rack $((hosts / 2))
racks-per-zone 2
zones 1
nic-gbps $(awk "BEGIN{print $NIC_MBIT/1000*$GOODPUT}")
host-gbps 100
spines 1
rack-uplink-gbps $(awk "BEGIN{print $UPLINK_MBIT/1000*$GOODPUT}")
hop-latency-us 0
op-overhead-us $overhead_us
chunk 131072
qps 1
EOF
}

echo "| ranks | algo | size | measured (us) | simulated (us) | sim / measured |"
echo "|---|---|---|---|---|---|"
for hosts in $RANKS; do
    cleanup
    build_net "$hosts"
    for algo in $ALGOS; do
        measure "$algo" "$hosts" "$OUT/$algo-$hosts.json"
    done
    # Per-op software cost on this machine: rd at 8 B is log2(n) exchanges, each one op plus
    # the (software) trip through veth and bridges; the model gets all of it as overhead.
    SIZES_SAVE=$SIZES
    SIZES="8 8" measure rd "$hosts" "$OUT/rd8-$hosts.json"
    SIZES=$SIZES_SAVE
    over=$(python3 -c "
import json,math
r=json.load(open('$OUT/rd8-$hosts.json'))['results'][0]
steps=math.log2($hosts)
print(round(max(r['time_us'] / steps, 1.0), 1))")
    fabric "$hosts" "$over" > "$OUT/fabric-$hosts.txt"
    for algo in $ALGOS; do
        for size in $SIZES; do
            sim=$("$BENCH" sim --fabric "$OUT/fabric-$hosts.txt" --algo "$algo" -b "$size" -e "$size" \
                --schedules built --measure-reduce --json "$OUT/sim.json" 2>/dev/null >/dev/null;
                python3 -c "import json; print(json.load(open('$OUT/sim.json'))[0]['time_us'])")
            python3 - "$OUT/$algo-$hosts.json" "$size" "$sim" "$hosts" "$algo" <<'PY'
import json, sys
path, size, sim, hosts, algo = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
mult = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
b = int(size[:-1]) * mult[size[-1]] if size[-1] in mult else int(size)
rows = [r for r in json.load(open(path))['results'] if r['size'] == b and r['placement'] == 'out-of-place']
m = rows[0]['time_us']
print(f"| {hosts} | {algo} | {size} | {m:.0f} | {sim:.0f} | {sim / m:.2f} |")
PY
        done
    done
done
