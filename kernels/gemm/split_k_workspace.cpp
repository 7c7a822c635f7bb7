// The split-K workspace (split_k_workspace.hpp): the eager cache, one per (device, stream), grown on
// demand; the buffers of captures, owned by their graphs.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "gemm/split_k_workspace.hpp"
#include "weave/common/capture.hpp"
#include "weave/common/error.hpp"

namespace weave::gemm {

namespace {

struct Buffers {
  void* partials = nullptr;
  void* counters = nullptr;
  size_t partial_bytes = 0, counter_bytes = 0;
};

size_t at_least_16(size_t bytes) { return bytes > 0 ? bytes : 16; }

// Captures' buffers. A capture's launches on one stream run in graph order, so they share one pair
// (the largest they asked for so far); a graph that no longer exists gives its pairs back to
// `spare`, whose counters every completed launch left zero.
struct Captured {
  std::mutex mu;
  std::map<std::tuple<int, unsigned long long, cudaStream_t>, Buffers> current;  // (device, capture id, stream)
  std::map<int, std::vector<Buffers>> spare;                                       // per device
  std::mutex zeroing_mu;
  std::map<int, cudaStream_t> zeroing;  // per device: a non-blocking stream outside every capture
};
Captured& captured() {
  static Captured* c = new Captured;  // never destroyed: user-object callbacks may run at exit
  return *c;
}

struct Owned {
  std::tuple<int, unsigned long long, cudaStream_t> key;  // (device, capture id, stream)
  Buffers b;
};

// A CUDA user object's destructor (no CUDA calls allowed here): back to the spare list.
void give_back(void* p) {
  Owned* o = static_cast<Owned*>(p);
  Captured& c = captured();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.current.find(o->key);
    if (it != c.current.end() && it->second.partials == o->b.partials) c.current.erase(it);
    c.spare[std::get<0>(o->key)].push_back(o->b);
  }
  delete o;
}

// The thread's capture mode relaxed for a scope: cudaMalloc is otherwise refused while a
// global-mode capture runs. (New buffers are zeroed on a stream no capture joins.)
class Relaxed {
 public:
  Relaxed() { WEAVE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
  ~Relaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  Relaxed(const Relaxed&) = delete;
  Relaxed& operator=(const Relaxed&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

cudaStream_t zeroing_stream(Captured& c, int dev) {
  std::lock_guard<std::mutex> lock(c.zeroing_mu);  // not `mu`: a CUDA call under it
  cudaStream_t& z = c.zeroing[dev];
  if (!z) WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&z, cudaStreamNonBlocking));
  return z;
}

Buffers allocate_zeroed(Captured& c, int dev, size_t pb, size_t cb) {
  const cudaStream_t z = zeroing_stream(c, dev);
  Buffers b;
  WEAVE_CUDA_CHECK(cudaMalloc(&b.partials, pb));
  if (const cudaError_t e = cudaMalloc(&b.counters, cb); e != cudaSuccess) {
    cudaFree(b.partials);
    WEAVE_CUDA_CHECK(e);
  }
  WEAVE_CUDA_CHECK(cudaMemsetAsync(b.counters, 0, cb, z));
  WEAVE_CUDA_CHECK(cudaStreamSynchronize(z));
  b.partial_bytes = pb;
  b.counter_bytes = cb;
  return b;
}

SplitKWorkspace for_capture(cudaStream_t stream, int dev, size_t pb, size_t cb) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  WEAVE_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &st, &id, &graph));
  WEAVE_CHECK(st == cudaStreamCaptureStatusActive && graph,
              "split-K GEMM: the stream's CUDA graph capture has been invalidated (an earlier error in it)");
  Captured& c = captured();
  const auto key = std::make_tuple(dev, id, stream);
  // The mutex is never held across a CUDA call: give_back takes it on CUDA's callback thread.
  Buffers b;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.current.find(key);
    if (it != c.current.end() && it->second.partial_bytes >= pb && it->second.counter_bytes >= cb)
      return {static_cast<float*>(it->second.partials), static_cast<int*>(it->second.counters)};
    // A pair this graph will own: a spare one large enough, or a new one. A smaller one it took
    // for an earlier launch stays its own (that launch's node uses it).
    std::vector<Buffers>& spare = c.spare[dev];
    for (size_t i = 0; i < spare.size(); ++i)
      if (spare[i].partial_bytes >= pb && spare[i].counter_bytes >= cb) {
        b = spare[i];
        spare.erase(spare.begin() + static_cast<long>(i));
        break;
      }
  }
  Relaxed relaxed;  // cudaMalloc and the user object under a global-mode capture
  if (!b.partials) b = allocate_zeroed(c, dev, pb, cb);
  Owned* o = new Owned{key, b};
  cudaUserObject_t obj;
  const cudaError_t e = cudaUserObjectCreate(&obj, o, give_back, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    give_back(o);
    WEAVE_CUDA_CHECK(e);
  }
  const cudaError_t r = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
  if (r != cudaSuccess) {
    cudaUserObjectRelease(obj, 1);  // its destructor gives the pair back
    WEAVE_CUDA_CHECK(r);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  c.current[key] = b;
  return {static_cast<float*>(b.partials), static_cast<int*>(b.counters)};
}

}  // namespace

SplitKWorkspace split_k_workspace(cudaStream_t stream, size_t partial_bytes, size_t counter_bytes) {
  const size_t pb = at_least_16(partial_bytes), cb = at_least_16(counter_bytes);
  int dev = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  if (capturing(stream)) return for_capture(stream, dev, pb, cb);
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, Buffers> cache;  // kept for the process's life
  std::lock_guard<std::mutex> lock(mu);
  Buffers& b = cache[{dev, stream}];
  if (b.partial_bytes < pb || b.counter_bytes < cb) {
    // Stream-ordered: the old buffers are freed after the kernels already queued on this stream
    // (no capture uses them).
    if (b.partials) WEAVE_CUDA_CHECK(cudaFreeAsync(b.partials, stream));
    if (b.counters) WEAVE_CUDA_CHECK(cudaFreeAsync(b.counters, stream));
    b = Buffers{};
    WEAVE_CUDA_CHECK(cudaMallocAsync(&b.partials, pb, stream));
    WEAVE_CUDA_CHECK(cudaMallocAsync(&b.counters, cb, stream));
    WEAVE_CUDA_CHECK(cudaMemsetAsync(b.counters, 0, cb, stream));  // the kernels keep them zero
    b.partial_bytes = pb;
    b.counter_bytes = cb;
  }
  return {static_cast<float*>(b.partials), static_cast<int*>(b.counters)};
}

}  // namespace weave::gemm
