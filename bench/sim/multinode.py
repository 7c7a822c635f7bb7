#!/usr/bin/env python3
"""Analytic (alpha-beta) model of weave's hierarchical multi-node fused kernels (issue 22, "At scale,
on paper"): N nodes x G H200 GPUs, one NIC per GPU, every network transfer between rail peers.

Per op and size it predicts
  unfused = compute (cuBLAS / cuDNN rate) + collective (NCCL-like hierarchical phases run one after
            another, each phase steps*alpha + bytes/beta; or --baseline ring: NCCL's flat
            rail-aligned ring, all links busy at once)
  fused   = max(compute/(1-p), T_nvlink, T_net) + fill/drain (one chunk of compute + one network chunk)
            (mKernel eq. 1; compute at weave's rate; p = share of SMs given to the communication roles)
Byte counts per GPU follow kernels/net_common (hierarchy.hpp, README.md):
  all_reduce  NVLink RS ((G-1)/G B) -> rail ring AR of B/G (2(N-1)/N * B/G) -> NVLink AG ((G-1)/G B)
  AG+GEMM     own shard S to each of N-1 rail peers; NVLink AG of the N shards of a local index
  GEMM+RS     NVLink RS of the node's partials ((G-1)/G B); partial shard to its owner: (N-1) S
  ring attn   K/V slice forwarded to the rail peer once per round: (N-1) slices over the network,
              N(G-1) slices over NVLink
Parameters: flag defaults (HARDWARE.md figures or assumptions), or derived from weave-bench JSON-lines
result files (--rates FILE..., --measured for the checked-in set); every parameter's source (file:line
or the default's label) is printed, and written as {"kind": "param"} lines with --json. Explicit
flags override both. Standard library only (matplotlib for --plot).
  python3 bench/sim/multinode.py [--measured | --rates F ...] [--json] [--check]
Parameters, the row -> parameter mapping and the predictions: bench/sim/README.md.
"""
import argparse, json, math, os, sys, tempfile

GiB = 1 << 30
US = 1e-6
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "bench", "results")

# ---- network profiles: per GPU, per direction. ASSUMPTIONS unless marked [src] ----
# Message latency alpha = queue (GPU command -> proxy took it) + post (the provider's write call) +
# wire (NIC, switch, remote flag); queue + post together are the "GPU write -> posted" target.
# Per message = the proxy's own occupancy + the provider's.
PROFILES = {
    # 8 x 400 Gb/s ConnectX-7, one per GPU [mKernel Table 4]; 50 GB/s per GPU [mKernel Table 1].
    # ASSUMED: 92 % of line rate for RC RDMA writes; queue 1 + post 1 (issue 22 target p50 <= 2 us)
    # + wire 1 us = 3 us; 0.2 us per message of proxy occupancy (target >= 5 M commands/s), none
    # extra for the NIC. Ordered notification (RC keeps write-after-write order).
    "ib": dict(name="IB RC (CX7)", link_GBps=50.0, eff=0.92, provider="verbs", notify="ordered",
               queue_us=1.0, post_us=1.0, wire_us=1.0, proxy_msg_us=0.2, provider_msg_us=0.0),
    # 16 x 200 Gb/s EFA per node = 400 Gb/s per GPU [mKernel Table 4], 50 GB/s per GPU [Table 1].
    # ASSUMED: 85 % of line rate for SRD (multipath, 2 NICs per GPU); 1 + 1 + 13 us = 15 us; 0.2 +
    # 0.3 us per message (completion-based notification: one extra completion). SRD is unordered.
    "efa": dict(name="EFA SRD", link_GBps=50.0, eff=0.85, provider="efa", notify="unordered",
                queue_us=1.0, post_us=1.0, wire_us=13.0, proxy_msg_us=0.2, provider_msg_us=0.3),
}

DEFAULTS = dict(
    # [src HARDWARE.md] usable NVLink ceiling ~370 GB/s per direction (TMA stores, 8+ SMs);
    # NCCL reaches 333 GB/s bus bandwidth at 1 GiB (2 ranks) -> 0.9 of it for the baseline.
    nvlink_GBps=370.0, nccl_nvlink_eff=0.9,
    # ASSUMED: per-step latency of an NVLink phase (flag round trip; HARDWARE.md measures a 4.6-7.4 us
    # round trip *with* an 8 KB tile, so 2 us per pipelined step is a middle value), NCCL launch.
    nvlink_alpha_us=2.0, nccl_launch_us=10.0,
    # [src HARDWARE.md] cuBLAS bf16 16384^3 class: 680 TFLOP/s (789 at 8192^3, 594 at 4096x2048x4096);
    # cuDNN SDPA non-causal D128: ~600-616 TFLOP/s. (Dense peak 989 [HOPPER-RECIPES.md, FA3 s3.1].)
    # The unfused baseline runs at the same rates unless --base-*-tflops or measured rows say otherwise.
    gemm_tflops=680.0, attn_tflops=600.0,
    # ASSUMED: SMs given to communication roles (mKernel's best static splits: 2-64 SMs of 132;
    # HARDWARE.md: TMA saturates NVLink from ~8 SMs; + network send/recv blocks) -> 16/132.
    comm_sms=16, sms=132,
    # NVLink push blocks of the hierarchical AG+GEMM and ring attention at G > 1, on top of the
    # send/recv blocks (NetTpOptions / NetRingOptions default; the measured rows are G = 1).
    push_blocks=2,
    # chunk sizes [mKernel Table 3]: AG+GEMM 128 rows; GEMM+AR 4 tiles (256 KiB); GEMM+RS 2-32 tiles
    # (8 x 64 KiB taken); ring attention 128-row K/V tiles.
    ag_chunk_rows=128, ar_chunk_bytes=256 << 10, rs_chunk_bytes=512 << 10, attn_chunk_rows=128,
    hidden=8192, ffn=28672, heads=64, kv_heads=64, head_dim=128, elem=2,
)
DEFAULT_SRC = dict(
    nvlink_GBps="HARDWARE.md (TMA store ceiling)", nccl_nvlink_eff="HARDWARE.md (NCCL AR 333 of 370 GB/s)",
    nvlink_alpha_us="assumption", nccl_launch_us="assumption",
    gemm_tflops="HARDWARE.md (cuBLAS bf16 16384^3 class)", attn_tflops="HARDWARE.md (cuDNN SDPA D128)",
    comm_sms="assumption", push_blocks="NetTpOptions / NetRingOptions default",
)
OPS = ["ag_gemm", "gemm_ar", "gemm_rs", "ring_attn"]
COLL = {"ag_gemm": "all_gather", "gemm_ar": "all_reduce", "gemm_rs": "reduce_scatter", "ring_attn": "all_gather"}
NET_KERNEL = {"net_ag_gemm": "ag_gemm", "net_gemm_ar": "gemm_ar", "net_gemm_rs": "gemm_rs",
              "net_ring_attention": "ring_attn"}
PUSHES = {"ag_gemm", "ring_attn"}  # ops whose G > 1 kernel adds NVLink push blocks

# The checked-in runs --measured feeds (bench/results; the README's table comes from them).
MEASURED = [
    "2026-12-06i-h200-gemm-core.jsonl", "2026-12-06i-h200-gemm-models.jsonl",  # weave + cuBLAS, one call
    "2026-11-30-h200x2-session7-attention.jsonl",                              # weave + cuDNN, one call
    "2026-11-30-h200x2-session9-c6-prim.jsonl", "2026-11-30-h200x2-session9-c6-coll.jsonl",
    "2026-12-04-h200-host-net.jsonl", "2026-12-02c-cpu-net.jsonl",            # proxy rows (tcp)
    "2026-12-03d-h200-net-tp-shared.jsonl", "2026-12-04-h200-net-rows-shared.jsonl",
    "2026-12-03e-h200-net-ring-bench-shared.jsonl",                            # send/recv blocks
    "2026-11-30-h200x2-session7-tp.jsonl", "2026-11-30-h200x2-session9-c6-sp.jsonl",  # cross-checks
]

# mKernel (arXiv 2609.13585) section 5, 2 x 8 H200, speedup over cuBLAS/FlashAttention + NCCL ("up to").
# Shapes per point are only in Figures 5/6 (not in the text we have): compare with the model's max.
PAPER = {
    ("ag_gemm", "ib"): (1.34, "up to"), ("ag_gemm", "efa"): (1.41, "up to"),
    ("gemm_ar", "ib"): (1.72, "up to"), ("gemm_ar", "efa"): (1.53, "up to"),
    ("gemm_rs", "ib"): (1.27, "1.02-1.27 for M>=16K (testbed not stated)"),
    ("gemm_rs", "efa"): (1.27, "1.02-1.27 for M>=16K (testbed not stated)"),
    ("ring_attn", "ib"): (1.88, "up to"), ("ring_attn", "efa"): (1.78, "up to"),
}


# ---------------------------------------------------------------- measured rows
class RatesError(Exception):
    pass


CARDS = ("H200", "H100")  # preference order: the model is of H200


class Row:
    def __init__(self, path, line, o):
        self.path, self.line, self.o = path, line, o
        name = os.path.basename(path).lower()
        # weave-bench rows carry no card field: the file name says where it ran
        self.card = next((c for c in CARDS if c.lower() in name), "CPU host" if "cpu" in name else "?")
        self.rank = CARDS.index(self.card) if self.card in CARDS else len(CARDS)

    def cite(self, what="", n=1):
        s = f"{os.path.basename(self.path)}:{self.line} ({self.card}"
        s += f"; {what}" if what else ""
        return s + (f"; median of {n} rows)" if n > 1 else ")")


def load(paths):
    """JSON lines of every file (blank lines skipped); a line that is not a JSON object is an error
    naming the file and line."""
    rows, per_file = [], {}
    for p in paths:
        try:
            f = open(p)
        except OSError as e:
            raise RatesError(f"{p}: cannot read ({e.strerror})")
        with f:
            n = 0
            for i, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    o = json.loads(text.strip())
                except ValueError as e:
                    raise RatesError(f"{p}:{i}: not a JSON line ({e})")
                if not isinstance(o, dict):
                    raise RatesError(f"{p}:{i}: not a JSON object (a weave-bench row is one)")
                rows.append(Row(p, i, o))
                n += 1
        per_file[p] = n
    return rows, per_file


def num(o, k):
    v = o.get(k)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def best_card(c):
    """The rows of the best card present (H200, then H100, then the rest)."""
    top = min(r.rank for r in c)
    return [r for r in c if r.rank == top]


def median_row(c, key):
    """Rows of the best card present; the lower median by key (always a real row), and how many."""
    c = sorted(best_card(c), key=key)
    return c[(len(c) - 1) // 2], len(c)


# Filters: which rows can feed which parameter. Rows another filter rejects are ignored.
def f_gemm(impl):
    return lambda o: (o.get("kernel") == "gemm" and o.get("impl") == impl and o.get("dtype", "bf16") == "bf16"
                      and o.get("correct") is not False and o.get("a_layout", "mk") == "mk"
                      and all(isinstance(o.get(k), int) and o[k] > 0 and o[k] % 128 == 0 for k in "MNK")
                      and (num(o, "tflops") or 0) > 0)  # the model's shards are 128-aligned: no ragged rows


def f_attn(impl, D):
    return lambda o: (o.get("kernel") == "attention" and o.get("impl") == impl and o.get("D") == D
                      and o.get("causal") is False and o.get("correct") is not False
                      and isinstance(o.get("S"), int) and (num(o, "tflops") or 0) > 0)


def f_signal(o):
    return o.get("kernel") == "signal" and o.get("impl") == "weave" and (num(o, "latency_us") or 0) > 0


def f_bidir(o):
    return (o.get("kernel") == "tma_store_bidir" and o.get("impl") == "weave" and (o.get("world") or 0) >= 2
            and isinstance(o.get("blocks"), int) and (num(o, "gbs") or 0) > 0)


def f_nccl(coll):
    return lambda o: (o.get("kernel") == coll and o.get("impl") == "nccl" and (o.get("world") or 0) >= 2
                      and not o.get("includes_copies") and (num(o, "busbw_gbs") or 0) > 0
                      and (num(o, "bytes") or 0) > 0 and (num(o, "time_us") or 0) > 0)


def f_blocks(o):
    return (o.get("kernel") in NET_KERNEL and o.get("impl") == "weave" and not o.get("adaptive")
            and isinstance(o.get("send_blocks"), int) and isinstance(o.get("recv_blocks"), int))


def provider_of(o):
    return str(o.get("provider", "")).split(";")[0]


def f_proxy(notify, provider=None):
    return lambda o: (o.get("kernel") == "proxy" and o.get("impl") == "weave" and o.get("notify") == notify
                      and o.get("batch") == 8 and o.get("correct") is not False
                      and (num(o, "taken_p50_us") or 0) > 0
                      and (provider is None or provider_of(o) == provider))


def f_transfer(provider):
    return lambda o: (o.get("kernel") == "transfer" and o.get("impl") == "weave" and provider_of(o) == provider
                      and o.get("correct") is not False and (num(o, "gbs") or 0) > 0)


def nearest_table(c, key, dist, what):
    """For a target, the rows at the nearest measured key (a tie: the larger key), their median."""
    memo = {}

    def look(t):
        if t not in memo:
            k0 = min({key(r.o) for r in c}, key=lambda k: (dist(k, t), -math.prod(k), tuple(-x for x in k)))
            r, n = median_row([r for r in c if key(r.o) == k0], lambda r: r.o["tflops"])
            memo[t] = (r.o["tflops"], r.cite(what(r.o), n), k0)
        return memo[t]
    return look


def logdist(x, y):
    return sum(abs(math.log(p / q)) for p, q in zip(x, y))


# ---------------------------------------------------------------- parameters
def resolve(opts, rows=(), per_file=None):
    """The model's parameters: explicit flags, else measured rows, else DEFAULTS / PROFILES. Returns
    the model dict `a` with a["src"] (parameter -> source) and a["notes"]."""
    a = {k: (opts[k] if opts.get(k) is not None else v) for k, v in DEFAULTS.items()}
    a["baseline"] = opts.get("baseline", "hier")
    src, notes, used = {}, [], {}
    flag = lambda k: opts.get(k) is not None

    def mark(r):
        used[r.path] = used.get(r.path, 0) + 1

    def pick(filt, key):  # the median row of the best card among the rows filt takes, and how many
        c = [r for r in rows if filt(r.o)]
        for r in c:
            mark(r)
        return median_row(c, lambda r: key(r.o)) if c else None

    def scalar(name, filt, key, what):
        if flag(name):
            src[name] = "flag"
            return
        got = pick(filt, key)
        if got:
            r, n = got
            a[name] = key(r.o)
            src[name] = r.cite(what(r.o), n)
        else:
            src[name] = DEFAULT_SRC[name]

    # compute rates: per shape from the nearest measured shape, else one figure. Fused (weave) and
    # unfused (cuBLAS / cuDNN) look among the shapes both were measured at (one call: a fair pair).
    D = a["head_dim"]
    gk, ak = (lambda o: (o["M"], o["N"], o["K"])), (lambda o: (o["S"],))
    spec = {"gemm": (f_gemm("weave"), gk, lambda o: f"weave gemm {o['M']}x{o['N']}x{o['K']}", "gemm_tflops", None),
            "base_gemm": (f_gemm("cublas"), gk, lambda o: f"cuBLAS {o['M']}x{o['N']}x{o['K']}",
                          "base_gemm_tflops", "gemm"),
            "attn": (f_attn("weave", D), ak, lambda o: f"weave attention S {o['S']} D {o['D']} non-causal",
                     "attn_tflops", None),
            "base_attn": (f_attn("cudnn", D), ak, lambda o: f"cuDNN S {o['S']} D {o['D']} non-causal",
                          "base_attn_tflops", "attn")}
    cand = {k: [r for r in rows if v[0](r.o)] for k, v in spec.items()}
    for k in cand:
        for r in cand[k]:
            mark(r)
    for fu, ba in (("gemm", "base_gemm"), ("attn", "base_attn")):
        both = {spec[fu][1](r.o) for r in cand[fu]} & {spec[ba][1](r.o) for r in cand[ba]}
        if both:
            for k in (fu, ba):
                cand[k] = [r for r in cand[k] if spec[k][1](r.o) in both]
    a["rates"] = {}
    for kind, (filt, key, what, fl, fb) in spec.items():
        if flag(fl):
            a["rates"][kind] = ("const", opts[fl], "flag")
        elif cand[kind]:
            a["rates"][kind] = ("table", nearest_table(cand[kind], key, logdist, what), None)
        elif fb:  # the baseline at the fused rate: the assumption-only model
            a["rates"][kind] = ("same", a["rates"][fb], f"assumption: = {fb}_tflops")
        else:
            a["rates"][kind] = ("const", DEFAULTS[fl], DEFAULT_SRC[fl])
    for kind in ("gemm", "base_gemm", "attn", "base_attn"):
        src[kind + "_tflops"] = describe_rate(a["rates"][kind])

    # SMs the fused kernels take from compute: the rows' send + recv blocks (+ push blocks at G > 1)
    a["comm"] = {}
    for op in OPS:
        name = f"comm_sms[{op}]"
        extra = a["push_blocks"] if op in PUSHES else 0
        got = None if flag("comm_sms") else pick(
            lambda o, op=op: f_blocks(o) and NET_KERNEL[o["kernel"]] == op,
            lambda o: o["send_blocks"] + o["recv_blocks"])
        if flag("comm_sms"):
            a["comm"][op], src[name] = a["comm_sms"], "flag"
        elif got:
            r, n = got
            a["comm"][op] = r.o["send_blocks"] + r.o["recv_blocks"] + extra
            src[name] = r.cite(f"{r.o['kernel']} send {r.o['send_blocks']} + recv {r.o['recv_blocks']}"
                               + (f" + push {extra} ({DEFAULT_SRC['push_blocks']})" if extra else "")
                               + " blocks" + ("; the row's time not used" if r.o.get("shared_gpu") else ""), n)
        else:
            a["comm"][op], src[name] = a["comm_sms"], DEFAULT_SRC["comm_sms"]

    # NVLink (fused): TMA stores both ways at once, at the comm SM count (the fewest of the ops)
    if flag("nvlink_GBps"):
        src["nvlink_GBps"] = "flag"
    else:
        c = [r for r in rows if f_bidir(r.o)]
        for r in c:
            mark(r)
        if c:
            c, want = best_card(c), min(a["comm"].values())
            bl = [r.o["blocks"] for r in c if r.o["blocks"] <= want] or [min(r.o["blocks"] for r in c)]
            r, n = median_row([r for r in c if r.o["blocks"] == max(bl)], lambda r: r.o["gbs"])
            a["nvlink_GBps"] = r.o["gbs"]
            src["nvlink_GBps"] = r.cite(f"tma_store_bidir, {r.o['blocks']} blocks, world {r.o['world']}", n)
        else:
            src["nvlink_GBps"] = DEFAULT_SRC["nvlink_GBps"]
    scalar("nvlink_alpha_us", f_signal, lambda o: o["latency_us"],
           lambda o: f"weave signal one-way, world {o.get('world')}")

    # NCCL (unfused NVLink phases): bus GB/s of the collective the baseline calls, at its largest
    # measured size; launch: its smallest size's whole time (includes one hop)
    a["nccl_bw"], a["nccl_launch"] = {}, {}
    for coll in sorted(set(COLL.values())):
        c = [r for r in rows if f_nccl(coll)(r.o)]
        for r in c:
            mark(r)
        c = best_card(c) if c else c
        nb, nl = f"nccl_GBps[{coll}]", f"nccl_launch_us[{coll}]"
        if flag("nccl_nvlink_eff") or not c:
            a["nccl_bw"][coll] = a["nvlink_GBps"] * a["nccl_nvlink_eff"]
            src[nb] = ("flag" if flag("nccl_nvlink_eff") else DEFAULT_SRC["nccl_nvlink_eff"]) + \
                " x nvlink_GBps"
        else:
            big = max(r.o["bytes"] for r in c)
            r, n = median_row([r for r in c if r.o["bytes"] == big], lambda r: r.o["busbw_gbs"])
            a["nccl_bw"][coll] = r.o["busbw_gbs"]
            src[nb] = r.cite(f"NCCL {coll} bus GB/s at {big / GiB:g} GiB, world {r.o['world']}", n)
        if flag("nccl_launch_us") or not c:
            a["nccl_launch"][coll] = a["nccl_launch_us"]
            src[nl] = "flag" if flag("nccl_launch_us") else DEFAULT_SRC["nccl_launch_us"]
        else:
            small = min(r.o["bytes"] for r in c)
            r, n = median_row([r for r in c if r.o["bytes"] == small], lambda r: r.o["time_us"])
            a["nccl_launch"][coll] = r.o["time_us"]
            src[nl] = r.cite(f"NCCL {coll} whole time at {small >> 10} KiB, world {r.o['world']}", n)

    # network per profile: weave's proxy queue from the proxy rows; the provider's post, per-message
    # cost and line rate only from rows of that profile's provider (verbs / efa)
    a["net"] = {}
    for prof, p in PROFILES.items():
        q, post, msg = p["queue_us"], p["post_us"], p["proxy_msg_us"] + p["provider_msg_us"]
        qs, ps, ms = "assumption", "assumption", "assumption"
        got = pick(f_proxy(p["notify"]), lambda o: o["taken_p50_us"])
        if got:
            r, n = got
            q, qs = r.o["taken_p50_us"], r.cite(
                f"proxy taken_p50 (ring -> proxy), notify {p['notify']}, batch 8, host producer", n)
        got = pick(f_proxy(p["notify"], p["provider"]), lambda o: o.get("post_p50_us") or 0)
        if got and num(got[0].o, "post_p50_us") is not None:
            r, n = got
            post, ps = r.o["post_p50_us"], r.cite(f"proxy post_p50 on {r.o['provider']}", n)
            if num(r.o, "commands_per_s"):
                msg, ms = 1e6 / r.o["commands_per_s"], r.cite(f"1 / commands_per_s on {r.o['provider']}", n)
        net = {}
        if flag("net_alpha_us"):
            net["alpha_us"], src[f"net_alpha_us[{prof}]"] = opts["net_alpha_us"], "flag"
        else:
            net["alpha_us"] = q + post + p["wire_us"]
            src[f"net_alpha_us[{prof}]"] = (f"queue {q:.3g} [{qs}] + post {post:.3g} [{ps}] + "
                                            f"wire {p['wire_us']:.3g} [assumption]")
        if flag("net_msg_us"):
            net["msg_us"], src[f"net_msg_us[{prof}]"] = opts["net_msg_us"], "flag"
        else:
            net["msg_us"], src[f"net_msg_us[{prof}]"] = msg, ms
        c = [r for r in rows if f_transfer(p["provider"])(r.o)]
        for r in c:
            mark(r)
        if flag("net_GBps"):
            net["GBps"], src[f"net_GBps[{prof}]"] = opts["net_GBps"], "flag"
        elif c:  # the largest message, device memory first
            c = best_card(c)
            big = max(r.o.get("bytes", 0) for r in c)
            c = [r for r in c if r.o.get("bytes", 0) == big]
            c = [r for r in c if r.o.get("memory") == "device"] or c
            r, n = median_row(c, lambda r: r.o["gbs"])
            net["GBps"], src[f"net_GBps[{prof}]"] = r.o["gbs"], r.cite(f"transfer on {r.o['provider']}", n)
        else:
            net["GBps"] = p["link_GBps"] * p["eff"]
            src[f"net_GBps[{prof}]"] = f"line rate {p['link_GBps']:g} [mKernel Table 1] x {p['eff']} [assumption]"
        a["net"][prof] = net

    if rows:
        notes += rate_notes(rows, a, mark)
    for path, n in (per_file or {}).items():
        b = os.path.basename(path)
        if not used.get(path):
            notes.append(f"{b}: {n} rows, none usable: defaults kept for what it would have fed")
        else:
            notes.append(f"{b}: {used[path]} of {n} rows usable (a parameter's candidates or a cross-check)")
    a["src"], a["notes"] = src, notes
    return a


def describe_rate(r):
    return r[2] if r[0] in ("const", "same") else "per shape, the nearest measured shape (table below)"


def rate(a, kind, key):
    """(TFLOP/s, source, measured key) of a compute rate at a shape."""
    r = a["rates"][kind]
    while r[0] == "same":
        r = r[1]
    if r[0] == "const":
        return r[1], r[2], None
    return r[1](key)


def rate_notes(rows, a, mark):
    """What the rows say that the model does not take, and why; cross-checks of the SM share p."""
    out = []
    prov = {}
    for r in rows:
        o = r.o
        if o.get("kernel") in ("proxy", "transfer") and o.get("impl") == "weave":
            pv = provider_of(o)
            if pv not in (p["provider"] for p in PROFILES.values()):
                prov.setdefault(pv, []).append(r)
    for pv, rs in sorted(prov.items()):
        post = [r.o["post_p50_us"] for r in rs if num(r.o, "post_p50_us")]
        rate_ = [r.o["commands_per_s"] for r in rs if num(r.o, "commands_per_s")]
        gbs = [r.o["gbs"] for r in rs if r.o.get("kernel") == "transfer" and num(r.o, "gbs")]
        s = f"provider {pv} rows ({len(rs)}): not the profiles' network (IB verbs / EFA), so"
        if post:
            s += f" post_p50 {min(post):.2f}-{max(post):.2f} us,"
        if rate_:
            s += f" {min(rate_) / 1e6:.2f}-{max(rate_) / 1e6:.2f} M commands/s (provider-bound),"
        if gbs:
            s += f" transfers up to {max(gbs):.2f} GB/s,"
        out.append(s + " are not used: post, per-message cost and line rate stay the profiles'")
    shared = [r for r in rows if r.o.get("shared_gpu")]
    if shared:
        out.append(f"{len(shared)} rows ran with ranks sharing one GPU (shared_gpu): their times are not "
                   "used; only their send/recv block counts")
    ad = [r for r in rows if r.o.get("adaptive")]
    if ad:
        out.append(f"{len(ad)} adaptive-split rows: not used (p is the fixed send/recv/push split)")
    # Cross-check of the (1 - p) compute share: weave's NVLink-fused GEMMs vs the GEMM alone on 2 x H200
    alone = {(r.o.get("kernel"), r.o.get("M"), r.o.get("N"), r.o.get("K")): r for r in rows
             if r.o.get("impl") == "weave-gemm-alone" and "sweep" not in r.o and num(r.o, "time_us")}
    for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        fu = [r for r in rows if r.o.get("kernel") == op and r.o.get("impl") == "weave" and "sweep" not in r.o
              and (op, r.o.get("M"), r.o.get("N"), r.o.get("K")) in alone and "layout" not in r.o
              and num(r.o, "time_us")]
        if fu:
            r = max(fu, key=lambda r: r.o["M"])
            al = alone[(op, r.o["M"], r.o["N"], r.o["K"])]
            mark(r); mark(al)
            out.append(f"cross-check {op}: on 2 x {r.card} (NVLink only) the fused kernel runs at "
                       f"{al.o['time_us'] / r.o['time_us']:.3f} of its GEMM alone at M = {r.o['M']} "
                       f"({r.o['num_comm_sms']} comm SMs, variant {r.o.get('variant')}; {r.cite()}); "
                       f"the model's 1 - p = {1 - a['comm'][op] / a['sms']:.3f}")
    one = {(r.o.get("S"), r.o.get("causal")): r for r in rows
           if r.o.get("kernel") == "ring_attention" and r.o.get("impl") == "weave-1gpu" and num(r.o, "tflops_per_gpu")}
    ring = [r for r in rows if r.o.get("kernel") == "ring_attention" and r.o.get("impl") == "weave"
            and (r.o.get("world") or 0) >= 2 and r.o.get("causal") is False and (r.o.get("S"), False) in one
            and num(r.o, "tflops_per_gpu")]
    if ring:
        r = max(ring, key=lambda r: r.o["S"])
        o1 = one[(r.o["S"], False)].o
        mark(r); mark(one[(r.o["S"], False)])
        out.append(f"cross-check ring_attn: on 2 x {r.card} the ring runs at {r.o['tflops_per_gpu']:.0f} "
                   f"TFLOP/s per GPU with {r.o['num_comm_sms']} comm SMs vs {o1['tflops_per_gpu']:.0f} on "
                   f"one GPU (S = {r.o['S']}, {r.o['tflops_per_gpu'] / o1['tflops_per_gpu']:.3f} of it; {r.cite()}); the model's 1 - p = "
                   f"{1 - a['comm']['ring_attn'] / a['sms']:.3f}")
    return out


# ---------------------------------------------------------------- model
class Link:
    def __init__(self, GBps, alpha_us, per_msg_us=0.0):
        self.bw = GBps * 1e9
        self.alpha = alpha_us * US
        self.per_msg = per_msg_us * US

    def phase(self, nbytes, steps):  # alpha-beta time of one phase
        return steps * self.alpha + nbytes / self.bw if nbytes > 0 else 0.0


def links(a, prof, op):
    n = a["net"][prof]
    fused_nvl = Link(a["nvlink_GBps"], a["nvlink_alpha_us"])
    nccl_nvl = Link(a["nccl_bw"][COLL[op]], a["nvlink_alpha_us"])
    net = Link(n["GBps"], n["alpha_us"], n["msg_us"])
    return fused_nvl, nccl_nvl, net


def op_bytes(op, size, N, G, a):
    """Per-GPU bytes and steps of weave's hierarchical schedule, and compute FLOPs per GPU.
    Returns dict: flops, kind (compute rate), shape (its lookup key), nvl (bytes out per GPU over
    NVLink), nvl_steps, net (bytes out per GPU over the network), net_steps, chunk (network chunk
    bytes), phases (the unfused collective as serial phases: (link, bytes, steps)), ring (flat-ring bytes)."""
    W, e, H, F = N * G, a["elem"], a["hidden"], a["ffn"]
    if op in ("ag_gemm", "gemm_ar", "gemm_rs"):
        T = size
        flops = 2.0 * T * H * F / W  # column-parallel W1 (AG+GEMM) or row-parallel W2 (GEMM+AR/RS)
        kind = "gemm"
        shape = (T, F // W, H) if op == "ag_gemm" else (T, H, F // W)  # per-GPU M x N x K
        if op == "ag_gemm":
            S = T / W * H * e  # own row shard of X (T x H)
            nvl, nvl_steps = (G - 1) * N * S, G - 1
            net, net_steps = (N - 1) * S, N - 1
            phases = [("net", net, N - 1), ("nvl", nvl, G - 1)]
            ring = dict(net=(W - 1) * S / G, nvl=(W - 1) * S * (G - 1) / G, steps=W - 1)
            chunk = a["ag_chunk_rows"] * H * e
        elif op == "gemm_ar":
            B = T * H * e  # partial output T x H on every GPU
            nvl, nvl_steps = 2 * (G - 1) / G * B, 2 * (G - 1)
            net, net_steps = 2 * (N - 1) / N * B / G, 2 * (N - 1)
            phases = [("nvl", (G - 1) / G * B, G - 1), ("net", net, 2 * (N - 1)),
                      ("nvl", (G - 1) / G * B, G - 1)]
            ring = dict(net=2 * (W - 1) / W * B / G, nvl=2 * (W - 1) / W * B * (G - 1) / G, steps=2 * (W - 1))
            chunk = a["ar_chunk_bytes"]
        else:  # gemm_rs
            B = T * H * e
            S = B / W
            nvl, nvl_steps = (G - 1) / G * B, G - 1
            net, net_steps = (N - 1) * S, N - 1
            phases = [("nvl", nvl, G - 1), ("net", net, N - 1)]
            ring = dict(net=(W - 1) * S / G, nvl=(W - 1) * S * (G - 1) / G, steps=W - 1)
            chunk = a["rs_chunk_bytes"]
    elif op == "ring_attn":
        L, D, Hq, Hk = size, a["head_dim"], a["heads"], a["kv_heads"]
        flops = 4.0 * L * L * D * Hq / W  # non-causal, batch 1: QK^T + PV over the whole sequence
        kind, shape = "attn", (L // W,)  # one ring step: L/W queries x L/W keys
        s = L / W * Hk * D * e * 2  # K and V slice of one rank
        nvl, nvl_steps = N * (G - 1) * s, N * (G - 1)
        net, net_steps = (N - 1) * s, N - 1
        # unfused: NCCL all_gather of K/V (hierarchical), then attention over the full sequence
        phases = [("net", net, N - 1), ("nvl", nvl, G - 1)]
        ring = dict(net=(W - 1) * s / G, nvl=(W - 1) * s * (G - 1) / G, steps=W - 1)
        chunk = a["attn_chunk_rows"] * Hk * D * e * 2
    else:
        raise ValueError(op)
    return dict(flops=flops, kind=kind, shape=shape, nvl=nvl, nvl_steps=nvl_steps, net=net,
                net_steps=net_steps, chunk=chunk, phases=phases, ring=ring)


def predict(op, size, N, G, prof, a):
    fnvl, cnvl, net = links(a, prof, op)
    b = op_bytes(op, size, N, G, a)
    fr, fsrc, fkey = rate(a, b["kind"], b["shape"])
    br, bsrc, bkey = rate(a, "base_" + b["kind"], b["shape"])
    t_comp = b["flops"] / (fr * 1e12)       # weave's kernel
    t_base = b["flops"] / (br * 1e12)       # cuBLAS / cuDNN in the unfused baseline
    # ---- unfused: compute, then the collective ----
    launch = a["nccl_launch"][COLL[op]] * US
    if a["baseline"] == "hier":
        t_coll = launch + sum((cnvl if l == "nvl" else net).phase(nb, st) for l, nb, st in b["phases"])
    else:  # NCCL flat rail-aligned ring, G channels (one NIC each), every link busy concurrently
        r = b["ring"]
        t_coll = launch + r["steps"] * max(cnvl.alpha, net.alpha) + max(r["net"] / net.bw, r["nvl"] / cnvl.bw)
    t_unfused = t_base + t_coll
    # ---- fused: compute and both tiers overlapped at chunk granularity ----
    p = a["comm"][op] / a["sms"]
    n_msgs = math.ceil(b["net"] / b["chunk"]) if b["net"] > 0 else 0
    t_net = (b["net"] / net.bw + n_msgs * net.per_msg + (net.alpha if n_msgs else 0.0))
    t_nvl = b["nvl"] / fnvl.bw + (fnvl.alpha if b["nvl"] > 0 else 0.0)
    chunk = min(b["chunk"], b["net"]) if b["net"] > 0 else b["chunk"]
    n_chunks = max(1.0, (b["net"] + b["nvl"]) / b["chunk"])
    fill = t_comp / n_chunks + (chunk / net.bw if b["net"] > 0 else chunk / fnvl.bw)
    t_fused = max(t_comp / (1 - p), t_nvl, t_net) + fill
    key = lambda k: "x".join(map(str, k)) if k else None
    return dict(kind="prediction", op=op, size=size, nodes=N, gpus=G, profile=prof, baseline=a["baseline"],
                compute_us=t_comp / US, base_compute_us=t_base / US, coll_us=t_coll / US, nvl_us=t_nvl / US,
                net_us=t_net / US, fill_us=fill / US, unfused_us=t_unfused / US, fused_us=t_fused / US,
                speedup=t_unfused / t_fused, net_MiB=b["net"] / 2**20, nvl_MiB=b["nvl"] / 2**20,
                tflops=fr, base_tflops=br, shape=key(b["shape"]), tflops_at=key(fkey), tflops_src=fsrc,
                base_tflops_at=key(bkey), base_tflops_src=bsrc, comm_sms=a["comm"][op])


SIZES = {"ag_gemm": [4096, 8192, 16384, 32768, 65536], "gemm_ar": [4096, 8192, 16384, 32768, 65536],
         "gemm_rs": [4096, 8192, 16384, 32768, 65536],
         "ring_attn": [65536, 131072, 262144, 524288, 1 << 20]}
CLUSTERS = [(2, 8), (4, 8)]


# ---------------------------------------------------------------- self-check
def check(a):
    """Self-check: (1) unfused == baseline compute + collective exactly; (2) with chunks -> 0, no
    per-message or latency costs and no SM penalty, fused -> max(compute, comm); (3) --rates parsing."""
    ok = True
    for op in SIZES:
        for N, G in CLUSTERS:
            for prof in PROFILES:
                r = predict(op, SIZES[op][2], N, G, prof, a)
                if abs(r["unfused_us"] - (r["base_compute_us"] + r["coll_us"])) > 1e-9 * r["unfused_us"]:
                    ok = False; print("FAIL unfused != compute + comm", op, N, prof)
                z = dict(a, comm={o: 0 for o in OPS}, nvlink_alpha_us=0.0,
                         net={p: dict(n, alpha_us=0.0, msg_us=0.0) for p, n in a["net"].items()},
                         ag_chunk_rows=1e-9, ar_chunk_bytes=1e-9, rs_chunk_bytes=1e-9, attn_chunk_rows=1e-9)
                r = predict(op, SIZES[op][2], N, G, prof, z)
                lim = max(r["compute_us"], r["nvl_us"], r["net_us"])
                if abs(r["fused_us"] - lim) > 1e-6 * lim:
                    ok = False; print("FAIL fused !-> max(compute, comm)", op, N, prof, r["fused_us"], lim)
    print("check:", "OK (unfused = compute + comm; fused -> max(compute, comm) as chunk -> 0)" if ok else "FAILED")
    return check_rates() and ok


def check_rates():
    ok = True

    def expect(cond, what):
        nonlocal ok
        if not cond:
            ok = False
        print(("  ok   " if cond else "  FAIL ") + what)

    base = vars(parser().parse_args([]))  # the rules alone: no flag of this run in the way
    plain = resolve(base)
    sig = lambda us, impl="weave": json.dumps({"kernel": "signal", "impl": impl, "world": 2, "latency_us": us})
    print("check --rates:")
    with tempfile.TemporaryDirectory() as d:
        def write(name, lines):
            p = os.path.join(d, name)
            with open(p, "w") as f:
                f.write("\n".join(lines) + "\n")
            return p
        f1 = write("match.jsonl", [
            sig(1.5), sig(9.0, "nccl"), "",  # NCCL's signal row: no filter takes it
            json.dumps({"kernel": "gemm", "impl": "weave", "M": 8192, "N": 1024, "K": 8192, "dtype": "fp8",
                        "tflops": 1500.0}),  # fp8: not the model's bf16 GEMM
            json.dumps({"kernel": "gemm", "impl": "weave", "M": 8191, "N": 1024, "K": 8192, "tflops": 300.0}),
            json.dumps({"kernel": "proxy", "impl": "weave", "notify": "ordered", "batch": 8, "provider": "tcp",
                        "taken_p50_us": 0.5, "post_p50_us": 9.0, "commands_per_s": 1e5})])
        a = resolve(base, *load([f1]))
        expect(a["nvlink_alpha_us"] == 1.5 and "match.jsonl:1 " in a["src"]["nvlink_alpha_us"],
               "a matching row is used and cited by file:line (signal -> nvlink_alpha_us)")
        expect(a["rates"]["gemm"][0] == "const" and rate(a, "gemm", (8192, 1792, 8192))[0] == DEFAULTS["gemm_tflops"],
               "rows that do not match (fp8, ragged M) are ignored: the GEMM rate stays the default")
        expect(abs(a["net"]["ib"]["alpha_us"] - (0.5 + 1.0 + 1.0)) < 1e-12
               and a["net"]["ib"]["msg_us"] == plain["net"]["ib"]["msg_us"],
               "a tcp proxy row feeds the proxy queue only, not the provider's post or per-message cost")
        f2 = write("none.jsonl", [json.dumps({"kernel": "moe_layer", "impl": "weave", "time_us": 3.0})])
        a = resolve(base, *load([f2]))
        same = all(predict(op, SIZES[op][0], 2, 8, "ib", a)["speedup"] == predict(op, SIZES[op][0], 2, 8, "ib", plain)["speedup"]
                   for op in OPS)
        expect(same and any("none.jsonl: 1 rows, none usable: defaults kept" in n for n in a["notes"]),
               "a file with no usable rows leaves every default and says so")
        f3 = write("bad.jsonl", [sig(1.5), "{\"kernel\": \"signal\",", sig(1.6)])
        try:
            load([f3]); expect(False, "a malformed line is an error")
        except RatesError as e:
            expect("bad.jsonl:2:" in str(e), f"a malformed line is an error naming file and line ({e})")
        f4 = write("array.jsonl", ["[1, 2]"])
        try:
            load([f4]); expect(False, "a line that is not an object is an error")
        except RatesError as e:
            expect("array.jsonl:1:" in str(e), "a line that is not a JSON object is an error naming file and line")
        try:
            load([os.path.join(d, "missing.jsonl")]); expect(False, "a missing file is an error")
        except RatesError as e:
            expect("missing.jsonl" in str(e), "a missing file is an error naming it")
        a = resolve(dict(base, nvlink_alpha_us=3.0, comm_sms=20), *load([f1]))
        expect(a["nvlink_alpha_us"] == 3.0 and a["src"]["nvlink_alpha_us"] == "flag" and a["comm"]["gemm_ar"] == 20,
               "an explicit flag overrides a measured row")
    files = [os.path.join(RESULTS, f) for f in MEASURED]
    missing = [f for f in files if not os.path.exists(f)]
    expect(not missing, "the --measured files are in the tree" + (f" (missing: {missing})" if missing else ""))
    if not missing:
        a = resolve(dict(base, measured=True), *load(files))
        measured = ["nvlink_GBps", "nvlink_alpha_us"] + [f"comm_sms[{op}]" for op in OPS] + \
            [f"nccl_GBps[{c}]" for c in set(COLL.values())] + [f"net_alpha_us[{p}]" for p in PROFILES]
        expect(all(".json" in a["src"][k] for k in measured) and all(a["rates"][k][0] == "table" for k in a["rates"]),
               "--measured derives the NVLink, NCCL, SM-split, proxy and compute parameters from rows")
    print("check --rates:", "OK" if ok else "FAILED")
    return ok


# ---------------------------------------------------------------- main
def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="JSON lines (parameters, then predictions)")
    ap.add_argument("--check", action="store_true", help="run the self-check and exit")
    ap.add_argument("--plot", metavar="PNG", help="speedup curves (needs matplotlib)")
    ap.add_argument("--profile", choices=list(PROFILES) + ["all"], default="all")
    ap.add_argument("--baseline", choices=["hier", "ring"], default="hier",
                    help="unfused collective: serial hierarchical phases (default) or NCCL flat rail ring")
    ap.add_argument("--rates", nargs="+", metavar="FILE", default=None,
                    help="weave-bench JSON-lines result files to derive the parameters from")
    ap.add_argument("--measured", action="store_true",
                    help="feed the checked-in runs (MEASURED, bench/results): the README's table")
    ap.add_argument("--net-GBps", dest="net_GBps", type=float, help="achieved network rate per GPU (overrides profile bw*eff)")
    ap.add_argument("--net-alpha-us", dest="net_alpha_us", type=float, help="network message latency")
    ap.add_argument("--net-msg-us", dest="net_msg_us", type=float, help="per-message proxy/NIC occupancy")
    ap.add_argument("--base-gemm-tflops", dest="base_gemm_tflops", type=float,
                    help="unfused baseline GEMM rate (default: --gemm-tflops, or cuBLAS rows)")
    ap.add_argument("--base-attn-tflops", dest="base_attn_tflops", type=float,
                    help="unfused baseline attention rate (default: --attn-tflops, or cuDNN rows)")
    for k, v in DEFAULTS.items():  # None: not given, so a measured row or the default applies
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=type(v), default=None, help=f"default {v}")
    return ap


def main():
    opts = vars(parser().parse_args())
    paths = list(opts["rates"] or []) + ([os.path.join(RESULTS, f) for f in MEASURED] if opts["measured"] else [])
    try:
        rows, per_file = load(paths)
    except RatesError as e:
        sys.exit(f"multinode.py: --rates: {e}")
    a = resolve(opts, rows, per_file)
    if opts["check"]:
        sys.exit(0 if check(a) else 1)
    profs = list(PROFILES) if opts["profile"] == "all" else [opts["profile"]]
    rows = [predict(op, s, N, G, pr, a) for op in SIZES for N, G in CLUSTERS for pr in profs for s in SIZES[op]]
    if opts["json"]:
        for k, v in params(a):
            print(json.dumps(dict(kind="param", name=k, value=v, source=a["src"].get(k, ""))))
        for r in rows:
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    else:
        report(a, rows, profs, paths)
    if opts["plot"]:
        import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
        fig, axs = plt.subplots(1, len(SIZES), figsize=(4 * len(SIZES), 3.5))
        for ax, op in zip(axs, SIZES):
            for N, G in CLUSTERS:
                for pr in profs:
                    c = [r for r in rows if r["op"] == op and r["nodes"] == N and r["profile"] == pr]
                    ax.plot([r["size"] for r in c], [r["speedup"] for r in c], marker="o", label=f"{N}x{G} {pr}")
            for (pop, pr), (v, _) in PAPER.items():
                if pop == op and pr in profs:
                    ax.axhline(v, ls="--", lw=0.8, color="k" if pr == "ib" else "gray")
            ax.set_xscale("log", base=2); ax.set_title(op); ax.set_xlabel("tokens" if op != "ring_attn" else "sequence")
            ax.axhline(1.0, color="r", lw=0.5)
        axs[0].set_ylabel("fused / unfused"); axs[0].legend(fontsize=7)
        fig.tight_layout(); fig.savefig(opts["plot"], dpi=120)


def params(a):
    """(name, value) of every scalar parameter the model runs with."""
    out = [("nvlink_GBps", a["nvlink_GBps"]), ("nvlink_alpha_us", a["nvlink_alpha_us"])]
    out += [(f"nccl_GBps[{c}]", v) for c, v in sorted(a["nccl_bw"].items())]
    out += [(f"nccl_launch_us[{c}]", v) for c, v in sorted(a["nccl_launch"].items())]
    out += [(f"comm_sms[{op}]", a["comm"][op]) for op in OPS]
    for p, n in a["net"].items():
        out += [(f"net_GBps[{p}]", n["GBps"]), (f"net_alpha_us[{p}]", n["alpha_us"]), (f"net_msg_us[{p}]", n["msg_us"])]
    for k in ("gemm", "base_gemm", "attn", "base_attn"):
        r = a["rates"][k]
        while r[0] == "same":
            r = r[1]
        out.append((k + "_tflops", r[1] if r[0] == "const" else "per shape"))
    return out


def report(a, rows, profs, paths):
    print(f"baseline={a['baseline']}  rates: " + (f"{len(paths)} files" if paths else "defaults (no --rates)"))
    print("parameters (value, source):")
    for k, v in params(a):
        print(f"  {k:28} {v if isinstance(v, str) else round(v, 3):>10}  {a['src'].get(k, '')}")
    if any(a["rates"][k][0] == "table" for k in a["rates"]):
        print("compute rates at the model's per-GPU shapes (TFLOP/s; measured at the nearest shape):")
        seen = set()
        for r in rows:
            k = (r["op"] == "ring_attn", r["shape"])
            if k in seen:
                continue
            seen.add(k)
            print(f"  {'attn S' if k[0] else 'gemm':6} {r['shape']:>16}  weave {r['tflops']:5.0f} at {r['tflops_at'] or '-':>16} "
                  f"{r['tflops_src']}\n  {'':6} {'':>16}  base  {r['base_tflops']:5.0f} at {r['base_tflops_at'] or '-':>16} "
                  f"{r['base_tflops_src']}")
    for n in a["notes"]:
        print("note:", n)
    print(f"\n{'op':9} {'cluster':7} {'net':4} {'size':>8} {'comp us':>8} {'coll us':>8} {'nvl us':>7} "
          f"{'net us':>7} {'unfused':>8} {'fused':>8} {'speedup':>7}")
    for r in rows:
        print(f"{r['op']:9} {r['nodes']}x{r['gpus']:<5} {r['profile']:4} {r['size']:>8} {r['compute_us']:8.0f} "
              f"{r['coll_us']:8.0f} {r['nvl_us']:7.0f} {r['net_us']:7.0f} {r['unfused_us']:8.0f} "
              f"{r['fused_us']:8.0f} {r['speedup']:6.2f}x")
    print("\nmKernel (2 x 8 H200) beside the model's best over the sweep (2 x 8; 4 x 8):")
    print(f"{'op':9} {'net':4} {'paper':>6} {'model max':>9} {'at size':>8} {'4x8 max':>8} {'at size':>8}  note")
    for (op, pr), (v, note) in PAPER.items():
        if pr not in profs:
            continue
        best = [max((r for r in rows if r["op"] == op and r["profile"] == pr and r["nodes"] == N),
                    key=lambda r: r["speedup"]) for N in (2, 4)]
        print(f"{op:9} {pr:4} {v:5.2f}x {best[0]['speedup']:8.2f}x {best[0]['size']:>8} "
              f"{best[1]['speedup']:7.2f}x {best[1]['size']:>8}  {note}")


if __name__ == "__main__":
    main()
