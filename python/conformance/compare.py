"""Compares runs of PyTorch's distributed tests on Gloo and on ccl (dist_suite.py --json).

    python python/conformance/compare.py RESULTS_DIR [--known docs/torch.md]

RESULTS_DIR holds gloo-N.json and oxccl-N.json for each world size N. Prints, per world size, how
many tests pass, fail and are skipped on each backend, and every test that passes on Gloo but
not on ccl. Those must be listed, with a reason, in the table of the section "Known differences
from Gloo" of docs/torch.md (rows ``| test_name | world sizes | reason |``); the exit status is 1
if one is not, or if a listed test now passes on ccl wherever it passes on Gloo (the list is out
of date). Tests ccl passes and Gloo does not are reported too.

--common compares only the tests both runs of a world size have outcomes for (runs stopped part
way: dist_suite.py writes its report after every test); it says how many it left out.
"""

import argparse
import json
import re
import sys
from pathlib import Path

SECTION = "## Known differences from Gloo"


def known_differences(md):
    """{test name: reason} from the section's table."""
    text = Path(md).read_text()
    if SECTION not in text:
        raise SystemExit(f"{md} has no section '{SECTION}'")
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in body.splitlines():
        m = re.match(r"\|\s*`?(test_\w+)`?\s*\|\s*([^|]*)\|\s*(.*?)\s*\|\s*$", line)
        if m:
            out[m.group(1)] = (m.group(2).strip(), m.group(3))
    return out


def load(path):
    with open(path) as f:
        return json.load(f)["tests"]


def outcome(tests, name):
    return tests.get(name, {}).get("outcome", "absent")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--known", default=str(Path(__file__).resolve().parents[2] / "docs/torch.md"))
    ap.add_argument(
        "--common", action="store_true", help="only the tests both backends' runs reached"
    )
    args = ap.parse_args()
    known = known_differences(args.known)
    res = Path(args.results)
    sizes = sorted(
        int(p.stem.split("-")[1])
        for p in res.glob("gloo-*.json")
        if (res / f"oxccl-{p.stem.split('-')[1]}.json").exists()
    )
    if not sizes:
        raise SystemExit(f"no gloo-N.json with a matching oxccl-N.json in {res}")
    bad = False
    still_listed = set(known)
    gloo_passed = set()
    for n in sizes:
        gloo, ccl = load(res / f"gloo-{n}.json"), load(res / f"oxccl-{n}.json")
        print(f"\n== world size {n}")
        if args.common:
            both = set(gloo) & set(ccl)
            left = len(set(gloo) | set(ccl)) - len(both)
            gloo = {k: v for k, v in gloo.items() if k in both}
            ccl = {k: v for k, v in ccl.items() if k in both}
            print(f"  {len(both)} tests reached by both runs ({left} reached by one only, left out)")
        for name, t in (("gloo", gloo), ("oxccl", ccl)):
            c = {k: sum(v["outcome"] == k for v in t.values()) for k in ("pass", "fail", "skip")}
            print(f"  {name:5s} {c['pass']:4d} pass {c['fail']:4d} fail {c['skip']:4d} skipped")
        gloo_passed |= {k for k in gloo if gloo[k]["outcome"] == "pass"}
        lost = sorted(k for k in gloo if gloo[k]["outcome"] == "pass" and outcome(ccl, k) != "pass")
        gained = sorted(
            k for k in ccl if ccl[k]["outcome"] == "pass" and outcome(gloo, k) != "pass"
        )
        for k in lost:
            if k in known:
                print(f"  known    {k}: {outcome(ccl, k)} on ccl ({known[k][1]})")
            else:
                bad = True
                detail = ccl.get(k, {}).get("detail", "").strip().splitlines()
                print(f"  NEW      {k}: {outcome(ccl, k)} on ccl, passes on Gloo")
                for line in detail[-6:]:
                    print(f"             {line}")
        for k in gained:
            print(f"  better   {k}: passes on ccl, {outcome(gloo, k)} on Gloo")
        for k in list(still_listed):
            if k in lost:
                still_listed.discard(k)
    # Listed, passing on Gloo somewhere, and never lost: ccl passes it too now.
    stale = still_listed & gloo_passed
    for k in sorted(stale):
        bad = True
        print(f"\nlisted in {args.known} but passes on ccl wherever Gloo passes it: {k}")
    print("\nOK: every difference is listed" if not bad else "\nFAILED: see above")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
