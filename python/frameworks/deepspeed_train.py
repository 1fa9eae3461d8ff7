"""DeepSpeed ZeRO (stage 2 by default) on its CPU accelerator over a chosen torch.distributed backend.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 python/frameworks/deepspeed_train.py \
        --backend oxccl --out r.json

The one change for oxccl is `deepspeed.init_distributed(dist_backend="oxccl")`: DeepSpeed's CPU
accelerator would otherwise pick "ccl" (Intel oneCCL's bindings, when installed) or "gloo".
The optimizer is torch's own AdamW handed to deepspeed.initialize, so no DeepSpeed C++
optimizer is compiled (its cpu_adam op is only needed for ZeRO-Offload). DS_ZERO_STAGE=1 runs
ZeRO stage 1.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn

import common


def main():
    args = common.parse(__doc__)
    stage = int(os.environ.get("DS_ZERO_STAGE", "2"))
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        raise SystemExit(f"DeepSpeed chose accelerator {get_accelerator().device_name()}; set DS_ACCELERATOR=cpu")
    deepspeed.init_distributed(dist_backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    result = common.Result(args, "deepspeed")
    result.set(**common.require_backend(args.backend), zero_stage=stage)

    x, y = common.synthetic(common.rank0_shard(world, args.batch, args.steps))
    x, y = x[rank::world], y[rank::world]
    model = common.mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": stage,
            # Small buckets so that even this model's gradients take several collectives.
            "reduce_bucket_size": 256,
            "allgather_bucket_size": 256,
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        xb = x[step * args.batch : (step + 1) * args.batch]
        yb = y[step * args.batch : (step + 1) * args.batch]
        loss = loss_fn(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        result.loss(mean / world)

    # ZeRO keeps one full copy of the weights per rank: they must be identical everywhere.
    flat = torch.cat([q.detach().reshape(-1) for q in engine.module.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(e, flat) for e in every)
    result.set(
        **common.require_backend(args.backend),
        weights_equal_on_all_ranks=same,
        optimizer=type(engine.optimizer).__name__,
        version=deepspeed.__version__,
        world_size=world,
    )
    result.write(rank)
    dist.destroy_process_group()
    if not same:
        raise SystemExit("ranks ended with different weights")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
