"""Hugging Face Accelerate on a chosen torch.distributed backend (CPU).

    torchrun --nproc-per-node 2 python/frameworks/accelerate_train.py --backend oxccl --out r.json

On CPU, Accelerate (1.15) chooses "gloo" itself (MPI if present) and refuses any other name
passed as `backend=` ("Your assigned backend oxccl is not available, please use gloo"). It
creates a group only when none exists, so the way in is to create the default group first;
Accelerate then adopts it. Its `state.backend` still says "gloo" (the name it would have
used); the collectives go through the existing group, which is checked here.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

import common


def main():
    args = common.parse(__doc__)
    # The one line oxccl needs: the group exists before Accelerator() looks for one.
    dist.init_process_group(args.backend)

    import accelerate
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    # cpu=True: without a GPU and without it Accelerate would train each rank alone
    # (DistributedType.NO) even under torchrun.
    accelerator = Accelerator(cpu=True)
    state = accelerator.state
    if str(state.distributed_type) != "DistributedType.MULTI_CPU" or state.num_processes != args.world_size:
        raise SystemExit(f"Accelerate did not go distributed: {state.distributed_type}, {state.num_processes}")
    result = common.Result(args, "accelerate")
    result.set(**common.require_backend(args.backend), accelerate_state_backend=state.backend)
    set_seed(0)

    x, y = common.synthetic(common.rank0_shard(args.world_size, args.batch, args.steps))
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
    model = common.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    while step < args.steps:
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
            # The mean over ranks, through Accelerate's own reduce (so through the group).
            mean = accelerator.reduce(loss.detach(), reduction="mean")
            result.loss(mean)
            step += 1
            if step == args.steps:
                break

    # A gather through Accelerate as well: every rank's final weights must be identical.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = accelerator.gather(flat.unsqueeze(0))
    same = bool((every == every[0]).all())
    result.set(weights_equal_on_all_ranks=same, version=accelerate.__version__, world_size=state.num_processes)
    result.write(state.process_index)
    accelerator.end_training()  # destroys the group
    if not same:
        raise SystemExit("ranks ended with different weights")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
