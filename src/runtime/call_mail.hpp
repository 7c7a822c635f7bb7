// The single-node communicator's cross-rank mail (internal to the runtime): every rank's page of
// host shared memory (memfd, mapped by every rank of the node) and the protocol of
// Communicator::agree_call over it, apart from CUDA so that the CPU tests run it with threads.
//
// A rank posts the values of its n-th check_same call and the plan of its n-th operator call in
// its page, so comparing arguments across ranks costs a few cache-line transfers instead of a
// socket round trip; a peer that rejects a call this rank already launched writes this rank's
// abort word, which its kernels poll through a host mapping.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "weave/common/error.hpp"

namespace weave::runtime::mail {

constexpr int kCheckValues = 17;
struct MailSlot {
  std::atomic<unsigned long long> seq;
  long long values[kCheckValues];
};
// An operator call's plan, published like a seqlock: seq is kWriting while the slot is written,
// then the call number. A reader that is a whole ring behind sees a larger number and knows it.
constexpr int kCallRing = 32;
constexpr int kOpWords = 4;  // the operator's name, 32 characters
constexpr unsigned long long kWriting = ~0ull;
struct CallSlot {
  std::atomic<unsigned long long> seq;
  std::atomic<long long> values[kCheckValues];  // [0]: how many follow (op hash, values, capturing, buffers, together, problem)
  std::atomic<unsigned long long> op[kOpWords];
};
constexpr size_t kWhyBytes = 512;
struct Mailbox {
  MailSlot slot[4];  // check_same: a rank is at most one call ahead of any peer that has not checked yet
  std::atomic<int> abort_from;  // rank + 1 of the peer that rejected a call; abort_why first
  char abort_why[kWhyBytes];
  CallSlot calls[kCallRing];
  // The last call whose peers' posts this rank has read on agree's together path. A rank leaves
  // such a call only once every peer that waited too has read its post: the calls after it may
  // be agreed ones, posted without waiting, and a ring of them would overwrite that post while a
  // slower peer is still to read it (which would then see a later call and report differing calls).
  std::atomic<unsigned long long> checked;
};
constexpr size_t kMailBytes = 8192;
static_assert(sizeof(Mailbox) <= kMailBytes && std::atomic<unsigned long long>::is_always_lock_free &&
              std::atomic<int>::is_always_lock_free && sizeof(std::atomic<int>) == sizeof(int));

// A peer rejected a call this rank had launched (this rank's abort word is set): the
// communicator is unusable from here on.
class PeerAborted : public Error {
 public:
  using Error::Error;
};

// agree_call's protocol for one rank over every rank's Mailbox (zeroed before any rank uses
// them). A plan's first call (or debug) waits for every rank's post of the call and all reach one
// verdict; later calls of an agreed plan compare with the posts already there and go on. Before
// posting call n a rank waits for every peer's post of call n - kCallRing and compares it with
// its own (whose slot it is about to reuse), so its calls run at most a ring ahead of the
// slowest peer's and every call is compared by the later poster of each pair; a watchdog thread
// compares the posts again as they come (two ranks that passed each other's posts unseen). A
// difference where a rank launched writes every peer's abort word.
class CallMail {
 public:
  // pids: every rank's process (for "exited" diagnostics). abort_peers: what rejecting a call a
  // peer may have launched does (the communicator marks itself unusable, then write_aborts);
  // null: write_aborts alone. skew_wait_s: how long a rank a ring ahead waits for a peer's post
  // (the communicator's device wait timeout: a rank may run minutes behind; 0 = forever);
  // check_wait_s: how long a plan's first call waits for every rank.
  CallMail(std::vector<Mailbox*> mail, std::vector<long long> pids, int rank, bool debug,
           std::function<void(const std::string&)> abort_peers = nullptr, double skew_wait_s = 0,
           double check_wait_s = 300);
  ~CallMail();
  CallMail(const CallMail&) = delete;
  CallMail& operator=(const CallMail&) = delete;

  // Communicator::agree_call's check (communicator.hpp); capturing: the call's stream captures a
  // graph (part of the plan). `buffers`: where peers reach this call's buffers (heap offsets or
  // registered places), compared on every call like the plan but not part of it: a new buffer
  // is no new plan (no wait), and a plan agreed with some buffers still compares the next call's.
  // Throws Error on a rejected call, PeerAborted once a peer wrote this rank's abort word.
  void agree(const std::string& op, const std::string& what, const std::vector<long long>& values,
             const std::string& problem, bool capturing, const std::vector<long long>& buffers = {});
  // Every peer's abort word (this rank's own too when `self`); the first writer of a word wins.
  void write_aborts(const std::string& why, bool self = false) noexcept;
  // Rank + 1 of the peer that wrote this rank's abort word (0: none), and its reason. A word a
  // writer has claimed but not yet published is waited for (up to 2 s; -1 if it never lands).
  int aborted_by() const;
  std::string abort_reason() const;
  unsigned long long calls() const { return call_seq_; }

 private:
  struct Posted {
    std::vector<long long> values;
    std::string op;
  };
  static void post(Mailbox& mb, unsigned long long n, const std::string& op, const std::vector<long long>& v);
  static unsigned long long read(const Mailbox& mb, unsigned long long n, Posted& out);
  static bool launched(const Posted& p);
  void write_abort(int r, const std::string& why) noexcept;
  void abort_peers(const std::string& why);
  template <class Stage, class Done>
  bool wait_for(int r, double limit_s, Stage&& stage, Done&& done);
  void bound_skew(unsigned long long n, const std::string& op);
  void watch() noexcept;

  std::vector<Mailbox*> mail_;
  std::vector<long long> pids_;
  int rank_, world_;
  bool debug_;
  std::function<void(const std::string&)> abort_peers_;
  double skew_wait_s_, check_wait_s_;
  unsigned long long call_seq_ = 0;
  std::set<std::vector<long long>> agreed_;  // plans (op hash, values, capturing) every rank checked together
  std::atomic<unsigned long long> posted_{0};
  std::thread watchdog_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
};

}  // namespace weave::runtime::mail
