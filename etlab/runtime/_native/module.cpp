// Python bindings of the native runtime core (module etlab.runtime._native._core).
#include <c10/util/Exception.h>
#include <torch/csrc/Dtype.h>

#include <variant>

#include "conv.h"
#include "core.h"
#include "qconv.h"

namespace etlab_native {
namespace {

// Torch warnings raised while the GIL is released are collected here and re-issued as Python
// warnings afterwards (the interpreter's own "output was resized" warning is dropped, as the
// Python core's warning filter does).
class WarningCollector : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    const std::string& msg = warning.msg();
    if (msg.find("An output with one or more elements was resized") != std::string::npos) return;
    messages_.emplace_back(msg, std::holds_alternative<c10::DeprecationWarning>(warning.type()));
  }
  void reissue() {
    for (const auto& [msg, deprecation] : messages_) {
      if (PyErr_WarnEx(deprecation ? PyExc_DeprecationWarning : PyExc_UserWarning, msg.c_str(), 1) < 0)
        throw py::error_already_set();
    }
  }

 private:
  std::vector<std::pair<std::string, bool>> messages_;
};

// Runs `body` without the GIL (unless `release` is false: only the test that shows a GIL-holding
// run is detected) and under the warning collector; torch errors become the Python exception torch
// itself would raise, with the message but without the C++ backtrace.
template <class Body>
auto without_gil(bool release, Body&& body) {
  WarningCollector warnings;
  try {
    auto result = [&] {
      std::optional<py::gil_scoped_release> released;
      if (release) released.emplace();
      c10::WarningUtils::WarningHandlerGuard guard(&warnings);
      return body();
    }();
    warnings.reissue();
    return result;
  } catch (const c10::IndexError& e) {
    throw py::index_error(error_message(e));
  } catch (const c10::ValueError& e) {
    throw py::value_error(error_message(e));
  } catch (const c10::TypeError& e) {
    throw py::type_error(error_message(e));
  } catch (const c10::NotImplementedError& e) {
    PyErr_SetString(PyExc_NotImplementedError, error_message(e).c_str());
    throw py::error_already_set();
  } catch (const c10::Error& e) {
    throw std::runtime_error(error_message(e));
  }
}

py::tuple sizes_tuple(const std::vector<int64_t>& sizes) {
  py::tuple t(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) t[i] = py::int_(sizes[i]);
  return t;
}

// The debug records of the last traced run as Python values:
// None | ("T", scalar_type, sizes, offset) | ("L", ((scalar_type, sizes, offset), ...)) | ("V", value).
py::list take_records(NativePlan& plan) {
  auto& records = plan.records();
  py::list out(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    DebugRecord& r = records[i];
    switch (r.kind) {
      case DebugRecord::None:
        out[i] = py::none();
        break;
      case DebugRecord::Tensor:  // NativePlan::log makes a Tensor record of exactly one tensor
        out[i] = py::make_tuple("T", r.scalar_types.at(0), sizes_tuple(r.sizes.at(0)), r.offsets.at(0));
        break;
      case DebugRecord::TensorList: {
        py::tuple members(r.offsets.size());
        for (size_t k = 0; k < r.offsets.size(); ++k)  // the three vectors grow together (NativePlan::log)
          members[k] = py::make_tuple(r.scalar_types.at(k), sizes_tuple(r.sizes.at(k)), r.offsets.at(k));
        out[i] = py::make_tuple("L", members);
        break;
      }
      case DebugRecord::Python:
        out[i] = py::make_tuple("V", r.value);
        break;
    }
  }
  records.clear();
  return out;
}

py::bytes as_bytes(const std::vector<int64_t>& v) {
  return py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// A TraceLog's runs for the writer: (chains key, bundled input index, events, kept,
// Method::execute start, end, the timed record as int64 bytes) each.
py::list timed_runs(TraceLog& log) {
  auto runs = log.runs();
  py::list out(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& [r, record] = runs[i];
    out[i] = py::make_tuple(r.chains_key, r.bundled, r.events, r.kept, r.start, r.end, as_bytes(record));
  }
  return out;
}

// A bare C++ loop making the add.out calls of an add chain (bench/runtime.py): what the same ATen
// work costs without any interpreter around it. The tensors are converted once, here.
class BareAddOutLoop {
 public:
  BareAddOutLoop(std::vector<at::Tensor> outs, std::vector<at::Tensor> lhs, std::vector<at::Tensor> rhs,
                 py::object alpha)
      : outs_(std::move(outs)), lhs_(std::move(lhs)), rhs_(std::move(rhs)),
        alpha_(PyLong_Check(alpha.ptr()) ? at::Scalar(alpha.cast<int64_t>()) : at::Scalar(alpha.cast<double>())) {
    if (outs_.size() != lhs_.size() || outs_.size() != rhs_.size())
      throw std::invalid_argument("outs, lhs and rhs must have the same length");
  }
  void run() {
    py::gil_scoped_release release;
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // as the native core runs its steps
    for (size_t i = 0; i < outs_.size(); ++i) at::add_out(outs_[i], lhs_[i], rhs_[i], alpha_);
  }

 private:
  std::vector<at::Tensor> outs_, lhs_, rhs_;
  at::Scalar alpha_;
};

// The packed float kernels of conv.h (the XNNPACK host backend's constant-weight nodes).
void bind_packed_kernels(py::module_& m) {
  py::class_<PackedConv2d, std::shared_ptr<PackedConv2d>>(m, "PackedConv2d",
                                                         "A float convolution with its weights packed (conv.h)")
      .def_property_readonly("kind", &PackedConv2d::kind)
      .def("__call__", [](const PackedConv2d& c, const at::Tensor& x, bool fused) {
        return without_gil(true, [&] { return c.run(x, fused); });
      }, py::arg("x"), py::arg("fused") = true);
  m.def("packed_conv2d",
        [](const at::Tensor& weight, std::optional<at::Tensor> bias, std::array<int64_t, 4> pads,
           std::array<int64_t, 2> stride, std::array<int64_t, 2> dilation, int64_t groups, double lo, double hi,
           std::vector<int64_t> input_nchw) -> py::object {
          ConvGeometry g;
          g.kh = weight.dim() == 4 ? weight.size(2) : 0, g.kw = weight.dim() == 4 ? weight.size(3) : 0;
          g.pad_left = pads[0], g.pad_right = pads[1], g.pad_top = pads[2], g.pad_bottom = pads[3];
          g.stride_h = stride[0], g.stride_w = stride[1], g.dilation_h = dilation[0], g.dilation_w = dilation[1];
          g.groups = groups;
          auto conv = without_gil(true, [&] {
            return PackedConv2d::make(weight, bias.value_or(at::Tensor()), g, lo, hi, input_nchw);
          });
          return conv ? py::cast(conv) : py::none();
        },
        py::arg("weight"), py::arg("bias"), py::arg("pads"), py::arg("stride"), py::arg("dilation"),
        py::arg("groups"), py::arg("lo"), py::arg("hi"), py::arg("input_nchw"),
        "PackedConv2d of an OIHW float32 weight, pads (left, right, top, bottom), or None where conv.h does not "
        "take the convolution (grouped but not depthwise, no MKL)");
  py::class_<PackedLinear, std::shared_ptr<PackedLinear>>(m, "PackedLinear",
                                                         "A float fully connected layer with its weight packed")
      .def("__call__", [](const PackedLinear& l, const at::Tensor& x, bool fused) {
        return without_gil(true, [&] { return l.run(x, fused); });
      }, py::arg("x"), py::arg("fused") = true);
  m.def("packed_linear",
        [](const at::Tensor& weight, std::optional<at::Tensor> bias, double lo, double hi, int64_t rows) -> py::object {
          auto linear = without_gil(true, [&] { return PackedLinear::make(weight, bias.value_or(at::Tensor()), lo, hi,
                                                                          rows); });
          return linear ? py::cast(linear) : py::none();
        },
        py::arg("weight"), py::arg("bias"), py::arg("lo"), py::arg("hi"), py::arg("rows"),
        "PackedLinear of a [out, in] float32 weight, or None without MKL's packed GEMM");
  m.def("packed_float_isa", &packed_float_isa, py::arg("widest"),
        "The widest form the float kernels use from now on (0 plain, 1 AVX2, 2 AVX-512), capped at the CPU's; "
        "returns the form in use (tests of every form)");
}

}  // namespace
}  // namespace etlab_native

PYBIND11_MODULE(_core, m) {
  using namespace etlab_native;
  m.doc() = "etlab's native runtime core: runs a bound method plan with pre-resolved dispatcher handles.";

  py::class_<DebugArena, std::shared_ptr<DebugArena>>(m, "DebugArena")
      .def(py::init<int64_t, int64_t>(), py::arg("size"), py::arg("limit"))
      .def("reserve", &DebugArena::reserve, py::arg("nbytes"), py::arg("alignment"))
      .def("grow_by_at_least", &DebugArena::grow_by_at_least, py::arg("nbytes"))
      .def("contents", &DebugArena::contents)
      .def_property_readonly("used", &DebugArena::used);

  struct MemoryWatchHandle {
    std::shared_ptr<MemoryWatch> watch = new_memory_watch();
  };
  py::class_<MemoryWatchHandle>(m, "MemoryWatch", "The CPU allocator's traffic on this thread (see core.h)")
      .def(py::init<>())
      .def("start", [](MemoryWatchHandle& h) { return start_memory_watch(h.watch); })
      .def("stop", [](MemoryWatchHandle& h) { stop_memory_watch(h.watch); })
      .def("mark", [](MemoryWatchHandle& h) { memory_mark(h.watch.get()); })
      .def("take", [](MemoryWatchHandle& h) { return memory_take(h.watch.get()); });

  py::class_<TraceLog, std::shared_ptr<TraceLog>>(m, "TraceLog")
      .def(py::init<int64_t>(), py::arg("max_events"))
      .def("fit", &TraceLog::fit, py::arg("n"))
      .def("__len__", &TraceLog::size)
      .def_property_readonly("dropped", &TraceLog::dropped)
      .def_property_readonly("anchors", &TraceLog::anchors)
      .def("runs", &timed_runs);

  py::class_<NativePlan>(m, "NativePlan")
      .def(py::init<py::object, py::list, std::vector<int64_t>>())
      .def("add_chain", &NativePlan::add_chain)
      .def("add_kernel", &NativePlan::add_kernel)
      .def("set_alternative", &NativePlan::set_alternative)
      .def("add_python", &NativePlan::add_python)
      .def("add_move", &NativePlan::add_move)
      .def("add_free", &NativePlan::add_free)
      .def("add_jump", &NativePlan::add_jump)
      .def("add_nop", &NativePlan::add_nop)
      .def("set_view_copy", &NativePlan::set_view_copy)
      .def("add_log", &NativePlan::add_log)
      .def("set_lstm_cell", &NativePlan::set_lstm_cell, py::arg("chain"), py::arg("start"), py::arg("span"),
           py::arg("bias"), py::arg("h"), py::arg("w"), py::arg("x"), py::arg("c"), py::arg("c_out"), py::arg("h_out"))
      .def_property_readonly("fused_cells", &NativePlan::fused_cells)
      .def("declare_int", &NativePlan::declare_int, py::arg("slot"), py::arg("initial"), py::arg("is_bool"))
      .def("add_sym_size", &NativePlan::add_sym_size)
      .def("add_int_op", &NativePlan::add_int_op)
      .def("add_view", &NativePlan::add_view)
      .def("add_dim_order_copy", &NativePlan::add_dim_order_copy)
      .def("set_int_patches", &NativePlan::set_int_patches)
      .def("set_view_of", &NativePlan::set_view_of)
      .def("set_sync", &NativePlan::set_sync)
      .def("set_exported_ints", &NativePlan::set_exported_ints)
      .def("int_value", &NativePlan::int_value, py::arg("slot"))
      .def_readonly("failed_chain", &NativePlan::failed_chain)
      .def_readonly("failed_index", &NativePlan::failed_index)
      .def_property_readonly("instruction_count", &NativePlan::instruction_count)
      .def_property_readonly("step_counts", [](const NativePlan& p) {
        auto c = p.step_counts();
        return py::dict(py::arg("unboxed") = c[0], py::arg("boxed") = c[1], py::arg("python") = c[2],
                        py::arg("other") = c[3]);
      })
      .def_readwrite("small_products", &NativePlan::small_products,
                     "False: one-row float addmm/mm through ATen (bit for bit the Python core's results)")
      .def_readwrite("release_gil", &NativePlan::release_gil,
                     "False makes runs hold the GIL: only for the test that shows the GIL-release test can fail")
      .def("run", [](NativePlan& p) { without_gil(p.release_gil, [&] { p.run(); return 0; }); })
      .def("set_event_counts", &NativePlan::set_event_counts)
      .def("run_timed",
           [](NativePlan& p) {
             auto [record, events] = without_gil(p.release_gil, [&] { return p.run_timed(); });
             return py::make_tuple(as_bytes(record), events);
           })
      .def("set_trace_log", &NativePlan::set_trace_log, py::arg("log"), py::arg("chains_key"))
      .def("run_logged", [](NativePlan& p, int64_t bundled) {
        without_gil(p.release_gil, [&] { p.run_logged(bundled); return 0; });
      })
      .def("run_traced", [](NativePlan& p, DebugArena& arena, py::list python_events) {
        p.records().clear();
        int64_t dropped = 0;
        std::vector<int64_t> steps;
        try {
          // The list is passed as a borrowed handle: copying a py::list would touch its reference count
          // without the GIL.
          py::handle events = python_events;
          steps = without_gil(p.release_gil, [&] { return p.run_traced(arena, events, dropped); });
        } catch (...) {
          p.records().clear();
          throw;
        }
        return py::make_tuple(as_bytes(steps), take_records(p), dropped);
      });

  m.def("clock_ns", &clock_ns,
        "CLOCK_MONOTONIC nanoseconds (time.perf_counter_ns's clock) read from the CPU's time-stamp counter");
  m.def("small_kernel_calls", &small_kernel_calls,
        "Calls each small_ops.cpp kernel computed in this process, by operator (tests: the native path was taken)");
  py::class_<BareAddOutLoop>(m, "BareAddOutLoop")
      .def(py::init<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, py::object>())
      .def("run", &BareAddOutLoop::run);
  bind_packed_kernels(m);
  bind_int8_kernels(m);
}
