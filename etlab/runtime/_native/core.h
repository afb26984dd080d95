// The native runtime core: a bound method plan run without Python (see __init__.py for the design).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace etlab_native {

namespace py = pybind11;

// Debug-buffer space shared by every method of a program and by the Python tracer: offsets are
// reserved under a lock, so threads never overlap, and the copy itself happens outside it.
class DebugArena {
 public:
  explicit DebugArena(at::Tensor buffer);
  // Offset of `nbytes` bytes aligned to `alignment`, or -1 when they do not fit.
  int64_t reserve(int64_t nbytes, int64_t alignment);
  int64_t used();
  const at::Tensor& buffer() const { return buffer_; }

 private:
  at::Tensor buffer_;
  int64_t used_ = 0;
  std::mutex mutex_;
};

enum class Op : uint8_t { Kernel, Python, Move, Free, JumpIfFalse };

// Unboxed calling conventions of the commonest out-variants (add.out, mul.out, mm.out, exp.out,
// addmm.out, ...): called through a typed handle with no argument stack at all.
using SigTTS = at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Scalar&, at::Tensor&);
using SigTT = at::Tensor&(const at::Tensor&, const at::Tensor&, at::Tensor&);
using SigT = at::Tensor&(const at::Tensor&, at::Tensor&);
using SigTTTSS = at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Scalar&,
                             const at::Scalar&, at::Tensor&);
enum class Fast : uint8_t { None, TTS, TT, T, TTTSS };

// A value an intermediate-output trace logs after a step.
struct LogItem {
  enum Kind : uint8_t { Tensor, TensorList, Python } kind;
  std::vector<at::Tensor> tensors;  // Tensor: one; TensorList: its members
  int64_t slot = -1;                // Python: the value-table slot read (with the GIL) after the step
};

struct Instr {
  // Hot fields first: a step of the common kinds touches only the start of its Instr.
  Op op;
  Fast fast = Fast::None;
  bool has_result = false;  // a functional operator: its fresh result is pointed into `a`
  std::vector<c10::IValue> args;  // Kernel: the argument stack, built at load time
  at::Scalar s0, s1;              // the fast path's Scalar arguments, in order
  std::optional<c10::TypedOperatorHandle<SigTTS>> tts;
  std::optional<c10::TypedOperatorHandle<SigTT>> tt;
  std::optional<c10::TypedOperatorHandle<SigT>> t;
  std::optional<c10::TypedOperatorHandle<SigTTTSS>> tttss;
  // Move (a.set_(b)), Free (a.set_()), JumpIfFalse (cond a, destination).
  at::Tensor a, b;
  int64_t destination = 0;
  // Kernel: the operator, resolved at load time (boxed calls).
  std::optional<c10::OperatorHandle> handle;
  // Kernel with an alternative (a direct kernel torch would pick only for some thread counts):
  // `choose()` (Python, called again whenever the thread count changes) says whether this one runs.
  std::shared_ptr<Instr> alternative;
  py::object choose;
  int64_t chosen_for_threads = -1;
  bool use_alternative = false;
  // Python: a zero-argument callable (custom kernels, prim ops on Python scalars, delegates).
  py::object fn;
  std::vector<LogItem> logs;
  std::string name;  // for error messages only
};

struct Chain {
  std::vector<Instr> instrs;
  std::vector<int64_t> event_counts;  // ETDump events per step (what the tracer counts against its limit)
  bool jumps = false;
};

// One logged value of a traced run: a tensor copied into the debug buffer, a tensor list, a
// Python value, or nothing (dropped, unsupported dtype).
struct DebugRecord {
  enum Kind : uint8_t { None, Tensor, TensorList, Python } kind = None;
  std::vector<int64_t> offsets;                // per tensor
  std::vector<int8_t> scalar_types;            // per tensor (ExecuTorch numbering)
  std::vector<std::vector<int64_t>> sizes;     // per tensor
  py::object value;                            // Python
};

class NativePlan {
 public:
  NativePlan(py::object goto_type, py::list values, std::vector<int64_t> et_scalar_types);
  ~NativePlan();

  int64_t add_chain(bool jumps);
  void add_kernel(int64_t chain, const std::string& name, const std::string& overload, py::list args,
                  py::object result);
  void set_alternative(int64_t chain, const std::string& name, const std::string& overload, py::list args,
                       py::object choose);
  void add_python(int64_t chain, const std::string& name, py::object fn);
  void add_move(int64_t chain, at::Tensor dst, at::Tensor src);
  void add_free(int64_t chain, at::Tensor t);
  void add_jump(int64_t chain, at::Tensor cond, int64_t destination);
  void add_log(int64_t chain, int64_t index, py::object value, int64_t slot);
  void set_event_counts(int64_t chain, std::vector<int64_t> counts);

  // The three loops of _interpreter.py; the GIL is released by the caller.
  void run();
  // The record and the number of ETDump events it stands for.
  std::pair<std::vector<int64_t>, int64_t> run_timed();
  // Steps as (chain, index, start, end, python events after, debug records after) per step.
  std::vector<int64_t> run_traced(DebugArena& arena, py::list python_events, int64_t& dropped);
  std::vector<DebugRecord>& records() { return records_; }

  int64_t failed_chain = -1, failed_index = -1;
  int64_t instruction_count() const;
  // How many steps are of each kind: native kernels (unboxed, boxed), Python call-backs, others.
  std::vector<int64_t> step_counts() const;

 private:
  int64_t step(Instr& in, int64_t pc);
  void call_kernel(Instr& in);
  Instr make_kernel(const std::string& name, const std::string& overload, py::list args, py::object result);
  void log(const LogItem& item, DebugArena& arena, int64_t& dropped);

  std::vector<Chain> chains_;
  std::vector<c10::IValue> stack_;
  py::object goto_type_;
  py::list values_;
  std::array<int8_t, 64> et_type_{};  // c10::ScalarType -> ExecuTorch ScalarType, -1 if none
  std::vector<DebugRecord> records_;
};

int64_t now_ns();

// Timestamps for tracing. Reading CLOCK_MONOTONIC can cost a system call (hundreds of ns in some
// virtual machines); the CPU's invariant time-stamp counter costs tens. A trace stores counter
// ticks and converts them to CLOCK_MONOTONIC nanoseconds through an anchor (one clock reading
// per run) and a tick period measured over the life of the process.
struct Anchor {
  uint64_t ticks = 0;
  int64_t ns = 0;
  double ns_per_tick = 1.0;
  int64_t to_ns(uint64_t t) const {
    return ns + static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(t - ticks)) * ns_per_tick);
  }
};
uint64_t ticks();
Anchor new_anchor();   // reads the clock; refines the tick period
Anchor last_anchor();  // no clock reading
int64_t clock_ns();    // CLOCK_MONOTONIC nanoseconds from the counter and the last anchor
std::string error_message(const c10::Error& e);

}  // namespace etlab_native
