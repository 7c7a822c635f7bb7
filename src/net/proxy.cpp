#include "weave/net/proxy.hpp"

#include <cuda_runtime.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "weave/common/error.hpp"
#include "host_buffer.hpp"
#include "weave/net/queue.cuh"
#include "weave/runtime/bootstrap.hpp"
#include "weave/runtime/env.hpp"
#include "weave/runtime/net_bootstrap.hpp"

namespace weave::net {

using detail::concat;
using queue_detail::load_acquire;
using queue_detail::store_release;

void stage_device_to_host(void*, const void*, size_t) {
  throw Error(
      "weave::net: staging device memory through host bounce buffers is not written yet (the GPU path: a "
      "cudaMemcpyAsync and an event per command); providers with FI_HMEM register device memory directly");
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A rank's message to every peer when its proxy fails; the check word (written with the text in
// one write) makes a half-landed note unreadable, whatever order the provider delivers in.
struct AbortNote {
  uint64_t check;
  char text[1016];
};
static_assert(sizeof(AbortNote) == 1024);

// FNV-1a of n bytes, never 0 (0 marks an empty note or post).
uint64_t check_word(const void* p, size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h | 1;
}

uint64_t note_check(const char* text) { return check_word(text, strnlen(text, sizeof(AbortNote::text))); }

// A call's post as it travels: its check word makes a half-landed post unreadable, as a note's.
static_assert(std::is_trivially_copyable_v<CallPost> && sizeof(CallPost) == 8 + 4 * 4 + 8 * kPostValues + 232,
              "CallPost must have no padding: its bytes are hashed");
struct PostSlot {
  uint64_t check;
  CallPost body;
};

uint64_t post_check(const CallPost& b) { return check_word(&b, sizeof(CallPost)); }

// What ranks exchange through the bootstrap at set-up.
struct PeerInfo {
  uint8_t addr[224];
  uint32_t addr_len;
  int32_t pid;
  char host[64];
  RemoteRegion recv;     // where this rank's peers write data
  RemoteRegion control;  // flags | heartbeats | abort notes | checked calls | call posts
  uint32_t nflags;
  uint32_t notify;  // Notify: how this rank learns of arrivals (its peers must write accordingly)
};

// A process on this host that has exited (or is a zombie): the peer is gone, not slow.
bool process_gone(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(f, stat);
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && (stat[close + 2] == 'Z' || stat[close + 2] == 'X');
}

// A failure that a peer's abort note reported: not sent on to the others (the peer did).
struct PeerReported : Error {
  using Error::Error;
};

enum Phase : int { kRunning, kDraining, kQuiet, kStopped };

// A command between leaving the ring and completing.
struct InFlight {
  Command cmd{};
  uint64_t ticket = 0;
  Clock::time_point since;  // taken; reset when its last write is posted
  OpContext ops[2];
  uint8_t nops = 0, posted = 0, done = 0;
  bool used = false, staged = false;
};

}  // namespace

struct Proxy::Impl {
  Transport& tr;
  std::unique_ptr<Rendezvous> boot_own;
  Rendezvous& boot;
  ProxyOptions opt;
  int rank = 0, world = 1;
  double timeout_s = 30, silence_s = 30, heartbeat_s = 0.1;
  Notify notify = Notify::ordered;
  uint32_t max_out = 1;

  HostBuffer ring_mem, control_mem, scratch_mem, bounce_mem;
  RingControl* ctl = nullptr;
  Command* slots = nullptr;
  uint64_t* flags = nullptr;         // control: arrival flags
  uint64_t* hb_in = nullptr;         // control: peers' heartbeats
  AbortNote* notes_in = nullptr;     // control: peers' abort notes
  uint64_t* flag_src = nullptr;      // scratch: ordered-mode flag values, one per in-flight slot
  uint64_t* hb_out = nullptr;        // scratch: heartbeat values, one per peer
  AbortNote* note_out = nullptr;     // scratch: this rank's abort note
  uint64_t* chk_in = nullptr;        // control: the last call each peer checked together
  PostSlot* posts_in = nullptr;      // control: peers' call posts, kCallRing per peer
  uint64_t* chk_out = nullptr;       // scratch: this rank's checked call, one per peer
  PostSlot* posts_out = nullptr;     // scratch: this rank's call posts, kCallRing
  const Region* send_reg = nullptr;  // nullptr while sources are staged
  const Region* control_reg = nullptr;
  const Region* scratch_reg = nullptr;
  const Region* bounce_reg = nullptr;
  char* send_base = nullptr;
  size_t send_bytes = 0;
  std::vector<PeerInfo> peers;

  std::vector<InFlight> inflight;
  std::vector<uint32_t> free_slots;
  std::vector<std::deque<uint32_t>> pending;  // per peer: taken, not yet fully posted
  uint64_t next_ticket = 0, completed = 0;

  std::vector<OpContext> hb_ops, note_ops;
  std::vector<uint8_t> hb_busy, note_busy;
  std::vector<uint64_t> hb_seen;
  std::vector<Clock::time_point> hb_changed;
  Clock::time_point last_hb, last_liveness;
  uint64_t hb_counter = 0;

  // The calls' mailbox. The host thread fills posts_out[call % kCallRing] once the slot's earlier
  // post reached every peer (post_left 0) and this thread compared call - kCallRing with every
  // peer's (compared), then publishes post_ready; this thread sends each post to every peer in
  // order and keeps a copy for its watchdog (own_copy), which compares posts of one call as they
  // come (cmp_next: the first call not yet compared with every peer). Waiting for `compared`
  // bounds how far this rank's calls run ahead of the slowest peer's posts to kCallRing, so no
  // post is overwritten before one of the two ranks compared it.
  std::atomic<uint64_t> post_ready{0}, chk_want{0}, compared{0};
  std::atomic<int> post_left[kCallRing] = {};
  std::vector<uint64_t> post_sent, chk_sent;  // per peer: the last call sent
  std::vector<OpContext> post_ops, chk_ops;   // post_ops[slot * world + peer]
  std::vector<uint8_t> chk_busy;
  CallPost own_copy[kCallRing];
  uint64_t own_seen = 0, cmp_next = 1;

  std::atomic<int> phase{kRunning};
  std::atomic<bool> drained{false}, quiet{false}, has_failed{false};
  // Proxy::abort from another thread: the transport belongs to the proxy thread, so the request
  // is handed over and the thread fails with it (its notes go out from there).
  std::atomic<bool> abort_requested{false};
  std::string abort_why;  // under mu
  mutable std::mutex mu;
  std::string error;
  std::thread thread;

  struct Counters {
    std::atomic<uint64_t> taken{0}, posted{0}, completed{0}, submissions{0}, writes{0}, arrivals{0}, queue_full{0};
    std::atomic<uint64_t> batch_sizes[kMaxBatch + 1] = {};
  } st;

  Impl(Transport& t, std::unique_ptr<Rendezvous> b, const ProxyOptions& o)
      : tr(t), boot_own(std::move(b)), boot(*boot_own), opt(o) {}

  static void bump(std::atomic<uint64_t>& c, uint64_t n = 1) { c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }

  size_t hb_offset(int from) const { return (opt.flags + static_cast<size_t>(from)) * sizeof(uint64_t); }
  size_t note_offset(int from) const {
    return (opt.flags + static_cast<size_t>(world)) * sizeof(uint64_t) + static_cast<size_t>(from) * sizeof(AbortNote);
  }
  size_t chk_offset(int from) const { return note_offset(world) + static_cast<size_t>(from) * sizeof(uint64_t); }
  size_t post_offset(int from, int slot) const {
    return chk_offset(world) + (static_cast<size_t>(from) * kCallRing + slot) * sizeof(PostSlot);
  }
  char* bounce(uint32_t slot) const { return bounce_mem.get() + static_cast<size_t>(slot) * opt.bounce_bytes; }

  void setup(void* send, size_t sbytes, MemKind send_kind, void* recv, size_t rbytes) {
    rank = boot.rank();
    world = boot.world();
    timeout_s = opt.timeout_s >= 0 ? opt.timeout_s : env::get_seconds("WEAVE_NET_TIMEOUT_S");
    silence_s = opt.silence_s >= 0 ? opt.silence_s : timeout_s;
    heartbeat_s = opt.heartbeat_s > 0 ? opt.heartbeat_s : std::min(0.1, silence_s / 8);
    notify = tr.notify();
    WEAVE_CHECK(opt.queue_slots >= 2 && (opt.queue_slots & (opt.queue_slots - 1)) == 0,
                "weave::net: queue_slots (", opt.queue_slots, ") must be a power of two >= 2");
    WEAVE_CHECK(opt.batch >= 1 && opt.batch <= kMaxBatch, "weave::net: batch (", opt.batch, ") must be 1 to ", kMaxBatch);
    WEAVE_CHECK(world <= 0xffff, "weave::net: a command names peers in 16 bits");
    WEAVE_CHECK(tr.peers() == 0, "weave::net: the transport already has peers; one proxy per transport");
    // Two writes per command at most, one heartbeat and one note per peer (the call posts and
    // checked words, up to kCallRing + 1 per peer, are retried when the endpoint is full).
    const size_t room = tr.tx_depth() > 2 * static_cast<size_t>(world) + 2 ? tr.tx_depth() - 2 * world : 2;
    max_out = static_cast<uint32_t>(std::max<size_t>(1, std::min<size_t>(opt.max_outstanding, room / 2)));

    ring_mem = HostBuffer(sizeof(RingControl) + opt.queue_slots * sizeof(Command), opt.mapped_ring);
    ctl = reinterpret_cast<RingControl*>(ring_mem.get());
    slots = reinterpret_cast<Command*>(ring_mem.get() + sizeof(RingControl));
    control_mem = HostBuffer(post_offset(world, 0), opt.mapped_ring);
    flags = reinterpret_cast<uint64_t*>(control_mem.get());
    hb_in = flags + opt.flags;
    notes_in = reinterpret_cast<AbortNote*>(control_mem.get() + note_offset(0));
    chk_in = reinterpret_cast<uint64_t*>(control_mem.get() + chk_offset(0));
    posts_in = reinterpret_cast<PostSlot*>(control_mem.get() + post_offset(0, 0));
    scratch_mem = HostBuffer((max_out + 2 * world) * sizeof(uint64_t) + sizeof(AbortNote) + kCallRing * sizeof(PostSlot),
                             false);
    flag_src = reinterpret_cast<uint64_t*>(scratch_mem.get());
    hb_out = flag_src + max_out;
    note_out = reinterpret_cast<AbortNote*>(hb_out + world);
    chk_out = reinterpret_cast<uint64_t*>(note_out + 1);
    posts_out = reinterpret_cast<PostSlot*>(chk_out + world);

    send_base = static_cast<char*>(send);
    send_bytes = sbytes;
    if (send_kind == MemKind::device && !tr.device_memory()) {
      bounce_mem = HostBuffer(static_cast<size_t>(max_out) * opt.bounce_bytes, opt.mapped_ring);
      bounce_reg = &tr.register_memory(bounce_mem.get(), bounce_mem.bytes());
    } else if (send_bytes) {
      send_reg = &tr.register_memory(send, send_bytes, send_kind);
    }
    control_reg = &tr.register_memory(control_mem.get(), control_mem.bytes());
    scratch_reg = &tr.register_memory(scratch_mem.get(), scratch_mem.bytes());

    PeerInfo mine{};
    const std::vector<uint8_t> addr = tr.address();
    WEAVE_CHECK(addr.size() <= sizeof(mine.addr), "weave::net: fabric address of ", addr.size(), " bytes is too long");
    std::memcpy(mine.addr, addr.data(), addr.size());
    mine.addr_len = static_cast<uint32_t>(addr.size());
    mine.pid = getpid();
    gethostname(mine.host, sizeof(mine.host) - 1);
    mine.recv = rbytes ? tr.register_memory(recv, rbytes).remote : RemoteRegion{0, 0, 0};
    mine.control = control_reg->remote;
    mine.nflags = opt.flags;
    mine.notify = static_cast<uint32_t>(tr.notify());
    peers.resize(static_cast<size_t>(world));
    boot.all_gather(&mine, peers.data(), sizeof(PeerInfo));
    // Every rank writes into its peers' control regions at offsets it computes from its own flag
    // count, and in its own arrival mode: both must be the same everywhere. The gathered table is,
    // so every rank refuses a difference alike, naming the ranks.
    for (int p = 1; p < world; ++p) {
      const PeerInfo& a = peers[0];
      const PeerInfo& b = peers[p];
      WEAVE_CHECK(a.nflags == b.nflags && a.notify == b.notify, "weave::net: the ranks' proxies differ: rank 0 has ",
                  a.nflags, " arrival flags and ", notify_name(static_cast<Notify>(a.notify)), " arrivals, rank ", p,
                  " has ", b.nflags, " and ", notify_name(static_cast<Notify>(b.notify)),
                  " (ProxyOptions::flags and the notification mode, WEAVE_NET_NOTIFY, must be the same on every rank)");
    }
    for (int p = 0; p < world; ++p) {
      const int index = tr.add_peer(peers[p].addr, peers[p].addr_len);
      WEAVE_CHECK(index == p, "weave::net: peer ", p, " got index ", index);
    }

    inflight.resize(max_out);
    for (uint32_t i = max_out; i-- > 0;) free_slots.push_back(i);
    pending.resize(static_cast<size_t>(world));
    hb_ops.resize(static_cast<size_t>(world));
    note_ops.resize(static_cast<size_t>(world));
    hb_busy.assign(static_cast<size_t>(world), 0);
    note_busy.assign(static_cast<size_t>(world), 0);
    hb_seen.assign(static_cast<size_t>(world), 0);
    hb_changed.assign(static_cast<size_t>(world), Clock::now());
    for (int p = 0; p < world; ++p) {
      hb_ops[p].kind = OpKind::heartbeat;
      note_ops[p].kind = OpKind::abort_note;
    }
    post_sent.assign(static_cast<size_t>(world), 0);
    chk_sent.assign(static_cast<size_t>(world), 0);
    chk_busy.assign(static_cast<size_t>(world), 0);
    post_ops.resize(static_cast<size_t>(kCallRing) * world);
    chk_ops.resize(static_cast<size_t>(world));
    for (int p = 0; p < world; ++p) {
      chk_ops[p].kind = OpKind::call_checked;
      chk_ops[p].peer = p;
      for (int slot = 0; slot < kCallRing; ++slot) {
        OpContext& op = post_ops[static_cast<size_t>(slot) * world + p];
        op.kind = OpKind::call_post;
        op.peer = p;
        op.owner = static_cast<uint32_t>(slot);
      }
    }
    last_hb = last_liveness = Clock::now();
  }

  // ---- the loop ---------------------------------------------------------------------------

  void run() {
    Completion c[32];
    uint32_t idle = 0, iteration = 0;
    Clock::time_point last_house = Clock::now();
    try {
      for (;;) {
        const int ph = phase.load(std::memory_order_acquire);
        if (ph == kStopped) break;
        if (abort_requested.load(std::memory_order_acquire)) {
          std::string why;
          {
            std::lock_guard<std::mutex> lock(mu);
            why = abort_why;
          }
          throw Error(why);
        }
        bool work = reap(c);
        work |= take();
        work |= post_pending();
        work |= send_posts();
        work |= compare_posts();
        if (ph >= kDraining && free_slots.size() == max_out && !ring_ready()) drained.store(true);
        if (ph >= kQuiet && !any(hb_busy) && !any(chk_busy) && posts_in_flight() == 0 && !checked_unsent())
          quiet.store(true);
        idle = work ? 0 : idle + 1;
        if (!work || (++iteration & 63) == 0) {
          const Clock::time_point now = Clock::now();
          if (now - last_house >= std::chrono::milliseconds(1)) {
            housekeeping(now, ph);
            last_house = now;
          }
        }
        // Idle: spin a while, then yield the core, then nap (idle_sleep_us; < 0: always spin).
        if (opt.idle_sleep_us >= 0 && idle > 256) {
          if (idle > 4096 && opt.idle_sleep_us > 0)
            std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(opt.idle_sleep_us));
          else
            sched_yield();
        }
      }
    } catch (const PeerReported& e) {
      fail(e.what(), false);
    } catch (const std::exception& e) {
      // A peer's own diagnostic explains more than what its failure did here (a broken
      // connection, a silent or exited peer): prefer it where it has come. A peer that failed
      // and exited at once may have its note still on the way (sent, not yet progressed here):
      // progress the transport a little first.
      try {
        drain_for_notes();
      } catch (const PeerReported& why) {
        fail(why.what(), false);
        return;
      }
      fail(e.what(), true);
    }
  }

  static bool any(const std::vector<uint8_t>& v) {
    for (uint8_t x : v)
      if (x) return true;
    return false;
  }

  bool ring_ready() const { return load_acquire(&slots[next_ticket & (opt.queue_slots - 1)].seq) == next_ticket + 1; }

  bool reap(Completion* c) {
    const size_t n = tr.poll(c, 32);
    for (size_t i = 0; i < n; ++i) {
      if (!c[i].op) {
        arrival(c[i].data);
        continue;
      }
      OpContext* op = c[i].op;
      if (op->kind == OpKind::heartbeat) {
        hb_busy[op->peer] = 0;
      } else if (op->kind == OpKind::abort_note) {
        note_busy[op->peer] = 0;
      } else if (op->kind == OpKind::call_post) {
        post_left[op->owner].fetch_sub(1, std::memory_order_acq_rel);
      } else if (op->kind == OpKind::call_checked) {
        chk_busy[op->peer] = 0;
      } else {
        InFlight& f = inflight[op->owner];
        if (++f.done == f.nops) complete(op->owner);
      }
    }
    return n > 0;
  }

  // Unordered mode: a peer's write with immediate data (the chunk id) has landed.
  void arrival(uint64_t imm) {
    const uint64_t chunk = imm & 0xffffffffu;
    if (chunk >= opt.flags)
      throw Error(concat("a write with immediate data named chunk ", chunk, ", beyond this rank's ", opt.flags, " flags"));
    // The count first: a reader that acquires the flag's new value then sees the count too.
    bump(st.arrivals);
    store_release(&flags[chunk], flags[chunk] + 1);  // this thread is the flag's only writer
  }

  void complete(uint32_t slot) {
    InFlight& f = inflight[slot];
    f.used = false;
    bump(st.completed);
    if (opt.on_completed) opt.on_completed(f.ticket);  // before producers can see it
    store_release(&ctl->completed, ++completed);
    free_slots.push_back(slot);
  }

  // Every ready command, up to the outstanding limit, out of the ring; then the credits.
  bool take() {
    const uint64_t first = next_ticket;
    while (!free_slots.empty() && ring_ready()) {
      const uint32_t slot = free_slots.back();
      free_slots.pop_back();
      InFlight& f = inflight[slot];
      f.cmd = slots[next_ticket & (opt.queue_slots - 1)];
      f.ticket = next_ticket++;
      f.since = Clock::now();
      f.used = true;
      f.staged = false;
      f.posted = f.done = 0;
      const bool notify_cmd = f.cmd.flags & kNotify;
      f.nops = notify_cmd && notify == Notify::ordered ? (f.cmd.bytes ? 2 : 1) : (notify_cmd || f.cmd.bytes ? 1 : 0);
      validate(f);
      bump(st.taken);
      if (opt.on_taken) opt.on_taken(f.ticket);
      if (f.nops == 0)
        complete(slot);
      else
        pending[f.cmd.peer].push_back(slot);
    }
    if (next_ticket == first) return false;
    store_release(&ctl->head, next_ticket);
    return true;
  }

  void validate(const InFlight& f) const {
    const Command& c = f.cmd;
    const auto where = [&] { return concat("command ", f.ticket, " (chunk ", c.chunk, " to peer ", c.peer, "): "); };
    if (c.peer >= world) throw Error(concat(where(), "no such peer (world ", world, ")"));
    if (c.src_offset > send_bytes || c.bytes > send_bytes - c.src_offset)
      throw Error(concat(where(), "source [", c.src_offset, ", +", c.bytes, ") is outside the send region of ", send_bytes,
                         " bytes"));
    const uint64_t dst = peers[c.peer].recv.bytes;
    if (c.dst_offset > dst || c.bytes > dst - c.dst_offset)
      throw Error(concat(where(), "destination [", c.dst_offset, ", +", c.bytes, ") is outside the peer's receive region of ",
                         dst, " bytes"));
    if ((c.flags & kNotify) && c.chunk >= peers[c.peer].nflags)
      throw Error(concat(where(), "the peer has ", peers[c.peer].nflags, " arrival flags"));
    if (bounce_reg && c.bytes > opt.bounce_bytes)
      throw Error(concat(where(), c.bytes, " bytes exceed the bounce buffer (", opt.bounce_bytes, ")"));
  }

  // Per peer: submissions of up to `batch` ready commands, FI_MORE on all but the last write.
  bool post_pending() {
    bool any_posted = false;
    for (int p = 0; p < world; ++p) {
      std::deque<uint32_t>& q = pending[p];
      while (!q.empty()) {
        size_t k = std::min<size_t>(opt.batch, q.size());
        for (size_t j = 0; j < k; ++j)
          if (inflight[q[j]].cmd.flags & kLastOfBatch) k = j + 1;
        size_t n = 0;
        while (n < k && post_command(q[n], n + 1 == k)) ++n;
        for (size_t j = 0; j < n; ++j) q.pop_front();
        if (n) {
          bump(st.submissions);
          bump(st.batch_sizes[n]);
          any_posted = true;
        }
        if (n < k) {  // the endpoint is full: reap first
          bump(st.queue_full);
          return any_posted;
        }
      }
    }
    return any_posted;
  }

  // Posts the command's writes not yet posted; false when the endpoint refused one (FI_EAGAIN).
  bool post_command(uint32_t slot, bool last_of_submission) {
    InFlight& f = inflight[slot];
    const Command& c = f.cmd;
    const PeerInfo& peer = peers[c.peer];
    const bool ordered_flag = (c.flags & kNotify) && notify == Notify::ordered;
    while (f.posted < f.nops) {
      const bool more = !(last_of_submission && f.posted + 1 == f.nops);
      OpContext& op = f.ops[f.posted];
      op.chunk = c.chunk;
      op.owner = slot;
      bool ok;
      if (ordered_flag && f.posted + 1 == f.nops) {  // the flag after the data
        op.kind = OpKind::flag_write;
        flag_src[slot] = c.flag_value;
        ok = tr.write(c.peer, *scratch_reg, &flag_src[slot], peer.control, c.chunk * sizeof(uint64_t), sizeof(uint64_t),
                      &op, more);
      } else {
        const Region* local = send_reg;
        const char* src = send_base + c.src_offset;
        if (bounce_reg) {
          if (!f.staged && c.bytes) opt.stage(bounce(slot), src, c.bytes);
          f.staged = true;
          local = bounce_reg;
          src = bounce(slot);
        } else if (!local) {  // an empty send region: zero-byte writes only
          local = scratch_reg;
          src = scratch_mem.get();
        }
        const bool imm = (c.flags & kNotify) && notify == Notify::unordered;
        op.kind = imm ? OpKind::data_write_imm : OpKind::data_write;
        ok = imm ? tr.write_data(c.peer, *local, src, peer.recv, c.dst_offset, c.bytes, c.chunk, &op, more)
                 : tr.write(c.peer, *local, src, peer.recv, c.dst_offset, c.bytes, &op, more);
      }
      if (!ok) return false;
      ++f.posted;
      bump(st.writes);
    }
    f.since = Clock::now();
    bump(st.posted);
    if (opt.on_posted) opt.on_posted(f.ticket);
    return true;
  }

  // ---- the calls' mailbox ----------------------------------------------------------------

  bool checked_unsent() const {
    const uint64_t want = chk_want.load(std::memory_order_acquire);
    for (int p = 0; p < world; ++p)
      if (p != rank && chk_sent[p] < want) return true;
    return false;
  }

  int posts_in_flight() const {
    int n = 0;
    for (const auto& left : post_left) n += left.load(std::memory_order_acquire);
    return n;
  }

  // New posts to every peer, in call order; the checked call to peers that lack it.
  bool send_posts() {
    const uint64_t ready = post_ready.load(std::memory_order_acquire);
    bool sent = false;
    if (world == 1) own_seen = ready;  // no peer to compare with (and the host does not wait for this copy)
    for (; own_seen < ready; ++own_seen) own_copy[(own_seen + 1) % kCallRing] = posts_out[(own_seen + 1) % kCallRing].body;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      while (post_sent[p] < ready) {
        const int slot = static_cast<int>((post_sent[p] + 1) % kCallRing);
        if (!tr.write(p, *scratch_reg, &posts_out[slot], peers[p].control, post_offset(rank, slot), sizeof(PostSlot),
                      &post_ops[static_cast<size_t>(slot) * world + p], false))
          break;  // the endpoint is full: after the next reap
        ++post_sent[p];
        sent = true;
      }
    }
    const uint64_t checked = chk_want.load(std::memory_order_acquire);
    for (int p = 0; p < world; ++p) {
      if (p == rank || chk_busy[p] || chk_sent[p] >= checked) continue;
      chk_out[p] = checked;
      if (tr.write(p, *scratch_reg, &chk_out[p], peers[p].control, chk_offset(rank), sizeof(uint64_t), &chk_ops[p],
                   false)) {
        chk_busy[p] = 1;
        chk_sent[p] = checked;
        sent = true;
      }
    }
    return sent;
  }

  uint64_t read_post(int p, uint64_t call, CallPost& out) const {
    const volatile unsigned char* src =
        reinterpret_cast<const volatile unsigned char*>(&posts_in[static_cast<size_t>(p) * kCallRing + call % kCallRing]);
    PostSlot copy;
    auto* dst = reinterpret_cast<unsigned char*>(&copy);
    for (size_t i = 0; i < sizeof(PostSlot); ++i) dst[i] = src[i];
    std::atomic_thread_fence(std::memory_order_acquire);
    if (copy.body.call == 0 || copy.check != post_check(copy.body)) return 0;
    if (copy.body.call == call) out = copy.body;
    return copy.body.call;
  }

  // The watchdog, on every turn of the loop with posts to compare: two posts of one call that
  // differ where either rank launched (neither waited for the other's post) fail the path, so
  // kernels that would wait for each other until the wait timeout are released with the reason.
  // A peer's post overwritten before this rank read it (got > call) was compared by that peer:
  // it overwrote it only after comparing the call with this rank's post (compared, post_call).
  bool compare_posts() {
    if (world == 1 || cmp_next > own_seen) return false;
    const uint64_t first = cmp_next;
    if (own_seen >= cmp_next + kCallRing) cmp_next = own_seen - kCallRing + 1;  // not reached: post_call waits
    for (; cmp_next <= own_seen; ++cmp_next) {
      const CallPost& own = own_copy[cmp_next % kCallRing];
      bool all = true;
      for (int p = 0; p < world; ++p) {
        if (p == rank) continue;
        CallPost theirs;
        const uint64_t got = read_post(p, cmp_next, theirs);
        if (got < cmp_next) {
          all = false;  // not here yet
          continue;
        }
        if (got != cmp_next) continue;  // lapped: nothing left to compare
        if ((own.launched() || theirs.launched()) && !own.same_plan(theirs))
          throw Error(concat("call ", cmp_next, " on the network path: rank ", rank, " calls ", own.text, ", rank ", p,
                             " calls ", theirs.text, " (or the same with other arguments); found by rank ", rank,
                             "'s proxy after ", own.launched() ? concat("rank ", rank) : concat("rank ", p),
                             " had launched it"));
      }
      if (!all) break;
    }
    compared.store(cmp_next - 1, std::memory_order_release);
    return cmp_next != first;
  }

  // ---- every millisecond: timeouts, heartbeats, liveness, peers' abort notes ----------------

  void housekeeping(Clock::time_point now, int ph) {
    for (const InFlight& f : inflight) {
      if (!f.used || seconds(now - f.since) <= timeout_s) continue;
      // The first write not done (an ordered command's writes complete in order).
      const OpKind kind = f.posted < f.nops ? op_kind_to_post(f) : f.ops[std::min<int>(f.done, f.nops - 1)].kind;
      const std::string what = concat(op_name(kind), " of chunk ", f.cmd.chunk, " to peer ", f.cmd.peer);
      if (f.posted < f.nops)
        throw Error(concat("could not post the ", what, " for ", timeout_s,
                           " s: the endpoint stayed full (WEAVE_NET_TIMEOUT_S)"));
      throw Error(concat("lost completion: no completion for the ", what, " within ", timeout_s,
                         " s of posting it (WEAVE_NET_TIMEOUT_S)", liveness_hint(f.cmd.peer)));
    }
    read_notes();
    if (ph >= kQuiet) return;
    if (seconds(now - last_hb) >= heartbeat_s) {
      last_hb = now;
      ++hb_counter;
      for (int p = 0; p < world; ++p) {
        if (p == rank || hb_busy[p]) continue;
        hb_out[p] = hb_counter;
        hb_ops[p].peer = p;
        if (tr.write(p, *scratch_reg, &hb_out[p], peers[p].control, hb_offset(rank), sizeof(uint64_t), &hb_ops[p], false))
          hb_busy[p] = 1;
      }
    }
    const bool check_pids = seconds(now - last_liveness) >= heartbeat_s;
    if (check_pids) last_liveness = now;
    for (int p = 0; p < world; ++p) {
      if (p == rank) continue;
      const uint64_t v = load_acquire(&hb_in[p]);
      if (v != hb_seen[p]) {
        hb_seen[p] = v;
        hb_changed[p] = now;
      }
      const bool gone = check_pids && local_peer(p) && process_gone(peers[p].pid);
      if (gone || seconds(now - hb_changed[p]) > silence_s)
        throw Error(concat("peer ", p, gone ? " has exited" : " is silent", " (no heartbeat for ",
                           seconds(now - hb_changed[p]), " s", liveness_hint(p), ")", in_flight_to(p, now)));
    }
  }

  OpKind op_kind_to_post(const InFlight& f) const {
    if ((f.cmd.flags & kNotify) && notify == Notify::ordered && f.posted + 1 == f.nops) return OpKind::flag_write;
    return (f.cmd.flags & kNotify) && notify == Notify::unordered ? OpKind::data_write_imm : OpKind::data_write;
  }

  bool local_peer(int p) const { return std::strncmp(peers[rank].host, peers[p].host, sizeof(PeerInfo::host)) == 0; }

  std::string liveness_hint(int p) const {
    if (!local_peer(p)) return concat("; peer ", p, " runs on ", peers[p].host);
    return concat("; its process ", peers[p].pid, " on this host ", process_gone(peers[p].pid) ? "is gone" : "is alive");
  }

  std::string in_flight_to(int p, Clock::time_point now) const {
    const InFlight* oldest = nullptr;
    for (const InFlight& f : inflight)
      if (f.used && f.cmd.peer == p && (!oldest || f.ticket < oldest->ticket)) oldest = &f;
    if (!oldest) return "; nothing in flight to it";
    return concat("; in flight to it: chunk ", oldest->cmd.chunk, " (", oldest->cmd.bytes, " bytes, ",
                  oldest->posted < oldest->nops ? "not yet posted" : "posted", " ", seconds(now - oldest->since),
                  " s ago)");
  }

  // Up to 50 ms of progress, reading the notes after each poll; completions are dropped (the
  // proxy is failing anyway) and transport errors ignored (a broken connection is expected).
  void drain_for_notes() {
    const Clock::time_point end = Clock::now() + std::chrono::milliseconds(50);
    Completion c[32];
    do {
      read_notes();
      try {
        tr.poll(c, 32);
      } catch (const std::exception&) {
      }
      std::this_thread::yield();
    } while (Clock::now() < end);
    read_notes();
  }

  void read_notes() {
    for (int p = 0; p < world; ++p) {
      const volatile AbortNote& n = notes_in[p];
      if (p == rank || n.check == 0) continue;
      char text[sizeof(AbortNote::text) + 1] = {};
      for (size_t i = 0; i < sizeof(AbortNote::text); ++i) text[i] = n.text[i];
      if (n.check == note_check(text)) throw PeerReported(concat("stopped because rank ", p, " failed: ", text));
    }
  }

  // ---- failure ------------------------------------------------------------------------------

  void fail(std::string msg, bool tell_peers) {
    const std::string_view lib = "weave::net: ";
    if (msg.compare(0, lib.size(), lib) == 0) msg.erase(0, lib.size());
    const std::string text = concat("weave::net rank ", rank, ": ", msg);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!error.empty()) return;
      error = text;
    }
    // The notes go out before this rank's own side learns of the failure: a rank that exits on
    // it right away must not take its note to the peers with it.
    if (tell_peers) send_notes(text);
    has_failed.store(true);
    store_release(&ctl->abort, 1);
  }

  // Best effort: the note to each live peer, posted again while the endpoint is busy, then
  // reaped; a second at most.
  void send_notes(const std::string& text) {
    std::memset(note_out, 0, sizeof(AbortNote));
    std::memcpy(note_out->text, text.data(), std::min(text.size(), sizeof(AbortNote::text) - 1));
    note_out->check = note_check(note_out->text);
    enum : uint8_t { kToPost = 1, kPosted = 2 };  // 0: done or given up
    for (int p = 0; p < world; ++p) {
      note_busy[p] = p == rank || (local_peer(p) && process_gone(peers[p].pid)) ? 0 : kToPost;
      note_ops[p].peer = p;
    }
    const Clock::time_point end = Clock::now() + std::chrono::seconds(1);
    Completion c[32];
    while (any(note_busy) && Clock::now() < end) {
      for (int p = 0; p < world; ++p) {
        if (note_busy[p] != kToPost) continue;
        try {
          if (tr.write(p, *scratch_reg, note_out, peers[p].control, note_offset(rank), sizeof(AbortNote), &note_ops[p],
                       false))
            note_busy[p] = kPosted;
        } catch (const std::exception&) {
          note_busy[p] = 0;
        }
      }
      try {
        reap(c);  // a note's completion clears its entry
      } catch (const OpError& e) {  // a failed peer's write: nothing more to say to it
        if (e.op && e.op->kind == OpKind::abort_note) note_busy[e.op->peer] = 0;
      } catch (const std::exception&) {
      }
      sched_yield();
    }
  }
};

Proxy::Proxy(Transport& transport, runtime::Bootstrap& boot, void* send, size_t send_bytes, MemKind send_kind, void* recv,
             size_t recv_bytes, const ProxyOptions& opts)
    : impl_(std::make_unique<Impl>(transport, std::make_unique<RendezvousOver<runtime::Bootstrap>>(boot), opts)) {
  impl_->setup(send, send_bytes, send_kind, recv, recv_bytes);
  impl_->thread = std::thread([this] { impl_->run(); });
}

Proxy::Proxy(Transport& transport, runtime::NetBootstrap& boot, void* send, size_t send_bytes, MemKind send_kind,
             void* recv, size_t recv_bytes, const ProxyOptions& opts)
    : impl_(std::make_unique<Impl>(transport, std::make_unique<RendezvousOver<runtime::NetBootstrap>>(boot), opts)) {
  impl_->setup(send, send_bytes, send_kind, recv, recv_bytes);
  impl_->thread = std::thread([this] { impl_->run(); });
}

Proxy::~Proxy() {
  impl_->phase.store(kStopped, std::memory_order_release);
  if (impl_->thread.joinable()) impl_->thread.join();
}

QueueView Proxy::queue() const {
  const Impl& m = *impl_;
  return QueueView{m.slots, &m.ctl->claim, &m.ctl->head, &m.ctl->completed, &m.ctl->abort, m.opt.queue_slots};
}

const uint64_t* Proxy::flags() const { return impl_->flags; }
int Proxy::rank() const { return impl_->rank; }
int Proxy::world() const { return impl_->world; }
bool Proxy::failed() const { return impl_->has_failed.load(); }

void Proxy::abort(const std::string& why) {
  Impl& m = *impl_;
  if (failed()) return;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.abort_why = why;
  }
  m.abort_requested.store(true, std::memory_order_release);
  // The thread fails within a loop iteration, its notes sent within a second; a stopped thread
  // (after shutdown) cannot, so the failure is recorded here without notes.
  const auto end = Clock::now() + std::chrono::seconds(3);
  while (!failed() && m.thread.joinable() && m.phase.load() != kStopped && Clock::now() < end)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  if (!failed()) {
    const std::string text = concat("weave::net rank ", m.rank, ": ", why);
    {
      std::lock_guard<std::mutex> lock(m.mu);
      if (m.error.empty()) m.error = text;
    }
    m.has_failed.store(true);
    store_release(&m.ctl->abort, 1);
  }
}

bool CallPost::same_plan(const CallPost& o) const {
  return nvalues == o.nvalues && std::equal(values, values + std::clamp(nvalues, 0, kPostValues), o.values);
}

uint64_t Proxy::calls_posted() const { return impl_->post_ready.load(std::memory_order_acquire); }

void Proxy::post_call(const CallPost& p, double wait_s) {
  Impl& m = *impl_;
  check();
  WEAVE_CHECK(m.phase.load() == kRunning, "weave::net rank ", m.rank, ": call ", p.call, " posted after shutdown()");
  WEAVE_CHECK(p.call == calls_posted() + 1, "weave::net: call ", p.call, " posted after call ", calls_posted());
  WEAVE_CHECK(p.nvalues >= 0 && p.nvalues <= kPostValues, "weave::net: a call's plan has at most ", kPostValues,
              " values (", p.nvalues, ")");
  const int slot = static_cast<int>(p.call % kCallRing);
  const uint64_t behind = p.call > kCallRing && m.world > 1 ? p.call - kCallRing : 0;  // compared first
  const double limit = wait_s < 0 ? m.timeout_s : wait_s;
  const Clock::time_point start = Clock::now();
  for (uint32_t spin = 0; m.post_left[slot].load(std::memory_order_acquire) != 0 ||
                          m.compared.load(std::memory_order_acquire) < behind;
       ++spin) {
    check();
    if ((spin & 255) == 0 && limit > 0 && seconds(Clock::now() - start) > limit) {
      // Fail the path: this rank's calls would stop numbering alike with its peers'.
      const std::string why = concat("call ", p.call, ": call ", behind, " was not posted by every peer (or this post of ",
                                     "call ", p.call - kCallRing, " did not reach them) within ", limit,
                                     " s: a rank stopped calling, or calls differently");
      abort(why);
      throw Error(concat("weave::net rank ", m.rank, ": ", why));
    }
    if (spin > 256) std::this_thread::sleep_for(std::chrono::microseconds(20));  // a rank may wait minutes here
    else if (spin > 64) sched_yield();
  }
  PostSlot& s = m.posts_out[slot];
  std::memset(&s, 0, sizeof(PostSlot));
  s.body = p;
  s.body.text[sizeof(s.body.text) - 1] = 0;
  s.check = post_check(s.body);
  m.post_left[slot].store(m.world - 1, std::memory_order_release);
  m.post_ready.store(p.call, std::memory_order_release);
}

uint64_t Proxy::read_post(int peer, uint64_t call, CallPost& out) const {
  WEAVE_CHECK(peer >= 0 && peer < impl_->world && peer != impl_->rank, "weave::net: read_post of peer ", peer);
  return impl_->read_post(peer, call, out);
}

void Proxy::post_checked(uint64_t call) {
  std::atomic<uint64_t>& want = impl_->chk_want;
  for (uint64_t cur = want.load(); cur < call && !want.compare_exchange_weak(cur, call);) {
  }
}

uint64_t Proxy::peer_checked(int peer) const {
  WEAVE_CHECK(peer >= 0 && peer < impl_->world, "weave::net: peer_checked of peer ", peer);
  return load_acquire(&impl_->chk_in[peer]);
}

std::string Proxy::error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->error;
}

void Proxy::check() const {
  if (failed()) throw Error(error());
}

void Proxy::wait_arrival(uint32_t chunk, uint64_t value, double timeout_s) const {
  const Impl& m = *impl_;
  WEAVE_CHECK(chunk < m.opt.flags, "weave::net: chunk ", chunk, " is beyond this rank's ", m.opt.flags, " flags");
  const double limit = timeout_s >= 0 ? timeout_s : m.timeout_s;
  const Clock::time_point start = Clock::now();
  for (uint32_t spin = 0; load_acquire(&m.flags[chunk]) < value; ++spin) {
    if (failed()) throw Error(concat(error(), " [while rank ", m.rank, " waited for chunk ", chunk, "]"));
    if ((spin & 255) == 0 && seconds(Clock::now() - start) > limit)
      throw Error(concat("weave::net rank ", m.rank, ": chunk ", chunk, " did not arrive within ", limit,
                         " s (flag ", load_acquire(&m.flags[chunk]), ", waiting for ", value, ")"));
    if (spin > 64) sched_yield();
  }
}

void Proxy::shutdown() {
  Impl& m = *impl_;
  const auto wait_for = [&](const std::atomic<bool>& done, const char* what) {
    const auto end = Clock::now() + std::chrono::duration<double>(2 * m.timeout_s + 1);
    while (!done.load() && !failed()) {
      if (Clock::now() > end) throw Error(concat("weave::net rank ", m.rank, ": shutdown: ", what, " took too long"));
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    check();
  };
  m.phase.store(kDraining, std::memory_order_release);
  wait_for(m.drained, "draining the queue");
  // A peer that failed but lives on never comes to these barriers: the proxy's own failure (its
  // note, or the peer falling silent) ends the wait.
  struct Interrupt {  // this proxy's, put back on every way out (the bootstrap outlives the proxy)
    Rendezvous& boot;
    std::function<std::string()> before;
    ~Interrupt() { boot.set_interrupt(std::move(before)); }
  } interrupt{m.boot, m.boot.set_interrupt([this] { return failed() ? error() : std::string(); })};
  try {
    m.boot.barrier();  // every rank drained; the threads keep progressing peers' writes
    m.phase.store(kQuiet, std::memory_order_release);
    wait_for(m.quiet, "the last heartbeats");
    m.boot.barrier();  // nobody writes any more
  } catch (const Error&) {
    check();  // the proxy's diagnostic says more than the bootstrap's
    throw;
  }
  m.phase.store(kStopped, std::memory_order_release);
  m.thread.join();
  check();
}

ProxyStats Proxy::stats() const {
  const Impl::Counters& c = impl_->st;
  ProxyStats s;
  s.taken = c.taken.load();
  s.posted = c.posted.load();
  s.completed = c.completed.load();
  s.submissions = c.submissions.load();
  s.writes = c.writes.load();
  s.arrivals = c.arrivals.load();
  s.queue_full = c.queue_full.load();
  for (uint32_t i = 0; i <= kMaxBatch; ++i) s.batch_sizes[i] = c.batch_sizes[i].load();
  return s;
}

}  // namespace weave::net
