// The native core's tracing pieces: timestamps from the CPU counter, the debug-buffer arena,
// and the log of timed runs.
#include "core.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

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

thread_local Anchor cached_anchor;  // this thread's last anchor (recent_anchor)

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

Anchor recent_anchor(uint64_t now_ticks) {
  // Converting a run's ticks needs an anchor near it (CLOCK_MONOTONIC may be slewed against the
  // counter, and the period is an estimate), not a clock reading per run: one every 10 ms.
  const Anchor& a = cached_anchor;
  if (a.ticks == 0 || now_ticks < a.ticks || static_cast<double>(now_ticks - a.ticks) * a.ns_per_tick > 1e7)
    return new_anchor();
  return a;
}

int64_t clock_ns() {
  if (!kCounter) return now_ns();
  const uint64_t t = ticks();
  return recent_anchor(t).to_ns(t);
}

std::string error_message(const c10::Error& e) { return e.what_without_backtrace(); }

// -- debug arena --------------------------------------------------------------------------------

namespace {
constexpr int64_t kMaxGrowthUnit = int64_t{64} << 20;  // a plan's claim never allocates more at once

int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
}  // namespace

DebugArena::DebugArena(int64_t size, int64_t limit) : limit_(std::max(size, limit)) {
  if (size < 0) throw std::invalid_argument("DebugArena: negative size");
  chunks_.push_back(at::empty({size}, at::kByte));
  starts_.push_back(0);
  capacity_ = size;
}

void DebugArena::grow_by_at_least(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  unit_ = std::max(unit_, std::min(round_up(std::max<int64_t>(bytes, 0), 64), kMaxGrowthUnit));
}

std::pair<int64_t, at::Tensor> DebugArena::reserve(int64_t nbytes, int64_t alignment) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (nbytes < 0 || alignment <= 0) return {-1, at::Tensor()};
  int64_t offset = round_up(used_, alignment);
  if (offset + nbytes > capacity_) {
    // A new chunk, if the limit allows: it starts aligned, and the old chunk's tail is zeroed.
    const int64_t start = round_up(capacity_, std::max<int64_t>(alignment, 64));
    const int64_t size = std::max(unit_, round_up(nbytes, 64));
    if (start + size > limit_) return {-1, at::Tensor()};
    const int64_t tail = starts_.back() + chunks_.back().numel() - used_;
    if (tail > 0) chunks_.back().narrow(0, used_ - starts_.back(), tail).zero_();
    if (start > capacity_) {  // unaligned capacity (a user-sized first chunk): a zero pad chunk
      chunks_.push_back(at::zeros({start - capacity_}, at::kByte));
      starts_.push_back(capacity_);
    }
    chunks_.push_back(at::empty({size}, at::kByte));
    starts_.push_back(start);
    capacity_ = start + size;
    used_ = offset = start;
  }
  at::Tensor& chunk = chunks_.back();
  const int64_t base = starts_.back();
  if (offset > used_) chunk.narrow(0, used_ - base, offset - used_).zero_();  // alignment padding
  used_ = offset + nbytes;
  return {offset, chunk.narrow(0, offset - base, nbytes)};
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

uint64_t decode_record(const uint32_t* record, size_t n, uint64_t start, const Anchor& anchor,
                       std::vector<int64_t>& out) {
  uint64_t t = start;
  for (size_t k = 0; k < n; ++k) {
    const uint32_t w = record[k];
    if (w < kRecordStep) {
      t += w;
    } else if (w == kRecordEnd) {
      out.push_back(-1);
      continue;
    } else if (w == kRecordWide) {
      if (k + 2 >= n) throw std::logic_error("decode_record: a wide time cut short");
      t += static_cast<uint64_t>(record[k + 1]) | (static_cast<uint64_t>(record[k + 2]) << 32);
      k += 2;
    } else {
      out.push_back(static_cast<int64_t>(w & ~kRecordStep));
      continue;
    }
    out.push_back(anchor.to_ns(t));
  }
  return t;
}

namespace {

// A run in the log: its record's length in words (the top bit set when not all its events were
// kept), its chains key, bundled input, events, the kept ones (only with that bit), the ticks since
// the previous run's start (put_ticks: one word, or three), then its record.
constexpr size_t kMaxHeader = 8;
constexpr uint32_t kCut = 0x80000000u;
constexpr size_t kBlockBytes = size_t{2} << 20;

uint32_t* allocate_block(size_t words, size_t& capacity) {
  const size_t bytes = (words * sizeof(uint32_t) + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  void* p = std::aligned_alloc(kBlockBytes, bytes);
  if (p == nullptr) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without huge pages it is 4 KiB pages
#endif
  capacity = bytes / sizeof(uint32_t);
  return static_cast<uint32_t*>(p);
}

}  // namespace

int64_t TraceLog::fit(int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t granted = std::max<int64_t>(0, std::min(n, max_events_ - count_));
  count_ += granted;
  return granted;
}

void TraceLog::add(TimedRun run, const uint32_t* record, size_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  run.kept = std::max<int64_t>(0, std::min(run.events, max_events_ - count_));
  count_ += run.kept;
  dropped_ += run.events - run.kept;
  if (run.kept == 0) n = 0;  // nothing of it is written: its events are only counted
  if (run.events >= int64_t{1} << 32 || n >= kCut) throw std::length_error("TraceLog: a run too long to log");
  if (anchors_.empty() || anchors_.back().second.ticks != run.anchor.ticks) anchors_.emplace_back(runs_, run.anchor);
  if (blocks_.empty() || blocks_.back().used + kMaxHeader + n > blocks_.back().capacity) {
    Block b;
    b.data.reset(allocate_block(kMaxHeader + n, b.capacity));
    blocks_.push_back(std::move(b));
  }
  Block& b = blocks_.back();
  uint32_t* out = b.data.get() + b.used;
  const bool cut = run.kept < run.events;
  size_t k = 0;
  out[k++] = static_cast<uint32_t>(n) | (cut ? kCut : 0);
  out[k++] = static_cast<uint32_t>(run.chains_key);
  out[k++] = static_cast<uint32_t>(static_cast<int32_t>(run.bundled));
  out[k++] = static_cast<uint32_t>(run.events);
  if (cut) out[k++] = static_cast<uint32_t>(run.kept);
  const uint64_t start = static_cast<uint64_t>(run.start);
  k = put_ticks(out, k, start - last_start_);
  last_start_ = start;
  if (n > 0) std::memcpy(out + k, record, n * sizeof(uint32_t));
  b.used += k + n;
  ++runs_;
}

int64_t TraceLog::dropped() {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

int64_t TraceLog::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return runs_;
}

std::vector<std::pair<TimedRun, std::vector<int64_t>>> TraceLog::runs() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<TimedRun, std::vector<int64_t>>> out;
  out.reserve(static_cast<size_t>(runs_));
  uint64_t start = 0;
  size_t anchor = 0;
  for (const Block& b : blocks_) {
    const uint32_t* p = b.data.get();
    for (size_t at = 0; at < b.used;) {
      const int64_t index = static_cast<int64_t>(out.size());
      while (anchor + 1 < anchors_.size() && anchors_[anchor + 1].first <= index) ++anchor;
      const uint32_t* h = p + at;
      const size_t n = h[0] & ~kCut;
      size_t k = 1;
      TimedRun r;
      r.chains_key = h[k++];
      r.bundled = static_cast<int32_t>(h[k++]);
      r.events = h[k++];
      r.kept = (h[0] & kCut) ? h[k++] : r.events;
      if (h[k] == kRecordWide) {
        start += static_cast<uint64_t>(h[k + 1]) | (static_cast<uint64_t>(h[k + 2]) << 32);
        k += 3;
      } else {
        start += h[k++];
      }
      r.anchor = anchors_[anchor].second;
      std::vector<int64_t> record;
      record.reserve(n);
      const uint64_t end = decode_record(h + k, n, start, r.anchor, record);
      r.start = r.anchor.to_ns(start);
      r.end = r.anchor.to_ns(end);
      out.emplace_back(r, std::move(record));
      at += k + n;
    }
  }
  return out;
}

}  // namespace etlab_native
