"""The frameworks people train with, on cnccl (examples/frameworks), each beside the same training
on gloo: 2 ranks on CPU, launched with torchrun.

- PyTorch Lightning (`DDPStrategy(process_group_backend="cnccl")`), Hugging Face Accelerate (the
  group made first, then `Accelerator(cpu=True)`: see the example for why) and Transformers' Trainer
  (the group made first, then `TrainingArguments(use_cpu=True)`) run DDP; with a bf16 wire
  they must end with the parameters of gloo + `bf16_compress_hook` bit for bit. At two ranks the
  math is the same (test_parity's module docstring): the hook divides by 2 in bf16 (exact), cnccl in
  fp32 before the cast; each element is then one add, rounded once to bf16, in both. cnccl's
  counters must show the buckets compressed.
- FSDP2 with `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` on cnccl with a bf16 wire
  and fp32 sums must match FSDP2's fp32 reduce-scatter on gloo bit for bit, every step's gradients
  and the final parameters (why: the example's docstring), while its reduce-scatters send half the
  bytes; a bf16 reduce-scatter (reduce_dtype=bf16) is measured beside it and must be further away.
  A backend that dropped the compression fails the bytes; one that dropped the fp32 sums (bf16 adds)
  fails the bit-for-bit comparison.

A framework that is not installed skips its case by name; with CNCCL_REQUIRE_FRAMEWORKS=1 (CI) the
skip is a failure (.ci/setup-deps.sh installs them).
"""

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from harness import clean_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples", "frameworks")


def require(module):
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CNCCL_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"CNCCL_REQUIRE_FRAMEWORKS=1 but {module} is not installed")
        pytest.skip(f"{module} is not installed (.ci/setup-deps.sh installs it)")


def train(tmp_path, script, *args, env=None):
    """Runs an example on 2 ranks; returns what its rank 0 saved."""
    out = tmp_path / f"{script}-{len(list(tmp_path.iterdir()))}.pt"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            os.path.join(EXAMPLES, script), *args, "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=REPO,
                       env=clean_env(OMP_NUM_THREADS="1", **(env or {})))
    assert r.returncode == 0, f"{' '.join(argv[3:])}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return torch.load(out)


def assert_equal(ours, ref, what):
    assert len(ours) == len(ref), what
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert torch.equal(a, b), f"{what} {i} differs by {(a - b).abs().max().item():.3e}"


def assert_compressed(stats, what):
    assert stats["compressed_collectives"] > 0, f"{what}: nothing was compressed: {stats}"


@pytest.mark.parametrize("framework, script", [("pytorch_lightning", "lightning_ddp.py"),
                                               ("accelerate", "accelerate_ddp.py"),
                                               ("transformers", "hf_trainer_ddp.py")])
def test_ddp_under_the_framework_matches_gloo_with_the_bf16_hook_bit_for_bit(tmp_path, framework, script):
    require(framework)
    ours = train(tmp_path, script, env={"CNCCL_WIRE_DTYPE": "bf16", "CNCCL_MIN_BYTES": "0"})
    ref = train(tmp_path, script, "--backend", "gloo", "--hook", "bf16")
    assert ours["backend"] == "cnccl" and ref["backend"] == "gloo"
    assert_compressed(ours["stats"], framework)
    assert_equal(ours["params"], ref["params"], f"{framework}: parameter")


def relative_distance(grads, exact):
    num = sum(((a.double() - b.double()) ** 2).sum() for step_a, step_b in zip(grads, exact)
              for a, b in zip(step_a, step_b))
    return (num / sum((b.double() ** 2).sum() for step in exact for b in step)).sqrt().item()


def test_fsdp2_mixed_precision_matches_the_fp32_reduce_scatter_with_half_its_bytes(tmp_path):
    ours = train(tmp_path, "fsdp2_mixed_precision.py")
    fp32 = train(tmp_path, "fsdp2_mixed_precision.py", "--backend", "gloo")
    bf16 = train(tmp_path, "fsdp2_mixed_precision.py", "--backend", "gloo", "--reduce-dtype", "bf16")
    sent, uncompressed = ours["reduce_scatter_bytes"]
    assert uncompressed > 0 and sent * 2 <= uncompressed, f"the reduce-scatters sent {sent} of {uncompressed} bytes"
    for step, (a, b) in enumerate(zip(ours["grads"], fp32["grads"])):
        assert_equal(a, b, f"step {step}: gradient")
    assert_equal(ours["params"], fp32["params"], "parameter")
    ours_distance, bf16_distance = relative_distance(ours["grads"], fp32["grads"]), relative_distance(bf16["grads"],
                                                                                                      fp32["grads"])
    print(f"relative distance of the gradients from the fp32 reduce-scatter: cnccl {ours_distance:.3e}, "
          f"bf16 reduce-scatter {bf16_distance:.3e}")
    assert ours_distance < bf16_distance
