"""PyTorch's own distributed tests (``DistributedTest._DistTestBase``) against a backend.

    BACKEND=ccl WORLD_SIZE=2 python python/conformance/dist_suite.py [--json out.json] [names]

Runs the class the way PyTorch's ``test/distributed/test_distributed_spawn.py`` does (every test
spawns WORLD_SIZE fresh processes that join a file:// rendezvous), for BACKEND=gloo or ccl.
``names`` are test method names (``test_all_reduce_sum``); none means every test.

PyTorch chooses which tests to run by the backend's name: ``BACKEND == "gloo"``, membership in
``DistTestCases`` sets. For ccl to get exactly the tests Gloo gets, two things are patched, and
nothing else, before the test module is imported (its decorators read the name at import):

1. the module's ``BACKEND`` is ``"oxccl"`` but compares (and hashes) equal to ``"gloo"`` as well
   (``_CpuBackendName``), so ``BACKEND == "gloo"``, ``BACKEND != "gloo"`` and
   ``BACKEND in {"gloo", ...}`` select as for Gloo;
2. ``"oxccl"`` is added to ``DistTestCases.backend_feature["plugin"]``, PyTorch's own list of
   third-party backends, which ``require_backend_is_available`` consults for the plain name.

Everything the tests do at run time goes through ``torch.distributed`` with backend ``"oxccl"``;
``dist.get_backend()`` returns ``"oxccl"``.
"""

import argparse
import json
import os
import sys
import time
import unittest

import torch  # noqa: F401 - imported before the patches, as the test module expects
import torch.distributed as dist

BACKEND = os.environ.get("BACKEND", "")
if BACKEND not in ("gloo", "oxccl"):
    raise SystemExit(f"BACKEND must be gloo or oxccl, not {BACKEND!r}")
if "WORLD_SIZE" not in os.environ:
    raise SystemExit("set WORLD_SIZE (2 or more)")
# Loopback only: Gloo resolves the host name unless told the interface.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("CCL_SOCKET_IFNAME", "=lo")


class _CpuBackendName(str):
    """The string "oxccl" that is also equal to "gloo": PyTorch's tests select CPU-backend tests
    with ``BACKEND == "gloo"`` and ``BACKEND in {...}``, and ccl is to take every one of them.
    Its hash is "gloo"'s, so set lookups find "gloo" (and then compare equal)."""

    def __eq__(self, other):
        return str.__eq__(self, other) or str.__eq__("gloo", other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash("gloo")


def _patch_for_ccl():
    import oxccl.torch  # noqa: F401 - registers the backend
    from torch.testing._internal.common_distributed import DistTestCases

    DistTestCases.backend_feature["plugin"].add("oxccl")

    # The test module reads os.environ["BACKEND"] once, at import; hand it the alias.
    environ_cls = type(os.environ)

    class _Environ(environ_cls):
        def __getitem__(self, key):
            v = super().__getitem__(key)
            return _CpuBackendName(v) if key == "BACKEND" else v

    os.environ.__class__ = _Environ
    try:
        from torch.testing._internal.distributed import distributed_test  # noqa: F401
    finally:
        os.environ.__class__ = environ_cls
    name = distributed_test.BACKEND
    assert name == "gloo" and name in {"gloo"} and str.__eq__(name, "oxccl") and name != "nccl"


if BACKEND == "oxccl":
    _patch_for_ccl()

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


class _Recorder(unittest.TextTestResult):
    """Records every test's outcome, reason and time for the JSON report."""

    json_path = None

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.records = {}
        self._t0 = {}

    def _name(self, test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        self._t0[self._name(test)] = time.monotonic()
        super().startTest(test)

    def _rec(self, test, outcome, detail=""):
        n = self._name(test)
        self.records[n] = {
            "outcome": outcome,
            "detail": detail[-4000:],
            "seconds": round(time.monotonic() - self._t0.get(n, time.monotonic()), 2),
        }
        if self.json_path:
            # After every test, so that a run stopped part way keeps what it measured.
            write_json(self.json_path, self.records)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._rec(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._rec(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._rec(test, "fail", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._rec(test, "skip", str(reason))

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._rec(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._rec(test, "fail", "unexpected success")


def write_json(path, records):
    """The report: {backend, world_size, torch, tests: {test: {outcome, detail, seconds}}}."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "backend": BACKEND,
                "world_size": int(os.environ["WORLD_SIZE"]),
                "torch": torch.__version__,
                "tests": records,
            },
            f,
            indent=1,
            sort_keys=True,
        )
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="test method names (default: all)")
    ap.add_argument("--json", help="write {test: {outcome, detail, seconds}} here")
    ap.add_argument("--list", action="store_true", help="print the test names and exit")
    args = ap.parse_args()

    loader = unittest.TestLoader()
    every = loader.getTestCaseNames(TestDistBackendWithSpawn)
    if args.list:
        print("\n".join(every))
        return 0
    names = args.names or every
    unknown = sorted(set(names) - set(every))
    if unknown:
        raise SystemExit(f"no such tests in _DistTestBase: {', '.join(unknown)}")
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    _Recorder.json_path = args.json
    runner = unittest.TextTestRunner(verbosity=2, resultclass=_Recorder, stream=sys.stdout)
    result = runner.run(suite)
    if args.json:
        write_json(args.json, result.records)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
