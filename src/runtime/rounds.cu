// The round cell's advance (SignalSet::next_round, communicator.hpp).
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::runtime {

namespace {
// Launched without programmatic serialization: it starts after the previous kernel on the stream
// (the set's previous launch, which reads the cell) has completed, and the next launch, which
// reads the cell after pdl_enter, sees its store.
__global__ void advance_round_kernel(unsigned long long* cell, unsigned long long host_round) {
  const unsigned long long next = *cell + 1;
  *cell = next > host_round ? next : host_round;
}
}  // namespace

void advance_round(unsigned long long* cell, unsigned long long host_round, cudaStream_t s) {
  advance_round_kernel<<<1, 1, 0, s>>>(cell, host_round);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::runtime
