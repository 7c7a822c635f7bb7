// What the network path needs from a bootstrap at set-up and shutdown: rank, world, all_gather,
// barrier. The proxy runs over the node-local Unix-socket Bootstrap (one host, the CPU tests) or
// over NetBootstrap (TCP, across hosts or simulated nodes); both have these four calls with the
// same contract (same calls in the same order on every rank; a peer that exits makes them throw),
// but no common base, so this interface wraps whichever one the caller has.
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace weave::net {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual void all_gather(const void* mine, void* all, size_t bytes) = 0;
  virtual void barrier() = 0;
  // Asked while a collective waits (a non-empty answer ends the wait with it); returns the previous.
  virtual std::function<std::string()> set_interrupt(std::function<std::string()> why) = 0;
};

// A Rendezvous over a bootstrap object the caller owns (it must outlive this).
template <class Boot>
class RendezvousOver final : public Rendezvous {
 public:
  explicit RendezvousOver(Boot& b) : b_(b) {}
  int rank() const override { return b_.rank(); }
  int world() const override { return b_.world(); }
  void all_gather(const void* mine, void* all, size_t bytes) override { b_.all_gather(mine, all, bytes); }
  void barrier() override { b_.barrier(); }
  std::function<std::string()> set_interrupt(std::function<std::string()> why) override {
    return b_.set_interrupt(std::move(why));
  }

 private:
  Boot& b_;
};

}  // namespace weave::net
