// The composed path's CUDA device (docs/design.md, "Stream order"). Its codec kernels and ATen
// operations run on the current stream. Asynchronous calls restore on a side stream that waits on
// the engine's end events (never on the host), so the caller's stream goes on with its compute
// while NCCL runs; every buffer NCCL read or wrote is recorded on that stream, so the caching
// allocator cannot hand it out before the restore is done, even after WorkNCCL::synchronize()
// unstashes its references. Events are recorded explicitly where the data is produced.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "backend/cuda/nccl_engine.h"
#include "backend/frames.h"
#include "backend/wide_data.h"
#include "compress/cuda/codec.h"

namespace cnccl::cuda {
namespace {

// Whether the current device's current stream is being captured into a CUDA graph.
bool capturing() { return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None; }

c10::cuda::CUDAStream current_stream() { return at::cuda::getCurrentCUDAStream(); }

// The streams asynchronous calls restore on: cnccl's own, one per group and device. A stream of
// torch's pool could be one ProcessGroupNCCL or the caller also took (the pool hands them out round
// robin), and one shared by groups would queue a group's restores, and the allgathers issued from
// them, behind another group's network. A group gives its streams back when it is gone, for a later
// group; none is destroyed (the caching allocator may still record events on one for buffers kept
// there), as torch never destroys its pool's.
class OwnStreams {
 public:
  c10::cuda::CUDAStream take(c10::DeviceIndex index) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& idle = idle_[index];
      if (!idle.empty()) {
        const c10::cuda::CUDAStream stream = idle.back();
        idle.pop_back();
        return stream;
      }
    }
    const c10::cuda::CUDAGuard guard(index);
    cudaStream_t raw = nullptr;
    C10_CUDA_CHECK(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
    return c10::cuda::getStreamFromExternal(raw, index);
  }
  void give_back(const c10::cuda::CUDAStream& stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_[stream.device_index()].push_back(stream);
  }

 private:
  std::mutex mutex_;
  std::map<c10::DeviceIndex, std::vector<c10::cuda::CUDAStream>> idle_;
};

// Never destroyed: a group may be released during static destruction.
OwnStreams& own_streams() {
  static auto* streams = new OwnStreams;
  return *streams;
}

class StreamEvent final : public composed::Event {
 public:
  // During graph capture nothing is recorded: every operation of a captured call stays on the
  // capturing stream, which orders it by itself.
  StreamEvent() = default;
  explicit StreamEvent(const c10::cuda::CUDAStream& stream) : stream_(stream), event_(std::in_place) {
    event_->record(stream);
  }
  bool query() override { return !event_ || event_->query(); }
  // The current stream of the event's device waits (whichever device is current).
  void block() {
    if (!event_) return;
    const c10::cuda::CUDAStream current = at::cuda::getCurrentCUDAStream(stream_->device_index());
    if (current != *stream_) event_->block(current);
  }

 private:
  std::optional<c10::cuda::CUDAStream> stream_;
  std::optional<at::cuda::CUDAEvent> event_;
};

// The current stream of t's device, where its kernels run.
cudaStream_t stream_of(const at::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// A frame kernel's workspace (a few bytes a rank), on t's device; the caching allocator keeps it for
// the current stream's kernels when it is released.
at::Tensor frame_workspace(const at::Tensor& t, int64_t ranks) {
  return at::empty({int64_t(compress::cuda::frame_workspace_bytes(size_t(ranks)))}, t.options().dtype(at::kByte));
}

// Where the kernels read the pre-scale on the device (Plan::pre_scale_tensor), or null.
const float* pre_scale_of(const Plan& plan) {
  return plan.pre_scale_tensor.defined() ? plan.pre_scale_tensor.const_data_ptr<float>() : nullptr;
}

// The frame kernels read rows of whole frames, `stride` bytes apart, with int32 headers and 16-bit values
// at their natural alignment (a misaligned access would end the CUDA context). An MX frame of no values
// has no bytes (an empty CUDA tensor's call with min_bytes=0), and any stride.
void check_frames(const at::Tensor& frames, int64_t count, const Plan& plan) {
  TORCH_CHECK(frames.is_cuda() && frames.scalar_type() == at::kByte && frames.dim() == 2 && frames.stride(1) == 1 &&
                  frames.size(1) == frames::frame_bytes(count, plan.wire) &&
                  (frames.size(1) == 0 || frames.stride(0) % 4 == 0) &&
                  reinterpret_cast<uintptr_t>(frames.const_data_ptr()) % 4 == 0,
              "cnccl: CUDA frame kernels take [rows, ", frames::frame_bytes(count, plan.wire),
              "] uint8 rows of whole frames, 4-byte aligned");
}

// A stochastic plan's block frames take the dither's bits from index `first` on; others round to nearest.
compress::cuda::FrameRounding rounding_of(const Plan& plan, const compress::Dither& dither, uint64_t first) {
  return plan.stochastic ? compress::cuda::FrameRounding{&dither, first} : compress::cuda::FrameRounding{};
}

void check_wide(const at::Tensor& wide, const at::Tensor& frames, int64_t most) {
  TORCH_CHECK(wide.device() == frames.device() && wide.is_contiguous() && wide.numel() <= most,
              "cnccl: CUDA frame kernels write a contiguous tensor of at most ", most, " values on ", frames.device());
}

class CudaDevice final : public composed::Device {
 public:
  CudaDevice(bool count_casts, bool host_waits) : count_casts_(count_casts), host_waits_(host_waits) {}

  ~CudaDevice() override {
    for (const auto& stream : side_streams_) {
      if (stream) own_streams().give_back(*stream);
    }
    for (const auto& c : counts_) {
      if (c.reader) own_streams().give_back(*c.reader);
    }
  }

  bool capturing(const at::Tensor& t) override {
    // Under t's device's guard: the check reads the current device's current stream (and would
    // otherwise create a context on device 0), as ProcessGroupNCCL::collective guards first.
    const c10::cuda::CUDAGuard guard(t.device());
    return cuda::capturing();
  }

  double premul_factor(const c10d::ReduceOp& op, const at::Tensor& t) override {
    const at::Tensor factor = premul_tensor_factor(op);
    // The capture that matters is on the stream the collective is issued on: t's device's.
    const c10::cuda::CUDAGuard guard(t.device());
    TORCH_CHECK_VALUE(!(factor.defined() && factor.is_cuda() && cuda::capturing()),
                      "cnccl: this PREMUL_SUM reads its factor on the host (a strided tensor that goes uncompressed, "
                      "or a factor on another device than the tensor's), which is not allowed for a CUDA tensor "
                      "factor while a CUDA graph is being captured; pass the factor as a Python number, or a "
                      "contiguous tensor with the factor on its device");
    return cnccl::premul_factor(op);
  }

  at::Tensor premul_factor_tensor(const c10d::ReduceOp& op, const at::Tensor& t) override {
    const at::Tensor factor = premul_tensor_factor(op);
    if (!factor.defined() || factor.device() != t.device()) return {};
    TORCH_CHECK_VALUE(factor.numel() == 1, "cnccl: PREMUL_SUM factor must have one element");
    const c10::cuda::CUDAGuard guard(t.device());
    // fp32, as the host's float(double(factor)) rounds it; an fp32 factor is read where it is.
    return factor.reshape({}).to(at::kFloat);
  }

  void cast(const at::Tensor& wide, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
            uint64_t first) override {
    const cudaStream_t stream = stream_of(wide);
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    with_wide_data(wide, [&](auto* src) {
      const float scale = float(plan.pre_scale);
      compress::cuda::CastCounts* counts = counts_for(wide.device().index());
      const float* factor = pre_scale_of(plan);
      if (plan.stochastic) {
        return compress::cuda::cast(src, dst, wide.numel(), scale, plan.wire, dither, first, stream, counts, factor);
      }
      compress::cuda::cast(src, dst, wide.numel(), scale, plan.wire, stream, counts, factor);
    });
  }

  void restore(const at::Tensor& wire, const at::Tensor& wide, const Plan& plan) override {
    const cudaStream_t stream = stream_of(wide);
    const auto* src = static_cast<const uint16_t*>(wire.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::restore(src, dst, wide.numel(), float(plan.post_scale), plan.wire, stream);
    });
  }

  void sum(const at::Tensor& rows, const at::Tensor& wire, const Plan& plan, const compress::Dither& dither,
           uint64_t first) override {
    const cudaStream_t stream = stream_of(wire);
    const auto* in = static_cast<const uint16_t*>(rows.const_data_ptr());
    auto* dst = static_cast<uint16_t*>(wire.data_ptr());
    const size_t k = size_t(rows.size(0)), stride = size_t(rows.stride(0)), n = size_t(rows.size(1));
    if (plan.stochastic) return compress::cuda::sum(in, k, stride, dst, n, plan.wire, dither, first, stream);
    compress::cuda::sum(in, k, stride, dst, n, plan.wire, stream);
  }

  void sum_wide(const at::Tensor& rows, const at::Tensor& wide, const Plan& plan) override {
    const cudaStream_t stream = stream_of(wide);
    const auto* src = static_cast<const uint16_t*>(rows.const_data_ptr());
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::sum(src, size_t(rows.size(0)), size_t(rows.stride(0)), dst, size_t(rows.size(1)),
                          float(plan.post_scale), plan.wire, stream);
    });
  }

  void encode_frames(const std::vector<at::Tensor>& rows, int64_t count, const Plan& plan, const at::Tensor& frames,
                     const compress::Dither& dither) override {
    check_frames(frames, count, plan);
    TORCH_CHECK(frames.size(0) == int64_t(rows.size()), "cnccl: ", rows.size(), " rows for ", frames.size(0),
                " frames");
    const c10::cuda::CUDAGuard guard(frames.device());
    const cudaStream_t stream = stream_of(frames);
    const at::Tensor workspace = frame_workspace(frames, rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      const at::Tensor x = rows[r].contiguous();
      TORCH_CHECK(x.device() == frames.device() && x.numel() <= count, "cnccl: a row of at most ", count,
                  " values on ", frames.device(), " to frame");
      uint8_t* frame = frames[int64_t(r)].mutable_data_ptr<uint8_t>();
      with_wide_data(static_cast<const char*>(x.const_data_ptr()), x.scalar_type(), [&](const auto* src) {
        // Row r's value i takes the dither's bits of index r x count + i, as frames::encode's.
        compress::cuda::frame_encode(src, size_t(x.numel()), size_t(count), float(plan.pre_scale), plan.wire,
                                     plan.mx_scale, frame, workspace.mutable_data_ptr(), stream,
                                     counts_for(frames.device().index()), pre_scale_of(plan),
                                     rounding_of(plan, dither, uint64_t(r) * uint64_t(count)));
      });
    }
  }

  void sum_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& out,
                  const compress::Dither& dither, uint64_t first) override {
    check_frames(frames, count, plan);
    check_frames(out.view({1, out.numel()}), count, plan);
    TORCH_CHECK(out.device() == frames.device(), "cnccl: a frame sum's output on ", out.device());
    const c10::cuda::CUDAGuard guard(frames.device());
    compress::cuda::frame_sum_encode(frames.const_data_ptr<uint8_t>(), size_t(frames.size(0)), size_t(frames.stride(0)),
                                     size_t(count), plan.wire, plan.mx_scale, out.mutable_data_ptr<uint8_t>(),
                                     frame_workspace(frames, frames.size(0)).mutable_data_ptr(), stream_of(frames),
                                     counts_for(frames.device().index()), rounding_of(plan, dither, first));
  }

  void sum_frames_wide(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    check_frames(frames, count, plan);
    check_wide(wide, frames, count);
    TORCH_CHECK(wide.numel() == count, "cnccl: frame sums of ", count, " values into ", wide.numel());
    const c10::cuda::CUDAGuard guard(frames.device());
    const at::Tensor workspace = frame_workspace(frames, frames.size(0));
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::frame_sum(frames.const_data_ptr<uint8_t>(), size_t(frames.size(0)), size_t(frames.stride(0)),
                                size_t(count), plan.wire, float(plan.post_scale), dst, workspace.mutable_data_ptr(),
                                stream_of(frames));
    });
  }

  void restore_frames(const at::Tensor& frames, int64_t count, const Plan& plan, const at::Tensor& wide) override {
    check_frames(frames, count, plan);
    check_wide(wide, frames, frames.size(0) * count);
    const c10::cuda::CUDAGuard guard(frames.device());
    with_wide_data(wide, [&](auto* dst) {
      compress::cuda::frame_restore(frames.const_data_ptr<uint8_t>(), size_t(frames.stride(0)), size_t(count),
                                    plan.wire, float(plan.post_scale), dst, size_t(wide.numel()), stream_of(frames));
    });
  }

  void run(const std::function<void()>& work) override { work(); }

  composed::EventPtr record() override {
    if (cuda::capturing()) return std::make_shared<StreamEvent>();
    return std::make_shared<StreamEvent>(current_stream());
  }

  void wait(const composed::EventPtr& event) override { static_cast<StreamEvent&>(*event).block(); }

  // WorkNCCL::synchronize(): the current stream waits on the work's end event (ncclEndEvent_) and
  // the work drops the tensors it stashed; the host never blocks, whatever TORCH_NCCL_BLOCKING_WAIT
  // says (that is wait()'s). gloo's CUDA works record their events in their worker thread as they
  // end: the host waits for that first, as the CPU device does, then the current stream waits on them.
  void wait(c10d::Work& work) override {
    if (host_waits_) composed::wait_on_host(work);
    work.synchronize();
  }

  std::shared_ptr<void> use_side_stream() override {
    if (cuda::capturing()) return nullptr;
    return std::make_shared<c10::cuda::CUDAStreamGuard>(side_stream(c10::cuda::current_device()));
  }

  void keep(const std::vector<at::Tensor>& buffers) override {
    if (cuda::capturing()) return;  // a graph's memory stays in its pool while the graph lives
    const c10::Stream stream = current_stream().unwrap();
    for (const auto& b : buffers) b.record_stream(stream);
  }

  // The counters' latest values: what the kernels had counted by then (one still running, part of its
  // count). Read through a stream of cnccl's own, which waits for nothing else (a hung collective cannot
  // hold it), outside the lock the issuing threads take; in relaxed capture mode, so that a graph another
  // thread captures is not spoiled; while this thread's current stream is being captured, or if the read
  // fails, the values read last.
  compress::Census cast_counts() override {
    std::vector<std::pair<size_t, Counters>> all;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < counts_.size(); ++i) {
        if (counts_[i].on_device) all.emplace_back(i, counts_[i]);
      }
    }
    for (auto& [index, c] : all) {
      const c10::cuda::CUDAGuard guard(c.reader->device_index());
      if (cuda::capturing()) continue;
      const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      compress::cuda::CastCounts read{};
      if (cudaMemcpyAsync(&read, c.on_device, sizeof read, cudaMemcpyDeviceToHost, c.reader->stream()) ==
              cudaSuccess &&
          cudaStreamSynchronize(c.reader->stream()) == cudaSuccess) {
        c.last = read;
      } else {
        (void)cudaGetLastError();  // the values read last stand
      }
    }
    compress::Census census;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [index, c] : all) counts_[index].last = c.last;
    for (const auto& c : counts_) {
      census.nonfinite += c.last.nonfinite;
      census.saturated += c.last.saturated;
    }
    return census;
  }

 private:
  // A device's counters: made and zeroed at its first count, the host waiting for the zeros (any stream's
  // kernels may count next), and never freed, since a kernel or a captured graph may still count into them
  // after the group is gone (16 bytes a group and device). Never made during graph capture: a call
  // captured before them counts nothing, one captured after counts at every replay, as its casts run again.
  struct Counters {
    compress::cuda::CastCounts* on_device = nullptr;
    std::optional<c10::cuda::CUDAStream> reader;  // cnccl's own, for the reads
    compress::cuda::CastCounts last{};
    bool unavailable = false;  // they could not be made: counting is off on this device
  };

  // Device `index`'s counters; null when this device does not count or they cannot be made now. Counting
  // never fails a collective: counters that cannot be made turn counting off on that device, with a
  // warning (CNCCL_FAULT_CUDA_COUNTERS=1 makes their allocation fail, for the test of this).
  compress::cuda::CastCounts* counts_for(c10::DeviceIndex index) {
    if (!count_casts_) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    if (counts_.size() <= size_t(index)) counts_.resize(index + 1);
    Counters& c = counts_[index];
    if (!c.on_device && !c.unavailable) {
      const c10::cuda::CUDAGuard guard(index);
      if (cuda::capturing()) return nullptr;
      // As the caching allocator's own cudaMalloc: a graph another thread captures stays valid.
      const c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      std::optional<c10::cuda::CUDAStream> reader;
      void* memory = nullptr;
      std::string failure;
      try {
        reader = own_streams().take(index);
        const char* fault = std::getenv("CNCCL_FAULT_CUDA_COUNTERS");
        cudaError_t rc = fault && std::string(fault) == "1" ? cudaErrorMemoryAllocation
                                                            : cudaMalloc(&memory, sizeof(compress::cuda::CastCounts));
        if (rc == cudaSuccess) rc = cudaMemsetAsync(memory, 0, sizeof(compress::cuda::CastCounts), reader->stream());
        if (rc == cudaSuccess) rc = cudaStreamSynchronize(reader->stream());
        if (rc != cudaSuccess) failure = cudaGetErrorString(rc);
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty()) {
        (void)cudaGetLastError();
        if (memory) (void)cudaFree(memory);
        if (reader) own_streams().give_back(*reader);
        c.unavailable = true;
        TORCH_WARN("cnccl: the CUDA telemetry counters could not be made on device ", int(index), " (", failure,
                   "): this group's casts there are not counted (cnccl.stats(): cast_nonfinite, cast_saturated)");
        return nullptr;
      }
      c.reader = reader;
      c.on_device = static_cast<compress::cuda::CastCounts*>(memory);
    }
    return c.on_device;
  }

  c10::cuda::CUDAStream side_stream(c10::DeviceIndex index) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (side_streams_.size() <= size_t(index)) side_streams_.resize(index + 1);
    auto& stream = side_streams_[index];
    if (!stream) stream = own_streams().take(index);
    return *stream;
  }

  const bool count_casts_;
  const bool host_waits_;
  std::mutex mutex_;
  std::vector<std::optional<c10::cuda::CUDAStream>> side_streams_;  // one per device, taken on first use
  std::vector<Counters> counts_;  // per device
};

}  // namespace

std::shared_ptr<composed::Device> make_cuda_device(bool count_casts, bool host_waits) {
  return std::make_shared<CudaDevice>(count_casts, host_waits);
}

}  // namespace cnccl::cuda
