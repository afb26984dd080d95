// The native core's steps for dynamic shapes: sizes computed while running (run-time ints), views and copies
// whose sizes come from them, out-variants resized to the run's shapes within their planned memory.
//
// A method exported with dynamic dimensions computes its sizes as it runs: aten::sym_size reads a tensor's
// size, executorch_prim's arithmetic combines sizes, et_view and the view-copy out-variants take the results
// as their sizes. The Python core keeps these ints in its value table; here they live in `ints_`, written and
// read without the GIL, and are published to the value table only where Python reads them (a Python step's
// arguments, the method's outputs, logged values). Memory stays the plan's: a view re-points its output at
// its source's memory, a copy resizes its output within the storage the plan gave it (an upper bound of a
// dynamic shape: the storage cannot grow, so a run past the bound is a clean error, never a write past it).
#include "core.h"

#include <ATen/native/Resize.h>

#include <stdexcept>
#include <unordered_map>

namespace etlab_native {

namespace {

IntOpKind int_op_kind(const std::string& op) {
  static const std::unordered_map<std::string, IntOpKind> kinds = {
      {"add", IntOpKind::Add}, {"sub", IntOpKind::Sub}, {"mul", IntOpKind::Mul},
      {"floordiv", IntOpKind::FloorDiv}, {"mod", IntOpKind::Mod}, {"neg", IntOpKind::Neg},
      {"sym_max", IntOpKind::Max}, {"sym_min", IntOpKind::Min}, {"eq", IntOpKind::Eq}, {"gt", IntOpKind::Gt},
      {"lt", IntOpKind::Lt}, {"ge", IntOpKind::Ge}, {"le", IntOpKind::Le}};
  auto it = kinds.find(op);
  if (it == kinds.end()) throw std::invalid_argument("executorch_prim::" + op + " is not a native int operation");
  return it->second;
}

[[noreturn, gnu::cold]] void int_error(const Instr& in, const std::string& why) {
  throw std::runtime_error(in.name + ": " + why);
}

// `overflow` first, then the result it wrote: one statement each (an argument list's order is unspecified).
int64_t checked(bool overflow, const int64_t& v, const Instr& in) {
  if (__builtin_expect(overflow, 0)) int_error(in, "integer overflow (the result does not fit in 64 bits)");
  return v;
}

// Python's a // b and a % b on ints: rounded toward negative infinity, the remainder taking b's sign.
int64_t floor_div(int64_t a, int64_t b, const Instr& in) {
  if (b == 0) int_error(in, "integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) int_error(in, "integer overflow (the result does not fit in 64 bits)");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t floor_mod(int64_t a, int64_t b, const Instr& in) {
  if (b == 0) int_error(in, "integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

int64_t compute(const Instr& in, int64_t a, int64_t b) {
  int64_t r = 0;
  switch (in.int_op) {
    case IntOpKind::Add: return checked(__builtin_add_overflow(a, b, &r), r, in);
    case IntOpKind::Sub: return checked(__builtin_sub_overflow(a, b, &r), r, in);
    case IntOpKind::Mul: return checked(__builtin_mul_overflow(a, b, &r), r, in);
    case IntOpKind::FloorDiv: return floor_div(a, b, in);
    case IntOpKind::Mod: return floor_mod(a, b, in);
    case IntOpKind::Neg: return checked(__builtin_sub_overflow(int64_t{0}, a, &r), r, in);
    case IntOpKind::Max: return a >= b ? a : b;
    case IntOpKind::Min: return a <= b ? a : b;
    case IntOpKind::Eq: return a == b;
    case IntOpKind::Gt: return a > b;
    case IntOpKind::Lt: return a < b;
    case IntOpKind::Ge: return a >= b;
    case IntOpKind::Le: return a <= b;
  }
  return r;
}

// Strides of a dense tensor of `sizes` whose dimensions lie outermost-first in `order` (empty: 0, 1, ...),
// a unit stride step for empty dimensions: _memory.dim_order_strides.
std::vector<int64_t> dim_order_strides(c10::IntArrayRef sizes, const std::vector<IntRef>& order) {
  const size_t n = sizes.size();
  std::vector<int64_t> strides(n, 0);
  int64_t step = 1;
  for (size_t k = n; k-- > 0;) {
    const int64_t d = order.empty() ? static_cast<int64_t>(k) : order[k].value;
    if (d < 0 || d >= static_cast<int64_t>(n)) throw std::out_of_range("dim order entry out of range");
    strides[static_cast<size_t>(d)] = step;
    step *= std::max<int64_t>(sizes[static_cast<size_t>(d)], 1);
  }
  return strides;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out;
  for (int64_t s : sizes) out += (out.empty() ? "" : ", ") + std::to_string(s);
  return "[" + out + "]";
}

// A dense result of `sizes` must fit the memory the plan gave `out` (planned storage cannot grow): an error
// naming both sizes, where ATen would say only that the storage is not resizable.
void check_fits(const Instr& in, const at::Tensor& out, c10::IntArrayRef sizes) {
  const c10::Storage& storage = out.storage();
  if (!storage || storage.resizable()) return;
  int64_t count = 1, bytes = 0;
  bool overflow = false;
  for (int64_t s : sizes) overflow |= __builtin_mul_overflow(count, std::max<int64_t>(s, 0), &count);
  overflow |= __builtin_add_overflow(count, out.storage_offset(), &bytes);
  overflow |= __builtin_mul_overflow(bytes, static_cast<int64_t>(out.itemsize()), &bytes);
  if (overflow || bytes > static_cast<int64_t>(storage.nbytes()))
    int_error(in, "a " + shape_text(sizes) + " result (" + (overflow ? std::string("over 2^63") : std::to_string(
                      count * static_cast<int64_t>(out.itemsize()))) + " bytes) is larger than its output's planned "
                  "memory (" + std::to_string(storage.nbytes() - out.storage_offset() * out.itemsize()) +
                  " bytes); the call was not run");
}

}  // namespace

Instr& NativePlan::last_step(int64_t chain, const char* what) {
  if (chain < 0 || chain >= static_cast<int64_t>(chains_.size())) throw std::out_of_range("chain index out of range");
  auto& instrs = chains_[static_cast<size_t>(chain)].instrs;
  if (instrs.empty()) throw std::invalid_argument(std::string(what) + ": the chain has no step yet");
  return instrs.back();
}

void NativePlan::declare_int(int64_t slot, int64_t initial, bool is_bool) {
  if (slot < 0 || slot >= static_cast<int64_t>(values_.size())) throw std::out_of_range("run-time int slot");
  if (ints_.size() != values_.size()) {
    ints_.assign(values_.size(), 0);
    int_kind_.assign(values_.size(), 0);
  }
  ints_[static_cast<size_t>(slot)] = initial;
  int_kind_[static_cast<size_t>(slot)] = is_bool ? 2 : 1;
}

int64_t NativePlan::int_value(int64_t slot) const {
  if (slot < 0 || static_cast<size_t>(slot) >= int_kind_.size() || !int_kind_[static_cast<size_t>(slot)])
    throw std::out_of_range("value " + std::to_string(slot) + " is not a run-time int of the core");
  return ints_[static_cast<size_t>(slot)];
}

namespace {
IntRef int_ref(const std::pair<int64_t, int64_t>& p, const std::vector<uint8_t>& kinds) {
  if (p.first >= 0 && (static_cast<size_t>(p.first) >= kinds.size() || kinds[static_cast<size_t>(p.first)] != 1))
    throw std::invalid_argument("value " + std::to_string(p.first) + " is not a run-time int of the core");
  return IntRef{p.first, p.second};
}
}  // namespace

void NativePlan::add_sym_size(int64_t chain, const std::string& name, at::Tensor t, int64_t dim, int64_t dst) {
  int_value(dst);  // declared
  Instr in;
  in.op = Op::SymSize;
  in.name = name;
  in.a = std::move(t);
  in.ints.push_back(IntRef{-1, dim});
  in.int_dst = dst;
  if (chain < 0 || chain >= static_cast<int64_t>(chains_.size())) throw std::out_of_range("chain index out of range");
  chains_[static_cast<size_t>(chain)].instrs.push_back(std::move(in));
}

void NativePlan::add_int_op(int64_t chain, const std::string& name, const std::string& op,
                            std::vector<std::pair<int64_t, int64_t>> operands, int64_t dst) {
  int_value(dst);
  Instr in;
  in.op = Op::IntOp;
  in.name = name;
  in.int_op = int_op_kind(op);
  const size_t arity = in.int_op == IntOpKind::Neg ? 1 : 2;
  if (operands.size() != arity)
    throw std::invalid_argument(name + ": " + std::to_string(arity) + " operands expected");
  for (const auto& p : operands) in.ints.push_back(int_ref(p, int_kind_));
  const bool comparison = in.int_op >= IntOpKind::Eq;
  if (int_kind_[static_cast<size_t>(dst)] != (comparison ? 2 : 1))
    throw std::invalid_argument(name + ": the result's kind (int or bool) differs from its value's");
  in.int_dst = dst;
  if (chain < 0 || chain >= static_cast<int64_t>(chains_.size())) throw std::out_of_range("chain index out of range");
  chains_[static_cast<size_t>(chain)].instrs.push_back(std::move(in));
}

void NativePlan::add_view(int64_t chain, const std::string& name, at::Tensor src, at::Tensor out,
                          std::vector<std::pair<int64_t, int64_t>> sizes) {
  Instr in;
  in.op = Op::View;
  in.name = name;
  in.a = std::move(src);
  in.b = std::move(out);
  for (const auto& p : sizes) in.ints.push_back(int_ref(p, int_kind_));
  if (chain < 0 || chain >= static_cast<int64_t>(chains_.size())) throw std::out_of_range("chain index out of range");
  chains_[static_cast<size_t>(chain)].instrs.push_back(std::move(in));
}

void NativePlan::add_dim_order_copy(int64_t chain, const std::string& name, at::Tensor src, at::Tensor out,
                                    std::vector<int64_t> dim_order) {
  Instr in;
  in.op = Op::DimOrderCopy;
  in.name = name;
  in.a = std::move(src);
  in.b = std::move(out);
  for (int64_t d : dim_order) in.ints.push_back(IntRef{-1, d});
  if (!in.ints.empty() && in.ints.size() != static_cast<size_t>(in.b.dim()))
    throw std::invalid_argument(name + ": a dim order of " + std::to_string(in.ints.size()) + " entries for a " +
                                std::to_string(in.b.dim()) + "-dimensional output");
  if (chain < 0 || chain >= static_cast<int64_t>(chains_.size())) throw std::out_of_range("chain index out of range");
  chains_[static_cast<size_t>(chain)].instrs.push_back(std::move(in));
}

void NativePlan::set_int_patches(int64_t chain, std::vector<std::tuple<int64_t, int64_t, int64_t>> patches) {
  Instr& in = last_step(chain, "set_int_patches");
  if (in.op != Op::Kernel || in.alternative)
    throw std::invalid_argument("int patches go on a kernel step (step " + in.name + ", kind " +
                                std::to_string(static_cast<int>(in.op)) + ")");
  for (const auto& [arg, element, slot] : patches) {
    if (arg < 0 || arg >= static_cast<int64_t>(in.args.size())) throw std::out_of_range("patched argument index");
    const c10::IValue& v = in.args[static_cast<size_t>(arg)];
    if (element < 0 ? !v.isInt() : !(v.isIntList() && element < static_cast<int64_t>(v.toIntList().size())))
      throw std::invalid_argument(in.name + ": argument " + std::to_string(arg) + " is not an int (list) to patch");
    int_ref({slot, 0}, int_kind_);
    in.patches.push_back(IntPatch{static_cast<int32_t>(arg), static_cast<int32_t>(element), slot});
  }
  // the unboxed paths read scalars taken at load: a patched call goes boxed
  in.fast = Fast::None;
  in.small = Small::None;
}

void NativePlan::set_view_of(int64_t chain, const std::string& name, const std::string& overload) {
  Instr& in = last_step(chain, "set_view_of");
  if (in.op != Op::Kernel || in.alternative || in.has_result || in.args.empty() || !in.args.back().isTensor())
    throw std::invalid_argument("a view copy is an out-variant kernel step");
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) throw std::invalid_argument("no operator " + name + "." + overload + " in the dispatcher");
  const auto& schema = handle->schema();
  if (schema.arguments().size() + 1 != in.args.size() || schema.returns().size() != 1 ||
      schema.returns()[0].type()->kind() != c10::TypeKind::TensorType)
    throw std::invalid_argument(name + ": not the view of " + in.name);
  in.view = *handle;
  in.fast = Fast::None;
  in.small = Small::None;
}

void NativePlan::set_sync(int64_t chain, std::vector<int64_t> slots) {
  Instr& in = last_step(chain, "set_sync");
  if (in.op != Op::Python) throw std::invalid_argument("only a Python step reads the value table");
  for (int64_t s : slots) int_value(s);
  in.sync = std::move(slots);
}

void NativePlan::set_exported_ints(std::vector<int64_t> slots) {
  for (int64_t s : slots) int_value(s);
  exported_ = std::move(slots);
}

void NativePlan::publish_ints(const std::vector<int64_t>& slots) {
  for (int64_t s : slots) {
    const size_t k = static_cast<size_t>(s);
    PyObject* v = int_kind_[k] == 2 ? PyBool_FromLong(ints_[k] != 0) : PyLong_FromLongLong(ints_[k]);
    if (v == nullptr) throw py::error_already_set();
    if (PyList_SetItem(values_.ptr(), static_cast<Py_ssize_t>(s), v) != 0) throw py::error_already_set();
  }
}

void NativePlan::publish_exported() {
  if (exported_.empty()) return;
  py::gil_scoped_acquire gil;
  publish_ints(exported_);
}

void NativePlan::patch_args(Instr& in) const {
  for (const IntPatch& p : in.patches) {
    c10::IValue& v = in.args[static_cast<size_t>(p.arg)];
    const int64_t x = ints_[static_cast<size_t>(p.slot)];
    if (p.element < 0) {
      v = x;
    } else {
      v.toIntList().set(static_cast<size_t>(p.element), x);
    }
  }
}

void NativePlan::call_view_copy(Instr& in) {
  // what ATen's view-copy out-variant computes (the view, cloned, then copied into the resized output),
  // without the clone: the same elements land in the same places
  stack_.assign(in.args.begin(), in.args.end() - 1);
  in.view->callBoxed(stack_);
  const at::Tensor v = stack_.at(0).toTensor();
  stack_.clear();
  const at::Tensor& out = in.args.back().toTensor();
  check_fits(in, out, v.sizes());
  at::native::resize_output(out, v.sizes());
  out.copy_(v);
}

void NativePlan::run_dynamic(Instr& in) {
  switch (in.op) {
    case Op::SymSize:
      ints_[static_cast<size_t>(in.int_dst)] = in.a.size(in.ints[0].value);
      return;
    case Op::IntOp: {
      const int64_t a = read_int(in.ints[0]);
      const int64_t b = in.ints.size() > 1 ? read_int(in.ints[1]) : 0;
      ints_[static_cast<size_t>(in.int_dst)] = compute(in, a, b);
      return;
    }
    case Op::View: {  // _prim_kernels._bind_et_view: one -1 inferred from the source's elements
      const size_t n = in.ints.size();
      std::vector<int64_t> sizes(n);
      int64_t known = 1;
      int64_t infer = -1;
      for (size_t k = 0; k < n; ++k) {
        sizes[k] = read_int(in.ints[k]);
        if (sizes[k] == -1) {
          if (infer < 0) infer = static_cast<int64_t>(k);
        } else if (__builtin_mul_overflow(known, sizes[k], &known)) {
          int_error(in, "view sizes overflow");
        }
      }
      const int64_t numel = in.a.numel();
      if (infer >= 0) sizes[static_cast<size_t>(infer)] = known != 0 ? floor_div(numel, known, in) : 0;
      int64_t count = 1;
      bool overflow = false;
      for (int64_t s : sizes) overflow |= __builtin_mul_overflow(count, s, &count);
      if (overflow || count != numel)
        int_error(in, "cannot view " + std::to_string(numel) + " elements as " + shape_text(sizes));
      in.b.set_(in.a.storage(), in.a.storage_offset(), sizes, dim_order_strides(sizes, {}));
      return;
    }
    case Op::DimOrderCopy:  // _prim_kernels._bind_dim_order_copy
      if (!in.b.sizes().equals(in.a.sizes())) {
        check_fits(in, in.b, in.a.sizes());
        in.b.set_(in.b.storage(), in.b.storage_offset(), in.a.sizes(), dim_order_strides(in.a.sizes(), in.ints));
      }
      in.b.copy_(in.a);
      return;
    default:
      throw std::logic_error("run_dynamic: not a dynamic-shape step");
  }
}

}  // namespace etlab_native
