// Running counts advanced on the device (running_counts.hpp): a signal set's round cell and the
// MoE operators' expected signal totals.
#include <utility>

#include "weave/common/error.hpp"
#include "weave/runtime/running_counts.hpp"

namespace weave::runtime {

namespace {
__global__ void advance_counts_kernel(unsigned long long* cells, const CountStep step) {
  for (int i = 0; i < step.n; ++i) {
    const unsigned long long next = cells[i] + step.add[i];
    cells[i] = next > step.floor[i] ? next : step.floor[i];
  }
}
}  // namespace

void advance_counts(unsigned long long* cells, const CountStep& step, cudaStream_t s) {
  advance_counts_kernel<<<1, 1, 0, s>>>(cells, step);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

RunningCounts::RunningCounts(unsigned long long* cells, int n) : cells_(cells), n_(n) {
  WEAVE_CHECK(n >= 1 && n <= kMax, "RunningCounts: ", n, " counts, want 1..", kMax);
}

RunningCounts::RunningCounts(int n) : n_(n), owned_(true) {
  WEAVE_CHECK(n >= 1 && n <= kMax, "RunningCounts: ", n, " counts, want 1..", kMax);
  WEAVE_CUDA_CHECK(cudaMalloc(&cells_, sizeof(unsigned long long) * n));
  cudaError_t e = cudaMemset(cells_, 0, sizeof(unsigned long long) * n);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();  // zero before any stream reads them
  if (e != cudaSuccess) {
    cudaFree(cells_);  // a throwing constructor runs no destructor
    WEAVE_CUDA_CHECK(e);
  }
}

RunningCounts::~RunningCounts() {
  // cudaFree waits for the device: a launch still reading the cells finishes first.
  if (owned_ && cells_) cudaFree(cells_);
}

RunningCounts::RunningCounts(RunningCounts&& o) noexcept
    : cells_(std::exchange(o.cells_, nullptr)), n_(o.n_), owned_(o.owned_), device_(o.device_), host_(o.host_) {}

RunningCounts& RunningCounts::operator=(RunningCounts&& o) noexcept {
  if (this != &o) {
    if (owned_ && cells_) cudaFree(cells_);
    cells_ = std::exchange(o.cells_, nullptr);
    n_ = o.n_, owned_ = o.owned_, device_ = o.device_, host_ = o.host_;
  }
  return *this;
}

RunningCounts::Adds RunningCounts::add_on_host(const Adds& adds) {
  WEAVE_CHECK(!device_, "RunningCounts: a host-only advance after a captured launch (the device cells lead)");
  for (int i = 0; i < n_; ++i) host_[i] += adds[i];
  return host_;
}

RunningCounts::Counts RunningCounts::advance(const Adds& adds, cudaStream_t s, bool capturing) {
  WEAVE_CHECK(cells_ != nullptr, "RunningCounts: advance on an empty object");
  // host_ sums eager launches only: a captured launch may run any number of times, none included.
  Adds floor = host_;
  for (int i = 0; i < n_; ++i) floor[i] += adds[i];
  if (capturing) device_ = true;
  else host_ = floor;
  Counts out{};
  if (device_) {
    CountStep step{};
    step.n = n_;
    for (int i = 0; i < n_; ++i) step.add[i] = adds[i], step.floor[i] = floor[i];
    advance_counts(cells_, step, s);
  }
  for (int i = 0; i < n_; ++i) out[i] = Round{floor[i], device_ ? cells_ + i : nullptr};
  return out;
}

}  // namespace weave::runtime
