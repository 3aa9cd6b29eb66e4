// Configuration of a cnccl group: CNCCL_* environment variables, read once at group creation,
// overridden field by field by an Options object (Python: pg_options).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>

#include "compress/codec.h"

namespace cnccl {

enum class SumScaling : uint8_t { kNone, kWorld };
// What runs CPU tensors' collectives: cnccl's own host path over UCX, or torch's ProcessGroupGloo
// under the composed path (docs/design.md, "The composed path").
enum class CpuEngine : uint8_t { kUcx, kGloo };
// What runs CUDA tensors' collectives under the composed path: torch's ProcessGroupNCCL, or its
// ProcessGroupGloo, which stages CUDA tensors through host memory, so that several ranks can share one
// GPU (NCCL refuses two ranks on one device). cnccl's CUDA kernels run on either (docs/design.md,
// "The composed path").
enum class CudaEngine : uint8_t { kNccl, kGloo };
// Whether the host path's ranks on one host use shared memory (docs/design.md, "Shared memory"):
// when they can (auto), always (on: group creation fails when they cannot), or never (UCX only).
enum class ShmMode : uint8_t { kAuto, kOn, kOff };
// How a compressed sum adds (docs/design.md, "Numerics"): in the wire type in whatever order the
// engine takes (a ring rounds every hop), or in fp32 in rank order with one rounding.
enum class Accumulate : uint8_t { kWire, kFp32 };
// How a value is rounded to the wire: to nearest (ties to even), or stochastically with Philox
// bits (compress/stochastic.h; needs accumulate=fp32, where cnccl does every rounding itself).
enum class Rounding : uint8_t { kNearest, kStochastic };
// Whether a compressed sum's parts travel as they are, or each in a frame with its own power-of-two
// exponent picked from its amax (backend/frames.h; needs accumulate=fp32, where cnccl decodes
// every contribution itself).
enum class Scaling : uint8_t { kNone, kPow2 };
// Whether a compressed sum's values travel as they are, or each block of 16 rotated by a signed Hadamard
// matrix first and rotated back once the sum is in (compress/codec.h, rotate; docs/design.md, "Block
// rotation"): a block's outliers spread over its elements before a coarse wire rounds them.
enum class Rotation : uint8_t { kNone, kHadamard };

// What cnccl.stats() learns of the casts (docs/design.md, "Telemetry"): nothing; the counts of values
// that were not finite or overflowed (the default: they cost nothing measurable); those and the
// relative error of each compressed collective's own contribution, sampled.
enum class Telemetry : uint8_t { kOff, kCounts, kError };

// The settings a group runs with, after defaults, environment and Options are combined.
struct Config {
  std::optional<compress::Wire> wire = compress::Wire::kFp16;  // nullopt: compression off
  int64_t min_bytes = 64 * 1024;
  SumScaling sum_scaling = SumScaling::kNone;
  bool compress_fp64 = false;
  CpuEngine cpu_engine = CpuEngine::kUcx;
  CudaEngine cuda_engine = CudaEngine::kNccl;
  ShmMode shm = ShmMode::kAuto;
  Accumulate accumulate = Accumulate::kWire;
  Rounding rounding = Rounding::kNearest;
  uint64_t sr_seed = 0;
  Scaling scaling = Scaling::kNone;
  Rotation rotation = Rotation::kNone;  // its signs keyed by sr_seed
  // Whether a failed shared-memory allreduce must leave the caller's tensor as it was: results then
  // land in a workspace and are restored only once every chunk is in, one more pass over memory
  // (docs/design.md, "Shared memory"). Off by default, as with NCCL and gloo, whose failed
  // collectives leave the group unusable and the tensor undefined.
  bool untouched_on_failure = false;
  Telemetry telemetry = Telemetry::kCounts;
  // How an MX block's power of two is chosen (compress::MxScale): RCEIL, the smallest that saturates
  // nothing (NVIDIA's hardware and torchao's RCEIL), or OCP's FLOOR. Changes bytes only on MX wires.
  compress::MxScale mx_scale = compress::MxScale::kRceil;
  // The wire between hosts where the host path runs hierarchically (docs/design.md, "A wire per
  // level"); unset, the group's `wire`. nullopt inside a set value: fp32 across hosts.
  std::optional<std::optional<compress::Wire>> inter_host_wire;

  std::optional<compress::Wire> wire_across() const { return inter_host_wire ? *inter_host_wire : wire; }
  // Whether the two levels send different formats: the host path's sums then run per level, in fp32 at each.
  bool per_level() const { return wire_across() != wire; }
  std::string wire_name() const { return wire ? compress::wire_name(*wire) : "none"; }
  std::string wire_across_name() const { return wire_across() ? compress::wire_name(*wire_across()) : "none"; }
  const char* cpu_engine_name() const { return cpu_engine == CpuEngine::kGloo ? "gloo" : "ucx"; }
  const char* cuda_engine_name() const { return cuda_engine == CudaEngine::kGloo ? "gloo" : "nccl"; }
  const char* shm_name() const { return shm == ShmMode::kOn ? "on" : shm == ShmMode::kOff ? "off" : "auto"; }
  const char* accumulate_name() const { return accumulate == Accumulate::kFp32 ? "fp32" : "wire"; }
  const char* rounding_name() const { return rounding == Rounding::kStochastic ? "sr" : "rne"; }
  const char* scaling_name() const { return scaling == Scaling::kPow2 ? "pow2" : "none"; }
  const char* rotation_name() const { return rotation == Rotation::kHadamard ? "hadamard" : "none"; }
  const char* telemetry_name() const {
    return telemetry == Telemetry::kOff ? "off" : telemetry == Telemetry::kError ? "error" : "counts";
  }
  // The settings in effect that change the bytes a collective sends or returns, as text ranks compare.
  std::string bytes_settings() const;
  // The settings that decide what a group builds at creation (its engines), as text its ranks compare
  // while they join (group_store): a rank that would build another engine fails there, naming both.
  std::string engine_settings() const;
};

// Returns once every rank of the group shows the same bytes_settings() through `store` (one round,
// under `key`, within `timeout`); otherwise throws a DistBackendError naming a rank that differs
// from this one and both settings, or the ranks that never showed theirs. The CUDA path's check,
// before its first allreduce or reduce_scatter: NCCL agrees on nothing per call, where the CPU
// paths sign every call (docs/design.md, "Agreement").
void agree_on_settings(c10d::Store& store, const std::string& key, int rank, int size, const Config& config,
                       std::chrono::milliseconds timeout);

struct Options : c10d::Backend::Options {
  explicit Options(std::chrono::milliseconds timeout = kBackendDefaultTimeout);

  std::optional<std::string> wire_dtype;   // fp16 | bf16 | e4m3 | e5m2 | mxfp8 | mxfp8_e5m2 | mxfp4 | nvfp4 | none
  std::optional<int64_t> min_bytes;        // >= 0
  std::optional<std::string> sum_scaling;  // none | world
  std::optional<bool> compress_fp64;
  std::optional<std::string> cpu_engine;   // ucx | gloo
  std::optional<std::string> cuda_engine;  // nccl | gloo
  std::optional<std::string> shm;          // auto | on | off
  std::optional<std::string> accumulate;   // wire | fp32
  std::optional<std::string> rounding;     // rne | sr
  std::optional<int64_t> sr_seed;          // any integer (its 64 bits key Philox)
  std::optional<std::string> scaling;      // none | pow2
  std::optional<std::string> rotation;     // none | hadamard
  std::optional<bool> untouched_on_failure;
  std::optional<std::string> telemetry;    // off | counts | error
  std::optional<std::string> mx_scale;     // rceil | floor
  std::optional<std::string> inter_host_wire;  // as wire_dtype

  // Overrides Backend::Options::clone() where the torch version has it (keeps the subclass).
  virtual c10::intrusive_ptr<c10d::Backend::Options> clone() const;

  // Defaults <- CNCCL_* environment <- these fields. Throws c10::ValueError naming the bad
  // variable or field and the allowed values.
  Config resolve() const;
};

// A wire_dtype value (CNCCL_WIRE_DTYPE, Options.wire_dtype): nullopt for "none". Throws c10::ValueError
// naming `source` and the allowed values.
std::optional<compress::Wire> parse_wire(const std::string& value, const char* source);
// An mx_scale value (CNCCL_MX_SCALE, Options.mx_scale): rceil or floor. Throws c10::ValueError likewise.
compress::MxScale parse_mx_scale(const std::string& value, const char* source);

}  // namespace cnccl
