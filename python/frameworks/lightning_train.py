"""PyTorch Lightning's DDP strategy on a chosen torch.distributed backend (CPU).

    torchrun --nproc-per-node 2 python/frameworks/lightning_train.py --backend oxccl --out r.json

The only change for oxccl is DDPStrategy(process_group_backend="oxccl"). Under torchrun Lightning
reads the ranks from the environment; without it, devices=N makes Lightning start the other
ranks itself.
"""

import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy
except ImportError:  # the smaller pytorch-lightning distribution
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy

import common


class Classifier(pl.LightningModule):
    def __init__(self, backend, result):
        super().__init__()
        self.net = common.mlp()
        self.backend = backend
        self.result = result
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch, _):
        if self.global_step == 0:
            # Lightning made the group: check it is the backend asked for, not a fall-back.
            self.result.set(**common.require_backend(self.backend))
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        if self.global_rank == 0:
            self.result.loss(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def main():
    args = common.parse(__doc__)
    pl.seed_everything(0, workers=True, verbose=False)
    x, y = common.synthetic(common.rank0_shard(args.world_size, args.batch, args.steps))
    # Lightning adds a DistributedSampler: each rank reads its own shard of this.
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=False)
    result = common.Result(args, "lightning")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.world_size,
        strategy=DDPStrategy(process_group_backend=args.backend),
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(args.backend, result), loader)
    result.set(version=pl.__version__, world_size=trainer.world_size)
    result.write(trainer.global_rank)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
