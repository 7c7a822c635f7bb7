"""CUDA-event timing shared by the PyTorch baseline scripts (torch_attention.py, torch_tp.py,
torch_sp.py). Without CUDA (testing a script on the CPU) it falls back to wall-clock time."""
import time

import torch


def median_us(fn, iters, repeats=3, warmup=2, before_repeat=None, warm_each=0):
    """Median over `repeats` of the mean time (us) of `iters` back-to-back calls of fn, after
    `warmup` calls. `before_repeat` (e.g. a process-group barrier) runs before each repeat, then
    `warm_each` untimed calls."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if before_repeat:
            before_repeat()
        for _ in range(warm_each):
            fn()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(iters):
                fn()
            b.record()
            b.synchronize()
            times.append(1e3 * a.elapsed_time(b) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            times.append(1e6 * (time.perf_counter() - t0) / iters)
    times.sort()
    return times[len(times) // 2]
