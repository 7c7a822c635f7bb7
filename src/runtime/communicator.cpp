#include "weave/runtime/communicator.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "weave/common/driver.hpp"
#include "weave/common/error.hpp"
#include "weave/common/extent.hpp"
#include "weave/runtime/allocator.hpp"
#include "weave/runtime/env.hpp"
#include "call_mail.hpp"

namespace weave::runtime {

namespace {

// The variables the GPU hosts set to forbid NVLink multicast; any one of them wins. They belong to
// other libraries, so only their documented "off" values are recognized, compared as text.
std::string multicast_disabled_by() {
  auto is = [](const char* n, const char* val) {
    const auto v = env::raw(n);
    return v && *v == val;
  };
  if (is("NCCL_NVLS_ENABLE", "0")) return "NCCL_NVLS_ENABLE=0";
  if (is("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")) return "TORCH_SYMM_MEM_DISABLE_MULTICAST=1";
  if (is("NVSHMEM_DISABLE_NVLS", "1")) return "NVSHMEM_DISABLE_NVLS=1";
  return "";
}

std::atomic<int> g_instance{0};

// Every rank's fd, entry r from rank r; our own `fd` is closed either way (the caller owns the rest).
std::vector<int> share_fd(Bootstrap& boot, int fd) {
  try {
    std::vector<int> fds = boot.all_gather_fd(fd);
    close(fd);
    return fds;
  } catch (...) {
    close(fd);
    throw;
  }
}

struct Registration {
  char* local;
  size_t bytes;
  long long serial;  // the registration's number, the same on every rank (register_buffer is collective)
  PeerPtrs ptrs{};
  std::vector<void*> opened;  // peer bases from cudaIpcOpenMemHandle, closed on deregister
};

using mail::kCheckValues;
using mail::kMailBytes;
using mail::Mailbox;
using mail::MailSlot;

struct IpcMsg {
  cudaIpcMemHandle_t handle;
  unsigned long long offset, bytes;
};

}  // namespace

struct Communicator::Impl {
  LaunchInfo info;
  CommOptions opt;
  unsigned long long uid = 0;
  int device = -1;
  cudaDeviceProp props{};
  std::unique_ptr<Bootstrap> boot;
  // heap
  size_t heap_size = 0;
  CUdeviceptr va = 0;  // world * heap_size, rank r's heap at va + r * heap_size
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<bool> mapped;
  std::unique_ptr<OffsetAllocator> alloc;
  std::vector<Registration> regs;
  long long registrations = 0;  // made so far (deregistering does not renumber the others)
  // check_same, agree_call, abort_peers
  std::vector<Mailbox*> mail;
  std::vector<long long> pids;
  unsigned long long check_seq = 0;
  std::unique_ptr<mail::CallMail> calls;  // agree_call's protocol over `mail`
  std::vector<long long> released;  // heap offsets release() handed back, not yet freed
  bool debug = false;
  bool mail_registered = false;  // this rank's page is mapped for its kernels (abort_dev)
  const volatile int* abort_dev = nullptr;
  // diagnostics
  WaitRecord* record_host = nullptr;
  WaitRecord* record_dev = nullptr;
  unsigned long long timeout_ns = 0;
  std::vector<std::string> names;
  bool broken = false;
  std::string broken_why;

  void check_usable() const {
    WEAVE_CHECK(!broken, "communicator is unusable after an earlier error: ", broken_why);
  }
  // Why a peer stopped this rank's calls (its abort word), or empty.
  std::string peer_aborted() const {
    const int from = calls ? calls->aborted_by() : 0;
    if (from <= 0) return {};
    return detail::concat("weave: rank ", from - 1, " rejected a call this rank had launched, so it will not come: ",
                          calls->abort_reason());
  }
  char* base(int r) const { return reinterpret_cast<char*>(va + size_t(r) * heap_size); }
  // Where a buffer lies: in this rank's heap, or in the first registration that holds all of
  // [p, p + bytes) (null if none).
  bool in_heap(const char* p) const { return p >= base(info.rank) && p < base(info.rank) + heap_size; }
  const Registration* registration_of(const char* p, size_t bytes) const {
    for (const Registration& g : regs)
      if (p >= g.local && p + bytes <= g.local + g.bytes) return &g;
    return nullptr;
  }
  void teardown() noexcept;
};

void Communicator::Impl::teardown() noexcept {
  calls.reset();  // its watchdog reads the pages
  if (mail_registered) cudaHostUnregister(mail[info.rank]);
  mail_registered = false;
  abort_dev = nullptr;
  for (Mailbox* m : mail)
    if (m) munmap(m, kMailBytes);
  mail.clear();
  for (auto& r : regs)
    for (void* p : r.opened) cudaIpcCloseMemHandle(p);
  regs.clear();
  const Driver* d = nullptr;
  try {
    d = &drv();
  } catch (...) {
  }
  if (d && va) {
    for (size_t r = 0; r < mapped.size(); ++r)
      if (mapped[r]) d->memUnmap(va + r * heap_size, heap_size);
    d->memAddressFree(va, heap_size * info.world);
  }
  if (d)
    for (auto h : handles)
      if (h) d->memRelease(h);
  handles.clear();
  va = 0;
  if (record_host) cudaFreeHost(record_host);
  record_host = nullptr;
}

LaunchInfo node_launch_info(const LaunchInfo& job, const std::string& node) {
  WEAVE_CHECK(!node.empty(), "node_launch_info: empty node name");
  WEAVE_CHECK(job.local_world >= 1 && job.local_rank >= 0 && job.local_rank < job.local_world,
              "node_launch_info: local rank ", job.local_rank, " outside a node of ", job.local_world);
  LaunchInfo n = job;
  n.rank = job.local_rank;
  n.world = job.local_world;
  n.job_id = job.job_id + "-node-" + node;
  return n;
}

Communicator::Communicator(CommOptions opt) : Communicator(detect_launch(), opt) {}

Communicator::Communicator(const LaunchInfo& info, CommOptions opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.info = info;
  m.opt = opt;
  static std::atomic<unsigned long long> communicators{0};
  m.uid = ++communicators;
  WEAVE_CHECK(info.world >= 1 && info.world <= kMaxWorld, "world size ", info.world, " is outside 1..", kMaxWorld,
              " (the compile-time maximum of one NVLink domain)");
  WEAVE_CHECK(info.local_world == info.world, "a communicator spans one node, but this job has ", info.world,
              " ranks with ", info.local_world, " on this node: make a node-local one, Communicator("
              "runtime::node_launch_info(info, node name), opts), and reach the other nodes through the network "
              "path (weave::net::NetPath)");
  if (opt.multicast) {
    std::string off = multicast_disabled_by();
    WEAVE_CHECK(off.empty(), "NVLink multicast requested but disabled on this machine by ", off);
    WEAVE_CHECK(false, "NVLink multicast requested, but weave has no multicast path; run without it");
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0;
  // WEAVE_SHARE_GPUS=1 (weave-run --share-gpus) lets several ranks take turns on one GPU: for
  // correctness runs on machines with fewer GPUs than ranks, never for timing (kernels of
  // different processes time-slice, so every cross-rank wait costs a context switch).
  const bool shared = env::get_bool("WEAVE_SHARE_GPUS");
  WEAVE_CHECK(ndev > 0 && (shared || info.local_world <= ndev), "world of ", info.local_world,
              " ranks on this node is larger than the ", ndev, " visible GPU(s)");
  WEAVE_CHECK(opt.device < ndev, "CommOptions::device = ", opt.device, " but ", ndev, " GPU(s) are visible");
  m.device = opt.device >= 0 ? opt.device : shared ? info.local_rank % ndev : info.local_rank;
  m.debug = opt.debug >= 0 ? opt.debug != 0 : env::get_bool("WEAVE_DEBUG");
  WEAVE_CUDA_CHECK(cudaSetDevice(m.device));
  WEAVE_CUDA_CHECK(cudaGetDeviceProperties(&m.props, m.device));
  WEAVE_CHECK(m.props.major >= 9, "GPU ", m.device, " (", m.props.name, ") has compute capability ", m.props.major,
              ".", m.props.minor, "; weave needs Hopper (9.0)");

  // Preflight: every pair of this node's GPUs must reach each other.
  const int node_gpus = std::min(info.local_world, ndev);
  for (int i = 0; i < node_gpus; ++i)
    for (int j = 0; j < node_gpus; ++j) {
      if (i == j) continue;
      int ok = 0;
      WEAVE_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, i, j));
      WEAVE_CHECK(ok, "GPU ", i, " cannot access GPU ", j, " as a peer; weave needs peer access between every pair");
    }
  const Driver& d = drv();
  CUdevice cudev;
  WEAVE_CU_CHECK(d.deviceGet(&cudev, m.device));
  int vmm = 0, fdok = 0;
  WEAVE_CU_CHECK(d.deviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cudev));
  WEAVE_CU_CHECK(d.deviceGetAttribute(&fdok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cudev));
  WEAVE_CHECK(vmm && fdok, "GPU ", m.device, " lacks virtual memory management with POSIX fd handles");

  m.timeout_ns = static_cast<unsigned long long>(
      1e9 * (opt.wait_timeout_s >= 0 ? opt.wait_timeout_s : env::get_seconds("WEAVE_WAIT_TIMEOUT_S")));
  try {
    WEAVE_CUDA_CHECK(cudaHostAlloc(&m.record_host, sizeof(WaitRecord), cudaHostAllocMapped));
    std::memset(m.record_host, 0, sizeof(WaitRecord));
    WEAVE_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.record_dev), m.record_host, 0));

    // Each communicator instance gets its own socket name, so back-to-back instances never meet
    // a stale listener. Every rank creates communicators in the same order.
    LaunchInfo bi = info;
    bi.job_id += opt.instance.empty() ? "-c" + std::to_string(g_instance.fetch_add(1)) : "-" + opt.instance;
    m.boot = std::make_unique<Bootstrap>(bi, opt.bootstrap_timeout);
    {
      int fd = memfd_create("weave-check", MFD_CLOEXEC);
      if (fd < 0 || ftruncate(fd, kMailBytes) != 0) {
        if (fd >= 0) close(fd);
        throw Error(detail::concat("weave: memfd for cross-rank checks: ", std::strerror(errno)));
      }
      for (int f : share_fd(*m.boot, fd)) {
        void* p = mmap(nullptr, kMailBytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        close(f);
        WEAVE_CHECK(p != MAP_FAILED, "mmap of a peer's check page failed: ", std::strerror(errno));
        m.mail.push_back(static_cast<Mailbox*>(p));
      }
      long long pid = getpid();
      m.pids.resize(info.world);
      m.boot->all_gather(&pid, m.pids.data(), sizeof pid);
      // Without the mapping a rejected call still throws on the rank that rejects it, and its
      // peers' kernels end at the wait timeout instead of at once.
      Mailbox* mine = m.mail[info.rank];
      if (cudaHostRegister(mine, kMailBytes, cudaHostRegisterMapped) == cudaSuccess) {
        m.mail_registered = true;
        void* dp = nullptr;
        WEAVE_CUDA_CHECK(cudaHostGetDevicePointer(&dp, &mine->abort_from, 0));
        m.abort_dev = static_cast<const volatile int*>(dp);
      } else {
        cudaGetLastError();
        std::fprintf(stderr, "weave: rank %d: could not map the abort word for kernels; a call rejected by a peer "
                     "will end at the wait timeout\n", info.rank);
      }
    }

    m.calls = std::make_unique<mail::CallMail>(m.mail, m.pids, info.rank, m.debug,
                                               [this](const std::string& why) { abort_peers(why); },
                                               static_cast<double>(m.timeout_ns) / 1e9);
    // A peer that rejected a call this rank had launched never reaches the host steps after it
    // (a shape's first signal sets, a barrier): this rank's waits there end with its reason.
    m.boot->set_interrupt([&m] { return m.peer_aborted(); });

    // The heap: one VMM allocation per rank, exported once as a POSIX fd, mapped by every rank.
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = m.device;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    WEAVE_CU_CHECK(d.memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    size_t want = opt.heap_bytes ? opt.heap_bytes : env::get_size("WEAVE_HEAP_BYTES");
    m.heap_size = (want + gran - 1) / gran * gran;
    check_same("symmetric heap size", {static_cast<long long>(m.heap_size)});

    const int W = info.world;
    m.handles.assign(W, 0);
    m.mapped.assign(W, false);
    WEAVE_CU_CHECK(d.memCreate(&m.handles[info.rank], m.heap_size, &prop, 0));
    int fd = -1;
    WEAVE_CU_CHECK(d.memExportToShareableHandle(&fd, m.handles[info.rank], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    const std::vector<int> fds = share_fd(*m.boot, fd);
    std::exception_ptr err;
    for (int r = 0; r < W; ++r) {
      if (r != info.rank && !err) {
        CUresult res = d.memImportFromShareableHandle(&m.handles[r], reinterpret_cast<void*>(static_cast<uintptr_t>(fds[r])),
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (res != CUDA_SUCCESS)
          err = std::make_exception_ptr(Error(detail::concat("weave: importing rank ", r, "'s heap failed: ",
                                                             driver_error_string(res))));
      }
      close(fds[r]);
    }
    if (err) std::rethrow_exception(err);
    WEAVE_CU_CHECK(d.memAddressReserve(&m.va, m.heap_size * W, gran, 0, 0));
    for (int r = 0; r < W; ++r) {
      WEAVE_CU_CHECK(d.memMap(m.va + size_t(r) * m.heap_size, m.heap_size, 0, m.handles[r], 0));
      m.mapped[r] = true;
    }
    CUmemAccessDesc acc{};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = m.device;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    WEAVE_CU_CHECK(d.memSetAccess(m.va, m.heap_size * W, &acc, 1));
    m.alloc = std::make_unique<OffsetAllocator>(m.heap_size);
    m.boot->barrier();
  } catch (...) {
    m.teardown();
    throw;
  }
}

Communicator::~Communicator() {
  Impl& m = *impl_;
  // No rank unmaps while a peer may still be using the memory.
  if (!m.broken && m.boot) {
    try {
      cudaDeviceSynchronize();
      m.boot->barrier();
    } catch (...) {
    }
  }
  m.teardown();
}

int Communicator::rank() const { return impl_->info.rank; }
int Communicator::world() const { return impl_->info.world; }
unsigned long long Communicator::uid() const { return impl_->uid; }
int Communicator::local_rank() const { return impl_->info.local_rank; }
int Communicator::device() const { return impl_->device; }
const cudaDeviceProp& Communicator::props() const { return impl_->props; }
Bootstrap& Communicator::bootstrap() { return *impl_->boot; }
size_t Communicator::heap_bytes() const { return impl_->heap_size; }
size_t Communicator::heap_used() const { return impl_->alloc->used(); }
bool Communicator::heap_fits(size_t bytes, size_t align) const { return impl_->alloc->fits(bytes, align); }
WaitRecord* Communicator::wait_record() const { return impl_->record_dev; }
const volatile int* Communicator::abort_word() const { return impl_->abort_dev; }
bool Communicator::debug_calls() const { return impl_->debug; }
unsigned long long Communicator::wait_timeout_ns() const { return impl_->timeout_ns; }

void* Communicator::alloc(size_t bytes, size_t align) {
  Impl& m = *impl_;
  m.check_usable();
  // The heap's use too: every rank's heap must be the same, and a divergence (a buffer freed on one
  // rank only) shows here, at no extra cost, instead of as peers writing at the wrong offsets.
  check_same("symmetric alloc (bytes, align, heap bytes in use)",
             {static_cast<long long>(bytes), static_cast<long long>(align), static_cast<long long>(m.alloc->used())});
  // Released buffers: free the ones every rank has released (the same set everywhere).
  long long n = static_cast<long long>(m.released.size()), most = n;
  std::vector<long long> counts(m.info.world);
  m.boot->all_gather(&n, counts.data(), sizeof n);
  for (long long c : counts) most = std::max(most, c);
  if (most > 0) {
    std::vector<long long> mine(most, -1), all(size_t(most) * m.info.world);
    std::copy(m.released.begin(), m.released.end(), mine.begin());
    m.boot->all_gather(mine.data(), all.data(), sizeof(long long) * most);
    std::vector<long long> common;
    for (long long off : m.released) {
      bool everywhere = true;
      for (int r = 0; r < m.info.world && everywhere; ++r)
        everywhere = std::find(all.begin() + r * most, all.begin() + (r + 1) * most, off) != all.begin() + (r + 1) * most;
      if (everywhere) common.push_back(off);
    }
    // The intersection is the same set on every rank (sorted: one order of frees everywhere), so
    // every rank quiesces or none.
    std::sort(common.begin(), common.end());
    if (!common.empty()) {
      // The released buffers go back only once no rank has device work left that may still write
      // into them; without that (a peer stopped this rank's calls, or a device error), nothing is
      // freed and the communicator is unusable (the released list stays for the diagnostics).
      if (!quiesce()) {
        m.broken = true;
        if (m.broken_why.empty())
          m.broken_why = "a symmetric alloc could not wait for every rank's device work before reusing released buffers";
        throw Error("weave: " + m.broken_why);
      }
      for (long long off : common) {
        m.alloc->free(size_t(off));
        m.released.erase(std::find(m.released.begin(), m.released.end(), off));
      }
    }
  }
  return m.base(m.info.rank) + m.alloc->alloc(bytes, align);
}

void Communicator::free(void* ptr) {
  Impl& m = *impl_;
  char* p = static_cast<char*>(ptr);
  char* b = m.base(m.info.rank);
  WEAVE_CHECK(m.in_heap(p), "free of ", ptr, ", which is not in the symmetric heap");
  m.alloc->free(size_t(p - b));
}

void Communicator::release(void* ptr) {
  Impl& m = *impl_;
  char* p = static_cast<char*>(ptr);
  char* b = m.base(m.info.rank);
  WEAVE_CHECK(m.in_heap(p), "release of ", ptr, ", which is not in the symmetric heap");
  const long long off = p - b;
  // A pointer that is not a live allocation's start, or one released twice, would be freed on this
  // rank and not on its peers (or never), and the ranks' heaps would go apart.
  WEAVE_CHECK(m.alloc->is_start(size_t(off)), "release of ", ptr, ", which is not the start of a live heap allocation");
  WEAVE_CHECK(std::find(m.released.begin(), m.released.end(), off) == m.released.end(), "release of ", ptr,
              ", which was released already");
  m.released.push_back(off);
}

void Communicator::check_same(const std::string& what, const std::vector<long long>& values) {
  Impl& m = *impl_;
  const int W = m.info.world;
  // A length prefix makes vectors of different lengths disagree instead of misaligning.
  WEAVE_CHECK(values.size() < kCheckValues, "check_same: at most ", kCheckValues - 1, " values");
  const unsigned long long n = ++m.check_seq;
  MailSlot& mine = m.mail[m.info.rank]->slot[n % 4];
  mine.values[0] = static_cast<long long>(values.size());
  for (int i = 1; i < kCheckValues; ++i) mine.values[i] = size_t(i) <= values.size() ? values[i - 1] : 0;
  mine.seq.store(n, std::memory_order_release);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < W; ++r) {
    const MailSlot& s = m.mail[r]->slot[n % 4];
    for (long spins = 0; s.seq.load(std::memory_order_acquire) != n; ++spins) {
      if (spins < 20000) continue;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (spins % 2000 != 0) continue;
      if (kill(static_cast<pid_t>(m.pids[r]), 0) != 0 && errno == ESRCH)
        throw Error(detail::concat("weave: rank ", r, " (pid ", m.pids[r], ") exited before checking ", what));
      if (const std::string why = m.peer_aborted(); !why.empty()) {
        m.broken = true;  // this check's number is taken: later checks would read misaligned slots
        m.broken_why = why;
        throw Error(why);
      }
      if (std::chrono::steady_clock::now() - t0 > std::chrono::minutes(5))
        throw Error(detail::concat("weave: rank ", r, " did not reach the check of ", what, " within 5 minutes"));
    }
  }
  auto render = [&](int r) {
    const long long* v = m.mail[r]->slot[n % 4].values;
    std::string s = "(";
    for (long long i = 0; i < v[0] && i + 1 < kCheckValues; ++i) s += (i ? ", " : "") + std::to_string(v[i + 1]);
    return s + ")";
  };
  const long long* v0 = m.mail[0]->slot[n % 4].values;
  for (int r = 1; r < W; ++r)
    if (!std::equal(v0, v0 + kCheckValues, m.mail[r]->slot[n % 4].values))
      throw Error(detail::concat("weave: ", what, " differs across ranks: rank 0 has ", render(0), ", rank ", r,
                                 " has ", render(r)));
}

void Communicator::agree_call(const std::string& op, const std::string& what, const std::vector<long long>& values,
                              const std::string& problem, cudaStream_t stream,
                              const std::vector<const void*>& peer_buffers) {
  Impl& m = *impl_;
  m.check_usable();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) cudaGetLastError();
  std::vector<long long> places;
  for (const void* p : peer_buffers) places.push_back(buffer_place(p));
  try {
    m.calls->agree(op, what, values, problem, capture != cudaStreamCaptureStatusNone, places);
  } catch (const mail::PeerAborted& e) {
    m.broken = true;
    m.broken_why = e.what();
    throw Error("weave: " + m.broken_why);
  }
}

long long Communicator::buffer_place(const void* p) const {
  const Impl& m = *impl_;
  const char* c = static_cast<const char*>(p);
  if (m.in_heap(c)) return static_cast<long long>(c - m.base(m.info.rank));
  const Registration* g = m.registration_of(c, 1);
  return g ? (g->serial << 44) + static_cast<long long>(c - g->local) : -1;
}

void Communicator::abort_peers(const std::string& why) noexcept {
  Impl& m = *impl_;
  m.broken = true;
  m.broken_why = "this rank rejected a call its peers may have launched: " + why;
  if (m.calls) m.calls->write_aborts(why);
}

void Communicator::check_buffer(const char* who, const char* name, const void* p, size_t bytes) const {
  const Impl& m = *impl_;
  if (bytes == 0) return;
  WEAVE_CHECK(p != nullptr, who, ": ", name, " is a null pointer");
  const char* c = static_cast<const char*>(p);
  if (m.in_heap(c)) {
    WEAVE_CHECK(m.alloc->contains(size_t(c - m.base(m.info.rank)), bytes), who, ": ", name, " needs ", bytes,
                " bytes from ", p, ", which runs past its symmetric heap allocation");
    return;
  }
  if (const Registration* g = m.registration_of(c, 1)) {
    WEAVE_CHECK(c + bytes <= g->local + g->bytes, who, ": ", name, " needs ", bytes, " bytes from ", p,
                ", which runs past its registered buffer (", g->bytes, " bytes from ", static_cast<void*>(g->local),
                ")");
    return;
  }
  check_extent(who, name, p, bytes);
}

PeerPtrs Communicator::peers(const void* ptr, size_t bytes) const {
  const Impl& m = *impl_;
  m.check_usable();
  PeerPtrs out{};
  const char* p = static_cast<const char*>(ptr);
  if (m.in_heap(p)) {
    const size_t off = size_t(p - m.base(m.info.rank));
    WEAVE_CHECK(m.alloc->contains(off, bytes), "buffer ", ptr, " (", bytes,
                " bytes) is in the symmetric heap but not inside one live allocation");
    for (int r = 0; r < m.info.world; ++r) out[r] = m.base(r) + off;
    return out;
  }
  if (const Registration* g = m.registration_of(p, bytes)) {
    for (int r = 0; r < m.info.world; ++r) out[r] = static_cast<char*>(g->ptrs[r]) + (p - g->local);
    return out;
  }
  throw Error(detail::concat("weave: buffer ", ptr, " (", bytes,
                             " bytes) is neither in the symmetric heap nor registered; allocate it with "
                             "Communicator::alloc or call Communicator::register_buffer first"));
}

void Communicator::register_buffer(void* ptr, size_t bytes) {
  Impl& m = *impl_;
  m.check_usable();
  WEAVE_CHECK(ptr && bytes, "register_buffer: null pointer or zero bytes");
  WEAVE_CHECK(!m.in_heap(static_cast<const char*>(ptr)), "register_buffer: ", ptr, " is in the symmetric heap already");
  CUdeviceptr base = 0;
  size_t size = 0;
  WEAVE_CU_CHECK(drv().memGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)));
  const size_t off = reinterpret_cast<CUdeviceptr>(ptr) - base;
  WEAVE_CHECK(off + bytes <= size, "register_buffer: [", ptr, ", +", bytes, ") runs past its allocation (", size,
              " bytes from ", reinterpret_cast<void*>(base), ")");
  IpcMsg mine{};
  cudaError_t e = cudaIpcGetMemHandle(&mine.handle, reinterpret_cast<void*>(base));
  WEAVE_CHECK(e == cudaSuccess, "register_buffer: cudaIpcGetMemHandle failed for ", ptr, ": ", cudaGetErrorString(e),
              " (only cudaMalloc'd memory can be registered)");
  mine.offset = off;
  mine.bytes = bytes;
  check_same("register_buffer bytes", {static_cast<long long>(bytes)});
  std::vector<IpcMsg> all(m.info.world);
  m.boot->all_gather(&mine, all.data(), sizeof(IpcMsg));
  Registration g{static_cast<char*>(ptr), bytes, {}, {}};
  try {
    for (int r = 0; r < m.info.world; ++r) {
      if (r == m.info.rank) {
        g.ptrs[r] = ptr;
        continue;
      }
      void* pb = nullptr;
      WEAVE_CUDA_CHECK(cudaIpcOpenMemHandle(&pb, all[r].handle, cudaIpcMemLazyEnablePeerAccess));
      g.opened.push_back(pb);
      g.ptrs[r] = static_cast<char*>(pb) + all[r].offset;
    }
  } catch (...) {
    for (void* p : g.opened) cudaIpcCloseMemHandle(p);
    throw;
  }
  g.serial = ++m.registrations;
  m.regs.push_back(std::move(g));
}

void Communicator::deregister_buffer(void* ptr) {
  Impl& m = *impl_;
  for (auto it = m.regs.begin(); it != m.regs.end(); ++it)
    if (it->local == ptr) {
      for (void* p : it->opened) WEAVE_CUDA_CHECK(cudaIpcCloseMemHandle(p));
      m.regs.erase(it);
      return;
    }
  throw Error(detail::concat("weave: deregister_buffer: ", ptr, " is not registered"));
}

int Communicator::name_id(const std::string& name) {
  auto& n = impl_->names;
  for (size_t i = 0; i < n.size(); ++i)
    if (n[i] == name) return static_cast<int>(i);
  n.push_back(name);
  return static_cast<int>(n.size() - 1);
}

const std::string& Communicator::signal_name(int id) const {
  static const std::string unknown = "?";
  return id >= 0 && size_t(id) < impl_->names.size() ? impl_->names[id] : unknown;
}

SignalSet Communicator::signals(const std::string& name, int count) { return SignalSet(*this, name, count); }

void Communicator::sync(cudaStream_t stream) {
  Impl& m = *impl_;
  m.check_usable();
  cudaError_t e = cudaStreamSynchronize(stream);
  const WaitRecord& r = *m.record_host;
  // Read only after a failed sync: aborted_by() waits out a peer caught between claiming the word
  // and publishing it.
  if (const int from = e != cudaSuccess && m.calls ? m.calls->aborted_by() : 0; from > 0) {
    m.broken = true;
    m.broken_why = detail::concat("rank ", from - 1, " rejected a call this rank had launched (its kernels stopped: ",
                                  cudaGetErrorName(e), "): ", m.calls->abort_reason());
    throw Error("weave: " + m.broken_why);
  }
  if (r.timed_out) {
    m.broken = true;
    m.broken_why = detail::concat("wait timed out on rank ", r.rank, ": signal '", signal_name(r.name_id), "'[",
                                  r.index, "] expected >= ", r.expected, ", observed ", r.observed, " (block ",
                                  r.block, ", thread ", r.thread, ", timeout ", m.timeout_ns / 1e9, " s)");
    throw Error("weave: " + m.broken_why);
  }
  if (e != cudaSuccess) {
    m.broken = true;
    m.broken_why = detail::concat("device error on rank ", m.info.rank, ": ", cudaGetErrorName(e), " (",
                                  cudaGetErrorString(e), ")");
    throw Error("weave: " + m.broken_why);
  }
}

void Communicator::barrier() { impl_->boot->barrier(); }

bool Communicator::quiesce() noexcept {
  Impl& m = *impl_;
  if (m.broken || !m.boot) return false;
  // cudaDeviceSynchronize covers every stream of this device, the non-blocking ones included
  // (a legacy-stream memset does not wait for those). After the barrier every rank has done the
  // same, so no peer's kernel can still write into this rank's heap either: a kernel's stores,
  // peer stores and reductions included, are performed by the time it is complete. The
  // communicator's device, whatever the caller's current one is.
  int current = -1;
  const bool switched = cudaGetDevice(&current) == cudaSuccess && current != m.device &&
                        cudaSetDevice(m.device) == cudaSuccess;
  const bool idle = cudaDeviceSynchronize() == cudaSuccess;
  if (switched) cudaSetDevice(current);
  try {
    m.boot->barrier();
  } catch (...) {
    return false;
  }
  return idle;
}

SignalSet::SignalSet(Communicator& c, const std::string& name, int count) : c_(&c) {
  WEAVE_CHECK(count > 0, "signal set '", name, "' needs at least one counter");
  // The counters, then the round cell (next_round): zeroed together, written by this rank only.
  void* p = c.alloc(sizeof(unsigned long long) * (count + 1), 256);
  try {
    // The memory may come from a tensor freed without a quiesce (SymmetricTensor does not wait):
    // zero it only once no rank has work left that could still write there.
    c.quiesce();
    WEAVE_CUDA_CHECK(cudaMemset(p, 0, sizeof(unsigned long long) * (count + 1)));
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    c.barrier();  // nobody signals into counters a peer has not zeroed yet
  } catch (...) {
    c.free(p);
    throw;
  }
  PeerPtrs pp = c.peers(p, sizeof(unsigned long long) * (count + 1));
  round_ = RunningCounts(static_cast<unsigned long long*>(p) + count, 1);
  for (int r = 0; r < c.world(); ++r) view_.ptr[r] = static_cast<unsigned long long*>(pp[r]);
  view_.world = c.world();
  view_.rank = c.rank();
  view_.count = count;
  view_.name_id = c.name_id(name);
  view_.timeout_ns = c.wait_timeout_ns();
  view_.record = c.wait_record();
  view_.abort = c.abort_word();
}

SignalSet::SignalSet(SignalSet&& o) noexcept : c_(o.c_), view_(o.view_), round_(std::move(o.round_)) {
  o.c_ = nullptr;
}

SignalSet::~SignalSet() {
  if (!c_) return;
  c_->quiesce();
  try {
    c_->free(view_.ptr[view_.rank]);
  } catch (...) {
  }
}

}  // namespace weave::runtime
