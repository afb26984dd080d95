// One XNNPACK partition (a delegate call) run as one native loop: the XNNPACK host backend
// (etlab/runtime/backends/xnnpack/_native_plan.py) builds it once at load from its prepared steps, and an
// execute is then a single call: no Python frame, dict or closure per node.
//
// Each step reads value slots and writes one: a packed float convolution or fully connected layer (conv.h), an
// int8 convolution or add (qconv*.cpp, optionally after turning a float input into integers), a conversion between
// float levels and the shifted integers, a permute, a float add with its clamp (ATen's, as the Python step calls
// it), or a Python callable for a node the loop has no native form of (mixed plans: such a step runs with the
// GIL, the rest without). Every step computes what the Python step computes, with the same kernels in the same
// order, so the results are the Python path's bit for bit.
//
// `run` takes the call's arguments only when each one is a tensor of its declared shape and dtype (float32 inputs
// that need no conversion); anything else (dynamic shapes, quantized or narrow inputs, bad arguments) returns None
// and the caller takes its Python path, which checks and converts. With `timed`, each step's start and end
// (CLOCK_MONOTONIC ns, perf_counter_ns's clock) are returned for the caller's per-node profiling events.
#include "qconv_internal.h"
#include "conv.h"

#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <optional>
#include <utility>

namespace etlab_native {

int64_t clock_ns();  // trace.cpp

namespace int8 __attribute__((visibility("hidden"))) {

namespace {

enum class StepKind { kUnary, kBinary, kQuantize, kDequantize, kClamp, kPermute, kFloatAdd, kPython };

struct Quantize {
  double inv_scale = 1.0;
  int64_t zp = 0, lo = 0, hi = 255;
};

struct Step {
  StepKind kind;
  std::vector<int64_t> ins;
  int64_t out = 0;
  UnaryFn unary;
  BinaryFn binary;
  std::optional<Quantize> pre_a, pre_b;  // float inputs turned into integers first
  Quantize quantize;                     // kQuantize; kDequantize: inv_scale is the scale
  std::vector<int64_t> perm;
  std::optional<std::pair<double, double>> clamp;
  py::object python;
  const char* name = "";
};

at::Tensor integers(const at::Tensor& x, const std::optional<Quantize>& q) {
  if (!q) return x;
  check(x.scalar_type() == at::kFloat, "a float input of an int8 step must be float32 levels");
  return quantize_u8(x, q->inv_scale, q->zp, q->lo, q->hi, -1);
}

std::optional<Quantize> quantize_of(const std::optional<std::array<double, 4>>& p) {
  if (!p) return std::nullopt;
  return Quantize{(*p)[0], int64_t((*p)[1]), int64_t((*p)[2]), int64_t((*p)[3])};
}

}  // namespace

class XnnPartition {
 public:
  // slots: how many values; inputs/outputs: their slots in the call's argument order, with their declared shapes
  // (`direct_inputs[i]` false: input i always takes the caller's path; `direct_outputs[k]` false: output k is
  // always stored by `store`); store: fn(position, value, out) for an output the loop does not copy itself.
  XnnPartition(int64_t slots, std::vector<int64_t> inputs, std::vector<std::vector<int64_t>> input_shapes,
               std::vector<bool> direct_inputs, std::vector<int64_t> outputs,
               std::vector<std::vector<int64_t>> output_shapes, std::vector<bool> direct_outputs, py::object store)
      : constants_(size_t(slots)), inputs_(std::move(inputs)), input_shapes_(std::move(input_shapes)),
        direct_(std::move(direct_inputs)), outputs_(std::move(outputs)), output_shapes_(std::move(output_shapes)),
        direct_out_(std::move(direct_outputs)), store_(std::move(store)) {
    check(slots >= 0 && inputs_.size() == input_shapes_.size() && inputs_.size() == direct_.size() &&
              outputs_.size() == output_shapes_.size() && outputs_.size() == direct_out_.size(),
          "XnnPartition: inputs, outputs and their shapes must match");
    for (int64_t s : inputs_) slot(s);
    for (int64_t s : outputs_) slot(s);
  }

  void set_constant(int64_t s, const at::Tensor& value) { constants_[size_t(slot(s))] = value; }

  // A packed float convolution / fully connected layer (its clamp fused) or a bound int8 convolution / fully
  // connected layer; `pre`: (inv_scale, zp, lo, hi) to make integers of a float input first.
  void add_kernel(py::object kernel, int64_t in, int64_t out, std::optional<std::array<double, 4>> pre) {
    Step st = base(StepKind::kUnary, {in}, out);
    if (py::isinstance<PackedConv2d>(kernel)) {
      st.unary = [k = kernel.cast<std::shared_ptr<PackedConv2d>>()](const at::Tensor& x) { return k->run(x, true); };
      st.name = "packed_conv2d";
    } else if (py::isinstance<PackedLinear>(kernel)) {
      st.unary = [k = kernel.cast<std::shared_ptr<PackedLinear>>()](const at::Tensor& x) { return k->run(x, true); };
      st.name = "packed_linear";
    } else if ((st.unary = bound_qconv_fn(kernel))) {
      st.name = "qconv2d";
    } else if ((st.unary = bound_qdepthwise_fn(kernel))) {
      st.name = "qdepthwise_conv2d";
    } else {
      throw std::invalid_argument("XnnPartition.add_kernel: not a native kernel object: " +
                                  std::string(py::str(py::type::of(kernel))));
    }
    st.pre_a = quantize_of(pre);
    steps_.push_back(std::move(st));
  }

  void add_qadd(py::object kernel, int64_t a, int64_t b, int64_t out, std::optional<std::array<double, 4>> pre_a,
                std::optional<std::array<double, 4>> pre_b) {
    Step st = base(StepKind::kBinary, {a, b}, out);
    st.binary = qadd_fn(kernel);
    check(bool(st.binary), "XnnPartition.add_qadd: not a QAdd");
    st.pre_a = quantize_of(pre_a), st.pre_b = quantize_of(pre_b);
    st.name = "qadd";
    steps_.push_back(std::move(st));
  }

  void add_quantize(int64_t in, int64_t out, double inv_scale, int64_t zp, int64_t lo, int64_t hi) {
    Step st = base(StepKind::kQuantize, {in}, out);
    st.quantize = Quantize{inv_scale, zp, lo, hi};
    st.name = "quantize";
    steps_.push_back(std::move(st));
  }

  void add_dequantize(int64_t in, int64_t out, double scale, int64_t zp) {
    Step st = base(StepKind::kDequantize, {in}, out);
    st.quantize = Quantize{scale, zp, 0, 255};
    st.name = "dequantize";
    steps_.push_back(std::move(st));
  }

  // torch.clamp of a value's integers (uint8 form), after making them of a float input if `pre`
  void add_clamp(int64_t in, int64_t out, std::optional<std::array<double, 4>> pre, int64_t lo, int64_t hi) {
    Step st = base(StepKind::kClamp, {in}, out);
    st.pre_a = quantize_of(pre);
    st.quantize = Quantize{1.0, 0, lo, hi};
    st.name = "clamp";
    steps_.push_back(std::move(st));
  }

  void add_permute(int64_t in, int64_t out, std::vector<int64_t> perm) {
    Step st = base(StepKind::kPermute, {in}, out);
    st.perm = std::move(perm);
    st.name = "permute";
    steps_.push_back(std::move(st));
  }

  void add_float_add(int64_t a, int64_t b, int64_t out, std::optional<std::pair<double, double>> clamp) {
    Step st = base(StepKind::kFloatAdd, {a, b}, out);
    st.clamp = clamp;
    st.name = "add";
    steps_.push_back(std::move(st));
  }

  void add_python(py::object fn, std::vector<int64_t> ins, int64_t out) {
    Step st = base(StepKind::kPython, std::move(ins), out);
    st.python = std::move(fn);
    st.name = "python";
    has_python_ = true;
    steps_.push_back(std::move(st));
  }

  std::vector<std::string> step_kinds() const {
    std::vector<std::string> out;
    for (const Step& st : steps_) out.emplace_back(st.name);
    return out;
  }

  // None when the arguments do not fit the loop (see the file's comment), else the step times (empty untimed).
  py::object run(const py::list& args, bool timed) const {
    const size_t n_in = inputs_.size(), n_out = outputs_.size();
    if (args.size() != n_in + n_out) return py::none();
    std::vector<at::Tensor> outs(n_out);
    std::vector<at::Tensor> values(constants_);
    for (size_t i = 0; i < n_in + n_out; ++i) {
      py::handle h = args[i];
      if (!THPVariable_Check(h.ptr())) return py::none();
      at::Tensor t = THPVariable_Unpack(h.ptr());
      const auto& shape = i < n_in ? input_shapes_[i] : output_shapes_[i - n_in];
      if (i < n_in && t.dim() == 0 && shape.size() == 1 && shape[0] == 1) t = t.reshape({1});  // XNNPACK's [1]
      if (t.sizes() != at::IntArrayRef(shape)) return py::none();
      if (i < n_in) {
        if (!direct_[i] || t.scalar_type() != at::kFloat) return py::none();
        values[size_t(inputs_[i])] = std::move(t);
      } else {
        outs[i - n_in] = std::move(t);
      }
    }
    std::vector<int64_t> times;
    if (timed) times.reserve(steps_.size() * 2);
    {
      std::optional<py::gil_scoped_release> release;
      if (!has_python_) release.emplace();
      for (const Step& st : steps_) {
        if (timed) times.push_back(clock_ns());
        values[size_t(st.out)] = step(st, values);
        if (timed) times.push_back(clock_ns());
      }
      for (size_t k = 0; k < n_out; ++k) {
        const at::Tensor& v = values[size_t(outputs_[k])];
        if (direct_out_[k] && v.scalar_type() == at::kFloat && outs[k].scalar_type() == at::kFloat &&
            v.sizes() == outs[k].sizes()) {
          outs[k].copy_(v);
          outs[k] = at::Tensor();  // stored
        }
      }
    }
    for (size_t k = 0; k < n_out; ++k)
      if (outs[k].defined()) store_(k, values[size_t(outputs_[k])], outs[k]);
    return py::cast(times);
  }

 private:
  int64_t slot(int64_t s) const {
    check(s >= 0 && s < int64_t(constants_.size()), "XnnPartition: slot " + std::to_string(s) + " out of range");
    return s;
  }

  Step base(StepKind kind, std::vector<int64_t> ins, int64_t out) const {
    for (int64_t s : ins) slot(s);
    Step st{kind, std::move(ins), slot(out)};
    return st;
  }

  at::Tensor step(const Step& st, const std::vector<at::Tensor>& v) const {
    const at::Tensor& a = v[size_t(st.ins.empty() ? 0 : st.ins[0])];
    switch (st.kind) {
      case StepKind::kUnary:
        return st.unary(integers(a, st.pre_a));
      case StepKind::kBinary:
        return st.binary(integers(a, st.pre_a), integers(v[size_t(st.ins[1])], st.pre_b));
      case StepKind::kQuantize:
        return integers(a, st.quantize);
      case StepKind::kDequantize:
        return dequantize_u8(a, st.quantize.inv_scale, st.quantize.zp, -1);
      case StepKind::kClamp:
        return at::clamp(integers(a, st.pre_a), st.quantize.lo, st.quantize.hi);
      case StepKind::kPermute:
        return a.permute(st.perm);
      case StepKind::kFloatAdd: {
        at::Tensor y = at::add(a, v[size_t(st.ins[1])]);
        return st.clamp ? at::clamp(y, st.clamp->first, st.clamp->second) : y;
      }
      case StepKind::kPython: {
        py::tuple operands(st.ins.size());
        for (size_t i = 0; i < st.ins.size(); ++i) operands[i] = py::cast(v[size_t(st.ins[i])]);
        return st.python(*operands).cast<at::Tensor>();
      }
    }
    throw std::logic_error("XnnPartition: unknown step kind");
  }

  std::vector<at::Tensor> constants_;  // a call's value table starts as this (constants; other slots empty)
  std::vector<int64_t> inputs_;
  std::vector<std::vector<int64_t>> input_shapes_;
  std::vector<bool> direct_;
  std::vector<int64_t> outputs_;
  std::vector<std::vector<int64_t>> output_shapes_;
  std::vector<bool> direct_out_;
  py::object store_;
  std::vector<Step> steps_;
  bool has_python_ = false;
};

void bind_xnn_plan(py::module_& m) {
  using py::arg;
  py::class_<XnnPartition, std::shared_ptr<XnnPartition>>(m, "XnnPartition",
                                                         "An XNNPACK partition run as one native loop (xnn_plan.cpp)")
      .def(py::init<int64_t, std::vector<int64_t>, std::vector<std::vector<int64_t>>, std::vector<bool>,
                    std::vector<int64_t>, std::vector<std::vector<int64_t>>, std::vector<bool>, py::object>(),
           arg("slots"), arg("inputs"), arg("input_shapes"), arg("direct_inputs"), arg("outputs"),
           arg("output_shapes"), arg("direct_outputs"), arg("store"))
      .def("set_constant", &XnnPartition::set_constant, arg("slot"), arg("value"))
      .def("add_kernel", &XnnPartition::add_kernel, arg("kernel"), arg("input"), arg("output"), arg("pre") = py::none())
      .def("add_qadd", &XnnPartition::add_qadd, arg("kernel"), arg("a"), arg("b"), arg("output"),
           arg("pre_a") = py::none(), arg("pre_b") = py::none())
      .def("add_quantize", &XnnPartition::add_quantize, arg("input"), arg("output"), arg("inv_scale"), arg("zp"),
           arg("lo"), arg("hi"))
      .def("add_dequantize", &XnnPartition::add_dequantize, arg("input"), arg("output"), arg("scale"), arg("zp"))
      .def("add_clamp", &XnnPartition::add_clamp, arg("input"), arg("output"), arg("pre"), arg("lo"), arg("hi"))
      .def("add_permute", &XnnPartition::add_permute, arg("input"), arg("output"), arg("perm"))
      .def("add_float_add", &XnnPartition::add_float_add, arg("a"), arg("b"), arg("output"),
           arg("clamp") = py::none())
      .def("add_python", &XnnPartition::add_python, arg("fn"), arg("inputs"), arg("output"))
      .def_property_readonly("step_kinds", &XnnPartition::step_kinds)
      .def("run", &XnnPartition::run, arg("args"), arg("timed") = false,
           "None when the arguments do not fit the loop (the caller's path then runs), else the steps' "
           "[start, end, ...] CLOCK_MONOTONIC ns (empty untimed)");
}

}  // namespace int8
}  // namespace etlab_native
