// The kernels and launchers that net_device_transfer.hpp declares (the protocol is described there).
#include "net_device_transfer.hpp"

#include "weave/common/error.hpp"
#include "weave/net/device.cuh"

namespace weave::bench::netdev {

namespace kernels {

__global__ void __launch_bounds__(kThreads) send(const net::NetHandle h, const Message m, char* src) {
  __shared__ int word;
  if (!net::open_send_gate(h, m.call, m.commands_before, blockIdx.x == 0, &word)) return;
  const uint64_t n = m.chunks();
  for (uint64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const uint64_t off = j * m.chunk, len = m.bytes - off < m.chunk ? m.bytes - off : m.chunk;
    if (threadIdx.x == 0) *reinterpret_cast<uint64_t*>(src + off) = chunk_stamp(m.seed, m.index, j);
    __syncthreads();
    net::block_copy_out(h.send + off, src + off, len);
    __syncthreads();
    bool queued = false;
    if (threadIdx.x == 0) {
      net::Producer p{h.queue};
      queued = net::push(h, p,
                         net::Command{off, m.recv_offset + off, len, 1, m.flag_offset + static_cast<uint32_t>(j),
                                      static_cast<uint16_t>(m.peer), net::kNotify, 0});
    }
    if (!net::block_agree(queued, &word)) return;  // the path failed: finish() says why
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && net::wait_arrival(h, m.flag_offset + m.ack_flag))
    net::consume(h, m.flag_offset + m.ack_flag);
}

__global__ void __launch_bounds__(kThreads) receive(const net::NetHandle h, const Message m, char* dst,
                                                   unsigned long long* done, unsigned long long done_target,
                                                   unsigned long long* first_bad) {
  __shared__ int word;
  const uint64_t n = m.chunks();
  for (uint64_t j = blockIdx.x; j < n; j += gridDim.x) {
    const uint32_t flag = m.flag_offset + static_cast<uint32_t>(j);
    // A block that gives up sends no ack: the sender's wait then ends with the path's failure.
    if (!net::block_agree(threadIdx.x == 0 && net::wait_arrival(h, flag), &word)) return;
    const uint64_t off = j * m.chunk, len = m.bytes - off < m.chunk ? m.bytes - off : m.chunk;
    net::block_copy_in(dst + off, h.recv + m.recv_offset + off, len);
    __syncthreads();
    if (threadIdx.x == 0) {
      if (*reinterpret_cast<const uint64_t*>(dst + off) != chunk_stamp(m.seed, m.index, j))
        atomicCAS(first_bad, 0ull, 1ull + ((m.index << 32) | j));
      net::consume(h, flag);
    }
  }
  if (threadIdx.x == 0) {
    // Release pattern over this block's copies and flag resets; the last block's fence after
    // its count acquires every other block's before the ack's header is committed.
    fence_acq_rel_sys();
    if (atomicAdd(done, 1ull) + 1 == done_target) {
      fence_acq_rel_sys();
      net::Producer p{h.queue};
      net::push(h, p, net::Command{0, m.recv_offset, 0, 1, m.flag_offset + m.ack_flag, static_cast<uint16_t>(m.peer),
                                   net::kNotify, 0});
    }
  }
}

}  // namespace kernels

void launch_send(const net::NetHandle& h, const Message& m, char* src, int blocks, cudaStream_t st) {
  kernels::send<<<grid(m, blocks), kThreads, 0, st>>>(h, m, src);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

void launch_receive(const net::NetHandle& h, const Message& m, char* dst, unsigned long long* done,
                    unsigned long long done_target, unsigned long long* first_bad, int blocks, cudaStream_t st) {
  kernels::receive<<<grid(m, blocks), kThreads, 0, st>>>(h, m, dst, done, done_target, first_bad);
  WEAVE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace weave::bench::netdev
