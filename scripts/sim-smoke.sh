#!/usr/bin/env bash
# One small simulator experiment for CI (seconds): a ring over 512 ranks whose hosts are
# scattered over 4 racks at 2:1, with 1 and 8 QPs per connection under ECMP and with spraying.
# Fails unless the sweep runs, writes its JSON and plot, and more QPs never lose bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q --workspace --bin ccl-bench
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
target/release/ccl-bench sim --fabric scripts/sim/zone.fabric --racks 4 --oversub 2 \
    --placement scattered --algo ring -b 64M -e 64M --qps 1,8 --hashing ecmp,spray \
    --seeds 1,2 --x qps --json "$out/smoke.json" --plot "$out/smoke.svg"
python3 - "$out/smoke.json" <<'PY'
import json, sys
runs = json.load(open(sys.argv[1]))
assert len(runs) == 8, len(runs)
bw = {}
for r in runs:
    assert r["ranks"] == 512 and r["busbw_gbs"] > 0, r
    bw.setdefault((r["hashing"], r["seed"]), {})[r["qps"]] = r["busbw_gbs"]
for k, v in bw.items():
    assert v[8] >= v[1] * 0.999, (k, v)
    print(f"{k[0]:6} seed {k[1]}: 1 QP {v[1]:.2f} GB/s, 8 QPs {v[8]:.2f} GB/s")
PY
grep -q "</svg>" "$out/smoke.svg"
echo "sim-smoke: ok"
