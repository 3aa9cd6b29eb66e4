// cnccl._C: the Python face of ProcessGroupCNCCL and its Options, as subclasses of torch's own
// c10d Backend and Backend.Options bindings.
#include <c10/core/DeviceGuard.h>
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include "backend/composed/device.h"
#include "backend/frames.h"
#include "backend/group_store.h"
#include "backend/process_group.h"
#include "backend/release_gate.h"
#include "compress/codec.h"
#include "tests/cpp/counting_allocator.h"

namespace py = pybind11;

namespace {

// The holder torch uses for c10d objects: drops the GIL while the last reference goes away,
// because destroying a group joins its communication thread.
template <typename T>
class IntrusivePtrNoGilDestructor {
 public:
  IntrusivePtrNoGilDestructor() = default;
  IntrusivePtrNoGilDestructor(const IntrusivePtrNoGilDestructor&) = default;
  IntrusivePtrNoGilDestructor(IntrusivePtrNoGilDestructor&&) noexcept = default;
  IntrusivePtrNoGilDestructor& operator=(const IntrusivePtrNoGilDestructor&) = default;
  IntrusivePtrNoGilDestructor& operator=(IntrusivePtrNoGilDestructor&&) noexcept = default;
  explicit IntrusivePtrNoGilDestructor(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  explicit IntrusivePtrNoGilDestructor(T* impl) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~IntrusivePtrNoGilDestructor() {
    if (impl_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      impl_.reset();
    }
  }
  T& operator*() const noexcept { return *impl_; }
  T* operator->() const noexcept { return impl_.get(); }
  T* get() const noexcept { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};

cnccl::compress::Wire framed_wire(const std::string& name) {
  const auto wire = cnccl::parse_wire(name, "wire");
  TORCH_CHECK_VALUE(wire.has_value(), "cnccl: frames need a wire format, not 'none'");
  return *wire;
}

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, IntrusivePtrNoGilDestructor<T>, true)

PYBIND11_MODULE(_C, m) {
  py::module_::import("torch._C._distributed_c10d");
  m.doc() = "cnccl: a c10d backend that sends fp32 gradients as fp16/bf16";
  // Before finalization, so that cnccl's threads stop releasing Python-owned tensors
  // (backend/release_gate.h).
  m.def("_close_release_gate", &cnccl::release_gate::close, py::call_guard<py::gil_scoped_release>());
  py::module_::import("atexit").attr("register")(m.attr("_close_release_gate"));

  py::class_<cnccl::Options, c10d::Backend::Options, c10::intrusive_ptr<cnccl::Options>>(m, "Options", R"(
Per-group settings for the cnccl backend; pass as ``pg_options`` to ``init_process_group`` or
``new_group``. A field left as None takes its CNCCL_* environment variable, or the default.)")
      .def(py::init([](std::optional<std::string> wire_dtype, std::optional<int64_t> min_bytes,
                       std::optional<std::string> sum_scaling, std::optional<bool> compress_fp64,
                       std::optional<std::string> cpu_engine, std::optional<std::string> cuda_engine,
                       std::optional<std::string> shm,
                       std::optional<std::string> accumulate, std::optional<std::string> rounding,
                       std::optional<int64_t> sr_seed, std::optional<std::string> scaling,
                       std::optional<std::string> rotation, std::optional<bool> untouched_on_failure,
                       std::optional<std::string> telemetry,
                       std::optional<std::string> mx_scale, std::optional<std::string> inter_host_wire,
                       std::chrono::milliseconds timeout) {
             auto o = c10::make_intrusive<cnccl::Options>(timeout);
             o->wire_dtype = std::move(wire_dtype);
             o->min_bytes = min_bytes;
             o->sum_scaling = std::move(sum_scaling);
             o->compress_fp64 = compress_fp64;
             o->cpu_engine = std::move(cpu_engine);
             o->cuda_engine = std::move(cuda_engine);
             o->shm = std::move(shm);
             o->accumulate = std::move(accumulate);
             o->rounding = std::move(rounding);
             o->sr_seed = sr_seed;
             o->scaling = std::move(scaling);
             o->rotation = std::move(rotation);
             o->untouched_on_failure = untouched_on_failure;
             o->telemetry = std::move(telemetry);
             o->mx_scale = std::move(mx_scale);
             o->inter_host_wire = std::move(inter_host_wire);
             o->resolve();  // bad values fail here, where the user wrote them
             return o;
           }),
           py::kw_only(), py::arg("wire_dtype") = py::none(), py::arg("min_bytes") = py::none(),
           py::arg("sum_scaling") = py::none(), py::arg("compress_fp64") = py::none(),
           py::arg("cpu_engine") = py::none(), py::arg("cuda_engine") = py::none(), py::arg("shm") = py::none(),
           py::arg("accumulate") = py::none(),
           py::arg("rounding") = py::none(), py::arg("sr_seed") = py::none(), py::arg("scaling") = py::none(),
           py::arg("rotation") = py::none(), py::arg("untouched_on_failure") = py::none(),
           py::arg("telemetry") = py::none(),
           py::arg("mx_scale") = py::none(), py::arg("inter_host_wire") = py::none(),
           py::arg("timeout") = kBackendDefaultTimeout)
      .def_readwrite("wire_dtype", &cnccl::Options::wire_dtype)
      .def_readwrite("min_bytes", &cnccl::Options::min_bytes)
      .def_readwrite("sum_scaling", &cnccl::Options::sum_scaling)
      .def_readwrite("compress_fp64", &cnccl::Options::compress_fp64)
      .def_readwrite("cpu_engine", &cnccl::Options::cpu_engine)
      .def_readwrite("cuda_engine", &cnccl::Options::cuda_engine)
      .def_readwrite("shm", &cnccl::Options::shm)
      .def_readwrite("accumulate", &cnccl::Options::accumulate)
      .def_readwrite("rounding", &cnccl::Options::rounding)
      .def_readwrite("sr_seed", &cnccl::Options::sr_seed)
      .def_readwrite("scaling", &cnccl::Options::scaling)
      .def_readwrite("rotation", &cnccl::Options::rotation)
      .def_readwrite("untouched_on_failure", &cnccl::Options::untouched_on_failure)
      .def_readwrite("telemetry", &cnccl::Options::telemetry)
      .def_readwrite("mx_scale", &cnccl::Options::mx_scale)
      .def_readwrite("inter_host_wire", &cnccl::Options::inter_host_wire)
      .def("_resolved_cpu_engine", [](const cnccl::Options& o) { return o.resolve().cpu_engine_name(); },
           "The CPU engine these options select once CNCCL_CPU_ENGINE is applied: 'ucx' or 'gloo'.")
      .def("_engine_settings", [](const cnccl::Options& o) { return o.resolve().engine_settings(); },
           "What the group builds at creation, as text its ranks compare while they join (backend/group_store.h).")
      .def("_resolved_cuda_engine", [](const cnccl::Options& o) { return o.resolve().cuda_engine_name(); },
           "The CUDA engine these options select once CNCCL_CUDA_ENGINE is applied: 'nccl' or 'gloo'.")
      .def("__repr__", [](const cnccl::Options& o) {
        auto show = [](const auto& v) { return v ? py::str(py::cast(*v)).cast<std::string>() : std::string("None"); };
        return "cnccl.Options(wire_dtype=" + show(o.wire_dtype) + ", min_bytes=" + show(o.min_bytes) +
               ", sum_scaling=" + show(o.sum_scaling) + ", compress_fp64=" + show(o.compress_fp64) +
               ", cpu_engine=" + show(o.cpu_engine) + ", cuda_engine=" + show(o.cuda_engine) + ", shm=" + show(o.shm) +
               ", accumulate=" + show(o.accumulate) + ", rounding=" + show(o.rounding) +
               ", sr_seed=" + show(o.sr_seed) + ", scaling=" + show(o.scaling) + ", rotation=" + show(o.rotation) +
               ", untouched_on_failure=" + show(o.untouched_on_failure) + ", telemetry=" + show(o.telemetry) +
               ", mx_scale=" + show(o.mx_scale) + ", inter_host_wire=" + show(o.inter_host_wire) + ")";
      });

  // The registration makes the group's store first, so that the gloo engine it builds keeps its keys
  // there too (backend/group_store.h).
  m.def("_group_store", &cnccl::group_store, py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
        py::arg("group_name"), py::arg("settings") = "", py::call_guard<py::gil_scoped_release>());

  py::class_<cnccl::ProcessGroupCNCCL, c10d::Backend, IntrusivePtrNoGilDestructor<cnccl::ProcessGroupCNCCL>>(
      m, "ProcessGroupCNCCL")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       c10::intrusive_ptr<cnccl::Options> options, c10::intrusive_ptr<c10d::Backend> cpu_engine,
                       c10::intrusive_ptr<c10d::Backend> cuda_engine) {
             return IntrusivePtrNoGilDestructor<cnccl::ProcessGroupCNCCL>(c10::make_intrusive<cnccl::ProcessGroupCNCCL>(
                 store, rank, size, std::move(options), std::move(cpu_engine), nullptr, std::move(cuda_engine)));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"), py::arg("cpu_engine") = nullptr,
           py::arg("cuda_engine") = nullptr,
           py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const cnccl::ProcessGroupCNCCL& pg) {
        py::dict d;
        std::map<std::string, uint64_t> stats;
        {
          // The CUDA path's counters are read from the device: other Python threads go on meanwhile.
          const py::gil_scoped_release released;
          stats = pg.stats();
        }
        for (const auto& [name, value] : stats) d[py::str(name)] = value;
        if (pg.config().telemetry == cnccl::Telemetry::kError) d["quantization_error"] = pg.quantization_error();
        return d;
      }, "Counters of this group's collectives, bytes and casts; with telemetry=error, the relative L2 error "
         "of the last compressed collective's own contribution (NaN before one).")
      .def("config", [](const cnccl::ProcessGroupCNCCL& pg) {
        const cnccl::Config& c = pg.config();
        py::dict d;
        d["wire_dtype"] = c.wire_name();
        d["min_bytes"] = c.min_bytes;
        d["sum_scaling"] = c.sum_scaling == cnccl::SumScaling::kWorld ? "world" : "none";
        d["compress_fp64"] = c.compress_fp64;
        d["cpu_engine"] = c.cpu_engine_name();
        d["cuda_engine"] = c.cuda_engine_name();
        d["shm"] = c.shm_name();
        d["accumulate"] = c.accumulate_name();
        d["rounding"] = c.rounding_name();
        d["sr_seed"] = c.sr_seed;
        d["scaling"] = c.scaling_name();
        d["rotation"] = c.rotation_name();
        d["untouched_on_failure"] = c.untouched_on_failure;
        d["telemetry"] = c.telemetry_name();
        d["mx_scale"] = cnccl::compress::mx_scale_name(c.mx_scale);
        d["inter_host_wire"] = c.wire_across_name();
        d["wire_levels"] = pg.wire_levels();
        d["cpu_transport"] = pg.cpu_transport();
        d["timeout"] = pg.timeout();
        return d;
      }, "The settings in force after defaults, CNCCL_* variables and Options are combined.");

  // The frames of a wire (backend/frames.h) on the rows' device, through the composed path's device
  // (the CPU kernels, or the CUDA ones), for tests that hold them to an independent oracle (torchao's
  // MX encoding) and the CUDA kernels to the CPU's: `rows` become [len(rows), bytes] frames of `count`
  // elements each; `mx_scale` is an MX block's scale rule (rceil or floor). With `sr_seed`, a block wire's
  // elements are rounded stochastically, as rank 0's contribution to its group's first stochastic sum.
  m.def("_encode_frames", [](const std::vector<at::Tensor>& rows, int64_t count, double scale, const std::string& wire,
                             const std::string& mx_scale, std::optional<uint64_t> sr_seed) {
    cnccl::Plan plan;
    plan.wire = framed_wire(wire);
    plan.pre_scale = scale;
    plan.mx_scale = cnccl::parse_mx_scale(mx_scale, "mx_scale");
    plan.stochastic = sr_seed.has_value();
    const at::TensorOptions options = rows.empty() ? at::TensorOptions(at::kByte) : rows[0].options().dtype(at::kByte);
    at::Tensor frames = at::empty({int64_t(rows.size()), cnccl::frames::frame_bytes(count, plan.wire)}, options);
    const c10::DeviceGuard guard(frames.device());
    cnccl::composed::make_device_for(frames.device())
        ->encode_frames(rows, count, plan, frames, cnccl::compress::contribution_dither(sr_seed.value_or(0), 0, 0));
    return frames;
  }, py::arg("rows"), py::arg("count"), py::arg("scale"), py::arg("wire"), py::arg("mx_scale") = "rceil",
     py::arg("sr_seed") = std::nullopt);
  m.def("_decode_frames", [](const at::Tensor& frames, int64_t count, const std::string& wire) {
    cnccl::Plan plan;
    plan.wire = framed_wire(wire);
    at::Tensor out = at::empty({frames.size(0) * count}, frames.options().dtype(at::kFloat));
    const c10::DeviceGuard guard(frames.device());
    cnccl::composed::make_device_for(frames.device())->restore_frames(frames, count, plan, out);
    return out.view({frames.size(0), count});
  }, py::arg("frames"), py::arg("count"), py::arg("wire"));

  // The largest number of bytes ATen's CPU allocator had handed out at once, from any thread, while `fn`
  // ran (the C++ tests' counting allocator): for tests that hold a collective to the buffers it plans.
  m.def("_cpu_bytes_peak", [](const py::function& fn) {
    const cnccl::testing::CountingAllocator counting;
    fn();
    return counting.peak();
  }, py::arg("fn"));

  m.def("build_info", [] {
    py::dict d;
    d["version"] = CNCCL_VERSION;
    d["torch_version"] = TORCH_VERSION;
    d["cuda_kernels"] = bool(CNCCL_WITH_CUDA);
    d["cuda_collectives"] = cnccl::ProcessGroupCNCCL::cuda_nccl_version() != 0;
    d["nccl_version"] = cnccl::ProcessGroupCNCCL::cuda_nccl_version();
    // Empty in a build without UCX: no host path, CPU tensors go through gloo.
    const std::string ucx = CNCCL_UCX_VERSION;
    d["ucx_version"] = ucx.empty() ? py::object(py::none()) : py::object(py::str(ucx));
    d["cpu_codec"] = cnccl::compress::cpu_path_name(cnccl::compress::cpu_path());
    return d;
  });
}
