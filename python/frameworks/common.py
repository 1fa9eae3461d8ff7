"""Shared pieces of the framework scripts: arguments, data, the model, and the result file.

Each framework script trains the same way on "oxccl" and on "gloo" from the same seeds and
writes rank 0's per-step losses to --out (JSON); compare.py puts two such files side by side.
Nothing here downloads anything: data and models are made from seeds.
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn

FEATURES = 16


def parse(doc, steps=20, batch=16, extra=None):
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--backend", default="oxccl", help="torch.distributed backend: oxccl or gloo")
    p.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    p.add_argument("--batch", type=int, default=batch, help="samples per rank per step")
    p.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "2")))
    p.add_argument("--out", help="write rank 0's results here (JSON)")
    if extra:
        extra(p)
    return p.parse_args()


def synthetic(n, seed=7):
    """A fixed classification problem: which side of a bent random hyperplane a point is on."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    w = torch.randn(FEATURES, generator=g)
    y = ((x @ w + 0.5 * torch.sin(3 * x[:, 0])) > 0).long()
    return x, y


def mlp(seed=0, width=32):
    # The same initial weights on every rank and both backends, so losses can be compared.
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, width), nn.Tanh(), nn.Linear(width, 2))


def rank0_shard(world, batch, steps):
    """Enough samples that every rank gets `steps` batches of `batch` without a repeat."""
    return world * batch * steps


def backend_in_use(group=None):
    """The name of the backend that actually serves CPU tensors in `group`: the registered name,
    and for oxccl also that the group's CPU backend object is ccl's (a framework that quietly
    built its own Gloo group would fail here)."""
    import torch.distributed as dist

    name = dist.get_backend(group)
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    impl = type(pg._get_backend(torch.device("cpu"))).__name__
    return {"backend": name, "impl": impl}


def require_backend(expected, group=None):
    got = backend_in_use(group)
    want_impl = "ProcessGroupOxccl" if expected == "oxccl" else "ProcessGroupGloo"
    if got["backend"] != expected or got["impl"] != want_impl:
        raise SystemExit(f"expected backend {expected} ({want_impl}), the group uses {got}")
    return got


class Result:
    """Rank 0's record of a run: per-step losses, the backend seen, timings."""

    def __init__(self, args, framework):
        self.args = args
        self.data = {"framework": framework, "backend": args.backend, "losses": [], "notes": []}
        self.t0 = time.perf_counter()

    def loss(self, value):
        self.data["losses"].append(float(value))

    def note(self, text):
        self.data["notes"].append(text)

    def set(self, **kw):
        self.data.update(kw)

    def start(self):
        self.t0 = time.perf_counter()

    def stop(self):
        """Ends the time counted as training (else it ends at write())."""
        self.data["train_s"] = round(time.perf_counter() - self.t0, 3)

    def write(self, rank=0):
        if "train_s" not in self.data:
            self.stop()
        if rank == 0 and self.args.out:
            with open(self.args.out, "w") as f:
                json.dump(self.data, f, indent=1)
