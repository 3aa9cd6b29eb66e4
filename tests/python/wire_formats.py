"""Facts about the 16-bit wire formats that the tests' rounding bounds are built from."""

import torch

WIRE_DTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT = {"fp16": 2.0**-11, "bf16": 2.0**-8}  # unit roundoff of the wire format
# The absolute error of a rounding that lands among the wire's subnormals.
HALF_SUBNORMAL_STEP = {"fp16": 2.0**-25, "bf16": 2.0**-134}
