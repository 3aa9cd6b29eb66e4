#include "backend/options.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "backend/errors.h"

namespace cnccl {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

Telemetry parse_telemetry(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "off") return Telemetry::kOff;
  if (v == "counts") return Telemetry::kCounts;
  if (v == "error") return Telemetry::kError;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: off, counts, error");
}

SumScaling parse_sum_scaling(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "none") return SumScaling::kNone;
  if (v == "world") return SumScaling::kWorld;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: none, world");
}

CpuEngine parse_cpu_engine(const std::string& value, const char* source) {
  const std::string v = lower(value);
#if CNCCL_WITH_UCX
  if (v == "ucx") return CpuEngine::kUcx;
#else
  TORCH_CHECK_VALUE(v != "ucx", "cnccl: ", source, "=ucx, but this build of cnccl has no UCX (built with ",
                    "CNCCL_WITH_UCX=OFF or without libucx), so no host path: CPU tensors go through gloo (",
                    source, "=gloo, the default in such a build), within a host and across hosts");
#endif
  if (v == "gloo") return CpuEngine::kGloo;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: ucx, gloo");
}

CudaEngine parse_cuda_engine(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "nccl") return CudaEngine::kNccl;
  if (v == "gloo") return CudaEngine::kGloo;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: nccl, gloo");
}

ShmMode parse_shm(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "auto") return ShmMode::kAuto;
  if (v == "on" || v == "1") return ShmMode::kOn;
  if (v == "off" || v == "0") return ShmMode::kOff;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: auto, on, off");
}

Accumulate parse_accumulate(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "wire") return Accumulate::kWire;
  if (v == "fp32") return Accumulate::kFp32;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: wire, fp32");
}

Rounding parse_rounding(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "rne") return Rounding::kNearest;
  if (v == "sr") return Rounding::kStochastic;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: rne, sr");
}

Scaling parse_scaling(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "none") return Scaling::kNone;
  if (v == "pow2") return Scaling::kPow2;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: none, pow2");
}

Rotation parse_rotation(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "none") return Rotation::kNone;
  if (v == "hadamard") return Rotation::kHadamard;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: none, hadamard");
}

uint64_t parse_seed(const std::string& value, const char* source) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 0);
  TORCH_CHECK_VALUE(!value.empty() && end && *end == '\0' && errno == 0, "cnccl: ", source, "='", value,
                    "' is not valid; allowed: an integer");
  return static_cast<uint64_t>(n);
}

int64_t parse_bytes(const std::string& value, const char* source) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  TORCH_CHECK_VALUE(!value.empty() && end && *end == '\0' && errno == 0 && n >= 0, "cnccl: ", source, "='", value,
                    "' is not valid; allowed: a byte count >= 0");
  return n;
}

bool parse_bool(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: 0, 1, true, false");
}

// A wire per level (docs/design.md, "A wire per level"): each level's owners decode and add in fp32.
// Every compressed level travels in frames (power-of-two, MX or NVFP4), so `scaling` asks nothing more.
void check_levels(const Config& c) {
  if (!c.per_level()) return;
  const std::string both = "wire_dtype=" + c.wire_name() + " inside a host and inter_host_wire=" + c.wire_across_name() +
                           " across hosts (CNCCL_WIRE_DTYPE, CNCCL_INTER_HOST_WIRE / Options)";
  TORCH_CHECK_VALUE(c.accumulate == Accumulate::kFp32, "cnccl: ", both, " need accumulate=fp32 (CNCCL_ACCUMULATE / ",
                    "Options.accumulate): a level's owner decodes every contribution and adds in fp32 before the next ",
                    "level's wire; got accumulate=", c.accumulate_name());
  // Power-of-two frames have no stochastic rounding (scaling=pow2 refuses rounding=sr alike).
  const auto admits_sr = [](const std::optional<compress::Wire>& w) { return !w || compress::is_blocks(*w); };
  TORCH_CHECK_VALUE(c.rounding == Rounding::kNearest || (admits_sr(c.wire) && admits_sr(c.wire_across())),
                    "cnccl: ", both, " with rounding=sr (CNCCL_ROUNDING / Options.rounding) need each level a block ",
                    "wire (mxfp8, mxfp8_e5m2, mxfp4, nvfp4) or none: a 16-bit or 8-bit level travels in power-of-two ",
                    "frames, which do not yet round stochastically; use rounding=rne, or e.g. wire_dtype=none with ",
                    "inter_host_wire=nvfp4");
}

}  // namespace

compress::MxScale parse_mx_scale(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "rceil") return compress::MxScale::kRceil;
  if (v == "floor") return compress::MxScale::kFloor;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value, "' is not valid; allowed: rceil, floor");
}

std::optional<compress::Wire> parse_wire(const std::string& value, const char* source) {
  const std::string v = lower(value);
  if (v == "fp16" || v == "float16") return compress::Wire::kFp16;
  if (v == "bf16" || v == "bfloat16") return compress::Wire::kBf16;
  if (v == "e4m3" || v == "float8_e4m3fn") return compress::Wire::kE4m3;
  if (v == "e5m2" || v == "float8_e5m2") return compress::Wire::kE5m2;
  if (v == "mxfp8") return compress::Wire::kMxfp8;
  if (v == "mxfp8_e5m2") return compress::Wire::kMxfp8E5m2;
  if (v == "mxfp4") return compress::Wire::kMxfp4;
  if (v == "nvfp4") return compress::Wire::kNvfp4;
  if (v == "none") return std::nullopt;
  TORCH_CHECK_VALUE(false, "cnccl: ", source, "='", value,
                    "' is not valid; allowed: fp16, bf16, e4m3, e5m2, mxfp8, mxfp8_e5m2, mxfp4, nvfp4, none");
}

Options::Options(std::chrono::milliseconds timeout) : c10d::Backend::Options("cnccl", timeout) {}

c10::intrusive_ptr<c10d::Backend::Options> Options::clone() const { return c10::make_intrusive<Options>(*this); }

Config Options::resolve() const {
  Config c;
#if !CNCCL_WITH_UCX
  c.cpu_engine = CpuEngine::kGloo;  // no host path in this build
#endif
  if (auto v = env("CNCCL_WIRE_DTYPE")) c.wire = parse_wire(*v, "CNCCL_WIRE_DTYPE");
  if (auto v = env("CNCCL_MIN_BYTES")) c.min_bytes = parse_bytes(*v, "CNCCL_MIN_BYTES");
  if (auto v = env("CNCCL_SUM_SCALING")) c.sum_scaling = parse_sum_scaling(*v, "CNCCL_SUM_SCALING");
  if (auto v = env("CNCCL_COMPRESS_FP64")) c.compress_fp64 = parse_bool(*v, "CNCCL_COMPRESS_FP64");
  if (auto v = env("CNCCL_CPU_ENGINE")) c.cpu_engine = parse_cpu_engine(*v, "CNCCL_CPU_ENGINE");
  if (auto v = env("CNCCL_CUDA_ENGINE")) c.cuda_engine = parse_cuda_engine(*v, "CNCCL_CUDA_ENGINE");
  if (auto v = env("CNCCL_SHM")) c.shm = parse_shm(*v, "CNCCL_SHM");
  if (auto v = env("CNCCL_ACCUMULATE")) c.accumulate = parse_accumulate(*v, "CNCCL_ACCUMULATE");
  if (auto v = env("CNCCL_ROUNDING")) c.rounding = parse_rounding(*v, "CNCCL_ROUNDING");
  if (auto v = env("CNCCL_SR_SEED")) c.sr_seed = parse_seed(*v, "CNCCL_SR_SEED");
  if (auto v = env("CNCCL_SCALING")) c.scaling = parse_scaling(*v, "CNCCL_SCALING");
  if (auto v = env("CNCCL_ROTATION")) c.rotation = parse_rotation(*v, "CNCCL_ROTATION");
  if (auto v = env("CNCCL_UNTOUCHED_ON_FAILURE")) {
    c.untouched_on_failure = parse_bool(*v, "CNCCL_UNTOUCHED_ON_FAILURE");
  }
  if (auto v = env("CNCCL_TELEMETRY")) c.telemetry = parse_telemetry(*v, "CNCCL_TELEMETRY");
  if (auto v = env("CNCCL_MX_SCALE")) c.mx_scale = parse_mx_scale(*v, "CNCCL_MX_SCALE");
  if (auto v = env("CNCCL_INTER_HOST_WIRE")) c.inter_host_wire = parse_wire(*v, "CNCCL_INTER_HOST_WIRE");
  if (wire_dtype) c.wire = parse_wire(*wire_dtype, "Options.wire_dtype");
  if (min_bytes) {
    TORCH_CHECK_VALUE(*min_bytes >= 0, "cnccl: Options.min_bytes=", *min_bytes,
                      " is not valid; allowed: a byte count >= 0");
    c.min_bytes = *min_bytes;
  }
  if (sum_scaling) c.sum_scaling = parse_sum_scaling(*sum_scaling, "Options.sum_scaling");
  if (compress_fp64) c.compress_fp64 = *compress_fp64;
  if (cpu_engine) c.cpu_engine = parse_cpu_engine(*cpu_engine, "Options.cpu_engine");
  if (cuda_engine) c.cuda_engine = parse_cuda_engine(*cuda_engine, "Options.cuda_engine");
  if (shm) c.shm = parse_shm(*shm, "Options.shm");
  if (accumulate) c.accumulate = parse_accumulate(*accumulate, "Options.accumulate");
  if (rounding) c.rounding = parse_rounding(*rounding, "Options.rounding");
  if (sr_seed) c.sr_seed = static_cast<uint64_t>(*sr_seed);
  if (scaling) c.scaling = parse_scaling(*scaling, "Options.scaling");
  if (rotation) c.rotation = parse_rotation(*rotation, "Options.rotation");
  if (untouched_on_failure) c.untouched_on_failure = *untouched_on_failure;
  if (telemetry) c.telemetry = parse_telemetry(*telemetry, "Options.telemetry");
  if (mx_scale) c.mx_scale = parse_mx_scale(*mx_scale, "Options.mx_scale");
  if (inter_host_wire) c.inter_host_wire = parse_wire(*inter_host_wire, "Options.inter_host_wire");
  check_levels(c);
  // Blocks first, naming everything they need at once: the general rules below would each name one of them.
  const bool mx = c.wire && compress::is_mx(*c.wire), nvfp4 = c.wire == compress::Wire::kNvfp4;
  TORCH_CHECK_VALUE(!mx || (c.accumulate == Accumulate::kFp32 && c.scaling == Scaling::kNone),
                    "cnccl: wire_dtype=", c.wire_name(), " (CNCCL_WIRE_DTYPE / Options.wire_dtype) needs accumulate=fp32 "
                    "and scaling=none (CNCCL_ACCUMULATE, CNCCL_SCALING / Options): the owner decodes every block of "
                    "32, which carries its own power of two (OCP MX v1.0); got accumulate=", c.accumulate_name(),
                    ", scaling=", c.scaling_name());
  TORCH_CHECK_VALUE(!nvfp4 || (c.accumulate == Accumulate::kFp32 && c.scaling == Scaling::kNone),
                    "cnccl: wire_dtype=nvfp4 (CNCCL_WIRE_DTYPE / Options.wire_dtype) needs accumulate=fp32 and "
                    "scaling=none (CNCCL_ACCUMULATE, CNCCL_SCALING / Options): the owner decodes every block, which "
                    "carries its own e4m3 scale under the part's fp32 one; got accumulate=", c.accumulate_name(),
                    ", scaling=", c.scaling_name());
  // With wire accumulation the engine's own 16-bit adds round to nearest: only the casts could be
  // stochastic, which is not what `sr` promises.
  TORCH_CHECK_VALUE(c.rounding != Rounding::kStochastic || c.accumulate == Accumulate::kFp32,
                    "cnccl: rounding=sr (CNCCL_ROUNDING / Options.rounding) needs accumulate=fp32 "
                    "(CNCCL_ACCUMULATE / Options.accumulate): with accumulate=wire the engine's 16-bit adds "
                    "round to nearest");
  // A frame's exponent is decoded by the part's owner before it adds: the engine's own adds
  // cannot.
  TORCH_CHECK_VALUE(c.scaling != Scaling::kPow2 || c.accumulate == Accumulate::kFp32,
                    "cnccl: scaling=pow2 (CNCCL_SCALING / Options.scaling) needs accumulate=fp32 "
                    "(CNCCL_ACCUMULATE / Options.accumulate): every contribution is decoded before it is added");
  TORCH_CHECK_VALUE(c.scaling != Scaling::kPow2 || c.rounding != Rounding::kStochastic,
                    "cnccl: scaling=pow2 (CNCCL_SCALING / Options.scaling) does not yet combine with rounding=sr "
                    "(CNCCL_ROUNDING / Options.rounding); use rounding=rne");
  // The rotation runs on the host path's sums, around whichever wire: not on gloo's, nor per level. (It
  // changes no CUDA tensor's bytes, which refuse it: each CPU call's signature names it instead of
  // bytes_settings.)
  TORCH_CHECK_VALUE(c.rotation == Rotation::kNone || (c.wire && !c.per_level() && c.cpu_engine == CpuEngine::kUcx),
                    "cnccl: rotation=hadamard (CNCCL_ROTATION / Options.rotation) needs a compressed wire_dtype, ",
                    "cpu_engine=ucx (the host path; it is not built for gloo's sums) and no inter_host_wire other ",
                    "than wire_dtype; got wire_dtype=", c.wire_name(), ", cpu_engine=", c.cpu_engine_name(),
                    ", inter_host_wire=", c.inter_host_wire ? c.wire_across_name() : std::string("unset"));
  const bool fp8 = c.wire == compress::Wire::kE4m3 || c.wire == compress::Wire::kE5m2;
  TORCH_CHECK_VALUE(!fp8 || (c.accumulate == Accumulate::kFp32 && c.scaling == Scaling::kPow2), "cnccl: wire_dtype=",
                    c.wire_name(), " (CNCCL_WIRE_DTYPE / Options.wire_dtype) needs accumulate=fp32 and scaling=pow2 "
                    "(CNCCL_ACCUMULATE, CNCCL_SCALING): an 8-bit value needs its part's exponent, and no engine "
                    "adds it");
  return c;
}

std::string Config::bytes_settings() const {
  // Only what is in effect: with compression off no other setting changes a byte, and the seed
  // keys only stochastic rounding.
  const std::string levels = per_level() ? ", inter_host_wire=" + wire_across_name() : "";
  if (!wire && !per_level()) return "wire_dtype=none";
  const std::string seed = rounding == Rounding::kStochastic ? ", sr_seed=" + std::to_string(sr_seed) : "";
  if (!wire) return "wire_dtype=none" + levels + ", min_bytes=" + std::to_string(min_bytes) + ", sum_scaling=" +
                    (sum_scaling == SumScaling::kWorld ? "world" : "none") + ", compress_fp64=" +
                    (compress_fp64 ? "1" : "0") + ", rounding=" + rounding_name() + seed + ", mx_scale=" +
                    compress::mx_scale_name(mx_scale);
  std::string text = "wire_dtype=" + wire_name() + ", min_bytes=" + std::to_string(min_bytes) +
                     ", sum_scaling=" + (sum_scaling == SumScaling::kWorld ? "world" : "none") +
                     ", compress_fp64=" + (compress_fp64 ? "1" : "0") + ", accumulate=" + accumulate_name() +
                     ", rounding=" + rounding_name() + seed + ", scaling=" + scaling_name();
  if (compress::is_mx(*wire) || per_level()) text += ", mx_scale=" + std::string(compress::mx_scale_name(mx_scale));
  return text + levels;
}

std::string Config::engine_settings() const {
  return std::string("cpu_engine=") + cpu_engine_name() + ", cuda_engine=" + cuda_engine_name();
}

void agree_on_settings(c10d::Store& store, const std::string& key, int rank, int size, const Config& config,
                       std::chrono::milliseconds timeout) {
  const std::string mine = config.bytes_settings();
  auto name = [&](int r) { return key + "/" + std::to_string(r); };
  store.set(name(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> others;
  for (int r = 0; r < size; ++r) {
    if (r != rank) others.push_back(name(r));
  }
  if (others.empty()) return;
  try {
    store.wait(others, timeout);
  } catch (const std::exception& e) {
    std::string missing;
    for (int r = 0; r < size; ++r) {
      bool shown = r == rank;
      try {
        shown = shown || store.check({name(r)});
      } catch (const std::exception&) {
      }
      if (!shown) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    throw errors::backend_error("cnccl: rank " + std::to_string(rank) + " waited " + std::to_string(timeout.count()) +
                                " ms for the settings of rank(s) " + (missing.empty() ? "?" : missing) +
                                ", which have not made their first CUDA allreduce or reduce_scatter on this group "
                                "(or failed before it): " + e.what());
  }
  const std::vector<std::vector<uint8_t>> values = store.multiGet(others);
  for (size_t i = 0; i < others.size(); ++i) {
    const std::string theirs(values[i].begin(), values[i].end());
    if (theirs != mine) {
      const int r = int(i) + (int(i) >= rank ? 1 : 0);
      throw errors::backend_error("cnccl: ranks disagree on the group's settings (CNCCL_* variables / Options): rank " +
                                  std::to_string(rank) + " has " + mine + "; rank " + std::to_string(r) + " has " +
                                  theirs);
    }
  }
}

}  // namespace cnccl
