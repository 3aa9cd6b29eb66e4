"""PyTorch Lightning's DDP on backend="cnccl": the strategy's process_group_backend is all it takes.

Launch: torchrun --nproc_per_node=2 examples/frameworks/lightning_ddp.py [--backend gloo --hook bf16] [--out FILE]

Lightning passes the name to init_process_group unchanged and wraps the model in DDP on that group
(pytorch_lightning/strategies/ddp.py); under torchrun it starts no processes of its own. With
`--backend gloo --hook bf16|fp16` it runs the same training on gloo with torch's seed compression hook,
registered by the module itself: DDPStrategy(ddp_comm_hook=...) registers a hook only where the root
device is CUDA (DDPStrategy._register_ddp_hooks), so on CPU it would silently train uncompressed.
"""

import os
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}


class Classifier(pl.LightningModule):
    def __init__(self, hook=None):
        super().__init__()
        self.net = common.model()
        self.hook = hook

    def on_train_start(self):
        if self.hook is not None:
            self.trainer.strategy.model.register_comm_hook(None, self.hook)

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    args = common.arguments(HOOKS).parse_args()
    strategy = DDPStrategy(process_group_backend=args.backend)
    trainer = pl.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), num_nodes=1,
                         strategy=strategy, max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
    module = Classifier(HOOKS.get(args.hook))
    data = torch.utils.data.DataLoader(common.dataset(int(os.environ.get("RANK", 0))), batch_size=32)
    trainer.fit(module, data)
    common.save(args.out, module.parameters(), loss=float(trainer.callback_metrics["loss"]))


if __name__ == "__main__":
    main()
