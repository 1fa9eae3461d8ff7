"""The transformers Trainer training a tiny Llama on a chosen torch.distributed backend (CPU).

    torchrun --nproc-per-node 2 python/frameworks/transformers_train.py --backend oxccl --out r.json

The model is built from a LlamaConfig (hidden size 64, 2 layers, vocabulary 256) and trained on
random token ids: nothing is downloaded. The Trainer runs through Accelerate, which on CPU only
knows "gloo" and "mpi" (`TrainingArguments.ddp_backend` accepts only the names it lists), so,
as with Accelerate itself, the default group is created first and the Trainer adopts it.
"""

import os
import tempfile

import torch
import torch.distributed as dist

import common

SEQ = 32
VOCAB = 256


class Tokens(torch.utils.data.Dataset):
    """Random sequences with a learnable rule: every token is the previous one plus 1 or 2
    (mod the vocabulary), so the loss falls within a few steps."""

    def __init__(self, n, seed=3):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        steps = torch.randint(1, 3, (n, SEQ - 1), generator=g)
        self.ids = torch.cat([start, start + steps.cumsum(1)], 1) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    args = common.parse(__doc__, steps=20, batch=4)
    # The one line oxccl needs: the group exists before the Trainer's Accelerate state.
    dist.init_process_group(args.backend)
    rank = dist.get_rank()

    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    result = common.Result(args, "transformers")
    result.set(**common.require_backend(args.backend))

    class Losses(TrainerCallback):
        def on_log(self, _args, state, _control, logs=None, **_):
            # The Trainer logs the loss averaged over ranks (gathered through the group).
            if logs and "loss" in logs:
                result.loss(logs["loss"])

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    model = LlamaForCausalLM(config)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out,
            use_cpu=True,
            per_device_train_batch_size=args.batch,
            max_steps=args.steps,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=0,
            data_seed=0,
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=model,
            args=targs,
            train_dataset=Tokens(common.rank0_shard(args.world_size, args.batch, args.steps)),
            callbacks=[Losses()],
        )
        if targs.world_size != args.world_size or targs.parallel_mode.name != "DISTRIBUTED":
            raise SystemExit(f"the Trainer is not distributed: {targs.parallel_mode}, {targs.world_size}")
        trainer.train()
    # After training: the Trainer must still be on the same group.
    result.set(
        **common.require_backend(args.backend),
        version=transformers.__version__,
        world_size=targs.world_size,
        parameters=sum(p.numel() for p in model.parameters()),
    )
    result.write(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
