"""Small models and one training loop, shared by the DDP and FSDP parity cases (CPU and CUDA)."""

import contextlib

import torch
import torch.nn as nn


class MLP(nn.Module):
    """Three linear layers; `unused=True` adds a layer forward never touches (find_unused_parameters)."""

    def __init__(self, unused=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
        self.unused = nn.Linear(256, 10) if unused else None

    def forward(self, x):
        return self.net(x)

    @staticmethod
    def batch(gen, device):
        x = torch.randn(64, 32, generator=gen)
        return x.to(device), (x[:, :10].argmax(1)).to(device)

    @staticmethod
    def loss(out, target):
        return nn.functional.cross_entropy(out, target)


class Block(nn.Module):
    """A small transformer-style block: embedding, layer norm, MLP, head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(512, 128)
        self.norm = nn.LayerNorm(128)
        self.mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
        self.head = nn.Linear(128, 512)

    def forward(self, tokens):
        h = self.emb(tokens)
        h = h + self.mlp(self.norm(h))
        return self.head(h)

    @staticmethod
    def batch(gen, device):
        tokens = torch.randint(0, 512, (16, 32), generator=gen).to(device)
        return tokens, tokens

    @staticmethod
    def loss(out, target):
        return nn.functional.cross_entropy(out.flatten(0, 1), target.flatten())


def train(model, net, steps, device, seed=3, micro_batches=1, lr=0.1, check=None):
    """SGD steps on `model` (`net` is the bare module, for its batch and loss).

    With micro_batches > 1, all but the last backward of a step run under `model.no_sync()`.
    `check(step, params, batches, grads)`, when given, sees each step after its last backward: the
    parameters the step started from, its (input, target) batches and the gradients.
    Returns the gradients after each step's last backward and the parameters after the last step.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    grads = []
    for step in range(steps):
        opt.zero_grad()
        start = [p.detach().clone() for p in model.parameters()] if check else None
        batches = []
        for m in range(micro_batches):
            last = m == micro_batches - 1
            with contextlib.nullcontext() if last else model.no_sync():
                x, y = net.batch(gen, device)
                batches.append((x, y))
                net.loss(model(x), y).backward()
        grads.append([None if p.grad is None else p.grad.detach().clone() for p in model.parameters()])
        if check:
            check(step, start, batches, grads[-1])
        opt.step()
    return grads, [p.detach().clone() for p in model.parameters()]
