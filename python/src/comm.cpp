#include "comm.hpp"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <unordered_map>

#include "weave/common/error.hpp"
#include "weave/runtime/device_copy.hpp"

namespace weave::py {

Comm::Comm(const runtime::LaunchInfo& info, const runtime::CommOptions& opt)
    : comm_(std::make_unique<runtime::Communicator>(info, opt)), ops_(*comm_) {}

Comm::~Comm() {
  if (ordered_) cudaEventDestroy(ordered_);
}

Ptr Comm::alloc(size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  set_device(comm_->device());
  drain_released();
  const Ptr p = reinterpret_cast<Ptr>(comm_->alloc(bytes));
  std::lock_guard<std::mutex> lk2(pending_mu_);
  live_[p] = bytes;
  return p;
}

void Comm::defer_release(Ptr p) {
  std::lock_guard<std::mutex> lk(pending_mu_);
  pending_.push_back(p);
  live_.erase(p);
}

bool Comm::owns(Ptr p, size_t bytes) {
  std::lock_guard<std::mutex> lk(pending_mu_);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return false;
  --it;
  return p + bytes <= it->first + it->second;
}

size_t Comm::pending() {
  std::lock_guard<std::mutex> lk(pending_mu_);
  return pending_.size();
}

void Comm::adopt(std::unique_ptr<Moe> m) {
  std::lock_guard<std::mutex> lk(pending_mu_);
  orphans_.push_back(std::move(m));
}

void Comm::drain_released() {
  std::vector<Ptr> ps;
  {
    std::lock_guard<std::mutex> lk(pending_mu_);
    ps.swap(pending_);
  }
  for (Ptr p : ps) comm_->release(reinterpret_cast<void*>(p));
}

void Comm::reserve(Which which, size_t bytes, cudaStream_t s, bool capturing) {
  set_device(comm_->device());
  captured_ = captured_ || capturing;
  Stage& st = stage_[which];
  if (st.bytes < bytes || st.p == 0) {
    const char* name = which == kIn ? "in" : "out";
    if (capturing)
      throw std::runtime_error(std::string("weave: the '") + name + "' staging buffer must grow to " +
                               std::to_string(bytes) +
                               " bytes, which a CUDA graph capture cannot do (allocation is collective and "
                               "synchronizes); make one eager call with these shapes first");
    constexpr size_t kGranule = size_t(2) << 20;  // whole 2 MiB granules, at least 1 MiB asked
    const size_t grow = st.p ? st.bytes + st.bytes / 2 : 0;
    const size_t want = std::max({bytes, grow, size_t(1) << 20});
    const size_t cap = (want + kGranule - 1) / kGranule * kGranule;
    // Agreed before the allocation, which is collective: a peer whose own arguments were refused
    // joins the call's agreement instead (torch_ops.cpp's Call::rules), and this is the step of
    // the call at which it meets this rank; both then fail, with nothing allocated.
    // The growth's number makes each one a new plan, waited for by every rank, even where an
    // earlier growth of the same size failed.
    comm_->agree_call("weave.staging", "a staging buffer's growth (buffer, number, new size)",
                      {static_cast<long long>(which), static_cast<long long>(++growths_),
                       static_cast<long long>(cap)}, "", s);
    // The old buffer goes back first, so that this allocation can reuse its memory; once a graph
    // may hold it, it is kept instead.
    if (st.p) {
      if (captured_)
        kept_.push_back(st.p);
      else
        comm_->release(reinterpret_cast<void*>(st.p));
    }
    st = {};
    drain_released();
    st.p = reinterpret_cast<Ptr>(comm_->alloc(cap));
    st.bytes = cap;
  }
}

Ptr Comm::staging(Which which, size_t bytes, size_t reserve_bytes, cudaStream_t s, bool capturing) {
  reserve(which, std::max(bytes, reserve_bytes), s, capturing);
  const Stage& st = stage_[which];
  // A graph cannot wait for work outside it: captured calls are ordered by the capture stream
  // alone (a graph's replays and eager calls must not overlap: the caller's stream order).
  if (!capturing) {
    if (last_stream_ && *last_stream_ != s) {
      if (!ordered_) WEAVE_CUDA_CHECK(cudaEventCreateWithFlags(&ordered_, cudaEventDisableTiming));
      WEAVE_CUDA_CHECK(cudaEventRecord(ordered_, *last_stream_));
      WEAVE_CUDA_CHECK(cudaStreamWaitEvent(s, ordered_, 0));
    }
    last_stream_ = s;
  }
  if (poison()) WEAVE_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(st.p), 0xFF, bytes, s));
  return st.p;
}

void Comm::refuse(const std::string& op, const std::string& why, cudaStream_t s) {
  try {  // always throws: this rank has a problem
    comm_->agree_call(op, "the operator's argument rules", {}, why, s);
  } catch (const std::exception&) {
  }
}

Ptr Comm::symmetric_input(Ptr p, size_t bytes, size_t reserve_bytes, cudaStream_t s, bool capturing) {
  if (bytes && owns(p, bytes)) {
    reserve(kIn, std::max(bytes, reserve_bytes), s, capturing);  // as a peer staging its input does
    return p;
  }
  const Ptr in = staging(kIn, bytes, reserve_bytes, s, capturing);
  runtime::device_copy(reinterpret_cast<void*>(in), reinterpret_cast<const void*>(p), bytes, s);
  return in;
}

namespace {
std::mutex registry_mu;
// Weak: the package's Communicator objects own them (and end them at exit).
std::unordered_map<std::string, std::weak_ptr<Comm>>& registry() {
  static auto* r = new std::unordered_map<std::string, std::weak_ptr<Comm>>();  // lives past exit
  return *r;
}
void (*resolver)(const std::string&) = nullptr;
std::atomic<bool> poison_on{false};
}  // namespace

void register_comm(const std::string& group, std::shared_ptr<Comm> c) {
  std::lock_guard<std::mutex> lk(registry_mu);
  registry()[group] = std::move(c);
}

void set_comm_resolver(void (*resolve)(const std::string&)) { resolver = resolve; }

std::shared_ptr<Comm> comm_for(const std::string& group) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> lk(registry_mu);
      auto it = registry().find(group);
      if (it != registry().end())
        if (auto c = it->second.lock()) return c;
    }
    if (attempt == 0 && resolver) resolver(group);
  }
  throw std::runtime_error("weave: no communicator for process group '" + group +
                           "' (call weave.init(group) on every rank of it first)");
}

void set_poison(bool on) { poison_on = on; }
bool poison() { return poison_on; }

}  // namespace weave::py
