// CUDA codec kernels against the CPU codec (itself checked against torch): every 16-bit pattern
// restored, and casts of boundary and random values, on the device. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "compress/codec.h"
#include "compress/cuda/codec.h"
#include "compress/stochastic.h"

namespace cnccl::compress {
namespace {

template <typename T>
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) { EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T) + 16), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  T* ptr = nullptr;
};

class CudaCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA GPU on this machine: CUDA codec kernels are built and linked, not run";
    }
  }
};

TEST_F(CudaCodec, RestoreEveryBitPatternMatchesCpu) {
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    std::vector<uint16_t> all(65536);
    for (uint32_t i = 0; i < all.size(); ++i) all[i] = uint16_t(i);
    std::vector<float> want(all.size()), got(all.size());
    restore(all.data(), want.data(), all.size(), 0.5f, w);
    DeviceBuffer<uint16_t> d_in(all.size());
    DeviceBuffer<float> d_out(all.size());
    cudaMemcpy(d_in.ptr, all.data(), all.size() * 2, cudaMemcpyHostToDevice);
    cuda::restore(d_in.ptr, d_out.ptr, all.size(), 0.5f, w, nullptr);
    cudaMemcpy(got.data(), d_out.ptr, got.size() * 4, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < all.size(); ++i) bad += !(got[i] == want[i] || (got[i] != got[i] && want[i] != want[i]));
    EXPECT_EQ(bad, 0u) << wire_name(w);
  }
}

TEST_F(CudaCodec, CastMatchesCpuForAlignedAndUnalignedBuffers) {
  std::mt19937 rng(5);
  std::vector<float> v(size_t(1) << 22 | 5);
  for (auto& x : v) {
    uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
  }
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t offset : {0, 1}) {
      const size_t n = v.size() - offset;
      std::vector<uint16_t> want(n), got(n);
      cast(v.data() + offset, want.data(), n, 0.25f, w);
      DeviceBuffer<float> d_in(v.size());
      DeviceBuffer<uint16_t> d_out(v.size());
      cudaMemcpy(d_in.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
      cuda::cast(d_in.ptr + offset, d_out.ptr + offset, n, 0.25f, w, nullptr);
      cudaMemcpy(got.data(), d_out.ptr + offset, n * 2, cudaMemcpyDeviceToHost);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool nan_w = (want[i] & 0x7FFF) > (w == Wire::kFp16 ? 0x7C00 : 0x7F80);
        const bool nan_g = (got[i] & 0x7FFF) > (w == Wire::kFp16 ? 0x7C00 : 0x7F80);
        bad += nan_w ? !nan_g : got[i] != want[i];
      }
      EXPECT_EQ(bad, 0u) << wire_name(w) << " offset " << offset;
    }
  }
}

TEST_F(CudaCodec, SumsMatchCpuRoundedOnceAndWide) {
  std::mt19937 rng(6);
  const size_t n = (size_t(1) << 18) + 3, stride = n + 5;
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    for (size_t k : {size_t(1), size_t(2), size_t(5)}) {
      std::vector<uint16_t> rows(k * stride);
      for (auto& x : rows) x = static_cast<uint16_t>(rng());
      std::vector<const uint16_t*> ptrs;
      for (size_t j = 0; j < k; ++j) ptrs.push_back(rows.data() + j * stride);
      std::vector<uint16_t> want16(n), got16(n);
      std::vector<float> want32(n), got32(n);
      sum(ptrs.data(), k, want16.data(), n, w);
      sum(ptrs.data(), k, want32.data(), n, w);
      DeviceBuffer<uint16_t> d_rows(rows.size());
      DeviceBuffer<uint16_t> d16(n);
      DeviceBuffer<float> d32(n);
      cudaMemcpy(d_rows.ptr, rows.data(), rows.size() * 2, cudaMemcpyHostToDevice);
      cuda::sum(d_rows.ptr, k, stride, d16.ptr, n, w, nullptr);
      cuda::sum(d_rows.ptr, k, stride, d32.ptr, n, 1.0f, w, nullptr);
      cudaMemcpy(got16.data(), d16.ptr, n * 2, cudaMemcpyDeviceToHost);
      cudaMemcpy(got32.data(), d32.ptr, n * 4, cudaMemcpyDeviceToHost);
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool nan_w = (want16[i] & 0x7FFF) > (w == Wire::kFp16 ? 0x7C00 : 0x7F80);
        bad += nan_w ? (got16[i] & 0x7FFF) <= (w == Wire::kFp16 ? 0x7C00 : 0x7F80) : got16[i] != want16[i];
        bad += want32[i] != want32[i] ? got32[i] == got32[i] : std::memcmp(&got32[i], &want32[i], 4) != 0;
      }
      EXPECT_EQ(bad, 0u) << wire_name(w) << " k=" << k;
    }
  }
}

TEST_F(CudaCodec, StochasticCastAndSumEqualTheCpusBitForBit) {
  std::mt19937 rng(9);
  const size_t n = (size_t(1) << 18) + 7;
  std::vector<float> v(n);
  for (auto& x : v) x = std::ldexp(std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng), int(rng() % 60) - 40);
  std::vector<double> v64(v.begin(), v.end());
  const Dither d{0xfeedface'12345678ull, 3, 1, kContribution};
  for (Wire w : {Wire::kFp16, Wire::kBf16}) {
    std::vector<uint16_t> want(n), got(n), want64(n), got64(n), want_sum(n), got_sum(n);
    cast(v.data(), want.data(), n, 0.5f, w, d, 11);
    cast(v64.data(), want64.data(), n, 0.5f, w, d, 11);
    DeviceBuffer<float> d_in(n);
    DeviceBuffer<double> d_in64(n);
    DeviceBuffer<uint16_t> d_out(n), d_out64(n), d_rows(2 * n), d_sum(n);
    cudaMemcpy(d_in.ptr, v.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_in64.ptr, v64.data(), n * 8, cudaMemcpyHostToDevice);
    cuda::cast(d_in.ptr, d_out.ptr, n, 0.5f, w, d, 11, nullptr);
    cuda::cast(d_in64.ptr, d_out64.ptr, n, 0.5f, w, d, 11, nullptr);
    // Two rows (the CPU's two casts), summed and rounded with the result's bits.
    const Dither result{d.seed, d.seq, kAnyOwner, kResult};
    const uint16_t* rows[2] = {want.data(), want64.data()};
    sum(rows, 2, want_sum.data(), n, w, result, 11);
    cudaMemcpy(d_rows.ptr, want.data(), n * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_rows.ptr + n, want64.data(), n * 2, cudaMemcpyHostToDevice);
    cuda::sum(d_rows.ptr, 2, n, d_sum.ptr, n, w, result, 11, nullptr);
    cudaMemcpy(got.data(), d_out.ptr, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(got64.data(), d_out64.ptr, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(got_sum.data(), d_sum.ptr, n * 2, cudaMemcpyDeviceToHost);
    EXPECT_EQ(got, want) << wire_name(w) << " fp32";
    EXPECT_EQ(got64, want64) << wire_name(w) << " fp64";
    EXPECT_EQ(got_sum, want_sum) << wire_name(w) << " sum";
  }
}

}  // namespace
}  // namespace cnccl::compress
