#include "call_mail.hpp"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "weave/common/hash.hpp"

namespace weave::runtime::mail {

CallMail::CallMail(std::vector<Mailbox*> mail, std::vector<long long> pids, int rank, bool debug,
                   std::function<void(const std::string&)> abort_peers, double skew_wait_s, double check_wait_s)
    : mail_(std::move(mail)),
      pids_(std::move(pids)),
      rank_(rank),
      world_(static_cast<int>(mail_.size())),
      debug_(debug),
      abort_peers_(std::move(abort_peers)),
      skew_wait_s_(skew_wait_s),
      check_wait_s_(check_wait_s) {
  WEAVE_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_ && pids_.size() == mail_.size(), "CallMail: rank ", rank_,
              " of ", world_, " mailboxes, ", pids_.size(), " pids");
  if (world_ > 1) watchdog_ = std::thread([this] { watch(); });
}

CallMail::~CallMail() {
  if (!watchdog_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  watchdog_.join();
}

void CallMail::post(Mailbox& mb, unsigned long long n, const std::string& op, const std::vector<long long>& v) {
  CallSlot& s = mb.calls[n % kCallRing];
  s.seq.store(kWriting, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.values[0].store(static_cast<long long>(v.size()), std::memory_order_relaxed);
  for (int i = 1; i < kCheckValues; ++i)
    s.values[i].store(size_t(i) <= v.size() ? v[i - 1] : 0, std::memory_order_relaxed);
  for (int w = 0; w < kOpWords; ++w) {
    unsigned long long x = 0;
    const size_t at = std::min<size_t>(op.size(), 8 * w);
    std::memcpy(&x, op.c_str() + at, std::min<size_t>(8, op.size() - at));
    s.op[w].store(x, std::memory_order_relaxed);
  }
  s.seq.store(n, std::memory_order_release);
}

// The post of call n; returns the number the slot held (n when `out` was filled).
unsigned long long CallMail::read(const Mailbox& mb, unsigned long long n, Posted& out) {
  const CallSlot& s = mb.calls[n % kCallRing];
  const unsigned long long a = s.seq.load(std::memory_order_acquire);
  if (a != n) return a;
  const long long cnt = std::clamp<long long>(s.values[0].load(std::memory_order_relaxed), 0, kCheckValues - 1);
  out.values.assign(cnt, 0);
  for (long long i = 0; i < cnt; ++i) out.values[i] = s.values[i + 1].load(std::memory_order_relaxed);
  char name[8 * kOpWords + 1] = {};
  for (int w = 0; w < kOpWords; ++w) {
    const unsigned long long x = s.op[w].load(std::memory_order_relaxed);
    std::memcpy(name + 8 * w, &x, 8);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  const unsigned long long b = s.seq.load(std::memory_order_relaxed);
  out.op = name;
  return b;
}

// Posts are (op hash, the operator's values, capturing, buffers' digest, together, state): only a
// rank that neither waited nor rejected launched.
bool CallMail::launched(const Posted& p) {
  const size_t z = p.values.size();
  return z >= 2 && p.values[z - 2] == 0 && p.values[z - 1] == 0;
}

namespace {

// Two posts of one call differ in their plans (the values before (buffers, together, state)) or,
// with `places` (both launched: a rank that waits compares the places itself, after its own
// problem), in their buffers' places too.
bool plans_differ(const std::vector<long long>& a, const std::vector<long long>& b, bool places) {
  const size_t tail = places ? 2 : 3, k = a.size() >= tail ? a.size() - tail : 0;
  return a.size() != b.size() || !std::equal(a.begin(), a.begin() + k, b.begin());
}

std::string render_plan(const std::vector<long long>& values, const std::string& op) {
  std::string s = op + "(";
  const size_t n = values.size();
  for (size_t i = 1; i + 4 < n; ++i) s += (i > 1 ? ", " : "") + std::to_string(values[i]);
  return s + (n >= 5 && values[n - 4] ? ") while capturing a graph" : ")");
}

// Rank `me`'s and rank `r`'s differing posts of one call, for a message. Equal up to the digest
// (the operator's hash first: a posted name is cut at 32 characters), they differ in the places.
std::string two_calls(int me, const std::vector<long long>& a, const std::string& a_op, int r,
                      const std::vector<long long>& b, const std::string& b_op) {
  const size_t n = a.size();
  if (n == b.size() && n >= 3 && std::equal(a.begin(), a.end() - 3, b.begin()))
    return detail::concat("ranks ", me, " and ", r, " called ", render_plan(a, a_op),
                          " on buffers that peers reach at different places (each rank's must be at the same place ",
                          "of the symmetric heap or registered buffer)");
  return detail::concat("rank ", me, " called ", render_plan(a, a_op), ", rank ", r, " called ", render_plan(b, b_op));
}

// The digest of a call's buffers' places (0: none given).
long long buffers_digest(const std::vector<long long>& ids) {
  if (ids.empty()) return 0;
  return static_cast<long long>(
      fnv1a(std::string_view(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(long long))));
}

}  // namespace

void CallMail::write_abort(int r, const std::string& why) noexcept {
  Mailbox& mb = *mail_[r];
  int expected = 0;
  if (!mb.abort_from.compare_exchange_strong(expected, -1, std::memory_order_acq_rel)) return;  // first writer wins
  std::snprintf(mb.abort_why, kWhyBytes, "%s", why.c_str());
  mb.abort_from.store(rank_ + 1, std::memory_order_release);
}

void CallMail::write_aborts(const std::string& why, bool self) noexcept {
  for (int r = 0; r < world_; ++r)
    if (self || r != rank_) write_abort(r, why);
}

void CallMail::abort_peers(const std::string& why) {
  if (abort_peers_)
    abort_peers_(why);
  else
    write_aborts(why);
}

int CallMail::aborted_by() const {
  const std::atomic<int>& word = mail_[rank_]->abort_from;
  int from = word.load(std::memory_order_acquire);
  // Claimed, its reason still being copied: a kernel stops on the claim, but a host reader waits
  // for the rank and reason (a writer preempted mid-copy on a busy host takes milliseconds).
  const auto t0 = std::chrono::steady_clock::now();
  while (from < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    std::this_thread::yield();
    from = word.load(std::memory_order_acquire);
  }
  return from;
}

std::string CallMail::abort_reason() const {
  const Mailbox& mb = *mail_[rank_];
  return std::string(mb.abort_why, strnlen(mb.abort_why, kWhyBytes));
}

// Spins, then sleeps, until done() for peer r. False when this rank's abort word was set;
// throws when r exits or limit_s pass (0: no limit). stage() says what r is to do (built only
// for a message).
template <class Stage, class Done>
bool CallMail::wait_for(int r, double limit_s, Stage&& stage, Done&& done) {
  const auto t0 = std::chrono::steady_clock::now();
  for (long spins = 0; !done(); ++spins) {
    if (spins < 20000) continue;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (spins % 2000 != 0) continue;
    if (aborted_by() > 0) return false;
    if (kill(static_cast<pid_t>(pids_[r]), 0) != 0 && errno == ESRCH)
      throw Error(detail::concat("weave: rank ", r, " (pid ", pids_[r], ") exited before it could ", stage()));
    if (limit_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s)
      throw Error(detail::concat("weave: rank ", r, " did not ", stage(), " within ", limit_s, " s"));
  }
  return true;
}

// Before this rank's post of call n reuses the slot of call m = n - kCallRing: every peer's post
// of m, compared with this rank's own. A peer whose slot already holds a later call compared m
// itself before reusing it.
void CallMail::bound_skew(unsigned long long n, const std::string& op) {
  if (n <= static_cast<unsigned long long>(kCallRing) || world_ == 1) return;
  const unsigned long long m = n - kCallRing;
  Posted own;
  if (read(*mail_[rank_], m, own) != m) return;  // only this rank writes its slots
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    Posted p;
    unsigned long long got = 0;
    const bool read_it = wait_for(
        r, skew_wait_s_,
        [&] {
          return detail::concat("post its call ", m, " (rank ", rank_, "'s call ", n, " (", op,
                                ") waits for it: a rank runs at most ", kCallRing,
                                " calls ahead of another; the limit is the device wait timeout)");
        },
        [&] {
          got = read(*mail_[r], m, p);
          return got != kWriting && got >= m;
        });
    if (!read_it) throw PeerAborted(detail::concat("rank ", aborted_by() - 1, " rejected a call this rank had launched: ",
                                                   abort_reason()));
    if (got != m || !(launched(own) || launched(p)) ||
        !plans_differ(own.values, p.values, launched(own) && launched(p)))
      continue;
    const std::string why = detail::concat("call ", m, ": ", two_calls(rank_, own.values, own.op, r, p.values, p.op),
                                           "; found by rank ", rank_, " before its call ", n, ", after one had launched");
    abort_peers(why);
    throw Error("weave: " + why);
  }
}

void CallMail::watch() noexcept {
  unsigned long long next = 1;  // the first call not yet compared with every peer
  std::unique_lock<std::mutex> lk(watch_mu_);
  while (!watch_cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return watch_stop_; })) {
    const unsigned long long last = posted_.load(std::memory_order_acquire);
    if (last >= next + kCallRing) next = last - kCallRing + 1;  // older posts are overwritten
    for (; next <= last; ++next) {
      Posted own;
      if (read(*mail_[rank_], next, own) != next) break;
      bool all = true;
      for (int r = 0; r < world_; ++r) {
        if (r == rank_) continue;
        Posted p;
        const unsigned long long got = read(*mail_[r], next, p);
        if (got == kWriting || got < next) {
          all = false;  // not posted yet: compare on a later round
          continue;
        }
        if (got != next) continue;  // lapped: that peer compared it before reusing its slot
        // A difference matters only where a rank launched (agree rejected the rest).
        if ((launched(own) || launched(p)) && plans_differ(own.values, p.values, launched(own) && launched(p))) {
          const std::string why = detail::concat("call ", next, ": ", two_calls(rank_, own.values, own.op, r, p.values, p.op),
                                                 "; found by rank ", rank_, "'s watchdog after one had launched");
          write_aborts(why, true);
          return;
        }
      }
      if (!all) break;
    }
  }
}

void CallMail::agree(const std::string& op, const std::string& what, const std::vector<long long>& values,
                     const std::string& problem, bool capturing, const std::vector<long long>& buffers) {
  const int W = world_, me = rank_;
  if (const int from = aborted_by(); from > 0)
    throw PeerAborted(detail::concat("rank ", from - 1, " rejected a call this rank had launched: ", abort_reason()));
  WEAVE_CHECK(values.size() + 5 < kCheckValues, "agree_call: at most ", kCheckValues - 6, " values");
  std::vector<long long> key{static_cast<long long>(fnv1a(op))};
  key.insert(key.end(), values.begin(), values.end());
  key.push_back(capturing);
  const long long digest = buffers_digest(buffers);
  const bool together = debug_ || !agreed_.count(key);
  const bool waits = together || !problem.empty();  // the path below that waits for every post
  const unsigned long long n = call_seq_ + 1;
  bound_skew(n, op);  // may throw: then call n was not taken (no rank launches anything more)
  call_seq_ = n;
  // A post is the plan, whether this rank waits for the others (together), and its state: 0 it
  // goes on to launch (or, together, to the verdict), 1 it rejected the call and launches nothing.
  std::vector<long long> mine;
  // (A rank with a problem of its own waits too: its post says so, so that peers wait for its
  // handshake before reusing their slots.)
  auto post_mine = [&](int state) {
    mine = key;
    mine.push_back(digest);
    mine.push_back(waits ? 1 : 0);
    mine.push_back(state);
    post(*mail_[me], n, op, mine);
    posted_.store(n, std::memory_order_release);
  };
  const std::string call = detail::concat("call ", n, " on this communicator");
  auto same_key = [&](const Posted& p) {
    return p.values.size() == key.size() + 3 && std::equal(key.begin(), key.end(), p.values.begin());
  };
  auto same_plan = [&](const Posted& p) { return same_key(p) && p.values[key.size()] == digest; };
  auto differ = [&](int r, const Posted& p) {
    if (same_key(p)) {  // the same operator and arguments on other buffers
      std::string places;
      for (long long b : buffers) places += (places.empty() ? "" : ", ") + std::to_string(b);
      return detail::concat("weave: ", call, ": ", two_calls(me, mine, op, r, p.values, p.op), "; rank ", me,
                            "'s places: ", places.empty() ? "none" : places,
                            " (a symmetric tensor on one rank and an ordinary or another one on another cannot work)");
    }
    return detail::concat("weave: ", call, ": ranks call different operators or arguments (", what, "): rank ", me,
                          " calls ", render_plan(mine, op), ", rank ", r, " calls ", render_plan(p.values, p.op));
  };
  if (!waits) {
    // An agreed plan: compare with the posts already there, without waiting (the watchdog and the
    // later posters compare the rest once they come).
    mine = key, mine.push_back(digest), mine.push_back(0), mine.push_back(0);  // for differ()'s message
    for (int r = 0; r < W; ++r) {
      Posted p;
      // A peer that waits compares the places itself (after its own problem, if it has one).
      if (r != me && read(*mail_[r], n, p) == n && !(launched(p) ? same_plan(p) : same_key(p))) {
        post_mine(1);
        const std::string msg = differ(r, p);
        if (launched(p)) abort_peers(msg);
        throw Error(msg);
      }
    }
    post_mine(0);
    return;
  }
  // This plan's first call (or debug), or a problem with this rank's own arguments: every peer's
  // post of call n (a peer posts before it launches, without waiting for this rank), then one
  // verdict everywhere; peers that launched regardless are stopped through their abort words.
  post_mine(problem.empty() ? 0 : 1);
  const auto aborted = [&] {
    return PeerAborted(detail::concat("rank ", aborted_by() - 1, " rejected a call this rank had launched: ",
                                      abort_reason()));
  };
  std::vector<Posted> all(W);
  for (int r = 0; r < W; ++r) {
    if (r == me) {
      all[r] = Posted{mine, op};
      continue;
    }
    const bool read_it = wait_for(r, check_wait_s_, [&] { return detail::concat("reach the check of ", call, " (", op, ")"); }, [&] {
      const unsigned long long got = read(*mail_[r], n, all[r]);
      if (got != kWriting && got > n) {
        // A whole ring of calls past this one without stopping for it: its plans were agreed
        // ones, this rank's is not (or its own arguments are wrong), so the ranks' calls differ,
        // and it launched them.
        const std::string msg =
            !problem.empty() ? problem
                             : detail::concat("weave: ", call, ": rank ", r, " is ", got - n,
                                              "+ calls past this call without checking it (this rank calls ",
                                              render_plan(mine, op),
                                              "): the ranks' calls differ (or WEAVE_DEBUG differs between the ranks)");
        abort_peers(msg);
        throw Error(msg);
      }
      return got == n;
    });
    if (!read_it) throw aborted();
  }
  // Every post of call n is read here: one verdict, the same on every rank that waited.
  mail_[me]->checked.store(n, std::memory_order_release);
  bool launched_peer = false;
  for (int r = 0; r < W; ++r) launched_peer |= r != me && launched(all[r]);
  std::string verdict, told;  // the error, and what the peers' abort words say
  // Differing plans, then a rank's own problem (which may be why its buffers' places differ), then
  // the places.
  for (int r = 0; r < W && verdict.empty(); ++r)
    if (!same_key(all[r])) verdict = told = differ(r, all[r]);
  if (verdict.empty() && !problem.empty()) verdict = problem, told = detail::concat(call, " (", op, "): ", problem);
  for (int r = 0; r < W && verdict.empty(); ++r)
    if (all[r].values.back() != 0)
      verdict = told = detail::concat("weave: ", call, " (", op, "): rank ", r,
                                      " rejected its arguments (its error says why); every rank rejects the call");
  for (int r = 0; r < W && verdict.empty(); ++r)
    if (!same_plan(all[r])) verdict = told = differ(r, all[r]);
  if (!verdict.empty() && launched_peer) {
    abort_peers(told);  // a peer launched regardless: its kernels stop at its abort word (so do the waiting ranks)
    throw Error(verdict);
  }
  // Wait until every peer that waited too has read this rank's post, so that the agreed calls
  // after it cannot overwrite it first (a peer that launched does not wait, nor read it again).
  for (int r = 0; r < W; ++r) {
    const size_t z = all[r].values.size();
    const bool waited = z >= 2 && all[r].values[z - 2] == 1;
    if (r != me && waited &&
        !wait_for(r, check_wait_s_, [&] { return detail::concat("finish the check of ", call, " (", op, ")"); },
                  [&] { return mail_[r]->checked.load(std::memory_order_acquire) >= n; }))
      throw aborted();
  }
  if (!verdict.empty()) throw Error(verdict);
  agreed_.insert(key);
}

}  // namespace weave::runtime::mail
