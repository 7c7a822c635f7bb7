// Each rank TMA-stores a tile into the next rank's copy of a symmetric buffer and signals it.
// Run: build/bin/weave-run -n 2 -- build/bin/example_pass_tile
#include <cstdio>

#include "weave/runtime/communicator.hpp"
#include "weave/runtime/pgl_host.hpp"
#include "weave/signal.cuh"
#include "weave/store.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

__global__ void pass_tile(const __grid_constant__ pgl<bf16> buf, signals s, unsigned long long round) {
  __shared__ __align__(128) bf16 tile[64 * 64];
  for (int i = threadIdx.x; i < 64 * 64; i += blockDim.x) tile[i] = __float2bfloat16(buf.rank + 1);
  tile::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int next = (buf.rank + 1) % buf.world;
    store_async(buf, next, tile, 0, 0);  // TMA store into the next rank's copy, tile (0, 0)
    store_wait();                        // the data is written, not only read from shared memory
    signal(s, next, 0);                  // release at system scope
    wait(s, 0, round);                   // acquire; a lost signal ends in a diagnostic, not a hang
  }
}

int main() try {
  runtime::Communicator comm;                       // rank and world from weave-run, torchrun or mpirun
  runtime::SymmetricTensor<bf16> x(comm, 64 * 64);  // the same offset in every rank's heap
  auto buf = runtime::make_pgl(comm, x.data(), 64, 64, 64, 64, 64);
  auto sig = comm.signals("pass", 1);
  pass_tile<<<1, 128>>>(buf, sig.view(), sig.next_round());
  comm.sync();  // device errors and wait timeouts become exceptions here
  bf16 got;
  cudaMemcpy(&got, x.data(), sizeof got, cudaMemcpyDeviceToHost);
  const int prev = (comm.rank() + comm.world() - 1) % comm.world();
  std::printf("rank %d received %.0f from rank %d\n", comm.rank(), __bfloat162float(got), prev);
  return __bfloat162float(got) == prev + 1 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
