"""Hugging Face Transformers' Trainer on backend="cnccl": create the process group, then the Trainer.

Launch: torchrun --nproc_per_node=2 examples/frameworks/hf_trainer_ddp.py [--backend gloo --hook bf16] [--out FILE]

`TrainingArguments(ddp_backend="cnccl")` is refused on CPU: the Trainer hands the name to Accelerate, whose
`PartialState` (accelerate/state.py) chooses "gloo" for a multi-CPU run and then refuses any other name it
was given ("Your assigned backend cnccl is not available, please use gloo"). What works, on CPU and GPU
alike, is the group the Trainer finds already made: `dist.init_process_group("cnccl")` first, then
`TrainingArguments(use_cpu=True)` with no `ddp_backend`; the Trainer wraps the model in DDP on the default
group, which is cnccl's. (Transformers' own list of backends has "cncl", Cambricon's MLU library, one
letter from "cnccl": `ddp_backend="cncl"` is that library, not this one.)

The model is a two-layer BERT made from a config (no download), trained on random token sequences. With
`--backend gloo --hook bf16|fp16` the same training runs on gloo with the seed hook registered on the
Trainer's DDP model before its first step (the Trainer has no setting for a comm hook).
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


class Tokens(torch.utils.data.Dataset):
    """Random sequences whose label is whether their first token is in the vocabulary's upper half."""

    def __init__(self, n=256, length=16, vocab=128):
        gen = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, vocab, (n, length), generator=gen)
        self.labels = (self.ids[:, 0] >= vocab // 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class RegisterHook(TrainerCallback):
    """Registers a seed hook on the Trainer's DDP model once it exists, before the first step."""

    def __init__(self, hook):
        self.hook, self.trainer = hook, None

    def on_train_begin(self, args, state, control, **kwargs):
        model = self.trainer.model_wrapped
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
        model.register_comm_hook(None, self.hook)


def main():
    args = common.arguments(HOOKS).parse_args()
    dist.init_process_group(args.backend)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    training = TrainingArguments(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "cnccl-hf-trainer"),
                                 use_cpu=True, per_device_train_batch_size=16, max_steps=args.steps,
                                 learning_rate=2e-4, report_to=[], save_strategy="no", logging_strategy="no",
                                 dataloader_num_workers=0, seed=0)
    callbacks = [RegisterHook(HOOKS[args.hook])] if args.hook else []
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=callbacks)
    for callback in callbacks:
        callback.trainer = trainer
    result = trainer.train()
    assert dist.get_backend() == args.backend and trainer.args.world_size == dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"loss {result.training_loss:.4f} on {dist.get_backend()}")
    common.save(args.out, model.parameters(), loss=result.training_loss)


if __name__ == "__main__":
    main()
