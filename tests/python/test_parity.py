"""DDP and FSDP2 on cnccl against gloo running the seed hooks, same models, data and seeds (CPU).

Where the math is the same, results must be equal bit for bit; elsewhere within a bound derived
from the rounding (see compare). Why the math is the same, or not:

- DDP without a hook (cnccl) multiplies each gradient by 1/world in fp32 while copying it into the
  bucket, then cnccl casts once. The seed hooks cast first and divide in 16 bits. For a power-of-two
  world size both give the same 16-bit value unless g/world is an fp16 subnormal (the hook rounds
  twice there); bf16 has fp32's exponent range, so for bf16 they always agree.
- Each 16-bit add is computed in fp32 and rounded once, in gloo and in cnccl. With two ranks each
  element is one add (commutative), so the sums agree; with four, gloo's ring adds in another order.

So at world size 2: bf16 vs `bf16_compress_hook` and fp16 vs a hook that divides before the cast
are bit for bit, every step; fp16 vs `fp16_compress_hook` and everything at world size 4 are held
to first_step_bound on the first step, and the trajectories to the accuracy case.
World sizes 2 and 4, on each CPU engine. Rank 0 of each job appends what it measured (maximum
differences, accuracy distances) to parity-<engine>-ws<world>.jsonl in the harness's report folder,
one JSON object a line; set CNCCL_TEST_REPORT_DIR to keep them.
"""

import copy
import json
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP

import cnccl
from harness import CASE_TIMEOUT, CPU_ENGINES, Cases, check_case, engine_of, gloo_group, share, shared_job
from wire_formats import HALF_SUBNORMAL_STEP, UNIT
from models import MLP, Block, train

case = Cases()
WORLD_SIZES = [2, 4]
share(__name__, CPU_ENGINES, WORLD_SIZES)

SEED_HOOKS = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
STEPS = 5


def divide_first_fp16_hook(group, bucket):
    """The seed fp16 hook with its division moved before the cast: cnccl's math, run on gloo."""
    buffer = bucket.buffer()
    wire = buffer.div(group.size()).to(torch.float16)
    fut = dist.all_reduce(wire, group=group, async_op=True).get_future()

    def restore(fut):
        buffer.copy_(fut.value()[0])
        return buffer

    return fut.then(restore)


class Context:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = gloo_group()
        self.groups = {
            wire: dist.new_group(backend="cnccl", timeout=CASE_TIMEOUT,
                                 pg_options=cnccl.Options(wire_dtype=wire, min_bytes=0))
            for wire in ("fp16", "bf16")
        }

    def report(self, **entry):
        if self.rank == 0:
            path = os.path.join(os.environ["CNCCL_TEST_REPORT_DIR"], f"parity-{engine_of()}-ws{self.world}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps(dict(world=self.world, **entry)) + "\n")


def relative_distance(params, exact):
    """||params - exact|| / ||exact|| over all parameters together."""
    diff = torch.cat([(a - b).flatten() for a, b in zip(params, exact)]).norm()
    return (diff / torch.cat([p.flatten() for p in exact]).norm()).item()


def max_diff(a, b):
    return max(((x.double() - y.double()).abs().max().item() for x, y in zip(a, b) if x is not None), default=0.0)




def local_gradient_magnitude(ctx, net, micro_batches):
    """Σ_i |g_i| / world for every parameter: rank i's first-step gradient g_i, computed without
    DDP from the same data train() draws, summed over ranks through gloo."""
    model = copy.deepcopy(net)
    gen = torch.Generator().manual_seed(100 + ctx.rank)
    for _ in range(micro_batches):
        x, y = net.batch(gen, "cpu")
        net.loss(model(x), y).backward()
    mags = []
    for p in model.parameters():
        m = torch.zeros_like(p) if p.grad is None else p.grad.abs() / ctx.world
        dist.all_reduce(m, group=ctx.gloo)
        mags.append(m)
    return mags


def mean_bound(mag, world, wire):
    """|cnccl - exact| for one element of an averaged gradient, whose exact value is the mean of the
    ranks' local gradients g_i, with mag = Σ|g_i|/world: collective_oracles.wire_bound for the
    contributions g_i/world, each rounded once to the wire (u) with world-1 adds rounded once, and
    two fp32 roundings (the 1/world, before the cast in DDP or after the sum for AVG, and cnccl's
    scale); a rounding among subnormals errs by half a step instead, once per contribution (the sum
    of two subnormals is exact). `mag` comes from eager kernels outside DDP and FSDP: the factor
    1 + 2^-10 covers gradients that differ from those at the fp32 level (up to 2^-20·mag)."""
    u = UNIT[wire]
    return (world * u + 2 * 2.0**-24) * (1 + u) ** world * mag * (1 + 2.0**-10) + world * HALF_SUBNORMAL_STEP[wire]


def first_step_bound(mag, world, wire):
    """|hook - cnccl| for one element of the first step's averaged gradient, where both start from
    the same local gradients: each side lies within mean_bound of the exact mean, and the hook
    rounds once more among subnormals (it casts g_i, then divides in 16 bits)."""
    return 2 * mean_bound(mag, world, wire) + world * HALF_SUBNORMAL_STEP[wire]


def full(t):
    """A plain tensor from a DDP parameter or gradient, or the whole of an FSDP2 (DTensor) one."""
    return None if t is None else t.full_tensor() if hasattr(t, "full_tensor") else t


def exact_mean_check(ctx, net, wire, what):
    """A train() check: each element of every step's averaged gradient lies within mean_bound of
    the exact mean of the ranks' local gradients. Each rank recomputes its local gradient on a plain
    copy of `net` from the step's parameters and batches, and gloo sums them in fp64 (exact to
    2^-50·mag). Returns the exact means and magnitudes of every step checked, for other bounds."""
    seen = []

    def check(step, params, batches, grads):
        replica = copy.deepcopy(net)
        with torch.no_grad():
            for p, value in zip(replica.parameters(), params):
                p.copy_(full(value))
        for x, y in batches:
            net.loss(replica(x), y).backward()
        local = [torch.zeros(p.shape, dtype=torch.float64) if p.grad is None else p.grad.double()
                 for p in replica.parameters()]
        flat = torch.cat([g.flatten() for g in local] + [g.abs().flatten() for g in local]) / ctx.world
        dist.all_reduce(flat, group=ctx.gloo)
        exact_flat, mag_flat = flat.chunk(2)
        exact = list(exact_flat.split([g.numel() for g in local]))
        mags = list(mag_flat.split([g.numel() for g in local]))
        for i, (ours, e, m) in enumerate(zip(grads, exact, mags)):
            ours = full(ours)
            if ours is None:
                assert not m.any(), f"{what} step {step}: grad {i} missing where a rank's local gradient is not 0"
                continue
            excess = ((ours.double().flatten() - e).abs() - mean_bound(m, ctx.world, wire)).max().item()
            assert excess <= 0, f"{what} step {step}: grad {i} exceeds the bound on |cnccl - exact mean| by {excess:.3e}"
        seen.append((exact, mags))

    check.seen = seen
    return check


def compare(ctx, what, ref, ours, bitwise, wire="fp16", magnitude=None):
    """Bit for bit, every step and the final parameters, where the math is identical. Otherwise
    the first step's gradients, the one step where both runs see the same local gradients, within
    first_step_bound; later steps start from parameters already apart, so their comparison is the
    accuracy case's distance from an fp32 run."""
    (ref_grads, ref_params), (our_grads, our_params) = ref, ours
    for step, (a, b) in enumerate(zip(ref_grads, our_grads)):
        for i, (ga, gb) in enumerate(zip(a, b)):
            assert (ga is None) == (gb is None), f"{what}: step {step} grad {i} present on one side only"
            if ga is None:
                continue
            if bitwise:
                assert torch.equal(ga, gb), f"{what}: step {step} grad {i} differs by {max_diff([ga], [gb])}"
            elif step == 0:
                excess = ((ga.double() - gb.double()).abs() - first_step_bound(magnitude[i].double(), ctx.world,
                                                                                wire)).max().item()
                assert excess <= 0, f"{what}: step 0 grad {i} exceeds the rounding bound by {excess:.3e}"
    if bitwise:
        for i, (pa, pb) in enumerate(zip(ref_params, our_params)):
            assert torch.equal(pa, pb), f"{what}: param {i} differs by {max_diff([pa], [pb])}"
    grad_diff = max(max_diff(a, b) for a, b in zip(ref_grads, our_grads))
    ctx.report(case=what, bitwise=bitwise, max_grad_diff=grad_diff, max_param_diff=max_diff(ref_params, our_params))


def reference(ctx, key, run):
    """`run()`'s result for a training on gloo alone: no CPU engine changes it (same seeds, same
    gloo, the same bytes), so the first job of this world size runs it and saves each rank's result
    in the harness's shared folder, and the other engines' jobs load it. The ranks agree first on
    whether every one has it."""
    path = os.path.join(os.environ["CNCCL_TEST_SHARED_DIR"], f"parity-ws{ctx.world}-rank{ctx.rank}-{key}.pt")
    have = torch.tensor([os.path.exists(path)], dtype=torch.int32)
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=ctx.gloo)
    if have.item():
        return torch.load(path)
    result = run()
    torch.save(result, path + ".tmp")
    os.replace(path + ".tmp", path)
    return result


def run_ddp(ctx, net, group, hook=None, compile_model=False, micro_batches=1, steps=STEPS, check=None, **ddp_args):
    model = DDP(copy.deepcopy(net), process_group=group, **ddp_args)
    if hook is not None:
        state, fn = hook
        model.register_comm_hook(state, fn)
    runner = torch.compile(model) if compile_model else model
    before = cnccl.stats(group)["compressed_collectives"] if group in ctx.groups.values() else None
    result = train(runner, net, steps, "cpu", seed=100 + ctx.rank, micro_batches=micro_batches, check=check)
    if before is not None:
        assert cnccl.stats(group)["compressed_collectives"] > before, "DDP's buckets were not compressed"
    return result


VARIANTS = {
    "default": {},
    "gradient_as_bucket_view": dict(gradient_as_bucket_view=True),
    "static_graph": dict(static_graph=True),
    "no_sync_accumulation": dict(micro_batches=3),
    "find_unused_parameters": dict(find_unused_parameters=True),
    "torch_compile": dict(compile_model=True),
}


def model_for(name, variant):
    torch.manual_seed(0)
    if name == "mlp":
        return MLP(unused=variant == "find_unused_parameters")
    return Block()


def ddp_parity(ctx, model_name):
    for variant, args in VARIANTS.items():
        net = model_for(model_name, variant)
        magnitude = local_gradient_magnitude(ctx, net, args.get("micro_batches", 1))
        for wire in ("fp16", "bf16"):
            what = f"ddp {model_name} {variant} {wire}"
            ref = reference(ctx, f"ddp-{model_name}-{variant}-{wire}-hook",
                            lambda: run_ddp(ctx, net, ctx.gloo, hook=(ctx.gloo, SEED_HOOKS[wire]), **args))
            ours = run_ddp(ctx, net, ctx.groups[wire], **args)
            compare(ctx, f"{what} vs {wire}_compress_hook", ref, ours, ctx.world == 2 and wire == "bf16", wire,
                    magnitude)
            if wire == "fp16" and ctx.world == 2:
                ref = reference(ctx, f"ddp-{model_name}-{variant}-divide-first",
                                lambda: run_ddp(ctx, net, ctx.gloo, hook=(ctx.gloo, divide_first_fp16_hook), **args))
                compare(ctx, f"{what} vs divide-first fp16 hook", ref, ours, bitwise=True)


@case
def ddp_mlp_matches_seed_hooks_in_every_variant(ctx):
    ddp_parity(ctx, "mlp")


@case
def ddp_transformer_block_matches_seed_hooks_in_every_variant(ctx):
    ddp_parity(ctx, "block")


@case
def powersgd_on_cnccl_no_further_from_fp32_powersgd_than_the_wrapped_hook(ctx):
    """PowerSGD on cnccl runs its matmuls in fp32 and sends P and Q as fp16; on gloo,
    fp16_compress_wrapper(powerSGD_hook) runs all of PowerSGD in fp16. Not the same math, so no
    tolerance between them means anything: both are measured against plain PowerSGD on gloo (fp32)
    and cnccl's distance must be no larger. Where the math is the same it must be equal: before
    start_powerSGD_iter PowerSGD divides in fp32 and allreduces, which is divide_first_fp16_hook on
    gloo; at two ranks each element is one add, so those steps' gradients are bit for bit."""
    start, steps = 2, 8  # two plain allreduces, then PowerSGD with error feedback and warm start

    def hook(group, fn):
        state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=2, start_powerSGD_iter=start,
                                       min_compression_rate=1, random_seed=0)
        return state, fn

    net = model_for("mlp", "default")
    g = ctx.groups["fp16"]
    exact = reference(ctx, "powersgd-fp32",
                      lambda: run_ddp(ctx, net, ctx.gloo, hook=hook(ctx.gloo, powersgd.powerSGD_hook), steps=steps))
    wrapped = reference(ctx, "powersgd-fp16-wrapper", lambda: run_ddp(
        ctx, net, ctx.gloo, steps=steps, hook=hook(ctx.gloo, default_hooks.fp16_compress_wrapper(powersgd.powerSGD_hook))))
    ours = run_ddp(ctx, net, g, hook=hook(g, powersgd.powerSGD_hook), steps=steps)
    if ctx.world == 2:
        plain_grads, _ = reference(ctx, "powersgd-divide-first", lambda: run_ddp(
            ctx, net, ctx.gloo, hook=(ctx.gloo, divide_first_fp16_hook), steps=start))
        for step in range(start):
            for i, (a, b) in enumerate(zip(plain_grads[step], ours[0][step])):
                assert (a is None and b is None) or torch.equal(a, b), f"step {step} grad {i}: {max_diff([a], [b])}"
    dist_wrapped, dist_ours = relative_distance(wrapped[1], exact[1]), relative_distance(ours[1], exact[1])
    ctx.report(case=f"powerSGD fp16 after {steps} steps, distance from fp32 PowerSGD",
               relative_l2_wrapped_hook=dist_wrapped, relative_l2_cnccl=dist_ours)
    assert dist_ours <= dist_wrapped, f"cnccl {dist_ours:.3e} vs fp16_compress_wrapper {dist_wrapped:.3e}"


@case
def accuracy_every_step_within_the_bound_of_the_exact_mean_and_at_2_ranks_no_worse_than_the_seed_hook(ctx):
    """30 steps of training on cnccl: every step's averaged gradients lie within mean_bound of the
    exact mean of that step's local gradients, element by element (exact_mean_check). The distance
    of the final parameters from an fp32 gloo run is reported beside the seed hook's; at 2 ranks
    cnccl's must be no larger (bf16 is bit for bit there, and fp16 differs from the hook only where
    the hook rounds a subnormal twice). Beyond 2 ranks gloo's ring adds in another order, which moves
    30 steps' distance either way, so only the per-step bound is asserted."""
    steps = 30
    for model_name in ("mlp", "block"):
        net = model_for(model_name, "default")
        _, exact = reference(ctx, f"accuracy-{model_name}-fp32", lambda: run_ddp(ctx, net, ctx.gloo, steps=steps))
        for wire in ("fp16", "bf16"):
            _, hooked = reference(ctx, f"accuracy-{model_name}-{wire}-hook",
                                  lambda: run_ddp(ctx, net, ctx.gloo, hook=(ctx.gloo, SEED_HOOKS[wire]), steps=steps))
            check = exact_mean_check(ctx, net, wire, f"ddp {model_name} {wire}")
            _, ours = run_ddp(ctx, net, ctx.groups[wire], steps=steps, check=check)
            assert len(check.seen) == steps
            dist_hook, dist_ours = relative_distance(hooked, exact), relative_distance(ours, exact)
            ctx.report(case=f"accuracy {model_name} {wire} after {steps} steps", relative_l2_hook=dist_hook,
                       relative_l2_cnccl=dist_ours, max_abs_hook=max_diff(hooked, exact),
                       max_abs_cnccl=max_diff(ours, exact))
            if ctx.world == 2:
                assert dist_ours <= dist_hook, f"{model_name} {wire}: cnccl {dist_ours:.3e} vs hook {dist_hook:.3e}"


def fully_sharded(group, force_sum):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Block()
    for layer in (model.mlp, model):
        fully_shard(layer, mesh=DeviceMesh.from_group(group, "cpu"))
    # gloo has no AVG: FSDP2 then sums and divides in fp32; on cnccl it reduce-scatters with AVG.
    model.set_force_sum_reduction_for_comms(force_sum)
    return model


@case(min_world=2)
def fsdp2_reduce_scatter_compressed_and_every_step_within_the_bound_of_the_exact_mean(ctx):
    """FSDP2 (fully_shard) on cnccl reduce-scatters with AVG over an fp16 wire: every step's
    gradients lie within mean_bound of the exact mean of the local gradients (exact_mean_check). On
    the first step both runs see the same local gradients, so FSDP2 on gloo (fp32: world-1 adds and
    a division, each rounded once) is within world·2^-24·(1+2^-24)^world·mag of the same exact
    mean, plus 2^-20·mag for local gradients that differ at the fp32 level (as in mean_bound), and
    the two runs within the sum of the bounds, element by element."""
    g = ctx.groups["fp16"]
    ref, ours = fully_sharded(ctx.gloo, True), fully_sharded(g, False)
    torch.manual_seed(0)
    check = exact_mean_check(ctx, Block(), "fp16", "fsdp2 block fp16")
    ref_grads, _ = train(ref, ref, 3, "cpu", seed=100 + ctx.rank)
    before = cnccl.stats(g)
    our_grads, _ = train(ours, ours, 3, "cpu", seed=100 + ctx.rank, check=check)
    after = cnccl.stats(g)
    rs = after["compressed_collectives"] - before["compressed_collectives"]
    assert rs >= 3 * 2, f"expected FSDP2's reduce-scatters (2 per step) to be compressed, saw {rs}"
    assert after["bytes_sent"] - before["bytes_sent"] < after["bytes_uncompressed"] - before["bytes_uncompressed"]
    assert len(check.seen) == 3
    exact, mags = check.seen[0]
    grad_diff = 0.0
    for i, (ga, gb, e, m) in enumerate(zip(ref_grads[0], our_grads[0], exact, mags)):
        ga, gb = full(ga).double().flatten(), full(gb).double().flatten()
        gloo_bound = (ctx.world * 2.0**-24 * (1 + 2.0**-24) ** ctx.world + 2.0**-20) * m
        assert ((ga - e).abs() - gloo_bound).max().item() <= 0, f"fsdp2 on gloo, grad {i}: beyond its fp32 bound"
        excess = ((ga - gb).abs() - gloo_bound - mean_bound(m, ctx.world, "fp16")).max().item()
        assert excess <= 0, f"fsdp2 step 0 grad {i}: cnccl and gloo differ by {excess:.3e} more than the bound"
        grad_diff = max(grad_diff, (ga - gb).abs().max().item())
    ctx.report(case="fsdp2 block fp16 vs FSDP2 on gloo (fp32), first step", bitwise=False, max_grad_diff=grad_diff)


@pytest.mark.parametrize("engine", CPU_ENGINES)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", case.names())
def test_parity(name, world_size, engine):
    check_case(shared_job(__name__, world_size, engine), name, world_size, case)
