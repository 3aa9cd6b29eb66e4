"""DDP training on CPU with backend="cnccl": gradients travel as fp16 with no hook and no code change.

Launch: torchrun --nproc_per_node=2 examples/train_ddp.py [--steps N] [--wire fp16|bf16|none] [--save FILE]

A small transformer language model learns a synthetic next-token task (a fixed permutation
with noise); loss falls from ~ln(vocab) as it learns. Prints per-step loss and step time, and at
the end the bytes the backend saved on the wire.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl


class TinyLM(nn.Module):
    def __init__(self, vocab=512, dim=256, heads=4, layers=2, seq=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        return self.head(self.norm(self.blocks(h)))


def batch(gen, perm, batch_size, seq, vocab):
    x = torch.randint(0, vocab, (batch_size, seq), generator=gen)
    y = perm[x]
    noise = torch.rand(y.shape, generator=gen) < 0.05
    return x, torch.where(noise, torch.randint(0, vocab, y.shape, generator=gen), y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--wire", default=None, help="fp16 | bf16 | none (default: CNCCL_WIRE_DTYPE or fp16)")
    parser.add_argument("--save", default=None, help="rank 0 saves the trained parameters (state_dict) here")
    args = parser.parse_args()

    options = cnccl.Options(wire_dtype=args.wire) if args.wire else None
    dist.init_process_group(backend="cnccl", pg_options=options)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    vocab, seq = 512, 64
    model = DDP(TinyLM(vocab=vocab, seq=seq))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(100 + rank)
    params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"cnccl DDP: {world} ranks, {params / 1e6:.2f}M parameters, wire {cnccl.config()['wire_dtype']}, "
              f"CPU transport {cnccl.config()['cpu_transport']}, OMP threads {torch.get_num_threads()}", flush=True)

    first = last = None
    for step in range(1, args.steps + 1):
        x, y = batch(gen, perm, args.batch, seq, vocab)
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - t0
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        first = first if first is not None else mean_loss.item()
        last = mean_loss.item()
        if rank == 0:
            print(f"step {step:3d}  loss {last:.4f}  step time {elapsed * 1e3:7.1f} ms", flush=True)

    if args.save and rank == 0:
        torch.save(model.module.state_dict(), args.save)
    s = cnccl.stats()
    if rank == 0:
        saved = s["bytes_uncompressed"] - s["bytes_sent"]
        print(f"done: loss {first:.4f} -> {last:.4f}; {s['compressed_collectives']} of {s['collectives']} "
              f"collectives compressed; wire bytes {s['bytes_sent'] / 2**20:.1f} MiB instead of "
              f"{s['bytes_uncompressed'] / 2**20:.1f} MiB (saved {saved / 2**20:.1f} MiB, "
              f"{100 * saved / max(1, s['bytes_uncompressed']):.0f}%)", flush=True)
    dist.destroy_process_group()
    if last >= first:
        raise SystemExit(f"rank {rank}: loss did not fall ({first:.4f} -> {last:.4f})")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
