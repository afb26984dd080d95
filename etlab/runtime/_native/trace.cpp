// The native core's tracing pieces: timestamps from the CPU counter, the debug-buffer arena,
// and the log of timed runs.
#include "core.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace etlab_native {

int64_t now_ns() {
  // CLOCK_MONOTONIC, the clock of Python's time.perf_counter_ns(): native and Python timestamps mix.
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// A (counter, clock) reading taken together: retried while the thread was interrupted between the
// two reads (two counter reads more than ~20 us apart), so that no anchor is off by a preemption.
Anchor read_pair() {
  Anchor a;
  for (int attempt = 0; attempt < 100; ++attempt) {
    const uint64_t before = ticks();
    a.ns = now_ns();
    const uint64_t after = ticks();
    a.ticks = before + (after - before) / 2;
    if (after - before < 50000) break;
  }
  return a;
}

struct ClockState {
  std::mutex mutex;
  Anchor first, last;
  ClockState() {
    if (!kCounter) return;
    // An initial period over ~2 ms; every later anchor refines it over a longer baseline.
    first = read_pair();
    Anchor end;
    do {
      end = read_pair();
    } while (end.ns - first.ns < 2000000);
    first.ns_per_tick = static_cast<double>(end.ns - first.ns) / static_cast<double>(end.ticks - first.ticks);
    last = end;
    last.ns_per_tick = first.ns_per_tick;
  }
};

ClockState& clock_state() {
  static ClockState state;
  return state;
}

thread_local Anchor cached_anchor;  // this thread's last anchor (clock_ns)

}  // namespace

Anchor new_anchor() {
  if (!kCounter) return Anchor{};
  ClockState& st = clock_state();
  Anchor a = read_pair();
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    a.ns_per_tick = st.last.ns_per_tick;
    if (a.ns - st.first.ns > 2000000 && a.ticks > st.first.ticks)  // the longest baseline there is
      a.ns_per_tick = static_cast<double>(a.ns - st.first.ns) / static_cast<double>(a.ticks - st.first.ticks);
    st.last = a;
  }
  cached_anchor = a;
  return a;
}

int64_t clock_ns() {
  // The counter through this thread's last anchor while it is under 10 ms old (CLOCK_MONOTONIC may
  // be slewed against the counter, and the period is an estimate), not a clock reading per call.
  if (!kCounter) return now_ns();
  const uint64_t t = ticks();
  const Anchor& a = cached_anchor;
  if (a.ticks == 0 || t < a.ticks || static_cast<double>(t - a.ticks) * a.ns_per_tick > 1e7) return new_anchor().to_ns(t);
  return a.to_ns(t);
}

std::string error_message(const c10::Error& e) { return e.what_without_backtrace(); }

// -- debug arena --------------------------------------------------------------------------------

namespace {
constexpr int64_t kMaxGrowthUnit = int64_t{64} << 20;  // a plan's claim never allocates more at once

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

// The arithmetic below never overflows: the constructor bounds limit_ by kMaxArenaBytes (2^48), so
// capacity_, used_ and unit_ stay at or under it, and reserve refuses an nbytes above limit_ and an
// alignment above kMaxAlignment before adding anything: every sum stays under 2^50.
DebugArena::DebugArena(int64_t size, int64_t limit) {
  if (size < 0 || limit < 0) throw std::invalid_argument("DebugArena: negative size or limit");
  if (size > kMaxArenaBytes || limit > kMaxArenaBytes)
    throw std::invalid_argument("DebugArena: size or limit above " + std::to_string(kMaxArenaBytes) + " bytes");
  limit_ = std::max(size, limit);
  chunks_.push_back(at::empty({size}, at::kByte));
  starts_.push_back(0);
  capacity_ = size;
}

void DebugArena::grow_by_at_least(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  unit_ = std::max(unit_, std::min(round_up(std::clamp<int64_t>(bytes, 0, kMaxGrowthUnit), 64), kMaxGrowthUnit));
}

std::pair<int64_t, at::Tensor> DebugArena::reserve(int64_t nbytes, int64_t alignment) {
  if (nbytes < 0 || alignment <= 0 || alignment > kMaxAlignment || (alignment & (alignment - 1)) != 0)
    throw std::invalid_argument("DebugArena.reserve: nbytes must be >= 0 and alignment a power of two up to " +
                                std::to_string(kMaxAlignment));
  std::lock_guard<std::mutex> lock(mutex_);
  if (nbytes > limit_) return {-1, at::Tensor()};
  int64_t offset = round_up(used_, alignment);
  if (offset + nbytes <= capacity_) {
    at::Tensor& chunk = chunks_.back();
    const int64_t base = starts_.back();
    if (offset > used_) chunk.narrow(0, used_ - base, offset - used_).zero_();  // alignment padding
    used_ = offset + nbytes;
    return {offset, chunk.narrow(0, offset - base, nbytes)};
  }
  // A new chunk, if the limit allows: it starts aligned, and the old chunk's tail is zeroed. Its
  // memory (and a zero pad chunk when the capacity is unaligned: a user-sized first chunk) is
  // allocated before any state changes, so a failed allocation leaves the arena as it was.
  const int64_t start = round_up(capacity_, std::max<int64_t>(alignment, 64));
  const int64_t size = std::max(unit_, round_up(nbytes, 64));
  if (start + size > limit_) return {-1, at::Tensor()};
  at::Tensor pad = start > capacity_ ? at::zeros({start - capacity_}, at::kByte) : at::Tensor();
  at::Tensor chunk = at::empty({size}, at::kByte);
  const int64_t tail = starts_.back() + chunks_.back().numel() - used_;
  if (tail > 0) chunks_.back().narrow(0, used_ - starts_.back(), tail).zero_();
  chunks_.reserve(chunks_.size() + 2);
  starts_.reserve(starts_.size() + 2);
  if (pad.defined()) {
    chunks_.push_back(std::move(pad));
    starts_.push_back(capacity_);
  }
  chunks_.push_back(chunk);
  starts_.push_back(start);
  capacity_ = start + size;
  used_ = start + nbytes;
  return {start, chunk.narrow(0, 0, nbytes)};
}

int64_t DebugArena::used() {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

at::Tensor DebugArena::contents() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < chunks_.size() && starts_[i] < used_; ++i)
    parts.push_back(chunks_[i].narrow(0, 0, std::min(chunks_[i].numel(), used_ - starts_[i])));
  if (parts.empty()) return at::empty({0}, at::kByte);
  return parts.size() == 1 ? parts[0] : at::cat(parts);
}

// -- the native trace ------------------------------------------------------------------------------

size_t put_wide_ticks(RecordWord* out, size_t pos, uint64_t delta) {
  out[pos] = kRecordWide;
  for (int k = 0; k < 4; ++k) out[pos + 1 + k] = static_cast<RecordWord>(delta >> (16 * k));
  return pos + 5;
}

size_t put_wide_step(RecordWord* out, size_t pos, uint64_t k) {
  out[pos] = kRecordWideStep;
  out[pos + 1] = static_cast<RecordWord>(k);
  out[pos + 2] = static_cast<RecordWord>(k >> 16);
  return pos + 3;
}

uint64_t decode_record(const RecordWord* record, size_t n, uint64_t start, const Anchor& anchor,
                       std::vector<int64_t>& out) {
  auto wide = [&](size_t k, int words) {  // the `words` words after record[k], low first
    if (k + static_cast<size_t>(words) >= n) throw std::logic_error("decode_record: a record cut short");
    uint64_t v = 0;
    for (int i = 0; i < words; ++i) v |= static_cast<uint64_t>(record[k + 1 + static_cast<size_t>(i)]) << (16 * i);
    return v;
  };
  uint64_t t = start;
  for (size_t k = 0; k < n; ++k) {
    const RecordWord w = record[k];
    if (w < kRecordStep) {
      t += w;
    } else if (w == kRecordWide) {
      t += wide(k, 4);
      k += 4;
    } else if (w == kRecordEnd) {
      out.push_back(-1);
      continue;
    } else if (w == kRecordWideStep) {
      out.push_back(static_cast<int64_t>(wide(k, 2)));
      k += 2;
      continue;
    } else {
      out.push_back(static_cast<int64_t>(w & ~kRecordStep));
      continue;
    }
    out.push_back(anchor.to_ns(t));
  }
  return t;
}

namespace {

// A run in the log, in bytes: varint (record words << 2 | cut << 1 | like the previous run); unless
// like it, varints of its chains key, zigzag bundled input and events; if cut (not all its events
// kept), a varint of the kept ones; a zigzag varint of its start's ticks since the previous run's
// start; then its record's words. A run of the method that ran before, with nothing cut, takes
// about four bytes besides its record.
constexpr size_t kMaxHeader = 6 * 10;
constexpr size_t kBlockBytes = size_t{2} << 20;

uint8_t* put_varint(uint8_t* out, uint64_t v) {
  while (v >= 0x80) {
    *out++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *out++ = static_cast<uint8_t>(v);
  return out;
}

uint64_t get_varint(const uint8_t*& in) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    const uint8_t b = *in++;
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
  throw std::logic_error("TraceLog: a varint over 64 bits");
}

uint64_t zigzag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
int64_t unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

}  // namespace

TraceLog::Block::Block(size_t bytes_needed) {
  // Whole 2 MiB units, 2 MiB-aligned so that the kernel can back them with huge pages. They are
  // mapped apart from malloc's heap: a block carved from the heap (glibc serves an aligned_alloc
  // from it once its mmap threshold has grown) fragments the heap that the kernels' own allocations
  // use, which measurably slowed a traced model's kernels.
  const size_t bytes = (bytes_needed + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
#if defined(__linux__)
  void* p = mmap(nullptr, bytes + kBlockBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (at + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  if (aligned > at) munmap(p, aligned - at);
  munmap(reinterpret_cast<void*>(aligned + bytes), at + kBlockBytes - aligned);
  data = reinterpret_cast<uint8_t*>(aligned);
#if defined(MADV_HUGEPAGE)
  madvise(data, bytes, MADV_HUGEPAGE);  // advice only: without huge pages it is 4 KiB pages
#endif
#else
  data = static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, bytes));
  if (data == nullptr) throw std::bad_alloc();
#endif
  capacity = bytes;
}

TraceLog::Block::Block(Block&& other) noexcept : data(other.data), capacity(other.capacity), used(other.used) {
  other.data = nullptr;
}

TraceLog::Block::~Block() {
  if (data == nullptr) return;
#if defined(__linux__)
  munmap(data, capacity);
#else
  std::free(data);
#endif
}

void TraceLog::Block::fault_in() {
  // Writes a byte a page, so the kernel maps (and zeroes) them now rather than during the runs.
  volatile uint8_t* p = data;
  for (size_t k = 0; k < capacity; k += 4096) p[k] = 0;
}

void TraceLog::next_block(size_t bytes) {
  if (!blocks_.empty()) blocks_.back().used = static_cast<size_t>(cursor_.load(std::memory_order_relaxed) - blocks_.back().data);
  blocks_.emplace_back(bytes);
  cursor_.store(blocks_.back().data, std::memory_order_relaxed);
  end_ = blocks_.back().data + blocks_.back().capacity;
}

void TraceLog::prepare() {
  // The first block is ready before the first run: a program traced for fewer runs than a block
  // holds (tens of thousands of small ones) never waits for a page fault. Later blocks are mapped
  // when needed, between runs (never inside a timed step).
  std::lock_guard<SpinLock> lock(lock_);
  if (!blocks_.empty()) return;
  next_block(kBlockBytes);
  blocks_.back().fault_in();
}

int64_t TraceLog::fit(int64_t n) {
  std::lock_guard<SpinLock> lock(lock_);
  const int64_t granted = std::max<int64_t>(0, std::min(n, max_events_ - count_));
  count_ += granted;
  return granted;
}

// The anchor a run ending at `end` converts with is the log's last while it lies under ~10 ms from
// the run's end (either way: a run on another core may end a little before an anchor taken on this
// one), else a new one. One anchor serves every method and thread that logs here, so runs that
// alternate never add anchors. (No run yet: no anchor yet.)
inline bool TraceLog::anchor_stale(uint64_t end) const {
  if (runs_ == 0) return true;
  const uint64_t apart = end >= anchor_.ticks ? end - anchor_.ticks : anchor_.ticks - end;
  return static_cast<double>(apart) * anchor_.ns_per_tick > 1e7;
}

inline bool TraceLog::like_last(const TimedRun& run) const {
  return runs_ > 0 && run.chains_key == last_key_ && run.bundled == last_bundled_ && run.events == last_events_;
}

inline void TraceLog::append(uint8_t* out, const RecordWord* record, size_t n, uint64_t start) {
  out = put_varint(out, zigzag(static_cast<int64_t>(start - last_start_)));
  if (n > 0) std::memcpy(out, record, n * sizeof(RecordWord));
  cursor_.store(out + n * sizeof(RecordWord), std::memory_order_relaxed);
  last_start_ = start;
  ++runs_;
}

void TraceLog::add(const TimedRun& run, const RecordWord* record, size_t n) {
  std::lock_guard<SpinLock> lock(lock_);
  // The common case: a run like the one before, all kept, near the last anchor, with room left (like_last
  // needs a run before, so a block exists and cursor_ and end_ point into it).
  uint8_t* const first = cursor_.load(std::memory_order_relaxed);
  if (__builtin_expect(!like_last(run) || run.events > max_events_ - count_ ||
                           anchor_stale(static_cast<uint64_t>(run.end)) || n == 0 ||
                           static_cast<size_t>(end_ - first) < kMaxHeader + n * sizeof(RecordWord),
                       0)) {
    add_any(run, record, n);
    return;
  }
  count_ += run.events;
  append(put_varint(first, (static_cast<uint64_t>(n) << 2) | 1), record, n, static_cast<uint64_t>(run.start));
}

void TraceLog::add_any(const TimedRun& run_in, const RecordWord* record, size_t n) {
  TimedRun run = run_in;
  run.kept = std::max<int64_t>(0, std::min(run.events, max_events_ - count_));
  count_ += run.kept;
  dropped_ += run.events - run.kept;
  if (run.kept == 0) n = 0;  // nothing of it is written: its events are only counted
  if (anchor_stale(static_cast<uint64_t>(run.end))) {
    anchor_ = new_anchor();
    anchors_.emplace_back(runs_, anchor_);
  }
  const size_t bytes = kMaxHeader + n * sizeof(RecordWord);
  uint8_t* first = cursor_.load(std::memory_order_relaxed);
  if (first == nullptr || static_cast<size_t>(end_ - first) < bytes) {
    next_block(bytes);
    first = cursor_.load(std::memory_order_relaxed);
  }
  const bool cut = run.kept < run.events;
  const bool like = like_last(run);
  uint8_t* out = put_varint(first, (static_cast<uint64_t>(n) << 2) | (cut ? 2 : 0) | (like ? 1 : 0));
  if (!like) {
    out = put_varint(out, static_cast<uint64_t>(run.chains_key));
    out = put_varint(out, zigzag(run.bundled));
    out = put_varint(out, static_cast<uint64_t>(run.events));
  }
  if (cut) out = put_varint(out, static_cast<uint64_t>(run.kept));
  append(out, record, n, static_cast<uint64_t>(run.start));
  last_key_ = run.chains_key;
  last_bundled_ = run.bundled;
  last_events_ = run.events;
}

int64_t TraceLog::dropped() {
  std::lock_guard<SpinLock> lock(lock_);
  return dropped_;
}

int64_t TraceLog::anchors() {
  std::lock_guard<SpinLock> lock(lock_);
  return static_cast<int64_t>(anchors_.size());
}

int64_t TraceLog::size() {
  std::lock_guard<SpinLock> lock(lock_);
  return runs_;
}

std::vector<std::pair<TimedRun, std::vector<int64_t>>> TraceLog::runs() {
  std::lock_guard<SpinLock> lock(lock_);
  std::vector<std::pair<TimedRun, std::vector<int64_t>>> out;
  out.reserve(static_cast<size_t>(runs_));
  uint64_t start = 0;
  size_t anchor = 0;
  TimedRun previous;
  std::vector<RecordWord> words;
  for (const Block& b : blocks_) {
    const uint8_t* p = b.data;
    const uint8_t* const end_of_block = &b == &blocks_.back() ? cursor_.load(std::memory_order_relaxed) : p + b.used;
    while (p < end_of_block) {
      const int64_t index = static_cast<int64_t>(out.size());
      while (anchor + 1 < anchors_.size() && anchors_[anchor + 1].first <= index) ++anchor;
      const uint64_t head = get_varint(p);
      const size_t n = static_cast<size_t>(head >> 2);
      TimedRun r = previous;
      if (!(head & 1)) {
        r.chains_key = static_cast<int64_t>(get_varint(p));
        r.bundled = unzigzag(get_varint(p));
        r.events = static_cast<int64_t>(get_varint(p));
      }
      r.kept = (head & 2) ? static_cast<int64_t>(get_varint(p)) : r.events;
      start += static_cast<uint64_t>(unzigzag(get_varint(p)));
      words.resize(n);
      if (n > 0) std::memcpy(words.data(), p, n * sizeof(RecordWord));  // the words may lie unaligned
      p += n * sizeof(RecordWord);
      r.anchor = anchors_[anchor].second;  // anchors_ is not empty: the first run took one (add_any: anchor_stale)
      std::vector<int64_t> record;
      record.reserve(n);
      const uint64_t end = decode_record(words.data(), n, start, r.anchor, record);
      previous = r;
      r.start = r.anchor.to_ns(start);
      r.end = r.anchor.to_ns(end);
      out.emplace_back(r, std::move(record));
    }
  }
  return out;
}

// -- memory watch -------------------------------------------------------------------------------

// A profiler state whose profiler is disabled (torch's profilerEnabled() and getProfilerConfig() read it
// correctly) but whose memory reporting is on: the CPU allocator then reports every allocation and free
// made on this thread. Counters are atomic: intra-op worker threads may report too.
class MemoryWatch : public torch::profiler::impl::ProfilerStateBase {
 public:
  MemoryWatch() : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    if (device.type() != c10::DeviceType::CPU) return;
    const int64_t level = level_.fetch_add(alloc_size, std::memory_order_relaxed) + alloc_size;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (level > peak && !peak_.compare_exchange_weak(peak, level, std::memory_order_relaxed)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
  void mark() {
    const int64_t level = level_.load(std::memory_order_relaxed);
    base_ = level;
    peak_.store(level, std::memory_order_relaxed);
  }
  std::pair<int64_t, int64_t> take() const {
    return {peak_.load(std::memory_order_relaxed) - base_, level_.load(std::memory_order_relaxed) - base_};
  }

 private:
  std::atomic<int64_t> level_{0}, peak_{0};
  int64_t base_ = 0;
};

namespace {
thread_local MemoryWatch* active_watch = nullptr;
}

bool start_memory_watch(const std::shared_ptr<MemoryWatch>& watch) {
  if (!watch || active_watch != nullptr) return false;
  if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return false;
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, watch);
  active_watch = watch.get();
  watch->mark();
  return true;
}

void stop_memory_watch(const std::shared_ptr<MemoryWatch>& watch) {
  if (!watch || active_watch != watch.get()) return;
  active_watch = nullptr;
  c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
}

MemoryWatch* active_memory_watch() { return active_watch; }

void memory_mark(MemoryWatch* watch) { watch->mark(); }

std::pair<int64_t, int64_t> memory_take(const MemoryWatch* watch) { return watch->take(); }

std::shared_ptr<MemoryWatch> new_memory_watch() { return std::make_shared<MemoryWatch>(); }

}  // namespace etlab_native
