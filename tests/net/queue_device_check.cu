// Compiles the queue's producer side for the device (sm_90a), where its memory order is PTX
// (memory_order.cuh): the GPU path's send blocks will call exactly this. Nothing launches it here.
#include "weave/net/queue.cuh"

namespace weave::net {

__global__ void queue_device_check(QueueView q, Command c, uint32_t n, int* ok) {
  if (threadIdx.x != 0) return;
  Producer p{q};
  bool good = true;
  for (uint32_t i = 0; i < n && good; ++i) {
    c.chunk = i;
    good = p.push(c);
  }
  *ok = good && p.wait_completed(n) && !p.aborted();
}

}  // namespace weave::net
