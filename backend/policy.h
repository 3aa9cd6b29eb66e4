// The one place that decides, per collective, whether a tensor travels compressed and which
// scales apply (docs/design.md, "Semantics"). Pure: no communication, unit-tested on its own.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/options.h"

namespace cnccl {

using RedOp = c10d::ReduceOp::RedOpType;

struct Plan {
  bool compress = false;
  codec::Wire wire = codec::Wire::kFp16;
  // The reduction the algorithm itself performs (SUM for AVG and PREMUL_SUM).
  RedOp inner_op = RedOp::SUM;
  // Multiplies every element before the reduction (in fp32 inside the cast when compressed).
  double pre_scale = 1.0;
  // Compressed: multiplies on restore. Uncompressed: 1.
  double post_scale = 1.0;
  // Uncompressed integer AVG: truncating division after the sum, as NCCL does.
  int64_t post_divisor = 1;
};

// Throws c10::ValueError / TypeError when `op` cannot apply to `dtype` (e.g. BAND on floats).
void check_reduction(at::ScalarType dtype, RedOp op);

// `factor` is PREMUL_SUM's multiplier (ignored otherwise).
Plan plan_reduction(const Config& config, at::ScalarType dtype, int64_t nbytes, RedOp op, double factor,
                    int world_size);

// PREMUL_SUM's factor (a double or a one-element tensor); 1 for other ops.
double premul_factor(const c10d::ReduceOp& op);
// PREMUL_SUM's factor when it is a tensor (undefined otherwise): reading it may need a device sync.
at::Tensor premul_tensor_factor(const c10d::ReduceOp& op);

const char* op_name(RedOp op);

}  // namespace cnccl
