#!/usr/bin/env python3
"""Host time per call of weave's operators against their C++ calls, piece by piece, at world 1
(2048^3 GEMMs, an 8 KiB all_reduce): the C++ entry point through its binding with buffers made
beforehand, the same with a new output per call, the same followed by a copy of the gathered A made by torch
(cudaMemcpyAsync, before which weave's next programmatic launch waits), the operator's default
overload, the overload packet, the public function (K x N and weight.t() B), and a bare torch.empty.

Host time is measured in batches of 50 calls with a synchronize between batches, as
bench/torch_ops.py's overhead section does: a 2048^3 GEMM runs longer on the GPU (~26 us) than its
call takes to issue, so back-to-back calls fill the launch queue and then wait in their launches,
and their host time becomes the GPU's. Wall time: the same calls back to back, one synchronize at
the end. No correctness check (bench/torch_ops.py checks every row it times).

    python3 bench/torch_op_pieces.py [--sets 3] [--dist [gloo|nccl]] [--profile N]

--sets N rotates N input sets (torch_ops.py uses 3); --dist initialises a world-1 torch.distributed
group first (gloo, a file store), as torchrun runs torch_ops.py; --profile N runs N calls of each
public function under cProfile and prints the 12 dearest functions by own time.
"""
import argparse
import cProfile
import os
import pstats
import tempfile
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", type=int, default=1, help="input sets used in rotation")
    ap.add_argument("--dist", nargs="?", const="gloo", default=None, choices=("gloo", "nccl"),
                    help="initialise a world-1 torch.distributed group first (backend; default gloo)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", type=int, default=0, help="calls of each public function under cProfile")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_op_pieces.py: no CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    torch.cuda.set_device(0)
    if args.dist:
        import torch.distributed as dist

        store = os.path.join(tempfile.mkdtemp(), "store")
        dist.init_process_group(args.dist, init_method=f"file://{store}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0) if args.dist == "nccl" else None)
        if args.dist == "nccl":  # a first NCCL call, as torch_ops.py's baselines make: its proxy thread runs
            y = torch.ones(4, device="cuda")
            dist.all_reduce(y)
            torch.cuda.synchronize()
    import weave
    from weave import _comm
    from weave._lib import lib

    c = _comm.communicator(None)
    name = c.group_name
    M = K = N = 2048
    n = max(1, args.sets)
    sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(K, N, device="cuda").bfloat16(),
             torch.randn(N, K, device="cuda").bfloat16().t()) for _ in range(n)]
    G = weave.empty((M, K), torch.bfloat16)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    raw = torch._C._cuda_getCurrentRawStream
    print(f"torch_op_pieces.py: {n} input set(s), torch.distributed {args.dist or 'off'}, group {name}")

    def t(label, fn, calls=args.calls, batch=50):
        for i in range(50):
            fn(*sets[i % n])
        torch.cuda.synchronize()
        host = 0.0
        for start in range(0, calls, batch):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(start, min(calls, start + batch)):
                out = fn(*sets[i % n])
            host += time.perf_counter() - t0
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(calls):
            out = fn(*sets[i % n])
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        del out
        print(f"{label:55s} host {1e6 * host / calls:7.2f} us  wall {1e6 * wall / calls:7.2f} us", flush=True)

    ops = torch.ops.weave

    def new_c():
        return torch.empty(M, N, device="cuda", dtype=torch.bfloat16).data_ptr()

    t("cpp ag_gemm fixed C (weave-cpp)",
      lambda a, b, bt: c._c.ag_gemm(a.data_ptr(), G.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, raw(0)))
    t("cpp ag_gemm new torch.empty C",
      lambda a, b, bt: c._c.ag_gemm(a.data_ptr(), G.data_ptr(), b.data_ptr(), new_c(), M, N, K, raw(0)))
    t("op all_gather_matmul.default return_A=False",
      lambda a, b, bt: ops.all_gather_matmul.default(a, [b], 0, name, return_A=False))
    with torch.no_grad():
        t("op all_gather_matmul.default return_A=False, no_grad",
          lambda a, b, bt: ops.all_gather_matmul.default(a, [b], 0, name, return_A=False))
    t("op all_gather_matmul.default return_A=True",
      lambda a, b, bt: ops.all_gather_matmul.default(a, [b], 0, name, return_A=True))

    def cpp_then_copy(a, b, bt):  # the gathered A copied out by torch (cudaMemcpyAsync), as ops did
        c._c.ag_gemm(a.data_ptr(), G.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, raw(0))
        return torch.empty(M, K, device="cuda", dtype=torch.bfloat16).copy_(G)

    t("cpp ag_gemm fixed C, then torch.empty A .copy_(G)", cpp_then_copy)
    t("op all_gather_matmul packet return_A=False",
      lambda a, b, bt: ops.all_gather_matmul(a, [b], 0, name, return_A=False))
    t("weave.all_gather_matmul return_A=False", lambda a, b, bt: weave.all_gather_matmul(a, [b], return_A=False))
    t("weave.all_gather_matmul", lambda a, b, bt: weave.all_gather_matmul(a, [b]))
    t("weave.all_gather_matmul NK weight return_A=False",
      lambda a, b, bt: weave.all_gather_matmul(a, [bt], return_A=False))
    t("cpp gemm_ar fixed out", lambda a, b, bt: c._c.gemm_ar(a.data_ptr(), b.data_ptr(), G.data_ptr(), M, N, K, raw(0)))
    t("op matmul_all_reduce", lambda a, b, bt: ops.matmul_all_reduce.default(a, b, name))
    t("cpp gemm (lib) fixed C",
      lambda a, b, bt: lib().gemm(0, a.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, False, raw(0)))
    t("op matmul", lambda a, b, bt: ops.matmul.default(a, b))
    with torch.no_grad():
        t("op matmul, no_grad", lambda a, b, bt: ops.matmul.default(a, b))
    t("weave.matmul", lambda a, b, bt: weave.matmul(a, b))
    # The same public calls on an A that requires grad: autograd records them (op_grads.py's Python
    # autograd kernel runs), as in training outside weave.nn's modules.
    t("weave.matmul, A requires grad", lambda a, b, bt: weave.matmul(a.requires_grad_(), b))
    t("weave.all_gather_matmul return_A=False, A requires grad",
      lambda a, b, bt: weave.all_gather_matmul(a.requires_grad_(), [b], return_A=False))
    for a, _, _ in sets:
        a.requires_grad_(False)
    x = torch.randn(4096, device="cuda").bfloat16()
    t("op all_reduce 8 KiB", lambda a, b, bt: ops.all_reduce.default(x, name))
    t("weave.all_reduce 8 KiB", lambda a, b, bt: weave.all_reduce(x))
    t("torch.empty 2048^2", lambda a, b, bt: torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    if args.profile:
        for label, fn in (("weave.all_gather_matmul return_A=False",
                           lambda a, b, bt: weave.all_gather_matmul(a, [b], return_A=False)),
                          ("weave.matmul", lambda a, b, bt: weave.matmul(a, b))):
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for i in range(args.profile):
                fn(*sets[i % n])
                if i % 50 == 49:
                    torch.cuda.synchronize()
            prof.disable()
            torch.cuda.synchronize()
            print(f"\ncProfile, {args.profile} calls of {label} (own time, 12 dearest):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
