// Bootstrap: the ranks of one node find each other over Unix-domain sockets named by the job
// id (two jobs on one node never collide), exchange small host data and file descriptors.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "weave/runtime/launch.hpp"

namespace weave::runtime {

class Bootstrap {
 public:
  // Connects all local ranks; throws weave::Error (naming the missing ranks) after `timeout`.
  explicit Bootstrap(const LaunchInfo& info, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const;
  int world() const;
  // Collectives: every rank calls the same ones in the same order with the same sizes (checked).
  // They wait without a time limit, but a peer that exits makes them throw instead of hanging;
  // after an error in a collective the bootstrap is unusable on every rank (later calls throw).
  // `all` receives world * bytes: rank r's `mine` at offset r * bytes.
  void all_gather(const void* mine, void* all, size_t bytes);
  void barrier();
  // Every rank contributes one fd; returns world fds, entry r received from rank r (own entry is
  // a dup of `fd`). The caller owns and closes all returned fds.
  std::vector<int> all_gather_fd(int fd);
  // While a collective waits for peers, `why` is asked every 200 ms; a non-empty answer ends the
  // wait with weave::Error(answer) (the Communicator passes its abort word's reason). Returns the
  // one it replaces (a caller that sets one for a while puts that back).
  std::function<std::string()> set_interrupt(std::function<std::string()> why);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace weave::runtime
