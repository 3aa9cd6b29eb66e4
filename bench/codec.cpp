// CPU codec throughput beside memcpy of the same fp32 buffer, measured interleaved in one run.
// Ratios > 1 mean the kernel moves the same elements faster than a plain copy of the fp32 data.
// Then every other wire's kernels (power-of-two frames in fp16, e4m3, e5m2; MX and NVFP4 blocks) beside the fp16
// cast, interleaved likewise: a frame's encode (amax, then the cast), its decode (the restore), and the
// owner's fp32 sum of two ranks' frames, each as GB/s of the fp32 elements and as a ratio to the fp16 cast;
// the block wires' stochastically rounded encodes, and the block rotation each way, beside them.
// Usage: codec [MiB=64] [repeats=15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "compress/codec.h"
#include "compress/stochastic.h"

using namespace cnccl::compress;

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 64;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 15;
  const size_t n = mib * (1u << 20) / sizeof(float);
  std::vector<float> src(n), dst(n);
  std::vector<double> src64(n);
  std::vector<uint16_t> wire(n), other(n);
  for (size_t i = 0; i < n; ++i) src[i] = src64[i] = static_cast<float>(i % 4099) * 0.37f - 700.0f;
  for (auto w : {Wire::kFp16, Wire::kBf16}) cast(src.data(), other.data(), n, 1.0f, w);

  const CpuPath in_use = cpu_path();  // the widest the processor has: the goals are its rows
  std::printf("cnccl codec, %zu MiB fp32 (%zu elements), one thread, median of %d\n", mib, n, repeats);
  std::printf("%-10s %-5s %-12s %9s %9s %12s\n", "path", "wire", "kernel", "GB/s", "memcpy", "vs memcpy");
  // The goals' rows: the vector path of the 16-bit kernels (AVX-512 runs AVX2's).
  const bool vector_16bit = cpu_path_supported(CpuPath::kAvx2F16c);
  bool met_16bit = vector_16bit;
  std::string worst_16bit;
  for (CpuPath path : kCpuPaths) {
    if (!cpu_path_supported(path) || path == CpuPath::kAvx512) continue;  // AVX-512's 16-bit kernels are AVX2's
    set_cpu_path(path);
    for (Wire w : {Wire::kFp16, Wire::kBf16}) {
      const std::pair<const char*, std::function<void()>> kernels[] = {
          {"cast", [&] { cast(src.data(), wire.data(), n, 0.5f, w); }},
          {"restore", [&] { restore(wire.data(), dst.data(), n, 2.0f, w); }},
          {"add", [&] { add(wire.data(), other.data(), n, w); }},
          {"cast-f64", [&] { cast(src64.data(), wire.data(), n, 0.5f, w); }},
      };
      for (const auto& [name, fn] : kernels) {
        std::vector<double> tk, tm;
        for (int r = 0; r < repeats; ++r) {
          tm.push_back(seconds([&] { std::memcpy(dst.data(), src.data(), n * sizeof(float)); }));
          tk.push_back(seconds(fn));
        }
        const double bytes = double(n) * sizeof(float);  // both rates counted in fp32 bytes of the same elements
        const double ratio = median(tm) / median(tk);
        const double goal = std::strcmp(name, "cast") == 0 ? 1.2 : std::strcmp(name, "restore") == 0 ? 1.0 : 0.0;
        const bool miss = path == CpuPath::kAvx2F16c && ratio < goal;
        if (miss) {
          met_16bit = false;
          worst_16bit += std::string(worst_16bit.empty() ? "" : ", ") + wire_name(w) + " " + name;
        }
        std::printf("%-10s %-5s %-12s %9.2f %9.2f %11.2fx%s\n", cpu_path_name(path), wire_name(w), name,
                    bytes / median(tk) / 1e9, bytes / median(tm) / 1e9, ratio, miss ? "  (goal not met)" : "");
      }
    }
  }
  std::printf("goals: cast >= 1.2x memcpy, restore >= 1.0x memcpy (%s rows): %s%s\n",
              cpu_path_name(CpuPath::kAvx2F16c),
              !vector_16bit ? "not run (no AVX2+F16C here)" : met_16bit ? "met" : "not met: ", worst_16bit.c_str());
  set_cpu_path(in_use);

  // Every wire beside the fp16 cast.
  std::vector<uint8_t> frame(mx_bytes(n, Wire::kMxfp8) + n), frame2(frame.size());
  std::vector<float> sums(n);
  std::printf("\nevery wire's kernels beside the fp16 cast (GB/s of fp32 elements)\n");
  std::printf("%-10s %-11s %-12s %9s %9s %12s\n", "path", "wire", "kernel", "GB/s", "fp16 cast", "vs fp16 cast");
  bool met = true;
  for (CpuPath path : kCpuPaths) {
    if (!cpu_path_supported(path)) continue;
    set_cpu_path(path);
    for (Wire w : {Wire::kFp16, Wire::kE4m3, Wire::kE5m2, Wire::kMxfp8, Wire::kMxfp8E5m2, Wire::kMxfp4, Wire::kNvfp4}) {
      const bool mx = is_mx(w), nv = w == Wire::kNvfp4, wide = w == Wire::kFp16;
      // Two ranks' encodings of the same values, for the owner's sum.
      const float parts[] = {nv_part_scale(src.data(), n, 0.5f), nv_part_scale(src.data(), n, 0.5f)};
      if (nv) {
        nv_encode(src.data(), n, n, 0.5f, parts[0], frame.data());
        frame2 = frame;
      } else if (mx) {
        mx_encode(src.data(), n, n, 0.5f, w, MxScale::kRceil, frame.data());
        frame2 = frame;
      } else if (!wide) {
        cast(src.data(), frame.data(), n, 0x1p-3f, w);
        frame2 = frame;
      }
      const void* frames[] = {wide ? static_cast<const void*>(other.data()) : frame.data(),
                              wide ? static_cast<const void*>(wire.data()) : frame2.data()};
      const uint8_t* blocks[] = {frame.data(), frame2.data()};
      const float scales[] = {8.0f, 8.0f};
      const std::pair<const char*, std::function<void()>> kernels[] = {
          {"encode", [&] {  // NVFP4: the part scale (an amax pass), then the blocks
             if (nv) return nv_encode(src.data(), n, n, 0.5f, nv_part_scale(src.data(), n, 0.5f), frame.data());
             if (mx) return mx_encode(src.data(), n, n, 0.5f, w, MxScale::kRceil, frame.data());
             const float k = 0x1p-3f * (amax(src.data(), n) > 0 ? 1.0f : 0.0f);
             if (wide) return cast(src.data(), wire.data(), n, k, w);
             cast(src.data(), frame.data(), n, k, w);
           }},
          {"encode sr", [&] {  // stochastically rounded elements (rounding=sr): block wires only
             const Dither d = contribution_dither(1, 0, 0);
             if (nv) return nv_encode(src.data(), n, n, 0.5f, nv_part_scale(src.data(), n, 0.5f), frame.data(), d, 0);
             if (mx) return mx_encode(src.data(), n, n, 0.5f, w, MxScale::kRceil, frame.data(), d, 0);
           }},
          {"decode", [&] {
             if (nv) return nv_restore(frame.data(), n, parts[0], dst.data(), n, 2.0f);
             if (mx) return mx_restore(frame.data(), n, dst.data(), n, 2.0f, w);
             if (wide) return restore(wire.data(), dst.data(), n, 8.0f, w);
             restore(frame.data(), dst.data(), n, 8.0f, w);
           }},
          {"owner sum 2", [&] {
             if (nv) return static_cast<void>(nv_sum(blocks, parts, 2, sums.data(), n));
             if (mx) return mx_sum(blocks, 2, sums.data(), n, w);
             scaled_sum(frames, scales, 2, sums.data(), n, w);
           }},
      };
      for (const auto& [name, fn] : kernels) {
        const bool stochastic = std::string(name) == "encode sr";
        if (stochastic && !mx && !nv) continue;
        std::vector<double> tk, tf;
        for (int r = 0; r < repeats; ++r) {
          tf.push_back(seconds([&] { cast(src.data(), wire.data(), n, 0.5f, Wire::kFp16); }));
          tk.push_back(seconds(fn));
        }
        const double bytes = double(n) * sizeof(float), ratio = median(tf) / median(tk);
        // Stochastic rounding is not held to the goal: its Philox bits cost more than the rest of the encode.
        const bool vector_row = path == in_use && path != CpuPath::kScalar && !stochastic;
        met = met && (!vector_row || ratio >= 0.8);
        std::printf("%-10s %-11s %-12s %9.2f %9.2f %11.2fx%s\n", cpu_path_name(path),
                    wide ? "fp16 frame" : wire_name(w), name, bytes / median(tk) / 1e9, bytes / median(tf) / 1e9,
                    ratio, vector_row && ratio < 0.8 ? "  (goal not met)" : "");
      }
    }
  }
  // The block rotation (rotation=hadamard) each way, out of place: a cost, not a goal's row.
  for (CpuPath path : kCpuPaths) {
    if (!cpu_path_supported(path)) continue;
    set_cpu_path(path);
    const uint16_t signs = rotation_signs(1);
    const std::pair<const char*, std::function<void()>> kernels[] = {
        {"rotate", [&] { rotate(src.data(), dst.data(), n, signs); }},
        {"unrotate", [&] { unrotate(src.data(), dst.data(), n, signs); }},
    };
    for (const auto& [name, fn] : kernels) {
      std::vector<double> tk, tf;
      for (int r = 0; r < repeats; ++r) {
        tf.push_back(seconds([&] { cast(src.data(), wire.data(), n, 0.5f, Wire::kFp16); }));
        tk.push_back(seconds(fn));
      }
      const double bytes = double(n) * sizeof(float);
      std::printf("%-10s %-11s %-12s %9.2f %9.2f %11.2fx\n", cpu_path_name(path), "hadamard", name,
                  bytes / median(tk) / 1e9, bytes / median(tf) / 1e9, median(tf) / median(tk));
    }
  }
  set_cpu_path(in_use);
  std::printf("goal: every %s row >= 0.8x the fp16 cast: %s\n", cpu_path_name(in_use), met ? "met" : "not met");
  return 0;
}
