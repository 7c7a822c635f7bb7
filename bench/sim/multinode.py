#!/usr/bin/env python3
"""Analytic (alpha-beta) model of weave's hierarchical multi-node fused kernels (issue 22, "At scale,
on paper"): N nodes x G H200 GPUs, one NIC per GPU, every network transfer between rail peers.

Per op and size it predicts
  unfused = compute + collective   (collective: NCCL-like hierarchical phases run one after another,
                                    each phase steps*alpha + bytes/beta; or --baseline ring: NCCL's
                                    flat rail-aligned ring, all links busy at once)
  fused   = max(compute/(1-p), T_nvlink, T_net) + fill/drain (one chunk of compute + one network chunk)
            (mKernel eq. 1; p = share of SMs given to the communication roles)
Byte counts per GPU follow kernels/net_common (hierarchy.hpp, README.md):
  all_reduce  NVLink RS ((G-1)/G B) -> rail ring AR of B/G (2(N-1)/N * B/G) -> NVLink AG ((G-1)/G B)
  AG+GEMM     own shard S to each of N-1 rail peers; NVLink AG of the N shards of a local index
  GEMM+RS     NVLink RS of the node's partials ((G-1)/G B); partial shard to its owner: (N-1) S
  ring attn   K/V slice forwarded to the rail peer once per round: (N-1) slices over the network,
              N(G-1) slices over NVLink
Standard library only (matplotlib for --plot). `python3 bench/sim/multinode.py [--json] [--check]`.
Parameters and sources: bench/sim/README.md.
"""
import argparse, json, math, sys

GiB = 1 << 30
US = 1e-6

# ---- network profiles: per GPU, per direction. ASSUMPTIONS unless marked [src] ----
PROFILES = {
    # 8 x 400 Gb/s ConnectX-7, one per GPU [mKernel Table 4]; 50 GB/s per GPU [mKernel Table 1].
    # ASSUMED: 92 % of line rate reachable by RC RDMA writes; 3 us end-to-end message latency
    # (GPU command -> proxy post (issue 22 target p50 <= 2 us) + wire/switch ~1 us); 0.2 us per
    # message of proxy/NIC occupancy (issue 22 target >= 5 M commands/s).
    "ib": dict(name="IB RC (CX7)", link_GBps=50.0, eff=0.92, alpha_us=3.0, per_msg_us=0.2),
    # 16 x 200 Gb/s EFA per node = 400 Gb/s per GPU [mKernel Table 4], 50 GB/s per GPU [Table 1].
    # ASSUMED: 85 % of line rate for SRD (multipath, 2 NICs per GPU); 15 us message latency;
    # 0.5 us per message (completion-based notification: one extra completion per message).
    "efa": dict(name="EFA SRD", link_GBps=50.0, eff=0.85, alpha_us=15.0, per_msg_us=0.5),
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
    gemm_tflops=680.0, attn_tflops=600.0,
    # ASSUMED: SMs given to communication roles (mKernel's best static splits: 2-64 SMs of 132;
    # HARDWARE.md: TMA saturates NVLink from ~8 SMs; + network send/recv blocks) -> 16/132.
    comm_sms=16, sms=132,
    # chunk sizes [mKernel Table 3]: AG+GEMM 128 rows; GEMM+AR 4 tiles (256 KiB); GEMM+RS 2-32 tiles
    # (8 x 64 KiB taken); ring attention 128-row K/V tiles.
    ag_chunk_rows=128, ar_chunk_bytes=256 << 10, rs_chunk_bytes=512 << 10, attn_chunk_rows=128,
    hidden=8192, ffn=28672, heads=64, kv_heads=64, head_dim=128, elem=2,
)

# mKernel (arXiv 2609.13585) section 5, 2 x 8 H200, speedup over cuBLAS/FlashAttention + NCCL ("up to").
# Shapes per point are only in Figures 5/6 (not in the text we have): compare with the model's max.
PAPER = {
    ("ag_gemm", "ib"): (1.34, "up to"), ("ag_gemm", "efa"): (1.41, "up to"),
    ("gemm_ar", "ib"): (1.72, "up to"), ("gemm_ar", "efa"): (1.53, "up to"),
    ("gemm_rs", "ib"): (1.27, "1.02-1.27 for M>=16K (testbed not stated)"),
    ("gemm_rs", "efa"): (1.27, "1.02-1.27 for M>=16K (testbed not stated)"),
    ("ring_attn", "ib"): (1.88, "up to"), ("ring_attn", "efa"): (1.78, "up to"),
}


class Link:
    def __init__(self, GBps, alpha_us, per_msg_us=0.0):
        self.bw = GBps * 1e9
        self.alpha = alpha_us * US
        self.per_msg = per_msg_us * US

    def phase(self, nbytes, steps):  # alpha-beta time of one phase
        return steps * self.alpha + nbytes / self.bw if nbytes > 0 else 0.0


def links(a, prof):
    p = PROFILES[prof]
    net_bw = a["net_GBps"] if a.get("net_GBps") else p["link_GBps"] * p["eff"]
    net_alpha = a["net_alpha_us"] if a.get("net_alpha_us") is not None else p["alpha_us"]
    per_msg = a["net_msg_us"] if a.get("net_msg_us") is not None else p["per_msg_us"]
    fused_nvl = Link(a["nvlink_GBps"], a["nvlink_alpha_us"])
    nccl_nvl = Link(a["nvlink_GBps"] * a["nccl_nvlink_eff"], a["nvlink_alpha_us"])
    net = Link(net_bw, net_alpha, per_msg)
    return fused_nvl, nccl_nvl, net


def op_bytes(op, size, N, G, a):
    """Per-GPU bytes and steps of weave's hierarchical schedule, and compute FLOPs per GPU.
    Returns dict: flops, rate (TFLOP/s key), nvl (bytes out per GPU over NVLink), nvl_steps,
    net (bytes out per GPU over the network), net_steps, chunk (network chunk bytes),
    phases (the unfused collective as serial phases: (link, bytes, steps)), ring (flat-ring bytes)."""
    W, e, H, F = N * G, a["elem"], a["hidden"], a["ffn"]
    if op in ("ag_gemm", "gemm_ar", "gemm_rs"):
        T = size
        flops = 2.0 * T * H * F / W  # column-parallel W1 (AG+GEMM) or row-parallel W2 (GEMM+AR/RS)
        rate = "gemm_tflops"
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
        rate = "attn_tflops"
        s = L / W * Hk * D * e * 2  # K and V slice of one rank
        nvl, nvl_steps = N * (G - 1) * s, N * (G - 1)
        net, net_steps = (N - 1) * s, N - 1
        # unfused: NCCL all_gather of K/V (hierarchical), then attention over the full sequence
        phases = [("net", net, N - 1), ("nvl", nvl, G - 1)]
        ring = dict(net=(W - 1) * s / G, nvl=(W - 1) * s * (G - 1) / G, steps=W - 1)
        chunk = a["attn_chunk_rows"] * Hk * D * e * 2
    else:
        raise ValueError(op)
    return dict(flops=flops, rate=rate, nvl=nvl, nvl_steps=nvl_steps, net=net, net_steps=net_steps,
                chunk=chunk, phases=phases, ring=ring)


def predict(op, size, N, G, prof, a):
    fnvl, cnvl, net = links(a, prof)
    b = op_bytes(op, size, N, G, a)
    t_comp = b["flops"] / (a[b["rate"]] * 1e12)
    # ---- unfused: compute, then the collective ----
    if a["baseline"] == "hier":
        t_coll = a["nccl_launch_us"] * US + sum(
            (cnvl if l == "nvl" else net).phase(nb, st) for l, nb, st in b["phases"])
    else:  # NCCL flat rail-aligned ring, G channels (one NIC each), every link busy concurrently
        r = b["ring"]
        t_coll = a["nccl_launch_us"] * US + r["steps"] * max(cnvl.alpha, net.alpha) + max(
            r["net"] / net.bw, r["nvl"] / cnvl.bw)
    t_unfused = t_comp + t_coll
    # ---- fused: compute and both tiers overlapped at chunk granularity ----
    p = a["comm_sms"] / a["sms"]
    n_msgs = math.ceil(b["net"] / b["chunk"]) if b["net"] > 0 else 0
    t_net = (b["net"] / net.bw + n_msgs * net.per_msg + (net.alpha if n_msgs else 0.0))
    t_nvl = b["nvl"] / fnvl.bw + (fnvl.alpha if b["nvl"] > 0 else 0.0)
    chunk = min(b["chunk"], b["net"]) if b["net"] > 0 else b["chunk"]
    n_chunks = max(1.0, (b["net"] + b["nvl"]) / b["chunk"])
    fill = t_comp / n_chunks + (chunk / net.bw if b["net"] > 0 else chunk / fnvl.bw)
    t_fused = max(t_comp / (1 - p), t_nvl, t_net) + fill
    return dict(op=op, size=size, nodes=N, gpus=G, profile=prof, baseline=a["baseline"],
                compute_us=t_comp / US, coll_us=t_coll / US, nvl_us=t_nvl / US, net_us=t_net / US,
                fill_us=fill / US, unfused_us=t_unfused / US, fused_us=t_fused / US,
                speedup=t_unfused / t_fused,
                net_MiB=b["net"] / 2**20, nvl_MiB=b["nvl"] / 2**20)


SIZES = {"ag_gemm": [4096, 8192, 16384, 32768, 65536], "gemm_ar": [4096, 8192, 16384, 32768, 65536],
         "gemm_rs": [4096, 8192, 16384, 32768, 65536],
         "ring_attn": [65536, 131072, 262144, 524288, 1 << 20]}
CLUSTERS = [(2, 8), (4, 8)]


def check(a):
    """Self-check: (1) unfused == compute + collective exactly; (2) with chunks -> 0, no per-message
    or latency costs and no SM penalty, fused -> max(compute, comm)."""
    ok = True
    for op in SIZES:
        for N, G in CLUSTERS:
            for prof in PROFILES:
                r = predict(op, SIZES[op][2], N, G, prof, a)
                if abs(r["unfused_us"] - (r["compute_us"] + r["coll_us"])) > 1e-9 * r["unfused_us"]:
                    ok = False; print("FAIL unfused != compute + comm", op, N, prof)
                z = dict(a, comm_sms=0, net_alpha_us=0.0, net_msg_us=0.0, nvlink_alpha_us=0.0,
                         ag_chunk_rows=1e-9, ar_chunk_bytes=1e-9, rs_chunk_bytes=1e-9, attn_chunk_rows=1e-9)
                r = predict(op, SIZES[op][2], N, G, prof, z)
                lim = max(r["compute_us"], r["nvl_us"], r["net_us"])
                if abs(r["fused_us"] - lim) > 1e-6 * lim:
                    ok = False; print("FAIL fused !-> max(compute, comm)", op, N, prof, r["fused_us"], lim)
    print("check:", "OK (unfused = compute + comm; fused -> max(compute, comm) as chunk -> 0)" if ok else "FAILED")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="JSON lines instead of the table")
    ap.add_argument("--check", action="store_true", help="run the self-check and exit")
    ap.add_argument("--plot", metavar="PNG", help="speedup curves (needs matplotlib)")
    ap.add_argument("--profile", choices=list(PROFILES) + ["all"], default="all")
    ap.add_argument("--baseline", choices=["hier", "ring"], default="hier",
                    help="unfused collective: serial hierarchical phases (default) or NCCL flat rail ring")
    ap.add_argument("--net-GBps", dest="net_GBps", type=float, help="achieved network rate per GPU (overrides profile bw*eff)")
    ap.add_argument("--net-alpha-us", dest="net_alpha_us", type=float, help="network message latency")
    ap.add_argument("--net-msg-us", dest="net_msg_us", type=float, help="per-message proxy/NIC occupancy")
    for k, v in DEFAULTS.items():
        ap.add_argument("--" + k.replace("_", "-"), dest=k, type=type(v), default=v)
    a = vars(ap.parse_args())
    if a["check"]:
        sys.exit(0 if check(a) else 1)
    profs = list(PROFILES) if a["profile"] == "all" else [a["profile"]]
    rows = [predict(op, s, N, G, pr, a) for op in SIZES for N, G in CLUSTERS for pr in profs for s in SIZES[op]]
    if a["json"]:
        for r in rows:
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))
    else:
        print(f"baseline={a['baseline']}  gemm={a['gemm_tflops']} attn={a['attn_tflops']} TFLOP/s  "
              f"NVLink={a['nvlink_GBps']} GB/s  comm SMs={a['comm_sms']}/{a['sms']}")
        print(f"{'op':9} {'cluster':7} {'net':4} {'size':>8} {'comp us':>8} {'coll us':>8} {'nvl us':>7} "
              f"{'net us':>7} {'unfused':>8} {'fused':>8} {'speedup':>7}")
        for r in rows:
            print(f"{r['op']:9} {r['nodes']}x{r['gpus']:<5} {r['profile']:4} {r['size']:>8} {r['compute_us']:8.0f} "
                  f"{r['coll_us']:8.0f} {r['nvl_us']:7.0f} {r['net_us']:7.0f} {r['unfused_us']:8.0f} "
                  f"{r['fused_us']:8.0f} {r['speedup']:6.2f}x")
        print("\nmKernel (2 x 8 H200) beside the model's best over the sweep (2 x 8):")
        print(f"{'op':9} {'net':4} {'paper':>6} {'model max':>9} {'at size':>8}  note")
        for (op, pr), (v, note) in PAPER.items():
            if pr not in profs:
                continue
            c = [r for r in rows if r["op"] == op and r["profile"] == pr and r["nodes"] == 2]
            best = max(c, key=lambda r: r["speedup"])
            print(f"{op:9} {pr:4} {v:5.2f}x {best['speedup']:8.2f}x {best['size']:>8}  {note}")
    if a["plot"]:
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
        fig.tight_layout(); fig.savefig(a["plot"], dpi=120)


if __name__ == "__main__":
    main()
