"""Ray Train's TorchTrainer on a chosen torch.distributed backend, local CPU workers.

    python python/frameworks/ray_train.py --backend oxccl --world-size 2 --out r.json

The change for oxccl is `TorchConfig(backend="oxccl")`: Ray Train passes the name to
init_process_group on every worker and wraps the model in DDP (`prepare_model`). The script
starts a local Ray instance bound to 127.0.0.1 with one CPU per worker (more than the machine
has, so that N workers fit on a small machine), no dashboard.
"""

import os
import sys
import tempfile

import common

HERE = os.path.dirname(os.path.abspath(__file__))
PASS_ENV = ("CCL_", "GLOO_", "OMP_", "PYTHONPATH")


def train_loop(config):
    import torch
    import torch.distributed as dist
    import ray.train
    import ray.train.torch

    import common as c

    res = c.Result(config["args"], "ray")
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    seen = c.backend_in_use()
    if seen["backend"] != config["backend"]:
        raise RuntimeError(f"Ray Train made a {seen} group, {config['backend']} was asked for")
    x, y = c.synthetic(c.rank0_shard(world, config["batch"], config["steps"]))
    x, y = x[rank::world], y[rank::world]
    model = ray.train.torch.prepare_model(c.mlp())  # DDP over the group Ray made
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    b = config["batch"]
    for step in range(config["steps"]):
        opt.zero_grad()
        loss = loss_fn(model(x[step * b : (step + 1) * b]), y[step * b : (step + 1) * b])
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append((mean / world).item())
    if rank == 0:
        # Written here rather than returned through ray.train.report: Ray Train 2.60 (its
        # "v2" trainer) keeps reported metrics only with a checkpoint.
        for v in losses:
            res.loss(v)
        res.set(**seen, world_size=world, version=ray.__version__)
        res.write(0)


def main():
    args = common.parse(__doc__)
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(
        num_cpus=args.world_size + 1,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
        # The workers inherit this environment (CCL_SOCKET_IFNAME, OMP_NUM_THREADS, ...).
        runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV)}},
    )
    with tempfile.TemporaryDirectory() as storage:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"backend": args.backend, "steps": args.steps, "batch": args.batch, "args": args},
            scaling_config=ScalingConfig(num_workers=args.world_size, use_gpu=False, resources_per_worker={"CPU": 1}),
            torch_config=TorchConfig(backend=args.backend),
            run_config=RunConfig(storage_path=storage, name="frameworks"),
        )
        out = trainer.fit()
    if out.error:
        raise SystemExit(f"Ray Train failed: {out.error}")
    ray.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
