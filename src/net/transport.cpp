#include "weave/net/transport.hpp"

#include <cuda_runtime.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <cstring>
#include <deque>

#include "weave/common/error.hpp"
#include "weave/runtime/env.hpp"

namespace weave::net {

using detail::concat;

static_assert(sizeof(OpContext::provider_context) >= sizeof(fi_context2), "OpContext holds a struct fi_context2");

namespace {

constexpr uint64_t kMrModes = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

void check(int rc, const char* what) {
  if (rc != 0) throw Error(concat("weave::net: ", what, " failed: ", fi_strerror(-rc), " (", rc, ")"));
}

std::string op_text(const OpContext* op) {
  if (!op) return "an operation without context";
  if (op->kind == OpKind::call_post) return concat(op_name(op->kind), " of call slot ", op->owner, " to peer ", op->peer);
  if (op->kind != OpKind::data_write && op->kind != OpKind::flag_write && op->kind != OpKind::data_write_imm)
    return concat(op_name(op->kind), " to peer ", op->peer);
  return concat(op_name(op->kind), " of chunk ", op->chunk, " to peer ", op->peer);
}

std::string mr_mode_text(int m) {
  std::string s;
  const std::pair<int, const char*> bits[] = {{FI_MR_LOCAL, "local"},         {FI_MR_VIRT_ADDR, "virt_addr"},
                                              {FI_MR_ALLOCATED, "allocated"}, {FI_MR_PROV_KEY, "prov_key"},
                                              {FI_MR_ENDPOINT, "endpoint"},   {FI_MR_HMEM, "hmem"}};
  for (const auto& [bit, name] : bits)
    if (m & bit) s += s.empty() ? name : concat("|", name);
  return s.empty() ? "none" : s;
}

// fi_getinfo for RDM + RMA under the given order and memory asks; nullptr where nothing matches.
fi_info* query(const std::string& provider, const std::string& domain, bool want_waw, bool want_hmem) {
  fi_info* hints = fi_allocinfo();
  if (!hints) throw Error("weave::net: fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (want_hmem ? FI_HMEM : 0);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = static_cast<int>(kMrModes | (want_hmem ? FI_MR_HMEM : 0));
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // after set-up, one thread (the proxy) uses it
  if (want_waw) hints->tx_attr->msg_order = hints->rx_attr->msg_order = FI_ORDER_WAW;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  if (!domain.empty()) hints->domain_attr->name = strdup(domain.c_str());
  fi_info* info = nullptr;
  const int rc = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &info);
  fi_freeinfo(hints);
  if (rc == -FI_ENODATA) return nullptr;
  check(rc, "fi_getinfo");
  if (domain.empty()) return info;
  // A layered provider (ofi_rxm over tcp, libfabric 1.17) lists every interface whatever the hint
  // names: keep the named domain's first entry, or offer nothing.
  fi_info* named = nullptr;
  for (fi_info* i = info; i && !named; i = i->next)
    if (i->domain_attr && i->domain_attr->name && domain == i->domain_attr->name) named = fi_dupinfo(i);
  fi_freeinfo(info);
  if (named) named->next = nullptr;
  return named;
}

}  // namespace

std::string_view notify_name(Notify n) {
  switch (n) {
    case Notify::automatic: return "auto";
    case Notify::ordered: return "ordered";
    case Notify::unordered: return "unordered";
  }
  return "?";
}

Notify parse_notify(std::string_view text) {
  for (Notify n : {Notify::automatic, Notify::ordered, Notify::unordered})
    if (text == notify_name(n)) return n;
  throw Error(concat("weave::net: notification mode '", text, "' is not auto, ordered or unordered"));
}

std::string_view op_name(OpKind k) {
  switch (k) {
    case OpKind::data_write: return "data write";
    case OpKind::flag_write: return "flag write";
    case OpKind::data_write_imm: return "data write with immediate";
    case OpKind::heartbeat: return "heartbeat write";
    case OpKind::abort_note: return "abort note write";
    case OpKind::call_post: return "call post write";
    case OpKind::call_checked: return "call checked write";
  }
  return "?";
}

struct Transport::Impl {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_av* av = nullptr;
  fid_cq* cq = nullptr;
  fid_ep* ep = nullptr;
  std::vector<fi_addr_t> peers;
  std::deque<Region> regions;
  uint64_t next_key = 1;
  std::string provider;
  Notify notify = Notify::ordered;
  bool waw = false, hmem = false;

  ~Impl() {
    if (ep) fi_close(&ep->fid);
    for (Region& r : regions) fi_close(&static_cast<fid_mr*>(r.mr)->fid);
    if (cq) fi_close(&cq->fid);
    if (av) fi_close(&av->fid);
    if (domain) fi_close(&domain->fid);
    if (fabric) fi_close(&fabric->fid);
    if (info) fi_freeinfo(info);
  }

  bool post(int peer, const Region& local, const void* src, const RemoteRegion& dst, uint64_t offset, size_t bytes,
            OpContext* op, bool more, const uint64_t* imm) {
    op->peer = peer;
    if (peer < 0 || peer >= static_cast<int>(peers.size()))
      throw Error(concat("weave::net: ", op_text(op), ": no such peer (", peers.size(), " known)"));
    const auto* s = static_cast<const char*>(src);
    const auto* base = static_cast<const char*>(local.ptr);
    if (s < base || s + bytes > base + local.bytes)
      throw Error(concat("weave::net: ", op_text(op), ": source [", static_cast<const void*>(s), ", +", bytes,
                         ") is outside its registered region [", local.ptr, ", +", local.bytes, ")"));
    if (offset > dst.bytes || bytes > dst.bytes - offset)
      throw Error(concat("weave::net: ", op_text(op), ": destination [", offset, ", ", offset + bytes,
                         ") is outside the peer's region of ", dst.bytes, " bytes"));
    iovec iov{const_cast<void*>(src), bytes};
    void* desc = local.desc;
    fi_rma_iov rma{dst.base + offset, bytes, dst.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = bytes ? 1 : 0;
    msg.addr = peers[static_cast<size_t>(peer)];
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = op->provider_context;
    msg.data = imm ? *imm : 0;
    const uint64_t flags = FI_COMPLETION | (more ? FI_MORE : 0) | (imm ? FI_REMOTE_CQ_DATA : 0);
    const ssize_t rc = fi_writemsg(ep, &msg, flags);
    if (rc == -FI_EAGAIN) return false;
    if (rc != 0)
      throw Error(concat("weave::net: ", op_text(op), " could not be posted: ", fi_strerror(static_cast<int>(-rc))));
    return true;
  }
};

Transport::Transport(const TransportOptions& opts) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const std::string provider = opts.provider.empty() ? env::get_string("WEAVE_NET_PROVIDER") : opts.provider;
  const Notify want = opts.notify == Notify::automatic ? parse_notify(env::get_string("WEAVE_NET_NOTIFY")) : opts.notify;
  // Ask for the most first (device memory, write-after-write order) and settle for less.
  for (bool hmem : {opts.device_memory, false}) {
    for (bool waw : {want != Notify::unordered, false}) {
      if (!m.info) {
        m.info = query(provider, opts.domain, waw, hmem);
        if (m.info) m.hmem = hmem;
      }
      if (want == Notify::ordered) break;  // never settle for less order than forced
    }
  }
  if (!m.info)
    throw Error(concat("weave::net: libfabric offers no RDM endpoint with RMA", provider.empty() ? "" : " from provider ",
                       provider, opts.domain.empty() ? "" : " on domain ", opts.domain,
                       want == Notify::ordered ? " with write-after-write order (WEAVE_NET_NOTIFY=ordered)" : "",
                       "; check WEAVE_NET_PROVIDER and libfabric's FI_PROVIDER"));
  fi_info* info = m.info;
  m.provider = info->fabric_attr->prov_name;
  m.waw = (info->tx_attr->msg_order & FI_ORDER_WAW) && (info->rx_attr->msg_order & FI_ORDER_WAW);
  m.notify = want == Notify::automatic ? (m.waw ? Notify::ordered : Notify::unordered) : want;
  if (m.notify == Notify::unordered && info->domain_attr->cq_data_size < 4)
    throw Error(concat("weave::net: provider ", m.provider, " carries ", info->domain_attr->cq_data_size,
                       " bytes of immediate data; unordered notification needs 4"));
  if (info->domain_attr->mr_mode & ~static_cast<int>(kMrModes | FI_MR_HMEM))
    throw Error(concat("weave::net: provider ", m.provider, " needs memory-registration modes weave lacks (0x",
                       std::hex, info->domain_attr->mr_mode, ")"));

  check(fi_fabric(info->fabric_attr, &m.fabric, nullptr), "fi_fabric");
  check(fi_domain(m.fabric, info, &m.domain, nullptr), "fi_domain");
  fi_av_attr av_attr{};
  av_attr.type = info->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info->domain_attr->av_type;
  check(fi_av_open(m.domain, &av_attr, &m.av, nullptr), "fi_av_open");
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = FI_WAIT_NONE;  // the proxy polls
  cq_attr.size = std::max<size_t>(info->tx_attr->size + info->rx_attr->size, 1024);
  check(fi_cq_open(m.domain, &cq_attr, &m.cq, nullptr), "fi_cq_open");
  check(fi_endpoint(m.domain, info, &m.ep, nullptr), "fi_endpoint");
  check(fi_ep_bind(m.ep, &m.av->fid, 0), "fi_ep_bind(av)");
  check(fi_ep_bind(m.ep, &m.cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  check(fi_enable(m.ep), "fi_enable");
}

Transport::~Transport() = default;

const std::string& Transport::provider() const { return impl_->provider; }
Notify Transport::notify() const { return impl_->notify; }
bool Transport::waw_ordered() const { return impl_->waw; }
bool Transport::device_memory() const { return impl_->hmem; }
size_t Transport::tx_depth() const { return impl_->info->tx_attr->size; }
size_t Transport::cq_data_bytes() const { return impl_->info->domain_attr->cq_data_size; }
int Transport::peers() const { return static_cast<int>(impl_->peers.size()); }

std::string Transport::describe() const {
  const fi_info* i = impl_->info;
  return concat("provider ", impl_->provider, ", domain ", i->domain_attr->name, ", fabric ", i->fabric_attr->name,
                ", write-after-write order ", impl_->waw ? "yes" : "no", ", MR mode ",
                mr_mode_text(i->domain_attr->mr_mode), ", notification ", notify_name(impl_->notify),
                ", device memory ", impl_->hmem ? "registered (FI_HMEM)" : "staged through host bounce buffers",
                ", tx depth ", i->tx_attr->size, ", immediate data ", i->domain_attr->cq_data_size, " bytes");
}

std::vector<uint8_t> Transport::address() const {
  std::vector<uint8_t> a(256);
  size_t len = a.size();
  check(fi_getname(&impl_->ep->fid, a.data(), &len), "fi_getname");
  a.resize(len);
  return a;
}

int Transport::add_peer(const void* address, size_t len) {
  (void)len;  // the provider knows its address format's length
  fi_addr_t fa = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(impl_->av, address, 1, &fa, 0, nullptr);
  if (n != 1) throw Error(concat("weave::net: fi_av_insert of peer ", impl_->peers.size(), " failed (", n, ")"));
  impl_->peers.push_back(fa);
  return static_cast<int>(impl_->peers.size()) - 1;
}

const Region& Transport::register_memory(void* ptr, size_t bytes, MemKind kind) {
  Impl& m = *impl_;
  if (kind == MemKind::device && !m.hmem)
    throw Error(concat("weave::net: provider ", m.provider,
                       " cannot register device memory (no FI_HMEM); the proxy stages it through host bounce buffers"));
  const int mode = m.info->domain_attr->mr_mode;
  iovec iov{ptr, bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_WRITE | FI_REMOTE_WRITE;
  attr.requested_key = (mode & FI_MR_PROV_KEY) ? 0 : m.next_key++;
  attr.iface = kind == MemKind::device ? FI_HMEM_CUDA : FI_HMEM_SYSTEM;
  if (kind == MemKind::device) WEAVE_CUDA_CHECK(cudaGetDevice(&attr.device.cuda));
  fid_mr* mr = nullptr;
  check(fi_mr_regattr(m.domain, &attr, 0, &mr), "fi_mr_regattr");
  if (mode & FI_MR_ENDPOINT) {
    const int rc = fi_mr_bind(mr, &m.ep->fid, 0);
    if (rc == 0) check(fi_mr_enable(mr), "fi_mr_enable");
    if (rc != 0) fi_close(&mr->fid);
    check(rc, "fi_mr_bind");
  }
  const uint64_t base = (mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(ptr) : 0;
  return m.regions.emplace_back(Region{ptr, bytes, kind, fi_mr_desc(mr), {base, fi_mr_key(mr), bytes}, mr});
}

bool Transport::write(int peer, const Region& local, const void* src, const RemoteRegion& dst, uint64_t offset,
                      size_t bytes, OpContext* op, bool more) {
  return impl_->post(peer, local, src, dst, offset, bytes, op, more, nullptr);
}

bool Transport::write_data(int peer, const Region& local, const void* src, const RemoteRegion& dst, uint64_t offset,
                           size_t bytes, uint64_t imm, OpContext* op, bool more) {
  return impl_->post(peer, local, src, dst, offset, bytes, op, more, &imm);
}

size_t Transport::poll(Completion* out, size_t max) {
  fi_cq_data_entry e[16];
  const ssize_t n = fi_cq_read(impl_->cq, e, std::min<size_t>(max, 16));
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(impl_->cq, &err, 0) < 0) throw Error("weave::net: fi_cq_readerr failed");
    char buf[256] = {};
    const char* why = fi_cq_strerror(impl_->cq, err.prov_errno, err.err_data, buf, sizeof buf);
    OpContext* op = static_cast<OpContext*>(err.op_context);
    throw OpError(concat("weave::net: ", op_text(op), " failed: ", fi_strerror(err.err), " (provider: ",
                         why ? why : "no detail", ")"),
                  op);
  }
  if (n < 0) check(static_cast<int>(n), "fi_cq_read");
  for (ssize_t i = 0; i < n; ++i) {
    const bool arrival = (e[i].flags & FI_REMOTE_WRITE) && (e[i].flags & FI_REMOTE_CQ_DATA);
    out[i] = arrival ? Completion{nullptr, e[i].data} : Completion{static_cast<OpContext*>(e[i].op_context), 0};
  }
  return static_cast<size_t>(n);
}

}  // namespace weave::net
