"""What compression adds to a DDP bucket's allreduce on one GPU (issue #4), measured side by side.

World size 1, one 25 MiB fp32 bucket (DDP's default bucket size). Three ways, timed with CUDA
events over the same iterations, interleaved:
  base   plain fp16 NCCL allreduce of a tensor with the bucket's element count (the wire alone)
  hook   what fp16_compress_hook does on nccl: cast to fp16, divide, allreduce, wait, copy back
  cnccl  an fp32 allreduce on a cnccl group (fused scale-and-cast, allreduce, restore)
  acc32  the same with accumulate=fp32 (all-to-all, fp32 sum kernel, allgather; issue #16)
The added time is each one's time minus base's; the goal is cnccl's <= 0.6x the hook's. acc32 / cnccl
is what fp32 sums cost (at world size 1 the collectives move nothing; the kernels and calls remain).

Then the peak extra GPU memory of one allreduce of the bucket per wire, beside the hook's, in units of
n bytes (n = the bucket's elements; the fp32 bucket is 4n): torch.cuda.max_memory_allocated over the
call, its work's wait and the release of the work, minus what was allocated before (issue #38's goal:
<= 2.5n for the 16-bit, 8-bit and MX wires, <= 3n with accumulate=fp32; the hook holds about 2n).

    torchrun --nproc_per_node=1 bench/gpu_allreduce.py    (or plain python: it sets up world size 1)
"""

import os
import statistics

import torch
import torch.distributed as dist

import cnccl

ELEMS = 25 * 2**20 // 4
ITERS, TRIALS = 50, 15


def timed(fn, stream):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(ITERS):
        fn()
    stop.record(stream)
    stop.synchronize()
    return start.elapsed_time(stop) / ITERS * 1000  # microseconds


# Each configuration's Options; the fp8 wires need pow2 scaling and fp32 sums, MX fp32 sums.
MEMORY_CASES = {
    "fp16": dict(wire_dtype="fp16"),
    "bf16": dict(wire_dtype="bf16"),
    "fp16 rounding=sr": dict(wire_dtype="fp16", accumulate="fp32", rounding="sr"),
    "fp16 accumulate=fp32": dict(wire_dtype="fp16", accumulate="fp32"),
    "fp16 scaling=pow2": dict(wire_dtype="fp16", accumulate="fp32", scaling="pow2"),
    "e4m3": dict(wire_dtype="e4m3", accumulate="fp32", scaling="pow2"),
    "e5m2": dict(wire_dtype="e5m2", accumulate="fp32", scaling="pow2"),
    "mxfp8": dict(wire_dtype="mxfp8", accumulate="fp32"),
    "mxfp4": dict(wire_dtype="mxfp4", accumulate="fp32"),
}


def peak_extra(fn, bucket):
    """Peak bytes allocated above the baseline while fn runs and its buffers are released, / n."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / bucket.numel()


def fp16_hook(bucket, nccl, world):
    """default_hooks.fp16_compress_hook's steps on `bucket`, as a function of no arguments."""

    def hook():
        compressed = bucket.to(torch.float16).div_(world)
        fut = dist.all_reduce(compressed, group=nccl, async_op=True).get_future()
        # wait() puts the allreduce on this stream before the copy back, as DDP's then() does.
        bucket.copy_(fut.wait()[0])

    return hook


def peak_memory(bucket, nccl, world):
    peaks = {"hook (fp16_compress_hook)": peak_extra(fp16_hook(bucket, nccl, world), bucket)}
    for name, options in MEMORY_CASES.items():
        try:
            group = dist.new_group(backend="cnccl", pg_options=cnccl.Options(**options))
        except (ValueError, RuntimeError) as e:  # a wire this build refuses is reported, not fatal
            print(f"  {name}: not measured ({e})")
            continue
        dist.all_reduce(bucket, group=group)  # warm: the first call sets up the group's engine
        peaks[name] = peak_extra(lambda: dist.all_reduce(bucket, group=group, async_op=True).wait(), bucket)
        dist.destroy_process_group(group)
    return peaks


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("cnccl", rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)))
    torch.cuda.set_device(0)
    world = dist.get_world_size()
    nccl = dist.new_group(backend="nccl")
    ours = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16"))
    acc32 = dist.new_group(backend="cnccl", pg_options=cnccl.Options(wire_dtype="fp16", accumulate="fp32"))
    bucket = torch.randn(ELEMS, device="cuda")
    wire = bucket.half()
    stream = torch.cuda.current_stream()

    def base():
        dist.all_reduce(wire, group=nccl)

    hook = fp16_hook(bucket, nccl, world)

    def cnccl_allreduce():
        dist.all_reduce(bucket, group=ours, async_op=True).wait()

    def acc32_allreduce():
        dist.all_reduce(bucket, group=acc32, async_op=True).wait()

    ways = {"base": base, "hook": hook, "cnccl": cnccl_allreduce, "acc32": acc32_allreduce}
    for fn in ways.values():
        for _ in range(5):
            fn()
    samples = {k: [] for k in ways}
    for _ in range(TRIALS):
        for k, fn in ways.items():
            samples[k].append(timed(fn, stream))
    med = {k: statistics.median(v) for k, v in samples.items()}
    hook_added, ours_added = med["hook"] - med["base"], med["cnccl"] - med["base"]
    print(f"25 MiB fp32 bucket, world size {world}, {torch.cuda.get_device_name()}, NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version()))}; median of {TRIALS} trials x {ITERS}")
    for k in ways:
        print(f"  {k:6s} {med[k]:9.1f} us")
    print(f"  added by the hook : {hook_added:9.1f} us")
    print(f"  added by cnccl    : {ours_added:9.1f} us")
    print(f"  cnccl / hook added: {ours_added / hook_added:9.2f}x   (goal <= 0.6x)")
    print(f"  acc32 / cnccl     : {med['acc32'] / med['cnccl']:9.2f}x   (goal <= 1.15x)")
    if os.environ.get("CNCCL_GPU_JSON"):
        import json

        with open(os.environ["CNCCL_GPU_JSON"], "w") as f:
            json.dump({"median_us": med, "hook_added_us": hook_added, "cnccl_added_us": ours_added,
                       "cnccl_over_hook_added": ours_added / hook_added,
                       "acc32_over_cnccl": med["acc32"] / med["cnccl"]}, f)
    peaks = peak_memory(bucket, nccl, world)
    print(f"peak extra GPU memory of one {ELEMS}-element allreduce, units of n bytes (goal <= 2.5n, 3n acc32):")
    for name, peak in peaks.items():
        print(f"  {name:28s} {peak:6.2f}n")
    if os.environ.get("CNCCL_GPU_JSON"):
        import json

        with open(os.environ["CNCCL_GPU_JSON"]) as f:
            out = json.load(f)
        out["peak_extra_n"] = peaks
        with open(os.environ["CNCCL_GPU_JSON"], "w") as f:
            json.dump(out, f)
    assert cnccl.stats(ours)["compressed_collectives"] > 0, "the cnccl allreduce was not compressed"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
