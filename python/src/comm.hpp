// One communicator of the Python package and what its operator calls share: the runtime
// communicator, its kernels (Ops), the heap tensors handed to Python (weave.empty), the two
// staging buffers through which ordinary tensors reach kernels that need symmetric memory, and the
// per-shape answers of "may this call take any device memory". The torch operators (torch_ops.cpp)
// find a communicator by its process group's name (comm_for); module.cpp binds the rest.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <cuda_runtime_api.h>

#include "ops.hpp"
#include "weave/runtime/communicator.hpp"

namespace weave::py {

class Comm : public std::enable_shared_from_this<Comm> {
 public:
  Comm(const runtime::LaunchInfo& info, const runtime::CommOptions& opt);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  runtime::Communicator& comm() { return *comm_; }
  Ops& ops() { return ops_; }
  // One call of this communicator at a time (operators, allocation, MoE layers).
  std::mutex& mu() { return mu_; }

  // A heap tensor's memory (collective). Buffers whose tensors died are handed back at the next
  // alloc: a tensor may die on any thread (the deleter takes only `pending_mu_`), and
  // Communicator::release must not race with alloc.
  Ptr alloc(size_t bytes);
  void defer_release(Ptr p);
  // Whether [p, p + bytes) lies in one live heap tensor of this communicator.
  bool owns(Ptr p, size_t bytes);
  size_t pending();
  // Keeps a MoE layer whose Python object died without close(): destroying it is collective, and
  // Python's collector does not drop objects in the same order on every rank. It goes with the
  // communicator (its symmetric buffers stay allocated until then).
  void adopt(std::unique_ptr<Moe> m);

  // The rest is called with mu() held.
  enum Which { kIn = 0, kOut = 1 };
  // Staging buffer `which` with room for `bytes` of this rank and at least `reserve` (the same on
  // every rank: ragged shards make `bytes` differ), ordered after its last use on another stream.
  // Growing allocates, which is collective, so whether and how much a call grows must follow
  // from `reserve` alone; under stream capture it cannot, and says to make one eager call of the
  // shapes first. Buffers outgrown once a graph captured a call are kept: the graph's replays
  // still use them.
  Ptr staging(Which which, size_t bytes, size_t reserve, cudaStream_t s, bool capturing);
  Ptr staging(Which which, size_t bytes, cudaStream_t s, bool capturing) {
    return staging(which, bytes, bytes, s, capturing);
  }
  // `p` itself when [p, p + bytes) is a heap tensor, else its copy in the input staging buffer;
  // the input buffer is made room for `reserve` either way (a peer's input may be staged).
  Ptr symmetric_input(Ptr p, size_t bytes, size_t reserve, cudaStream_t s, bool capturing);
  // This rank's argument error `why` in operator `op`, joined to its next cross-rank agreement so
  // that the peers, whose arguments passed, fail with it instead of waiting for this rank (the
  // agreement's own error is dropped: the caller raises its own).
  void refuse(const std::string& op, const std::string& why, cudaStream_t s);
  // The cached answer of `ask` for a call shape (asked once per key).
  using LocalKey = std::tuple<int, std::vector<long long>, int, int, bool>;
  template <class F>
  bool local(const LocalKey& key, F&& ask) {
    auto it = local_.find(key);
    if (it == local_.end()) it = local_.emplace(key, ask()).first;
    return it->second;
  }

 private:
  void drain_released();
  void reserve(Which which, size_t bytes, cudaStream_t s, bool capturing);  // grows staging buffer `which`

  std::unique_ptr<runtime::Communicator> comm_;
  Ops ops_;
  std::mutex mu_;
  std::mutex pending_mu_;
  std::vector<Ptr> pending_;
  std::map<Ptr, size_t> live_;  // heap tensors not yet dead: start -> bytes
  std::vector<std::unique_ptr<Moe>> orphans_;  // destroyed before ops_ and comm_
  struct Stage {
    Ptr p = 0;
    size_t bytes = 0;
  } stage_[2];
  std::vector<Ptr> kept_;  // outgrown staging buffers a captured graph may still use
  unsigned long long growths_ = 0;  // staging growths attempted (the same count on every rank)
  bool captured_ = false;
  std::optional<cudaStream_t> last_stream_;  // of the last eager call (nullptr: the legacy stream)
  cudaEvent_t ordered_ = nullptr;  // the last stream's point, waited for by the next one
  std::map<LocalKey, bool> local_;
};

// The communicators by process-group name (not owned). The package registers each one it makes; a name not
// registered is passed to the resolver (the package's weave.init for that group, which registers
// it), so an operator called on a group without weave.init makes its communicator, as Python did.
void register_comm(const std::string& group, std::shared_ptr<Comm> c);
void set_comm_resolver(void (*resolve)(const std::string& group));
std::shared_ptr<Comm> comm_for(const std::string& group);

// Tests: outputs of the torch operators and staging buffers filled with 0xFF bytes (NaN for
// floats) before every kernel writes them, so an unwritten element fails the checks.
void set_poison(bool on);
bool poison();

}  // namespace weave::py
