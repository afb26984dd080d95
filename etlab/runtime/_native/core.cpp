// The native runtime core: building a method's plan from Python values, and running it.
#include "core.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <stdexcept>
#include <type_traits>

namespace etlab_native {

// -- building ------------------------------------------------------------------------------------

namespace {

at::Tensor unpack_tensor(py::handle v, const std::string& what) {
  if (!THPVariable_Check(v.ptr())) throw std::invalid_argument(what + ": expected a tensor");
  return THPVariable_Unpack(v.ptr());
}

template <class T, class Convert>
c10::List<T> list_of(py::handle v, const std::string& what, Convert convert) {
  if (!PyList_Check(v.ptr()) && !PyTuple_Check(v.ptr())) throw std::invalid_argument(what + ": expected a list");
  c10::List<T> out;
  for (py::handle item : v) out.push_back(convert(item));
  return out;
}

int64_t as_int(py::handle v, const std::string& what) {
  if (!PyLong_Check(v.ptr())) throw std::invalid_argument(what + ": expected an int");
  return v.cast<int64_t>();
}

double as_double(py::handle v, const std::string& what) {
  if (!PyFloat_Check(v.ptr()) && !PyLong_Check(v.ptr())) throw std::invalid_argument(what + ": expected a float");
  return v.cast<double>();
}

bool as_bool(py::handle v, const std::string& what) {
  if (!PyBool_Check(v.ptr())) throw std::invalid_argument(what + ": expected a bool");
  return v.ptr() == Py_True;
}

// The IValue a boxed kernel expects for schema type `type`, from the value table's Python value.
c10::IValue to_ivalue(py::handle v, const c10::TypePtr& type, const std::string& what) {
  c10::TypePtr t = type;
  if (t->kind() == c10::TypeKind::OptionalType) {
    if (v.is_none()) return c10::IValue();
    t = t->containedType(0);
  }
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      return unpack_tensor(v, what);
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      return as_int(v, what);
    case c10::TypeKind::FloatType:
      return as_double(v, what);
    case c10::TypeKind::BoolType:
      return as_bool(v, what);
    case c10::TypeKind::NumberType:
      if (PyBool_Check(v.ptr())) return v.ptr() == Py_True;
      if (PyLong_Check(v.ptr())) return v.cast<int64_t>();
      return as_double(v, what);
    case c10::TypeKind::StringType:
      if (!PyUnicode_Check(v.ptr())) throw std::invalid_argument(what + ": expected a str");
      return v.cast<std::string>();
    case c10::TypeKind::NoneType:
      if (!v.is_none()) throw std::invalid_argument(what + ": expected None");
      return c10::IValue();
    case c10::TypeKind::ListType: {
      const c10::TypePtr& elem = t->containedType(0);
      switch (elem->kind()) {
        case c10::TypeKind::IntType:
        case c10::TypeKind::SymIntType:
          return list_of<int64_t>(v, what, [&](py::handle x) { return as_int(x, what); });
        case c10::TypeKind::FloatType:
          return list_of<double>(v, what, [&](py::handle x) { return as_double(x, what); });
        case c10::TypeKind::BoolType:
          return list_of<bool>(v, what, [&](py::handle x) { return as_bool(x, what); });
        case c10::TypeKind::TensorType:
          return list_of<at::Tensor>(v, what, [&](py::handle x) { return unpack_tensor(x, what); });
        case c10::TypeKind::OptionalType:
          if (elem->containedType(0)->kind() == c10::TypeKind::TensorType)
            return list_of<std::optional<at::Tensor>>(v, what, [&](py::handle x) -> std::optional<at::Tensor> {
              if (x.is_none()) return std::nullopt;
              return unpack_tensor(x, what);
            });
          break;
        default:
          break;
      }
      break;
    }
    default:
      break;
  }
  throw std::invalid_argument(what + ": schema type " + type->str() + " is not supported by the native core");
}

// The unboxed calling convention of `schema`, when it is one of the Fast ones: tensors and scalars
// only, nothing optional, the last argument the written output that is also the single return.
Fast fast_kind(const c10::FunctionSchema& schema) {
  const auto& params = schema.arguments();
  if (params.empty() || schema.returns().size() != 1 || !schema.returns()[0].alias_info()) return Fast::None;
  const auto& out = params.back();
  if (!out.alias_info() || !out.alias_info()->isWrite()) return Fast::None;
  std::string shape;
  for (const auto& p : params) {
    auto kind = p.type()->kind();
    if (kind == c10::TypeKind::TensorType) {
      shape += 'T';
    } else if (kind == c10::TypeKind::NumberType) {
      shape += 'S';
    } else {
      return Fast::None;
    }
    if (&p != &out && p.alias_info()) return Fast::None;
  }
  if (shape == "TTST") return Fast::TTS;
  if (shape == "TTT") return Fast::TT;
  if (shape == "TT") return Fast::T;
  if (shape == "TTTSST") return Fast::TTTSS;
  if (shape == "TST") return Fast::TS;
  return Fast::None;
}

// Takes the typed handle of the fast path (typed() checks the operator's registered C++ signature
// and throws on a mismatch: the call then stays boxed).
bool set_fast_path(Instr& in, Fast fast) {
  try {
    switch (fast) {
      case Fast::TTS: in.tts = in.handle->typed<SigTTS>(); break;
      case Fast::TT: in.tt = in.handle->typed<SigTT>(); break;
      case Fast::T: in.t = in.handle->typed<SigT>(); break;
      case Fast::TTTSS: in.tttss = in.handle->typed<SigTTTSS>(); break;
      case Fast::TS: in.ts = in.handle->typed<SigTS>(); break;
      case Fast::None: return false;
    }
  } catch (const c10::Error&) {
    return false;
  }
  in.fast = fast;
  return true;
}

// The key set the dispatcher computes for `in`'s arguments under dispatch state `tls`; the call may
// skip the dispatcher (redispatch to these keys) when they select the CPU kernel. The tensors keep
// their identity, so their key sets, for the life of the method.
void set_direct_keys(Instr& in, const c10::impl::LocalDispatchKeySet& tls) {
  c10::DispatchKeySet keys;
  for (const c10::IValue& v : in.args) {
    if (v.isTensor()) {
      keys = keys | v.toTensor().key_set();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) keys = keys | t.key_set();
    } else if (v.isList()) {
      for (const c10::IValue& x : v.toListRef())
        if (x.isTensor()) keys = keys | x.toTensor().key_set();
    }
  }
  in.keys = (keys | tls.included_) - tls.excluded_;
  // torch 2.13 keeps BackendSelect in the thread's included keys; it only has kernels for operators
  // that take no tensor to dispatch on (factories), and falls through for the rest, as here.
  if (!in.handle->hasKernelForDispatchKey(c10::DispatchKey::BackendSelect))
    in.keys = in.keys.remove(c10::DispatchKey::BackendSelect);
  in.direct = !keys.empty() && in.keys.highestPriorityTypeId() == c10::DispatchKey::CPU;
}

c10::impl::LocalDispatchKeySet below_autograd_tls() {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return c10::impl::tls_local_dispatch_key_set();
}

bool same_tls(const c10::impl::LocalDispatchKeySet& a, const c10::impl::LocalDispatchKeySet& b) {
  return a.included_ == b.included_ && a.excluded_ == b.excluded_;
}

}  // namespace

NativePlan::NativePlan(py::object goto_type, py::list values, std::vector<int64_t> et_scalar_types)
    : goto_type_(std::move(goto_type)), values_(std::move(values)), load_tls_(below_autograd_tls()),
      outer_tls_(c10::impl::tls_local_dispatch_key_set()) {
  et_type_.fill(-1);
  for (size_t i = 0; i < et_scalar_types.size() && i < et_type_.size(); ++i)
    et_type_[i] = static_cast<int8_t>(et_scalar_types[i]);
}

NativePlan::~NativePlan() = default;

int64_t NativePlan::add_chain(bool jumps) {
  chains_.emplace_back();
  chains_.back().jumps = jumps;
  return static_cast<int64_t>(chains_.size()) - 1;
}

static Chain& chain_at(std::vector<Chain>& chains, int64_t c) {
  if (c < 0 || c >= static_cast<int64_t>(chains.size())) throw std::out_of_range("chain index out of range");
  return chains[c];
}

Instr NativePlan::make_kernel(const std::string& name, const std::string& overload, py::list args,
                              py::object result) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) throw std::invalid_argument("no operator " + name + "." + overload + " in the dispatcher");
  const auto& params = handle->schema().arguments();
  if (args.size() != params.size())
    throw std::invalid_argument(name + ": " + std::to_string(args.size()) + " arguments for a schema of " +
                                std::to_string(params.size()));
  Instr in;
  in.op = Op::Kernel;
  in.name = name;
  for (size_t k = 0; k < params.size(); ++k)
    in.args.push_back(to_ivalue(args[k], params[k].type(), name + " argument '" + params[k].name() + "'"));
  if (!result.is_none()) {
    if (handle->schema().returns().size() != 1) throw std::invalid_argument(name + ": a result needs one return");
    in.has_result = true;
    in.a = unpack_tensor(result, name + " result");
  }
  in.handle = *handle;
  set_direct_keys(in, load_tls_);
  Fast fast = in.has_result ? Fast::None : fast_kind(handle->schema());
  if (set_fast_path(in, fast)) {
    std::vector<at::Scalar> scalars;
    for (const auto& arg : in.args)
      if (!arg.isTensor()) scalars.push_back(arg.toScalar());
    if (!scalars.empty()) in.s0 = scalars[0];
    if (scalars.size() > 1) in.s1 = scalars[1];
    in.small = small_kind(name, overload, in.fast);
    if (!small_products && (in.small == Small::Addmm || in.small == Small::Mm)) in.small = Small::None;
  }
  if (!in.has_result) in.small_fn = small_kernel(name, overload, small_products);
  if (in.small_fn != nullptr && in.small == Small::None) in.small = Small::Fn;
  return in;
}

void NativePlan::add_kernel(int64_t chain, const std::string& name, const std::string& overload, py::list args,
                            py::object result) {
  Chain& ch = chain_at(chains_, chain);
  ch.instrs.push_back(make_kernel(name, overload, args, result));
}

void NativePlan::set_alternative(int64_t chain, const std::string& name, const std::string& overload,
                                 py::list args, py::object choose) {
  Chain& ch = chain_at(chains_, chain);
  if (ch.instrs.empty() || ch.instrs.back().op != Op::Kernel)
    throw std::invalid_argument("an alternative follows the kernel it replaces");
  Instr& in = ch.instrs.back();
  in.alternative = std::make_shared<Instr>(make_kernel(name, overload, args, py::none()));
  in.choose = std::move(choose);
}

void NativePlan::add_python(int64_t chain, const std::string& name, py::object fn) {
  Instr in;
  in.op = Op::Python;
  in.name = name;
  in.fn = std::move(fn);
  chain_at(chains_, chain).instrs.push_back(std::move(in));
}

void NativePlan::add_nop(int64_t chain, const std::string& name) {
  Instr in;
  in.op = Op::Nop;
  in.name = name;
  chain_at(chains_, chain).instrs.push_back(std::move(in));
}

void NativePlan::set_view_copy(int64_t chain, at::Tensor src, std::vector<at::Tensor> views,
                               std::vector<at::Tensor> outs) {
  Chain& ch = chain_at(chains_, chain);
  if (ch.instrs.empty() || ch.instrs.back().op != Op::Kernel || ch.instrs.back().has_result)
    throw std::invalid_argument("a view copy is an out-variant kernel step");
  Instr& in = ch.instrs.back();
  in.copy = std::make_shared<const ViewCopy>(make_view_copy(src, views, outs));
  in.small = Small::Copy;
}

void NativePlan::add_move(int64_t chain, at::Tensor dst, at::Tensor src) {
  Instr in;
  in.op = Op::Move;
  in.a = std::move(dst);
  in.b = std::move(src);
  chain_at(chains_, chain).instrs.push_back(std::move(in));
}

void NativePlan::add_free(int64_t chain, at::Tensor t) {
  Instr in;
  in.op = Op::Free;
  in.a = std::move(t);
  chain_at(chains_, chain).instrs.push_back(std::move(in));
}

void NativePlan::add_jump(int64_t chain, at::Tensor cond, int64_t destination) {
  // Later steps may not exist yet: the destination is checked against the chain when the jump is taken.
  if (destination < 0) throw std::out_of_range("jump destination " + std::to_string(destination));
  Instr in;
  in.op = Op::JumpIfFalse;
  in.a = std::move(cond);
  in.destination = destination;
  chain_at(chains_, chain).instrs.push_back(std::move(in));
}

void NativePlan::add_log(int64_t chain, int64_t index, py::object value, int64_t slot) {
  Chain& ch = chain_at(chains_, chain);
  if (index < 0 || index >= static_cast<int64_t>(ch.instrs.size())) throw std::out_of_range("instruction index");
  LogItem item;
  item.slot = slot;
  if (THPVariable_Check(value.ptr())) {
    item.kind = LogItem::Tensor;
    item.tensors.push_back(THPVariable_Unpack(value.ptr()));
  } else if (PyList_Check(value.ptr()) && PyList_GET_SIZE(value.ptr()) > 0 &&
             std::all_of(value.begin(), value.end(), [](py::handle x) { return THPVariable_Check(x.ptr()); })) {
    item.kind = LogItem::TensorList;
    for (py::handle x : value) item.tensors.push_back(THPVariable_Unpack(x.ptr()));
  } else {
    item.kind = LogItem::Python;
    if (slot < 0 || slot >= static_cast<int64_t>(values_.size())) throw std::out_of_range("log slot");
  }
  ch.instrs[index].logs.push_back(std::move(item));
}

void NativePlan::set_lstm_cell(int64_t chain, int64_t start, int64_t span, std::optional<at::Tensor> bias,
                               at::Tensor h, at::Tensor w, at::Tensor x, at::Tensor c, at::Tensor c_out,
                               at::Tensor h_out) {
  Chain& ch = chain_at(chains_, chain);
  if (start < 0 || span < 1 || start + span > static_cast<int64_t>(ch.instrs.size()))
    throw std::out_of_range("LSTM cell: steps " + std::to_string(start) + " + " + std::to_string(span) +
                            " are not steps of the chain");
  for (int64_t k = start; k < start + span; ++k)
    if (ch.instrs[k].op != Op::Kernel || ch.instrs[k].fused)
      throw std::invalid_argument("LSTM cell: step " + std::to_string(k) + " is not a kernel of its own");
  Instr& first = ch.instrs[start];
  first.cell = std::make_shared<LstmCell>(make_lstm_cell(std::move(bias), std::move(h), std::move(w), std::move(x),
                                                         std::move(c), std::move(c_out), std::move(h_out), span));
  first.fused = true;
}

bool NativePlan::run_fused(Instr& in) {
  // as the small kernels: only when no dispatch mode or profiler watches the run (else they see each call)
  return direct_ && run_lstm_cell(*in.cell);
}

void NativePlan::set_event_counts(int64_t chain, std::vector<int64_t> counts) {
  Chain& ch = chain_at(chains_, chain);
  if (counts.size() != ch.instrs.size()) throw std::invalid_argument("one event count per step");
  ch.events = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] < 0 || counts[k] > INT32_MAX) throw std::invalid_argument("an event count out of range");
    ch.instrs[k].events = static_cast<int32_t>(counts[k]);
    ch.events += counts[k];
  }
}

int64_t NativePlan::instruction_count() const {
  int64_t n = 0;
  for (const auto& ch : chains_) n += static_cast<int64_t>(ch.instrs.size());
  return n;
}

int64_t NativePlan::fused_cells() const {
  int64_t n = 0;
  for (const auto& ch : chains_)
    for (const auto& in : ch.instrs) n += in.fused ? 1 : 0;
  return n;
}

std::vector<int64_t> NativePlan::step_counts() const {
  std::vector<int64_t> counts(4, 0);
  for (const auto& ch : chains_)
    for (const auto& in : ch.instrs) {
      if (in.op == Op::Kernel) ++counts[in.fast != Fast::None ? 0 : 1];
      else ++counts[in.op == Op::Python ? 2 : 3];
    }
  return counts;
}

// -- running ---------------------------------------------------------------------------------------

void NativePlan::begin_run(const c10::impl::LocalDispatchKeySet& outer) {
  // Called inside the run's AutoDispatchBelowADInplaceOrView: nothing the runtime owns requires
  // grad, so every step runs below autograd, where the Python core's calls end up too.
  outer_tls_ = outer;
  direct_ = same_tls(c10::impl::tls_local_dispatch_key_set(), load_tls_) &&
            !at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION).has_value();
}

void NativePlan::call_kernel(Instr& in) {
  // The fast paths index `a` without checks: make_kernel builds one argument per schema parameter,
  // and sets a fast kind only when fast_kind found the schema's exact shape (TTST: 4 arguments, TTT:
  // 3, TT: 2, TTTSST: 6, TST: 3), tensors where it reads tensors (to_ivalue made them from TensorType
  // parameters; toTensor() would throw otherwise).
  auto& a = in.args;
  // computed here when no dispatch mode or profiler watches this run (else they see the call)
  if (direct_ && in.small != Small::None && (run_small(in) || (in.small_fn != nullptr && in.small_fn(in.args))))
    return;
  if (direct_ && in.direct) {  // straight to the CPU kernel: the key set is known
    const c10::DispatchKeySet ks = in.keys;
    switch (in.fast) {
      case Fast::TTS:
        in.tts->redispatch(ks, a[0].toTensor(), a[1].toTensor(), in.s0, a[3].toTensor());
        return;
      case Fast::TT:
        in.tt->redispatch(ks, a[0].toTensor(), a[1].toTensor(), a[2].toTensor());
        return;
      case Fast::T:
        in.t->redispatch(ks, a[0].toTensor(), a[1].toTensor());
        return;
      case Fast::TTTSS:
        in.tttss->redispatch(ks, a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), in.s0, in.s1, a[5].toTensor());
        return;
      case Fast::TS:
        in.ts->redispatch(ks, a[0].toTensor(), in.s0, a[2].toTensor());
        return;
      case Fast::None:
        break;
    }
    stack_.assign(a.begin(), a.end());
    in.handle->redispatchBoxed(ks, &stack_);
  } else {
    switch (in.fast) {
      case Fast::TTS:
        in.tts->call(a[0].toTensor(), a[1].toTensor(), in.s0, a[3].toTensor());
        return;
      case Fast::TT:
        in.tt->call(a[0].toTensor(), a[1].toTensor(), a[2].toTensor());
        return;
      case Fast::T:
        in.t->call(a[0].toTensor(), a[1].toTensor());
        return;
      case Fast::TTTSS:
        in.tttss->call(a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), in.s0, in.s1, a[5].toTensor());
        return;
      case Fast::TS:
        in.ts->call(a[0].toTensor(), in.s0, a[2].toTensor());
        return;
      case Fast::None:
        break;
    }
    stack_.assign(a.begin(), a.end());
    in.handle->callBoxed(stack_);
  }
  if (in.has_result) {
    const at::Tensor& r = stack_.at(0).toTensor();
    if (!r.is_same(in.a)) in.a.set_(r);
  }
  stack_.clear();
}

namespace {
[[gnu::cold, gnu::noinline]] void bad_destination(int64_t destination, int64_t pc, int64_t n) {
  throw std::out_of_range("step " + std::to_string(pc) + " jumps to " + std::to_string(destination) +
                          ": not a later step of its chain of " + std::to_string(n) + " (forward jumps only)");
}

int64_t checked_destination(int64_t destination, int64_t pc, int64_t n) {
  if (__builtin_expect(destination <= pc || destination > n, 0)) bad_destination(destination, pc, n);
  return destination;
}
}  // namespace

int64_t NativePlan::step(Instr& in, int64_t pc, int64_t n) {
  switch (in.op) {
    case Op::Kernel:
      if (!in.patches.empty()) patch_args(in);
      if (in.view) {
        call_view_copy(in);
      } else if (in.alternative) {
        const int64_t threads = at::get_num_threads();
        if (threads != in.chosen_for_threads) {
          py::gil_scoped_acquire gil;
          c10::impl::ForceDispatchKeyGuard caller_state(outer_tls_);
          in.use_alternative = in.choose().cast<bool>();
          in.chosen_for_threads = threads;
        }
        call_kernel(in.use_alternative ? *in.alternative : in);
      } else {
        call_kernel(in);
      }
      return pc + 1;
    case Op::Python: {
      py::gil_scoped_acquire gil;
      c10::impl::ForceDispatchKeyGuard caller_state(outer_tls_);  // Python code runs as it would anywhere
      if (!in.sync.empty()) publish_ints(in.sync);
      py::object r = in.fn();
      if (Py_TYPE(r.ptr()) == reinterpret_cast<PyTypeObject*>(goto_type_.ptr()))
        return checked_destination(r.cast<int64_t>(), pc, n);
      return pc + 1;
    }
    case Op::Move: {
      in.a.set_(in.b);
      return pc + 1;
    }
    case Op::Free: {
      in.a.set_();
      return pc + 1;
    }
    case Op::JumpIfFalse: {
      return at::all(in.a).item<bool>() ? pc + 1 : checked_destination(in.destination, pc, n);
    }
    case Op::Nop:
      return pc + 1;
    case Op::SymSize:
    case Op::IntOp:
    case Op::View:
    case Op::DimOrderCopy:
      run_dynamic(in);
      return pc + 1;
  }
  return pc + 1;
}

void NativePlan::set_trace_log(std::shared_ptr<TraceLog> log, int64_t chains_key) {
  log_ = std::move(log);
  chains_key_ = chains_key;
  if (log_) log_->prepare();  // at load: the first runs write into memory already mapped
}

void NativePlan::run() {
  if (log_) {
    run_logged(-1);
  } else {
    run_plain();
  }
}

namespace {
// Makes room for at least `size` words (twice what there was, at least): out of the loop's line.
[[gnu::cold, gnu::noinline]] RecordWord* grow_record(std::vector<RecordWord>& record, size_t size) {
  record.resize(std::max(size, 2 * record.size()));
  return record.data();
}
}  // namespace

template <bool kTimed>
NativePlan::LoopResult NativePlan::loop(std::vector<RecordWord>* record) {
  // One loop for plain and timed runs, so that the two compile alike and differ only by what timing
  // adds: per step one counter read and one 2-byte store (straight-line chains, nearly all, write
  // into room made before the chain starts and count their events once per chain).
  failed_chain = failed_index = -1;
  const c10::impl::LocalDispatchKeySet outer = c10::impl::tls_local_dispatch_key_set();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  begin_run(outer);
  LoopResult result;
  size_t& pos = result.length;
  uint64_t& prev = result.last;
  for (size_t c = 0; c < chains_.size(); ++c) {
    auto& ch = chains_[c];
    const int64_t n = static_cast<int64_t>(ch.instrs.size());
    int64_t pc = 0;
    RecordWord* out = nullptr;
    if constexpr (kTimed) {
      const size_t room = pos + kRecordMaxTime * (static_cast<size_t>(n) + 1) + 1;  // all times wide; an end
      if (__builtin_expect(record->size() < room, 0)) grow_record(*record, room);
      out = record->data();
      const uint64_t t = ticks();
      if (c == 0) result.first = prev = t;
      pos = put_ticks(out, pos, t - prev);
      prev = t;
    }
    try {
      if (!ch.jumps) {  // only a jump's step returns anything but pc + 1
        for (; pc < n; ++pc) {
          if constexpr (!kTimed) {
            if (__builtin_expect(ch.instrs[pc].fused, 0) && run_fused(ch.instrs[pc])) {
              pc += ch.instrs[pc].cell->span - 1;
              continue;
            }
          }
          step(ch.instrs[pc], pc, n);
          if constexpr (kTimed) {
            const uint64_t t = ticks();
            pos = put_ticks(out, pos, t - prev);
            prev = t;
          }
        }
        if constexpr (kTimed) result.events += ch.events;
      } else {
        while (pc < n) {
          if constexpr (!kTimed) {
            if (__builtin_expect(ch.instrs[pc].fused, 0) && run_fused(ch.instrs[pc])) {
              pc += ch.instrs[pc].cell->span;
              continue;
            }
          }
          const int64_t next = step(ch.instrs[pc], pc, n);
          if constexpr (kTimed) {
            const uint64_t t = ticks();
            constexpr size_t most = kRecordMaxStep + kRecordMaxTime + 1;  // and the chain's end
            if (__builtin_expect(record->size() < pos + most, 0)) out = grow_record(*record, pos + most);
            pos = put_step(out, pos, static_cast<uint64_t>(pc));
            pos = put_ticks(out, pos, t - prev);
            prev = t;
            result.events += ch.instrs[pc].events;
          }
          pc = next;
        }
        if constexpr (kTimed) out[pos++] = kRecordEnd;
      }
    } catch (...) {
      failed_chain = static_cast<int64_t>(c);
      failed_index = pc;
      throw;
    }
  }
  publish_exported();
  return result;
}

void NativePlan::run_plain() { loop<false>(nullptr); }

std::pair<std::vector<int64_t>, int64_t> NativePlan::run_timed() {
  std::vector<RecordWord> raw;
  const LoopResult r = loop<true>(&raw);
  std::vector<int64_t> record;
  record.reserve(r.length);
  decode_record(raw.data(), r.length, r.first, new_anchor(), record);
  return {std::move(record), r.events};
}

void NativePlan::run_logged(int64_t bundled) {
  if (!log_) throw std::logic_error("run_logged: no trace log set");
  TimedRun run;
  run.chains_key = chains_key_;
  run.bundled = bundled;
  log_->warm();
  __builtin_prefetch(scratch_.data(), 1);
  const LoopResult r = loop<true>(&scratch_);
  // Method::execute spans the instruction loop: from the first chain's start to the last step's end
  // (no counter reads of its own).
  run.start = static_cast<int64_t>(r.length > 0 ? r.first : ticks());
  run.events = r.events + 1;  // + Method::execute
  run.end = static_cast<int64_t>(r.length > 0 ? r.last : run.start);  // the log picks the anchor
  log_->add(run, scratch_.data(), r.length);
}

// records_ grows without the GIL (tensor records): growing must move the Python values of earlier
// records (no reference count change), never copy them.
static_assert(std::is_nothrow_move_constructible_v<DebugRecord>, "DebugRecord must move without copying");

void NativePlan::log(const LogItem& item, DebugArena& arena, int64_t& dropped) {
  if (item.kind == LogItem::Python) {
    py::gil_scoped_acquire gil;
    DebugRecord rec;  // declared after the GIL is taken: its value is released before the GIL is
    if (item.slot < 0 || item.slot >= static_cast<int64_t>(PyList_GET_SIZE(values_.ptr())))
      throw std::out_of_range("log slot " + std::to_string(item.slot) + " is outside the value table");
    if (static_cast<size_t>(item.slot) < int_kind_.size() && int_kind_[static_cast<size_t>(item.slot)])
      publish_ints({item.slot});  // a run-time int: the table holds the value of an earlier run
    rec.kind = DebugRecord::Python;
    rec.value = py::reinterpret_borrow<py::object>(PyList_GET_ITEM(values_.ptr(), item.slot));
    records_.push_back(std::move(rec));
    return;
  }
  DebugRecord rec;
  bool complete = true;
  for (const at::Tensor& t : item.tensors) {
    auto st = static_cast<size_t>(t.scalar_type());
    int8_t et = st < et_type_.size() ? et_type_[st] : -1;
    if (et < 0) {  // no ExecuTorch dtype: no event, nothing dropped (as the Python tracer)
      complete = false;
      continue;
    }
    const int64_t nbytes = t.numel() * static_cast<int64_t>(t.element_size());
    auto [offset, bytes] = arena.reserve(nbytes, 64);
    if (offset < 0) {
      ++dropped;
      complete = false;
      continue;
    }
    if (nbytes > 0) bytes.view(t.scalar_type()).view(t.sizes()).copy_(t);
    rec.offsets.push_back(offset);
    rec.scalar_types.push_back(et);
    rec.sizes.emplace_back(t.sizes().begin(), t.sizes().end());
  }
  if (complete) rec.kind = item.kind == LogItem::Tensor ? DebugRecord::Tensor : DebugRecord::TensorList;
  records_.push_back(std::move(rec));
}

std::vector<int64_t> NativePlan::run_traced(DebugArena& arena, py::handle python_events, int64_t& dropped) {
  failed_chain = failed_index = -1;
  const c10::impl::LocalDispatchKeySet outer = c10::impl::tls_local_dispatch_key_set();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  begin_run(outer);
  std::vector<int64_t> steps;
  steps.reserve(static_cast<size_t>(8 * instruction_count()));
  // The list's length, read with the GIL (it is the caller's list, which delegates append to).
  auto events_so_far = [&] {
    py::gil_scoped_acquire gil;
    if (!PyList_Check(python_events.ptr())) throw std::invalid_argument("run_traced: python_events is not a list");
    return static_cast<int64_t>(PyList_GET_SIZE(python_events.ptr()));
  };
  int64_t python_count = events_so_far();
  MemoryWatch* watch = active_memory_watch();  // trace_allocations: each step's temporaries and kept bytes
  for (size_t c = 0; c < chains_.size(); ++c) {
    auto& ch = chains_[c];
    const int64_t n = static_cast<int64_t>(ch.instrs.size());
    int64_t pc = 0;
    try {
      while (pc < n) {
        Instr& in = ch.instrs[pc];
        if (watch) memory_mark(watch);
        const int64_t start = static_cast<int64_t>(ticks());
        const int64_t next = step(in, pc, n);
        const std::pair<int64_t, int64_t> memory = watch ? memory_take(watch) : std::pair<int64_t, int64_t>{0, 0};
        if (in.op == Op::Python) python_count = events_so_far();  // a delegate may have added events
        for (const LogItem& item : in.logs) log(item, arena, dropped);
        const int64_t end = static_cast<int64_t>(ticks());
        steps.insert(steps.end(), {static_cast<int64_t>(c), pc, start, end, python_count,
                                   static_cast<int64_t>(records_.size()), memory.first, memory.second});
        pc = next;
      }
    } catch (...) {
      failed_chain = static_cast<int64_t>(c);
      failed_index = pc;
      throw;
    }
  }
  publish_exported();
  const Anchor anchor = new_anchor();
  for (size_t k = 0; k < steps.size(); k += 8) {
    steps[k + 2] = anchor.to_ns(static_cast<uint64_t>(steps[k + 2]));
    steps[k + 3] = anchor.to_ns(static_cast<uint64_t>(steps[k + 3]));
  }
  return steps;
}

}  // namespace etlab_native
