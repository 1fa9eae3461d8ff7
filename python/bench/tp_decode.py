"""Tensor-parallel greedy decoding of a Llama-shaped model through torch.distributed: tokens per
second with the oxccl backend beside Gloo (and DeepSpeed's shared-memory all-reduce), at TP=2
against one process at TP=1 on the same cores. Not a test: numbers, as JSON lines, summarized
as a markdown table.

    python python/bench/tp_decode.py run --backend oxccl --mode dtensor --tp 2 --out r.jsonl
    python python/bench/tp_decode.py run --backend gloo --mode manual --tp 2 --out r.jsonl
    python python/bench/tp_decode.py run --backend deepspeed --mode manual --tp 2 --out r.jsonl
    python python/bench/tp_decode.py run --tp 1 --threads 2 --out r.jsonl
    python python/bench/tp_decode.py summary r.jsonl      # exit status 1 if tokens differ

scripts/tp-decode.sh runs every row in interleaved rounds and prints the summary.

The model is written here in plain torch, weights from a fixed seed (nothing is downloaded):
token embedding, --layers decoder layers (RMSNorm, attention with q/k/v/o projections, rotary
embeddings, grouped-query attention when --kv-heads < --heads, a KV cache; RMSNorm, SwiGLU MLP
gate/up/down), a final RMSNorm and the lm head. Decoding is greedy, batch 1: --prompt tokens
(from the seed) in one prefill step, timed apart, then --new tokens one at a time; the first
--warmup of them are not timed. Time per token is the slowest rank's, per step.

Modes of tensor parallelism (TP > 1):

- dtensor: torch's own parallelize_module on a CPU DeviceMesh over the default process group,
  ColwiseParallel on q/k/v/gate/up and RowwiseParallel on o/down; attention runs on the local
  heads. torch issues two all-reduces per layer through the group's backend (functional
  collectives, waited on when the result is used).
- manual: the same split done by hand on plain nn.Linear weights, with an explicit in-place
  all-reduce after o_proj and down_proj (how DeepSpeed's AutoTP runs inference). The all-reduce
  is dist.all_reduce on the group's backend, or with --backend deepspeed DeepSpeed's
  deepspeed.comm.inference_all_reduce (its shared-memory op; the process group under it is
  Gloo, used only for set-up and the final exchange of timings).

Embedding and final norm are replicated on every rank; the lm head is split by vocabulary
(each rank's block of logits, then gathered: ColwiseParallel with replicated output in the
DTensor mode, an all-reduce of the blocks over zeros in the manual one). TP=1 is the plain model in one
process with --threads threads, no process group. TP ranks are bound to disjoint cores
(--threads cores each) when the machine has enough of them.

Ranks meet through a file:// store; Gloo is pinned to loopback with GLOO_SOCKET_IFNAME=lo,
oxccl with CCL_SOCKET_IFNAME="=lo". DeepSpeed's op names its shared memory after MASTER_ADDR and
MASTER_PORT (set here to 127.0.0.1 and a number unique to the run; nothing listens on it) and
needs LOCAL_SIZE = world size; the segments are removed after the run. The process group's
timeout (--timeout) bounds every torch collective; DeepSpeed's shared-memory all-reduce spins
without a deadline, so the launcher kills the ranks when --timeout has passed.

Checks: every rank must decode the same tokens, and summary fails (exit status 1, FAILED
lines) when a backend's tokens differ from Gloo's in the same mode and TP. It also says whether
every step's logits are bit-identical to Gloo's (reported, not enforced). TP=1 adds in another
order: its tokens are compared for information only.
"""

import argparse
import datetime
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ["dtensor", "manual"]
BACKENDS = ["oxccl", "gloo", "deepspeed"]

# The default shape: 175M parameters (33M of them embedding and lm head), about 13 ms per
# token at TP=1 with 2 threads in bf16 on a 2-vCPU AMD EPYC, 17 ms with 1 thread: large enough
# that the matrix products dominate a step, small enough that 2 all-reduces per layer of 2 KiB
# each still show.
SHAPE = dict(hidden=1024, layers=12, heads=16, kv_heads=8, intermediate=2816, vocab=16384)
# --tiny (CI): a millisecond-scale model whose all-reduces still cross every layer.
TINY = dict(hidden=256, layers=2, heads=8, kv_heads=4, intermediate=704, vocab=1024)


def load():
    """Other processes' CPU share over the last minute (1-minute load average / cores)."""
    try:
        return round(os.getloadavg()[0] / os.cpu_count(), 2)
    except OSError:
        return None


# ---- the model --------------------------------------------------------------------------


def build_model(cfg, dtype):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self, dim, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            # In float32 as Llama does: bf16 squares lose too much.
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x32.to(x.dtype)

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        xf = x.float()
        rot = torch.cat((-x2, x1), dim=-1).float()
        return (xf * cos + rot * sin).to(x.dtype)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            h, hd = cfg["hidden"], cfg["hidden"] // cfg["heads"]
            self.head_dim = hd
            self.q_proj = nn.Linear(h, cfg["heads"] * hd, bias=False)
            self.k_proj = nn.Linear(h, cfg["kv_heads"] * hd, bias=False)
            self.v_proj = nn.Linear(h, cfg["kv_heads"] * hd, bias=False)
            self.o_proj = nn.Linear(cfg["heads"] * hd, h, bias=False)
            self.reduce = None  # manual mode: the sum of the ranks' partial o_proj outputs
            self.cache = None

        def forward(self, x, pos, cos, sin):
            b, s, _ = x.shape
            hd = self.head_dim
            # -1 heads: under tensor parallelism the projections return this rank's heads only.
            q = self.q_proj(x).view(b, s, -1, hd).transpose(1, 2)
            k = self.k_proj(x).view(b, s, -1, hd).transpose(1, 2)
            v = self.v_proj(x).view(b, s, -1, hd).transpose(1, 2)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            if self.cache is None:
                shape = (b, k.shape[1], cfg["max_len"], hd)
                self.cache = (k.new_zeros(shape), v.new_zeros(shape))
            kc, vc = self.cache
            kc[:, :, pos : pos + s] = k
            vc[:, :, pos : pos + s] = v
            k, v = kc[:, :, : pos + s], vc[:, :, : pos + s]
            # Prefill starts at position 0, so its causal mask is the square one SDPA builds;
            # a decode step's single query sees the whole cache.
            assert s == 1 or pos == 0
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=s > 1, enable_gqa=q.shape[1] != k.shape[1]
            )
            out = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
            if self.reduce is not None:
                self.reduce(out)
            return out

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            h, i = cfg["hidden"], cfg["intermediate"]
            self.gate_proj = nn.Linear(h, i, bias=False)
            self.up_proj = nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)
            self.reduce = None

        def forward(self, x):
            out = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
            if self.reduce is not None:
                self.reduce(out)
            return out

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm = RMSNorm(cfg["hidden"])
            self.attn = Attention()
            self.post_norm = RMSNorm(cfg["hidden"])
            self.mlp = MLP()

        def forward(self, x, pos, cos, sin):
            x = x + self.attn(self.input_norm(x), pos, cos, sin)
            return x + self.mlp(self.post_norm(x))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["hidden"])
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["layers"]))
            self.norm = RMSNorm(cfg["hidden"])
            self.lm_head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)
            hd = cfg["hidden"] // cfg["heads"]
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            ang = torch.outer(torch.arange(cfg["max_len"], dtype=torch.float32), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.cos, self.sin = ang.cos(), ang.sin()

        def forward(self, tokens, pos):
            s = tokens.shape[1]
            cos, sin = self.cos[pos : pos + s], self.sin[pos : pos + s]
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, pos, cos, sin)
            return self.lm_head(self.norm(x[:, -1]))

    # Every rank builds the whole model from the same seed, so the shards fit together and
    # every backend decodes the same weights.
    torch.manual_seed(cfg["seed"])
    model = Decoder()
    return model.to(dtype).eval()


def count_params(model):
    return sum(p.numel() for p in model.parameters())


PLAN_COL = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
PLAN_ROW = ("attn.o_proj", "mlp.down_proj")


def shard_dtensor(model, tp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    # A 1-D mesh over every rank of the world is the default process group itself.
    mesh = DeviceMesh("cpu", list(range(tp)))
    assert dist.get_world_size() == tp
    plan = {}
    for i in range(len(model.layers)):
        plan.update({f"layers.{i}.{n}": ColwiseParallel() for n in PLAN_COL})
        plan.update({f"layers.{i}.{n}": RowwiseParallel() for n in PLAN_ROW})
    # The vocabulary split too, as tensor-parallel inference does (a replicated head is about a
    # tenth of the default model's work done twice): each rank computes its block of the
    # logits, gathered for the argmax.
    plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, mesh, plan)


def shard_manual(model, rank, tp, reduce):
    import torch.nn as nn

    for layer in model.layers:
        for name in PLAN_COL + PLAN_ROW:
            parent, attr = name.split(".")
            lin = getattr(getattr(layer, parent), attr)
            # Column-parallel layers keep a block of output rows, row-parallel ones the
            # matching block of input columns: contiguous blocks, as ColwiseParallel and
            # RowwiseParallel cut them, so both modes run the same local products.
            dim = 0 if name in PLAN_COL else 1
            w = lin.weight.detach().chunk(tp, dim=dim)[rank].contiguous()
            lin.weight = nn.Parameter(w, requires_grad=False)
        layer.attn.reduce = reduce
        layer.mlp.reduce = reduce
    # The vocabulary split as in the DTensor mode; the blocks of logits come together through
    # the same all-reduce (each rank's block in place, zeros elsewhere: x + 0 is x), so that
    # every backend, DeepSpeed's too, gathers with its own call.
    head = model.lm_head
    vocab = head.weight.shape[0]
    blocks = head.weight.detach().chunk(tp, dim=0)
    lo = sum(b.shape[0] for b in blocks[:rank])
    local = nn.Linear(head.weight.shape[1], blocks[rank].shape[0], bias=False)
    local.weight = nn.Parameter(blocks[rank].contiguous(), requires_grad=False)

    class VocabParallel(nn.Module):
        def __init__(self):
            super().__init__()
            self.local = local

        def forward(self, x):
            part = self.local(x)
            out = part.new_zeros(*part.shape[:-1], vocab)
            out[..., lo : lo + part.shape[-1]] = part
            reduce(out)
            return out

    model.lm_head = VocabParallel()


# ---- one rank ---------------------------------------------------------------------------


def bind(rank, tp, threads):
    """Cores for this rank: a block of `threads` of them, disjoint from the other ranks' (the
    default binding of MPI launchers); none when the machine has fewer cores than that."""
    cores = sorted(os.sched_getaffinity(0))
    if tp > 1 and tp * threads <= len(cores):
        mine = cores[rank * threads : (rank + 1) * threads]
        os.sched_setaffinity(0, mine)
        return mine
    return cores


def rank_main(args):
    import faulthandler

    # A rank that aborts inside a C++ library says where it was.
    faulthandler.enable(all_threads=True)
    rank, tp = int(os.environ.get("RANK", "0")), args.tp
    cores = bind(rank, tp, args.threads) if args.bind else sorted(os.sched_getaffinity(0))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    cfg = shape(args)
    dtype = {"bf16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    deadline = datetime.timedelta(seconds=args.timeout)

    ds = None
    if tp > 1:
        pg_backend = "gloo" if args.backend == "deepspeed" else args.backend
        dist.init_process_group(
            pg_backend, init_method="file://" + args.store, rank=rank, world_size=tp,
            timeout=deadline,
        )
        pg = dist.distributed_c10d._get_default_group()
        impl = type(pg._get_backend(torch.device("cpu"))).__name__
        if args.backend == "deepspeed":
            import deepspeed
            import deepspeed.comm as ds

            # The group exists already: DeepSpeed wraps it and loads its shared-memory op.
            deepspeed.init_distributed(dist_backend=pg_backend, timeout=deadline)
            # Without its op, or on a CPU its kernels cannot serve, DeepSpeed would quietly fall
            # back to dist.all_reduce on Gloo and the row would measure Gloo.
            if not hasattr(getattr(torch.ops, "deepspeed", None), "inference_all_reduce_"):
                raise SystemExit("DeepSpeed's shared-memory op (deepspeed_shm_comm) did not load")
            level = getattr(ds.comm.cdb, "shm_vector_kernel_level", 0)
            if level < (1 if dtype == torch.float32 else 2):
                raise SystemExit(
                    f"DeepSpeed's shm kernels cannot run {args.dtype} on this CPU (level {level})"
                )
    else:
        impl = None

    model = build_model(cfg, dtype)
    nparams = count_params(model)
    if tp > 1 and args.mode == "dtensor":
        shard_dtensor(model, tp)
    elif tp > 1:
        if args.backend == "deepspeed":
            reduce = ds.inference_all_reduce
        else:
            reduce = dist.all_reduce
        shard_manual(model, rank, tp, reduce)

    g = torch.Generator().manual_seed(cfg["seed"] + 1)
    prompt = torch.randint(cfg["vocab"], (1, args.prompt), generator=g)
    tokens, steps = [], []
    # Greedy tokens shrug off small errors (a sum off by one bf16 ulp in every element of every
    # all-reduce still decodes the same tokens here), so every step's logits are hashed too:
    # with two ranks a + b rounds the same on any correct backend (with more ranks the order of
    # the additions, and so the logits, may legitimately differ).
    logits_hash = hashlib.sha256()
    with torch.no_grad():
        if tp > 1:
            dist.barrier()
        t0 = time.perf_counter()
        logits = model(prompt, 0)
        nxt = int(logits.argmax(-1))
        prefill = time.perf_counter() - t0
        logits_hash.update(logits.contiguous().view(torch.uint8).numpy())
        tokens.append(nxt)
        pos = args.prompt
        for _ in range(args.new - 1):
            t0 = time.perf_counter()
            logits = model(torch.tensor([[nxt]]), pos)
            nxt = int(logits.argmax(-1))
            steps.append(time.perf_counter() - t0)
            logits_hash.update(logits.contiguous().view(torch.uint8).numpy())
            tokens.append(nxt)
            pos += 1

    timed = steps[args.warmup :]
    times = torch.tensor([prefill] + timed, dtype=torch.float64)
    same = True
    if tp > 1:
        # Per step, the slowest rank's time; and every rank must have decoded the same tokens.
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        t = torch.tensor(tokens, dtype=torch.int64)
        lo, hi = t.clone(), t.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        same = bool(torch.equal(lo, hi))
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    prefill, timed = times[0].item(), times[1:].tolist()
    if not timed:
        raise SystemExit("no decode step was timed: --new must exceed --warmup + 1")
    ms = [x * 1e3 for x in timed]
    row = {
        "kind": "tp_decode",
        "mode": args.mode if tp > 1 else "single",
        "backend": args.backend if tp > 1 else "none",
        "pg_backend": impl,
        "tp": tp,
        "threads": args.threads,
        "cores": cores,
        "dtype": args.dtype,
        "shape": {k: cfg[k] for k in SHAPE},
        "params": nparams,
        "prompt": args.prompt,
        "new": args.new,
        "timed_tokens": len(ms),
        "prefill_ms": prefill * 1e3,
        "tokens_per_s": len(ms) / (sum(ms) / 1e3),
        "ms_median": statistics.median(ms),
        "ms_max": max(ms),
        "ms_min": min(ms),
        "seed": args.seed,
        "tokens": tokens,
        "tokens_sha": hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16],
        "logits_sha": logits_hash.hexdigest()[:16],
        "ranks_agree": same,
        "torch": torch.__version__,
    }
    with open(args.rows, "w") as f:
        json.dump(row, f)


def shape(args):
    cfg = dict(TINY if args.tiny else SHAPE)
    for k in SHAPE:
        v = getattr(args, k)
        if v is not None:
            cfg[k] = v
    if cfg["hidden"] % cfg["heads"] or cfg["heads"] % cfg["kv_heads"]:
        raise SystemExit("--hidden must be a multiple of --heads, --heads of --kv-heads")
    if cfg["kv_heads"] % args.tp or cfg["intermediate"] % args.tp:
        raise SystemExit(f"--kv-heads and --intermediate must be multiples of --tp {args.tp}")
    cfg["seed"] = args.seed
    cfg["max_len"] = args.prompt + args.new
    return cfg


# ---- launching ranks --------------------------------------------------------------------


def _source_tree():
    """The repository's python/ when the package is not installed (it is in the bench venv)."""
    import importlib.util

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [] if importlib.util.find_spec("oxccl") is not None else [os.path.join(repo, "python")]


def cmd_run(args):
    shape(args)  # refuse a bad shape before any process starts
    if args.threads is None:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.tp)
    with tempfile.TemporaryDirectory(prefix="ccl-tp-decode-") as d:
        rows = os.path.join(d, "row.json")
        # Names DeepSpeed's shared-memory segments, so that runs never share one. Nothing
        # listens on it.
        port = 20000 + os.getpid() % 40000
        segments = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_*"
        # A killed launcher of the same number may have left its segments: start from none.
        for f in glob.glob(segments):
            os.unlink(f)
        env = dict(os.environ)
        env.update(
            {
                "WORLD_SIZE": str(args.tp),
                "LOCAL_SIZE": str(args.tp),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "GLOO_SOCKET_IFNAME": "lo",
                "CCL_SOCKET_IFNAME": "=lo",
                "OMP_NUM_THREADS": str(args.threads),
                "DS_ACCELERATOR": "cpu",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (*_source_tree(), env.get("PYTHONPATH")) if p
                ),
            }
        )
        argv = [sys.executable, os.path.abspath(__file__), "_rank",
                "--store", os.path.join(d, "store"), "--rows", rows] + _forward(args)
        before = load()
        procs = []
        try:
            for r in range(args.tp):
                e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
                # DeepSpeed prints its start-up chatter on stdout; only errors matter here.
                procs.append(subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL))
            end = time.monotonic() + args.timeout
            codes = []
            for p in procs:
                codes.append(p.wait(timeout=max(1.0, end - time.monotonic())))
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the run took longer than --timeout {args.timeout} s; ranks killed")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
            for f in glob.glob(segments):
                os.unlink(f)
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        with open(rows) as f:
            row = json.load(f)
    row.update({"round": args.round, "load_before": before, "load_after": load()})
    text = json.dumps(row) + "\n"
    if args.out:
        with open(args.out, "a") as f:
            f.write(text)
    sys.stdout.write(text)


def _forward(args):
    out = ["--mode", args.mode, "--backend", args.backend, "--tp", str(args.tp),
           "--threads", str(args.threads), "--dtype", args.dtype, "--prompt", str(args.prompt),
           "--new", str(args.new), "--warmup", str(args.warmup), "--seed", str(args.seed),
           "--timeout", str(args.timeout)]
    out += ["--tiny"] if args.tiny else []
    out += [] if args.bind else ["--no-bind"]
    for k in SHAPE:
        v = getattr(args, k)
        if v is not None:
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


# ---- summary --------------------------------------------------------------------------


def cmd_summary(args):
    rows = []
    for p in args.files:
        with open(p) as f:
            rows += [json.loads(x) for x in f if x.strip()]
    rows = [r for r in rows if r.get("kind") == "tp_decode"]
    if not rows:
        raise SystemExit("no tp_decode rows")
    med = statistics.median
    names = {"oxccl": "oxccl", "gloo": "Gloo", "deepspeed": "DeepSpeed shm", "none": "-"}
    labels = {"dtensor": "DTensor", "manual": "manual", "single": "none"}
    order = {"dtensor": 0, "manual": 1, "single": 2}
    border = {"oxccl": 0, "gloo": 1, "deepspeed": 2, "none": 3}

    # Runs of different models or lengths are never compared: one table each.
    def section(r):
        return (r["dtype"], json.dumps(r["shape"], sort_keys=True), r["prompt"], r["new"], r["seed"])

    def key(r):
        return (r["mode"], r["backend"], r["tp"], r["threads"])

    out, failures = [], []
    for sec in sorted({section(r) for r in rows}):
        srows = [r for r in rows if section(r) == sec]
        keys = sorted({key(r) for r in srows}, key=lambda k: (order[k[0]], border[k[1]], -k[2], k[3]))
        groups = {k: [r for r in srows if key(r) == k] for k in keys}
        tps = {k: med(r["tokens_per_s"] for r in v) for k, v in groups.items()}
        m, s = srows[0], srows[0]["shape"]
        out.append(
            f"\n### Greedy decode, {m['dtype']}: hidden {s['hidden']}, {s['layers']} layers, heads "
            f"{s['heads']} (kv {s['kv_heads']}), intermediate {s['intermediate']}, vocab "
            f"{s['vocab']} ({m['params'] / 1e6:.0f}M parameters); prompt {m['prompt']}, "
            f"{m['timed_tokens']} timed tokens of {m['new']}\n"
        )
        out.append("| TP mode | all-reduce | TP | threads/rank | tokens/s | ms/token median | "
                   "ms/token slowest | vs Gloo TP=2 | vs TP=1 | prefill ms | rounds | tokens | logits |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
        single = [k for k in keys if k[0] == "single"]
        base1 = tps[single[0]] if single else None
        for k in keys:
            mode, backend, tp, threads = k
            v = groups[k]
            gloo = (mode, "gloo", tp, threads)
            vs_gloo = f"{tps[k] / tps[gloo]:.2f}" if mode != "single" and gloo in tps else "-"
            vs_one = f"{tps[k] / base1:.2f}" if base1 else "-"
            what = f"{labels[mode]} + {names[backend]} TP={tp}"
            toks, lgts = {r["tokens_sha"] for r in v}, {r["logits_sha"] for r in v}
            if mode == "single":
                # Another order of bf16 additions: equal tokens are likely, equal logits not.
                ref = [r for k2 in keys if k2[2] > 1 for r in groups[k2]]
                same_t = "-" if not ref else (
                    "same as TP=2" if toks == {r["tokens_sha"] for r in ref} else "differ from TP=2")
                same_l = "-"
            else:
                ref = groups.get(gloo, [])
                if len(toks) > 1 or not all(r["ranks_agree"] for r in v):
                    same_t = "DIFFER between rounds or ranks"
                    failures.append(f"{what}: tokens differ between rounds or between ranks")
                elif backend == "gloo" or not ref:
                    same_t = "reference" if backend == "gloo" else "no Gloo run"
                elif toks == {r["tokens_sha"] for r in ref}:
                    same_t = "same as Gloo"
                else:
                    same_t = "DIFFER from Gloo"
                    failures.append(f"{what}: tokens differ from Gloo's")
                if backend == "gloo" or not ref:
                    same_l = "reference" if backend == "gloo" and len(lgts) == 1 else "-"
                else:
                    same_l = ("bit-identical to Gloo" if lgts == {r["logits_sha"] for r in ref}
                              else "differ from Gloo")
            out.append(
                f"| {labels[mode]} | {names[backend]} | {tp} | {threads} | {tps[k]:.1f} | "
                f"{med(r['ms_median'] for r in v):.2f} | {med(r['ms_max'] for r in v):.2f} | "
                f"{vs_gloo} | {vs_one} | {med(r['prefill_ms'] for r in v):.0f} | {len(v)} | "
                f"{same_t} | {same_l} |"
            )
    loads = [r["load_before"] for r in rows if r.get("load_before") is not None]
    if loads:
        out.append(f"\nMachine load (1-min load average per core) before the runs: median "
                   f"{med(loads):.2f}, max {max(loads):.2f}.")
    out.append("Medians over rounds; 'slowest' is the median over rounds of each run's slowest step; "
               "tokens/s counts the timed steps over their total time.")
    print("\n".join(out))
    if failures:
        print("\nFAILED: generated tokens differ between backends of the same TP mode:")
        for f in failures:
            print(f"  FAILED: {f}")
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one decode run (all its ranks); prints one JSON line")
    rk = sub.add_parser("_rank")
    for p in (run, rk):
        p.add_argument("--mode", choices=MODES, default="dtensor", help="how TP > 1 splits the model")
        p.add_argument("--backend", choices=BACKENDS, default="oxccl",
                       help="the all-reduce at TP > 1 (deepspeed: manual mode only)")
        p.add_argument("--tp", type=int, default=2, help="ranks (1: the plain model, no group)")
        p.add_argument("--threads", type=int, help="torch threads per rank (default: cores / tp)")
        p.add_argument("--dtype", choices=["bf16", "float32"], default="bf16")
        p.add_argument("--prompt", type=int, default=32, help="prompt tokens (prefill, timed apart)")
        p.add_argument("--new", type=int, default=64, help="tokens generated")
        p.add_argument("--warmup", type=int, default=4, help="first decode steps left out of the timing")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--tiny", action="store_true", help="a tiny model (CI) unless sizes are given")
        p.add_argument("--no-bind", dest="bind", action="store_false",
                       help="leave the ranks free to run on any core")
        p.add_argument("--timeout", type=float, default=600,
                       help="seconds for the whole run; also the process group's deadline")
        for k in SHAPE:
            p.add_argument("--" + k.replace("_", "-"), type=int, dest=k,
                           help=f"default {SHAPE[k]} ({TINY[k]} with --tiny)")
    run.add_argument("--out", help="append the JSON line here")
    run.add_argument("--round", type=int, default=0)
    rk.add_argument("--store", required=True)
    rk.add_argument("--rows", required=True)
    s = sub.add_parser("summary", help="markdown table from JSON lines; exit 1 if tokens differ")
    s.add_argument("files", nargs="+")
    args = ap.parse_args()
    if args.cmd in ("run", "_rank"):
        if args.backend == "deepspeed" and args.mode != "manual" and args.tp > 1:
            ap.error("DeepSpeed's inference_all_reduce does not plug into DTensor: --mode manual")
        if args.new < args.warmup + 2:
            ap.error("--new must be at least --warmup + 2")
    {"run": cmd_run, "_rank": rank_main, "summary": cmd_summary}[args.cmd](args)
    if args.cmd == "_rank":
        # Skips the interpreter's finalization: a Gloo worker thread can still be releasing the
        # last collective's work (and with it a tensor whose Python object needs the GIL) while
        # Python shuts down, and torch then aborts the process ("terminate called without an
        # active exception") after the results are written. Seen about once in ten runs.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
