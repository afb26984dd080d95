// The native runtime core: a bound method plan run without Python (see __init__.py for the design).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/utils/pybind.h>

#include "lstm.h"
#include "small.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace etlab_native {

namespace py = pybind11;

int64_t now_ns();

// Timestamps for tracing. Reading CLOCK_MONOTONIC can cost a system call (hundreds of ns in some
// virtual machines); the CPU's invariant time-stamp counter costs tens. A trace stores counter
// ticks and converts them to CLOCK_MONOTONIC nanoseconds through an anchor (a clock reading within
// ~10 ms of the run: the trace log keeps them) and a tick period measured over the life of the process.
struct Anchor {
  uint64_t ticks = 0;
  int64_t ns = 0;
  double ns_per_tick = 1.0;
  int64_t to_ns(uint64_t t) const {
    return ns + static_cast<int64_t>(static_cast<double>(static_cast<int64_t>(t - ticks)) * ns_per_tick);
  }
};
#if defined(__x86_64__) || defined(__i386__)
inline uint64_t ticks() { return __rdtsc(); }  // inline: a traced step pays this and nothing more
constexpr bool kCounter = true;
#else
inline uint64_t ticks() { return static_cast<uint64_t>(now_ns()); }
constexpr bool kCounter = false;
#endif
Anchor new_anchor();   // reads the clock; refines the tick period
int64_t clock_ns();    // CLOCK_MONOTONIC nanoseconds from the counter and the last anchor
// The CPU allocator's traffic on one thread while a traced method runs or loads (trace_allocations):
// c10's memory-reporting hook (the one torch's profiler uses), pushed as the thread's profiler state with
// the profiler itself disabled. A step reads the most held at once above its mark (its temporaries and
// what it kept) and what it still holds (negative when it freed more than it allocated). c10 then also keeps
// the size of each block allocated while a watch runs until it is freed with one running (a block freed
// with none keeps its entry: a few dozen bytes), and warns (every 1000th time) of a block freed during a
// watch that was allocated before it.
class MemoryWatch;
// Starts `watch` on this thread; false when another profiler state is set (torch's profiler) or a
// watch already runs here. stop_memory_watch undoes a start of the same watch on the same thread.
bool start_memory_watch(const std::shared_ptr<MemoryWatch>& watch);
void stop_memory_watch(const std::shared_ptr<MemoryWatch>& watch);
MemoryWatch* active_memory_watch();  // this thread's started watch, or nullptr
void memory_mark(MemoryWatch* watch);
std::pair<int64_t, int64_t> memory_take(const MemoryWatch* watch);  // (peak above the mark, held above it)
std::shared_ptr<MemoryWatch> new_memory_watch();
// Debug-buffer space shared by every method of a program and by the Python tracer: offsets are
// reserved under a lock, so threads never overlap, and the copy itself happens outside it. The
// space is a run of chunks: one of `size` bytes, and more (each at least the growth unit) while
// the total stays within `limit` (a buffer sized from the plan grows with the runs it keeps).
// Offsets count from the start of the first chunk; bytes between values are zeroed.
constexpr int64_t kMaxArenaBytes = int64_t{1} << 48;  // a size or limit above this is refused
constexpr int64_t kMaxAlignment = 4096;
class DebugArena {
 public:
  DebugArena(int64_t size, int64_t limit);  // std::invalid_argument for a negative or too large one
  // Offset of `nbytes` bytes aligned to `alignment`, and the uint8 view to copy them into, or
  // (-1, undefined) when they do not fit (the arena unchanged). std::invalid_argument for a
  // negative nbytes or an alignment that is not a power of two up to kMaxAlignment.
  std::pair<int64_t, at::Tensor> reserve(int64_t nbytes, int64_t alignment);
  void grow_by_at_least(int64_t bytes);  // raises the growth unit (methods as they load)
  int64_t used();
  at::Tensor contents();  // bytes [0, used) as one tensor

 private:
  std::vector<at::Tensor> chunks_;
  std::vector<int64_t> starts_;
  int64_t used_ = 0, capacity_ = 0, limit_ = 0, unit_ = 1 << 20;
  std::mutex mutex_;
};

// Nop: an instruction computed at load (a layout copy of constant data): a step with nothing to do.
// SymSize, IntOp, View, DimOrderCopy: the steps of dynamic shapes (dynamic.cpp), which read and write the
// core's run-time ints (`NativePlan::ints_`).
enum class Op : uint8_t { Kernel, Python, Move, Free, JumpIfFalse, Nop, SymSize, IntOp, View, DimOrderCopy };

// An int a dynamic-shape step reads: a run-time int of the core (slot >= 0) or a constant (`value`).
struct IntRef {
  int64_t slot = -1;
  int64_t value = 0;
};
// executorch_prim's integer arithmetic and comparisons, with Python's semantics on ints (floor division and
// modulo rounding toward negative infinity; an overflow of int64 is an error, where Python would go on).
enum class IntOpKind : uint8_t { Add, Sub, Mul, FloorDiv, Mod, Neg, Max, Min, Eq, Gt, Lt, Ge, Le };
// A kernel argument read from a run-time int before each call: args[arg] itself (element -1) or one element
// of the int list args[arg].
struct IntPatch {
  int32_t arg = 0;
  int32_t element = -1;
  int64_t slot = 0;
};

// Unboxed calling conventions of the commonest out-variants (add.out, mul.out, mm.out, exp.out,
// addmm.out, ...): called through a typed handle with no argument stack at all.
using SigTTS = at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Scalar&, at::Tensor&);
using SigTT = at::Tensor&(const at::Tensor&, const at::Tensor&, at::Tensor&);
using SigT = at::Tensor&(const at::Tensor&, at::Tensor&);
using SigTS = at::Tensor&(const at::Tensor&, const at::Scalar&, at::Tensor&);
using SigTTTSS = at::Tensor&(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Scalar&,
                             const at::Scalar&, at::Tensor&);
enum class Fast : uint8_t { None, TTS, TT, T, TTTSS, TS };
// Out-variants the core computes itself on small tensors (`run_small`; small.h): for a (4, 4) add,
// ATen's own dispatch and TensorIterator set-up cost ~20x the arithmetic. Elementwise add/sub/mul/div on
// float, sigmoid and tanh on float, copies of views (Copy: `Instr::copy`), one-row addmm/mm (Addmm, Mm), a float
// tensor times a number (MulScalar: mul.Scalar_out, attention's scaling of its queries and keys). Fn: only
// `Instr::small_fn` (small_ops.cpp), which also runs when a named kind declines (add/mul with broadcasts).
enum class Small : uint8_t { None, Add, Sub, Mul, Div, Copy, Addmm, Mm, Sigmoid, Tanh, MulScalar, Fn };

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
  Small small = Small::None;
  bool has_result = false;  // a functional operator: its fresh result is pointed into `a`
  bool fused = false;       // the first of a fused cell's steps (`cell`): plain runs compute the cell at once
  int32_t events = 0;       // ETDump events of a timed step (what the tracer counts against its limit)
  std::vector<c10::IValue> args;  // Kernel: the argument stack, built at load time
  std::shared_ptr<const ViewCopy> copy;  // Small::Copy: where each output's view lies in the source
  SmallFn small_fn = nullptr;             // small.h small_kernel's kernel for this operator, if any
  at::Scalar s0, s1;              // the fast path's Scalar arguments, in order
  std::optional<c10::TypedOperatorHandle<SigTTS>> tts;
  std::optional<c10::TypedOperatorHandle<SigTT>> tt;
  std::optional<c10::TypedOperatorHandle<SigT>> t;
  std::optional<c10::TypedOperatorHandle<SigTTTSS>> tttss;
  std::optional<c10::TypedOperatorHandle<SigTS>> ts;
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
  // A fused LSTM cell starting at this step (`fused`; lstm.h): an untraced run computes it in one step and goes on
  // after its `span` steps, which keep their own kernels for timed and traced runs and for any run the cell declines.
  std::shared_ptr<LstmCell> cell;
  // Dynamic shapes (dynamic.cpp). Kernel: run-time ints written into `args` before each call, and the view
  // operator of a view-copy out-variant computed as view, resize of the output within its memory, copy (no
  // temporary). SymSize: `a`'s size along ints[0]; IntOp: int_op of ints; View: `b` re-pointed at `a`'s
  // memory with sizes ints; DimOrderCopy: `a` copied into `b`, laid out in dim order ints (empty: contiguous).
  std::vector<IntPatch> patches;
  std::optional<c10::OperatorHandle> view;
  std::vector<IntRef> ints;
  int64_t int_dst = -1;  // SymSize, IntOp: the run-time int written
  IntOpKind int_op = IntOpKind::Add;
  std::vector<int64_t> sync;  // Python: run-time ints it reads, written into the value table before it runs
  // The dispatch key set the dispatcher would compute for these arguments inside the core (below
  // autograd), resolved at load time; `direct` when it selects the CPU kernel, which the core then
  // calls by redispatch (no key extraction, no TLS reads) on runs whose dispatch state matches.
  c10::DispatchKeySet keys;
  bool direct = false;
};

// The core's own small-tensor kernels (core_small.cpp): the kind of out-variant `name.overload` with calling
// convention `fast` it may compute itself, and the call (false: nothing done, ATen's kernel runs).
Small small_kind(const std::string& name, const std::string& overload, Fast fast);
bool run_small(const Instr& in);

struct Chain {
  std::vector<Instr> instrs;
  int64_t events = 0;  // its steps' events: a straight-line chain's, counted once per run
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

// The timings of one run traced without logged values (the common ETDump case), kept natively
// until the ETDump is written: nothing is built in Python while the program runs.
struct TimedRun {
  int64_t chains_key = -1;   // EventTracer.register_chains key of the method
  int64_t bundled = -1;      // bundled input index
  int64_t events = 0;        // events it stands for (instructions' and Method::execute)
  int64_t kept = 0;          // how many of them fit under the tracer's event limit
  int64_t start = 0, end = 0;  // Method::execute (the instruction loop): ticks when added, ns when read
  Anchor anchor;               // converts this run's ticks (the log's choice)
};

// A timed run's record as the loop writes it: 16-bit words, per chain its start, then one end per
// step (straight-line chains) or (step, end) pairs closed by kRecordEnd (chains with jumps). A time is
// the counter ticks since the time before it (the run's start for the first): one word below 2^15
// (12 us at 2.6 GHz: most steps of the models where tracing's share matters), else kRecordWide and
// four more words; a step index k is kRecordStep | k below kRecordStepLimit, else kRecordWideStep
// and two more words. Two bytes a step: the log keeps every run, each in fresh memory (pages faulted
// in and zeroed), so the record is as small as it can be while staying cheap to write.
using RecordWord = uint16_t;
constexpr RecordWord kRecordStep = 0x8000u;
constexpr uint64_t kRecordStepLimit = 0x7FF0u;
constexpr RecordWord kRecordWideStep = 0xFFFDu;
constexpr RecordWord kRecordWide = 0xFFFEu;
constexpr RecordWord kRecordEnd = 0xFFFFu;
constexpr size_t kRecordMaxTime = 5, kRecordMaxStep = 3;  // words a time or a step index may take

// The common forms inline, the wide ones out of line: a traced run started from Python finds its code
// gone from the near caches, and the fewer lines it spans the less that costs.
[[gnu::cold, gnu::noinline]] size_t put_wide_ticks(RecordWord* out, size_t pos, uint64_t delta);
[[gnu::cold, gnu::noinline]] size_t put_wide_step(RecordWord* out, size_t pos, uint64_t k);

inline size_t put_ticks(RecordWord* out, size_t pos, uint64_t delta) {
  if (__builtin_expect(delta >= kRecordStep, 0)) return put_wide_ticks(out, pos, delta);
  out[pos] = static_cast<RecordWord>(delta);
  return pos + 1;
}

inline size_t put_step(RecordWord* out, size_t pos, uint64_t k) {
  if (__builtin_expect(k >= kRecordStepLimit, 0)) return put_wide_step(out, pos, k);
  out[pos] = static_cast<RecordWord>(kRecordStep | k);
  return pos + 1;
}

// Appends a record in run_timed's format (times in CLOCK_MONOTONIC ns, plain step indices, -1 closing
// a jump chain) to `out`; returns the tick of its last time (`start` if it has none).
uint64_t decode_record(const RecordWord* record, size_t n, uint64_t start, const Anchor& anchor,
                       std::vector<int64_t>& out);

// A program's native trace: its timed runs and the event count shared with the Python tracer
// (one limit for both), under one lock so methods on several threads may share it.
class TraceLog {
 public:
  explicit TraceLog(int64_t max_events) : max_events_(max_events) {}
  void prepare();  // maps and faults in the first block (a plan set to log here calls it)
  // How many of `n` more events fit under the limit (those are counted as kept).
  int64_t fit(int64_t n);
  // Appends a run and its record (see decode_record; `run.start`, `run.end` in ticks), cut to the room left under
  // the limit (the rest counted as dropped; a run with nothing kept keeps no record).
  void add(const TimedRun& run, const RecordWord* record, size_t n);
  int64_t size();
  int64_t dropped();
  // Prefetches what `add` will touch (the run's state and where its record goes), so that a run
  // started from Python finds it near by the time it ends.
  void warm() const {
    __builtin_prefetch(&lock_, 1);
    __builtin_prefetch(reinterpret_cast<const char*>(&lock_) + 64, 1);
    __builtin_prefetch(cursor_.load(std::memory_order_relaxed), 1);
  }
  int64_t anchors();  // clock readings the runs convert with (about one per 10 ms of runs)
  // A copy of the runs (start and end in ns) and their records in run_timed's format, for writing.
  std::vector<std::pair<TimedRun, std::vector<int64_t>>> runs();

 private:
  // Runs back to back, each a header and its record, in blocks that are never reallocated (2 MiB,
  // huge pages where the kernel has them); the anchors the runs' ticks convert with, one per ~10 ms,
  // each with the index of the first run it converts.
  struct Block {  // pages of their own (mmap where there is one), apart from the heap the kernels use
    explicit Block(size_t bytes_needed);
    Block(Block&& other) noexcept;
    Block(const Block&) = delete;
    ~Block();
    void fault_in();
    uint8_t* data = nullptr;
    size_t capacity = 0, used = 0;  // `used` of the last block is `cursor_ - data`
  };
  // A lock of one byte: runs hold it for tens of ns, and a traced run's whole state fits in the two
  // cache lines below.
  struct SpinLock {
    std::atomic<bool> held{false};
    void lock() {
      if (__builtin_expect(held.exchange(true, std::memory_order_acquire), 0)) wait();
    }
    [[gnu::cold, gnu::noinline]] void wait() {
      do {
        while (held.load(std::memory_order_relaxed)) std::this_thread::yield();
      } while (held.exchange(true, std::memory_order_acquire));
    }
    void unlock() { held.store(false, std::memory_order_release); }
  };
  // What every run reads and writes, together in two cache lines: between two calls from Python,
  // the interpreter pushes them out of the near caches, and fetching them at the run's end cost about
  // 100 ns a run on a 17 us model (measured); `warm` asks for them when a run starts. The lock spins
  // (yielding) while another thread holds it: for a run's add, tens of ns; for `runs`, the decoding.
  alignas(64) SpinLock lock_;
  std::atomic<uint8_t*> cursor_{nullptr};  // where the next run goes (in the last block)
  uint8_t* end_ = nullptr;                 // the last block's end
  int64_t max_events_, count_ = 0, dropped_ = 0, runs_ = 0;
  uint64_t last_start_ = 0;  // the previous run's start: a run stores its start as the ticks since
  int64_t last_key_ = -1, last_bundled_ = -1, last_events_ = -1;  // the previous run: one like it
  Anchor anchor_;                                                   // stores only its record's length
  std::vector<Block> blocks_;
  std::vector<std::pair<int64_t, Anchor>> anchors_;

  void next_block(size_t bytes);  // closes the last block, maps a new one of at least `bytes`
  bool anchor_stale(uint64_t end) const;     // a run ending at `end` needs a new anchor
  bool like_last(const TimedRun& run) const; // same method, bundled input and events as the last run
  // Writes a run's start (since the last run's) and its record at `out`, after its header.
  void append(uint8_t* out, const RecordWord* record, size_t n, uint64_t start);
  // `add` under the lock, for any run: a new anchor, a new block, a run unlike the one before or cut
  // by the limit (add's own code is only the common case: a run like the one before).
  [[gnu::noinline]] void add_any(const TimedRun& run, const RecordWord* record, size_t n);
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
  void add_nop(int64_t chain, const std::string& name);
  // Makes the last kernel of `chain` (a view-copy out-variant) a small copy: `views` are the view
  // operator's results on `src` (made at load), one per output in `outs`.
  void set_view_copy(int64_t chain, at::Tensor src, std::vector<at::Tensor> views, std::vector<at::Tensor> outs);
  void add_log(int64_t chain, int64_t index, py::object value, int64_t slot);
  // Steps [start, start + span) of `chain`, already added, form an LSTM cell (lstm.h) untraced runs compute at once.
  void set_lstm_cell(int64_t chain, int64_t start, int64_t span, std::optional<at::Tensor> bias, at::Tensor h,
                     at::Tensor w, at::Tensor x, at::Tensor c, at::Tensor c_out, at::Tensor h_out);
  // Dynamic shapes (dynamic.cpp): value-table slot `slot` is a run-time int of the core (a size computed while
  // running), starting at `initial`; `is_bool` for a comparison's result (published to Python as a bool).
  void declare_int(int64_t slot, int64_t initial, bool is_bool);
  void add_sym_size(int64_t chain, const std::string& name, at::Tensor t, int64_t dim, int64_t dst);
  // `operands`: (slot, value) pairs, slot -1 for a constant; `op`: executorch_prim's name (add, mul, ...)
  void add_int_op(int64_t chain, const std::string& name, const std::string& op,
                  std::vector<std::pair<int64_t, int64_t>> operands, int64_t dst);
  void add_view(int64_t chain, const std::string& name, at::Tensor src, at::Tensor out,
                std::vector<std::pair<int64_t, int64_t>> sizes);
  void add_dim_order_copy(int64_t chain, const std::string& name, at::Tensor src, at::Tensor out,
                          std::vector<int64_t> dim_order);
  // The last kernel of `chain` reads these (arg, element, slot) run-time ints before each call.
  void set_int_patches(int64_t chain, std::vector<std::tuple<int64_t, int64_t, int64_t>> patches);
  // The last kernel of `chain`, a view-copy out-variant, runs as view operator `name.overload`, resize, copy.
  void set_view_of(int64_t chain, const std::string& name, const std::string& overload);
  void set_sync(int64_t chain, std::vector<int64_t> slots);  // the last step (Python) publishes these first
  void set_exported_ints(std::vector<int64_t> slots);         // published after each run (outputs, logs)
  int64_t int_value(int64_t slot) const;
  void set_event_counts(int64_t chain, std::vector<int64_t> counts);

  // The three loops of _interpreter.py; the GIL is released by the caller. With a trace log set,
  // `run` is `run_logged(-1)`: a traced run costs Python nothing more than an untraced one.
  void run();
  void set_trace_log(std::shared_ptr<TraceLog> log, int64_t chains_key);
  // The record and the number of ETDump events it stands for.
  std::pair<std::vector<int64_t>, int64_t> run_timed();
  // run_timed, kept in the trace log as one run block (with its Method::execute event).
  void run_logged(int64_t bundled);
  // Steps as (chain, index, start, end, python events after, debug records after) per step.
  // `python_events` is a borrowed Python list (delegate events): read only with the GIL, and never
  // copied as a py::object (which would change its reference count without the GIL).
  std::vector<int64_t> run_traced(DebugArena& arena, py::handle python_events, int64_t& dropped);
  std::vector<DebugRecord>& records() { return records_; }

  int64_t failed_chain = -1, failed_index = -1;
  // Whether the bindings release the GIL around a run (always, but for the test that shows the
  // GIL-release test can fail: tests/runtime/test_cores.py).
  bool release_gil = true;
  // Whether kernels added from now on compute one-row float products (addmm/mm) with small.h's
  // matrix-vector kernel, whose sums round a few ulps apart from MKL's (false: ATen's, bit for bit).
  bool small_products = true;
  int64_t instruction_count() const;
  int64_t fused_cells() const;  // steps that start a fused cell (set_lstm_cell)
  // How many steps are of each kind: native kernels (unboxed, boxed), Python call-backs, others.
  std::vector<int64_t> step_counts() const;

 private:
  // Runs one step; returns the next step's index: pc + 1, or a jump's destination, checked here to
  // lie in (pc, n] (forward jumps only: a run always ends), whatever the loader checked.
  int64_t step(Instr& in, int64_t pc, int64_t n);
  void call_kernel(Instr& in);
  bool run_fused(Instr& in);  // a fused cell (Instr::cell); false: its steps run one by one
  // Entering and leaving a run: below autograd for the whole run, and whether the precomputed key
  // sets hold (the dispatch state is the one seen at load, and no RecordFunction callbacks run).
  void begin_run(const c10::impl::LocalDispatchKeySet& outer);
  // The one instruction loop of run_plain (kTimed false) and of timed runs (kTimed true: the
  // record, see decode_record, into `record`, grown and never shrunk).
  struct LoopResult {
    int64_t events = 0;            // the ETDump events the steps stand for (timed)
    size_t length = 0;             // of the record, in words (timed)
    uint64_t first = 0, last = 0;  // the first and the last tick read (timed)
  };
  template <bool kTimed>
  LoopResult loop(std::vector<RecordWord>* record);
  Instr make_kernel(const std::string& name, const std::string& overload, py::list args, py::object result);
  void log(const LogItem& item, DebugArena& arena, int64_t& dropped);
  // Dynamic shapes (dynamic.cpp).
  void run_dynamic(Instr& in);
  void patch_args(Instr& in) const;
  void call_view_copy(Instr& in);
  void publish_ints(const std::vector<int64_t>& slots);  // with the GIL held
  void publish_exported();                               // takes the GIL when there is anything to publish
  int64_t read_int(const IntRef& r) const { return r.slot < 0 ? r.value : ints_[static_cast<size_t>(r.slot)]; }
  Instr& last_step(int64_t chain, const char* what);
  std::vector<int64_t> ints_;     // per value-table slot: the run-time ints (declare_int)
  std::vector<uint8_t> int_kind_; // per slot: 0 not a run-time int, 1 int, 2 bool
  std::vector<int64_t> exported_;

  std::vector<Chain> chains_;
  std::vector<c10::IValue> stack_;
  py::object goto_type_;
  py::list values_;
  std::array<int8_t, 64> et_type_{};  // c10::ScalarType -> ExecuTorch ScalarType, -1 if none
  std::vector<DebugRecord> records_;
  c10::impl::LocalDispatchKeySet load_tls_;   // the dispatch state (below autograd) at load
  c10::impl::LocalDispatchKeySet outer_tls_;  // the caller's, restored for Python steps
  bool direct_ = false;                       // this run may redispatch
  std::shared_ptr<TraceLog> log_;             // timed runs go here (set_trace_log)
  int64_t chains_key_ = -1;
  void run_plain();
  std::vector<RecordWord> scratch_;  // run_logged's record, reused from run to run
};

std::string error_message(const c10::Error& e);

}  // namespace etlab_native
