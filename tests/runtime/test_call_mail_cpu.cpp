// The single-node communicator's cross-rank check of operator calls (src/runtime/call_mail.hpp,
// Communicator::agree_call's protocol) with threads as ranks over zeroed mailboxes in one
// process: a new plan is checked together and rejected alike on every rank, an agreed plan goes on
// without waiting (up to a ring of calls ahead of a sleeping peer, then it waits: no deadlock),
// and differing agreed plans end with an error or a set abort word (what a launched kernel polls)
// on every rank, naming both calls, whether the ranks run in step or one lags.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "call_mail.hpp"

namespace mail = weave::runtime::mail;

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Node {
  std::vector<std::unique_ptr<mail::Mailbox>> boxes;
  std::vector<mail::Mailbox*> ptrs;
  explicit Node(int world) {
    for (int r = 0; r < world; ++r) {
      boxes.push_back(std::make_unique<mail::Mailbox>());
      std::memset(static_cast<void*>(boxes.back().get()), 0, sizeof(mail::Mailbox));
      ptrs.push_back(boxes.back().get());
    }
  }
  // Runs body(rank, mail) on a thread per rank; returns each rank's text.
  std::vector<std::string> run(const std::function<std::string(int, mail::CallMail&)>& body) {
    const int world = static_cast<int>(ptrs.size());
    std::vector<std::string> out(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        // Waits bounded at 20 s: the threads share one pid, so a stuck peer is never "exited".
        mail::CallMail m(ptrs, std::vector<long long>(world, getpid()), r, false, nullptr, 20, 20);
        try {
          out[r] = body(r, m);
        } catch (const std::exception& e) {
          out[r] = std::string("threw: ") + e.what();
        }
      });
    for (auto& t : threads) t.join();
    return out;
  }
};

std::string describe(const std::vector<std::string>& out) {
  std::string s;
  for (size_t r = 0; r < out.size(); ++r) s += "\n  rank " + std::to_string(r) + ": " + out[r];
  return s;
}

// As a launched kernel does: poll this rank's abort word, up to `s` seconds.
std::string wait_like_a_kernel(mail::CallMail& m, double s = 10) {
  const auto t0 = std::chrono::steady_clock::now();
  while (m.aborted_by() == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > s) return "no abort";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return "aborted: " + m.abort_reason();
}

const std::vector<long long> kA{100, 1}, kC{400, 1};

TEST(CallMail, NewPlansTogetherAgreedPlansWithoutWaiting) {
  Node node(2);
  const auto out = node.run([](int r, mail::CallMail& m) {
    std::string report;
    m.agree("all_gather", "count, dtype", kA, "", false);
    m.agree("reduce_scatter", "count, dtype", kC, "", false);
    try {  // different operators, new to both: rejected on both, nothing launched
      m.agree(r == 0 ? "all_gather" : "all_reduce", "count, dtype", {200, 1}, "", false);
      report += "different operators agreed; ";
    } catch (const weave::Error& e) {
      report += has(e.what(), "ranks call different operators") && has(e.what(), "all_gather(200, 1)") &&
                        has(e.what(), "all_reduce(200, 1)")
                    ? "mismatch ok; "
                    : std::string("mismatch message: ") + e.what() + "; ";
    }
    try {  // one rank's own problem on a new plan
      m.agree("reduce_scatter", "count, dtype", {300, 1}, r == 1 ? "rank 1's buffer is short" : "", false);
      report += "a problem agreed; ";
    } catch (const weave::Error& e) {
      const bool ok = r == 1 ? has(e.what(), "rank 1's buffer is short") : has(e.what(), "rank 1 rejected its arguments");
      report += ok ? "problem ok; " : std::string("problem message: ") + e.what() + "; ";
    }
    // Agreed plans alternating: rank 1 sleeps; rank 0's calls within a ring do not wait for it,
    // then three rings more on both (rank 0 waits where it would run a ring ahead).
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < mail::kCallRing - 2; ++i)
      m.agree(i % 2 ? "reduce_scatter" : "all_gather", "count, dtype", i % 2 ? kC : kA, "", false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 && s > 0.5) report += "agreed calls waited for the peer (" + std::to_string(s) + " s); ";
    for (int i = 0; i < 3 * mail::kCallRing; ++i)
      m.agree(i % 2 ? "all_gather" : "reduce_scatter", "count, dtype", i % 2 ? kA : kC, "", false);
    // The bound held: rank 0 could not finish a ring ahead of its sleeping peer's posts.
    const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 && all < 0.8) report += "rank 0 ran a ring ahead of its peer (" + std::to_string(all) + " s); ";
    if (m.aborted_by()) report += "aborted: " + m.abort_reason();
    return report;
  });
  for (const auto& o : out) EXPECT_EQ(o, "mismatch ok; problem ok; ") << describe(out);
}

// Both ranks have a problem of their own on an agreed plan: nobody launches, nobody is stopped, and
// the agreed calls after it (a ring and more) run; a rank that waits posts so (the peer waits for
// its handshake before reusing its slot, instead of lapping it).
TEST(CallMail, ProblemsOnAnAgreedPlan) {
  Node node(2);
  const auto out = node.run([](int r, mail::CallMail& m) {
    m.agree("all_gather", "count, dtype", kA, "", false);
    std::string report;
    try {
      m.agree("all_gather", "count, dtype", kA, "rank " + std::to_string(r) + "'s pointer is bad", false);
      report += "a problem agreed; ";
    } catch (const weave::Error& e) {
      report += has(e.what(), "pointer is bad") ? "problem ok; " : std::string("problem message: ") + e.what() + "; ";
    }
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int i = 0; i < 2 * mail::kCallRing; ++i) m.agree("all_gather", "count, dtype", kA, "", false);
    if (m.aborted_by()) report += "aborted: " + m.abort_reason();
    return report;
  });
  for (const auto& o : out) EXPECT_EQ(o, "problem ok; ") << describe(out);
}

// Agreed plans that differ at the third call of a burst of 40, with the ranks in step, one rank
// lagging, and 3 ranks: every rank ends with an error or its abort word set, naming both calls.
TEST(CallMail, DifferingAgreedPlansEndOnEveryRank) {
  for (const int world : {2, 3})
    for (const int lag_ms : {0, 300}) {
      Node node(world);
      const auto out = node.run([&](int r, mail::CallMail& m) {
        std::string msg;
        try {  // a rank still in the first calls may be stopped there (its peers ran on to the third)
          m.agree("all_gather", "count, dtype", kA, "", false);
          m.agree("reduce_scatter", "count, dtype", kC, "", false);
          if (r == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(lag_ms));
          for (int i = 0; i < 40; ++i) {
            const bool odd = i == 2 && r == 0;
            m.agree(odd ? "reduce_scatter" : "all_gather", "count, dtype", odd ? kC : kA, "", false);
          }
          msg = wait_like_a_kernel(m);
        } catch (const weave::Error& e) {
          msg = e.what();
        }
        return has(msg, "all_gather") && has(msg, "reduce_scatter") ? std::string("ok") : msg;
      });
      for (const auto& o : out) EXPECT_EQ(o, "ok") << "world " << world << ", lag " << lag_ms << " ms" << describe(out);
    }
}

// A rank at a new plan while its peer runs agreed calls: the waiting rank finds the launched post
// and stops the peer.
TEST(CallMail, NewPlanAgainstAgreedPlan) {
  Node node(2);
  const auto out = node.run([](int r, mail::CallMail& m) {
    std::string msg;
    try {
      m.agree("all_gather", "count, dtype", kA, "", false);
      if (r == 0)
        m.agree("all_gather", "count, dtype", kA, "", false);
      else
        m.agree("all_reduce", "count, dtype", {64, 3}, "", false);
      msg = wait_like_a_kernel(m);
    } catch (const weave::Error& e) {
      msg = e.what();
    }
    return has(msg, "all_gather(100, 1)") && has(msg, "all_reduce(64, 3)") ? std::string("ok") : msg;
  });
  for (const auto& o : out) EXPECT_EQ(o, "ok") << describe(out);
}

// Buffers' places, compared on every call but not part of the plan: on a plan's first call a
// difference is rejected on every rank, with both still usable; the ranks moving to other buffers
// together keep the plan agreed (no wait, no error); one rank moving alone on an agreed plan ends
// with an error or its abort word set on every rank, naming the buffers.
TEST(CallMail, BuffersComparedEveryCall) {
  Node node(2);
  const auto out = node.run([](int r, mail::CallMail& m) {
    std::string report;
    try {  // a new plan, rank 1's buffer elsewhere (an operator name longer than a post holds)
      m.agree("collectives.all_to_all.seq_to_head", "count, dtype", kA, "", false, {4096, r == 0 ? 8192 : 12288});
      report += "different buffers agreed; ";
    } catch (const weave::Error& e) {
      report += has(e.what(), "buffers that peers reach at different places") && has(e.what(), "4096, ")
                    ? "first call ok; "
                    : std::string("first-call message: ") + e.what() + "; ";
    }
    m.agree("all_gather", "count, dtype", kA, "", false, {4096, 8192});  // agreed now
    // Both ranks on other buffers: the same plan, no wait even with the peer asleep.
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const auto t0 = std::chrono::steady_clock::now();
    m.agree("all_gather", "count, dtype", kA, "", false, {65536, 8192});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0 && s > 0.5) report += "new buffers waited (" + std::to_string(s) + " s); ";
    std::string msg;
    try {  // rank 0 alone on another output
      m.agree("all_gather", "count, dtype", kA, "", false, {65536, r == 0 ? 1 << 20 : 8192});
      msg = wait_like_a_kernel(m);
    } catch (const weave::Error& e) {
      msg = e.what();
    }
    report += has(msg, "different places") ? "moved alone ok" : "moved alone: " + msg;
    return report;
  });
  for (const auto& o : out) EXPECT_EQ(o, "first call ok; moved alone ok") << describe(out);
  // A rank whose own problem is a bad buffer (so its place differs too) is told its problem, and
  // its peer that the rank rejected its arguments, not that the places differ.
  Node fresh(2);
  const auto told = fresh.run([](int r, mail::CallMail& m) {
    try {
      m.agree("all_gather", "count, dtype", kA, r == 1 ? "rank 1's output is not symmetric" : "", false,
              {4096, r == 1 ? -1 : 8192});
      return std::string("agreed");
    } catch (const weave::Error& e) {
      return std::string(has(e.what(), r == 1 ? "not symmetric" : "rank 1 rejected its arguments") ? "ok" : e.what());
    }
  });
  for (const auto& o : told) EXPECT_EQ(o, "ok") << describe(told);
}

// A writer claims a rank's abort word, copies its reason, then publishes its rank; a host reader
// that comes between (the writer preempted mid-copy, as on a busy CI host) gets the rank and the
// whole reason, not the claim and an empty reason.
TEST(CallMail, ReaderWaitsForAClaimedAbortWord) {
  Node node(2);
  mail::Mailbox& mine = *node.ptrs[0];
  mine.abort_from.store(-1);  // as write_abort's claim
  mail::CallMail reader(node.ptrs, std::vector<long long>(2, getpid()), 0, false);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::snprintf(mine.abort_why, mail::kWhyBytes, "%s", "call 3: all_gather against reduce_scatter");
    mine.abort_from.store(2, std::memory_order_release);
  });
  const int from = reader.aborted_by();
  const std::string why = reader.abort_reason();
  writer.join();
  EXPECT_EQ(from, 2);
  EXPECT_EQ(why, "call 3: all_gather against reduce_scatter");
}

}  // namespace
