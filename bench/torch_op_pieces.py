#!/usr/bin/env python3
"""Host time per call of weave's operators against their C++ calls, piece by piece, at world 1
(2048^3 GEMMs, an 8 KiB all_reduce): the C++ entry point through its binding with buffers made
beforehand, the same with a new output per call, the operator's default overload, the overload
packet, the public function (K x N and weight.t() B), and a bare torch.empty. One input set, 2000
calls after 50 warm-up calls, one synchronize at the end (host: until the last call returned; wall:
until the GPU finished). No correctness check (bench/torch_ops.py checks every row it times).

    python3 bench/torch_op_pieces.py          # one GPU, no torchrun
"""
import time

import torch

import weave
from weave import _comm
from weave._lib import lib


def main() -> int:
    if not torch.cuda.is_available():
        print("torch_op_pieces.py: no CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    torch.cuda.set_device(0)
    c = _comm.communicator(None)
    name = c.group_name
    M = K = N = 2048
    a = torch.randn(M, K, device="cuda").bfloat16()
    b = torch.randn(K, N, device="cuda").bfloat16()
    bt = torch.randn(N, K, device="cuda").bfloat16().t()
    G = weave.empty((M, K), torch.bfloat16)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    raw = torch._C._cuda_getCurrentRawStream

    def t(label, fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"{label:55s} host {1e6*(t1-t0)/n:7.2f} us  wall {1e6*(t2-t0)/n:7.2f} us", flush=True)

    ops = torch.ops.weave
    def new_c():
        return torch.empty(M, N, device="cuda", dtype=torch.bfloat16).data_ptr()

    t("cpp ag_gemm fixed C (weave-cpp)",
      lambda: c._c.ag_gemm(a.data_ptr(), G.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, raw(0)))
    t("cpp ag_gemm new torch.empty C",
      lambda: c._c.ag_gemm(a.data_ptr(), G.data_ptr(), b.data_ptr(), new_c(), M, N, K, raw(0)))
    t("op all_gather_matmul.default return_A=False",
      lambda: ops.all_gather_matmul.default(a, [b], 0, name, return_A=False))
    t("op all_gather_matmul packet return_A=False", lambda: ops.all_gather_matmul(a, [b], 0, name, return_A=False))
    t("weave.all_gather_matmul return_A=False", lambda: weave.all_gather_matmul(a, [b], return_A=False))
    t("weave.all_gather_matmul NK weight return_A=False", lambda: weave.all_gather_matmul(a, [bt], return_A=False))
    t("cpp gemm_ar fixed out", lambda: c._c.gemm_ar(a.data_ptr(), b.data_ptr(), G.data_ptr(), M, N, K, raw(0)))
    t("op matmul_all_reduce", lambda: ops.matmul_all_reduce.default(a, b, name))
    t("cpp gemm (lib) fixed C",
      lambda: lib().gemm(0, a.data_ptr(), b.data_ptr(), C.data_ptr(), M, N, K, False, raw(0)))
    t("op matmul", lambda: ops.matmul.default(a, b))
    x = torch.randn(4096, device="cuda").bfloat16()
    t("op all_reduce 8 KiB", lambda: ops.all_reduce.default(x, name))
    t("torch.empty 2048^2", lambda: torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
