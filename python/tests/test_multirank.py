"""Multi-rank GPU tests, run by every rank under torchrun (skipped under plain pytest):

    WEAVE_SHARE_GPUS=1 torchrun --nproc_per_node 2 -m pytest python/tests/test_multirank.py -q -p no:cacheprovider

(WEAVE_SHARE_GPUS=1 lets two ranks share one GPU; leave it out with a GPU per rank.) torch.distributed
runs on gloo (NCCL cannot put two ranks on one GPU) and serves only the store and the seed: every
rank regenerates every rank's inputs from the shared seed and computes the reference locally.
Ragged shapes (not tile multiples, shards of different sizes), outputs and staging poisoned.
test_tp_subgroups_alternate_with_the_whole_group needs a world of 4 (`--nproc_per_node 4`; with
WEAVE_SHARE_GPUS=1 on fewer GPUs) and skips at any other. WEAVE_GRAPH_REPLAYS sets the replays of
the capture tests (refs.graph_replays, default 1000)."""
import os

import pytest
import torch
import torch.distributed as dist

import weave
from refs import (attention_ref, check_attention, check_close, check_fp8_partials, check_gemm, fp8, graph_replays,
                  poison, qkv, rand)

if "WORLD_SIZE" not in os.environ:
    pytest.skip("multi-rank tests run under torchrun (see the module's docstring)", allow_module_level=True)

pytestmark = pytest.mark.gpu
BF, F16, F32 = torch.bfloat16, torch.float16, torch.float32
E4 = torch.float8_e4m3fn
EPS = {BF: 2.0 ** -8, F16: 2.0 ** -11, F32: 2.0 ** -23}


@pytest.fixture
def env(world, monkeypatch):
    poison(monkeypatch)
    weave.init()
    return world


def rows_of(chunks, x, dim=1):
    return torch.cat([x.narrow(dim, b, n) for b, n in chunks], dim=dim)


@pytest.mark.parametrize("dtype", [BF, F16, F32])
@pytest.mark.parametrize("n", [1, 1000, 4099, 300001, 3000017])
def test_all_reduce(env, dtype, n):
    rank, W, seed = env
    xs = [rand((n,), dtype, seed, "ar", r) for r in range(W)]
    y = weave.all_reduce(xs[rank])
    ref = sum(x.float() for x in xs)
    check_close(y, ref, 2 * W * EPS[dtype] * sum(x.float().abs() for x in xs) + 1e-30, f"all_reduce {dtype} {n}")


def test_empty_tensors(env):
    """Tensors with a dimension of 0 before or after the gathered one: empty results of the right
    shapes on every rank, and the ops usable after them (the plan once handed the collective the
    other dimensions' size instead of an empty shape)."""
    rank, W, seed = env
    assert weave.all_gather(torch.empty((0, 3, 5), dtype=BF, device="cuda"), 1).shape == (0, 3 * W, 5)
    assert weave.all_gather(torch.empty((4, 3, 0), dtype=F32, device="cuda"), 1).shape == (4, 3 * W, 0)
    y = weave.reduce_scatter(torch.empty((0, 2 * W + 1, 4), dtype=BF, device="cuda"), 1)
    assert y.shape == (0, _share(2 * W + 1, W, rank), 4)
    assert weave.all_reduce(torch.empty((0, 7), dtype=F32, device="cuda")).shape == (0, 7)
    xs = [rand((5, 7), F32, seed, "empty-after", r) for r in range(W)]
    assert torch.equal(weave.all_gather(xs[rank], 0), torch.cat(xs, 0)), "all_gather after the empty calls"


@pytest.mark.parametrize("dtype", [BF, F16, F32])
@pytest.mark.parametrize("shape, dim", [((2 * 64 + 1,), 0), ((5, 77, 3), 1), ((6, 7, 33), -1)])
def test_all_gather_reduce_scatter(env, dtype, shape, dim):
    rank, W, seed = env
    d = dim % len(shape)
    full = shape[d] * W + 1  # ragged: the first rank holds one more
    parts = []
    for r in range(W):
        s = list(shape)
        s[d] = _share(full, W, r)
        parts.append(rand(s, dtype, seed, "ag", r))
    out = weave.all_gather(parts[rank], dim, full_size=full)
    assert torch.equal(out, torch.cat(parts, dim=d)), "all_gather"

    xs = [rand(shape, dtype, seed, "rs", r) for r in range(W)]
    first, size = weave.shard(shape[d])
    y = weave.reduce_scatter(xs[rank], dim)
    ref = sum(x.float() for x in xs).narrow(d, first, size)
    bound = 2 * W * EPS[dtype] * sum(x.float().abs() for x in xs).narrow(d, first, size) + 1e-30
    check_close(y, ref, bound, "reduce_scatter")


def _share(n, W, r):
    """Rows of n that rank r holds (the first n % W ranks one more)."""
    return n // W + (1 if r < n % W else 0)


@pytest.mark.parametrize("dtype", [BF, F16, F32])
@pytest.mark.parametrize("S", [77, 1024])
def test_all_to_all(env, dtype, S):
    rank, W, seed = env
    H = 3 * W
    X = rand((2, S, H, 64), dtype, seed, "a2a")
    first, rows = weave.shard(S)
    heads = slice(rank * H // W, (rank + 1) * H // W)
    y = weave.all_to_all(X[:, first:first + rows].contiguous(), "seq_to_head", seq_len=S)
    assert torch.equal(y, X[:, :, heads]), "seq_to_head"
    z = weave.all_to_all(X[:, :, heads].contiguous(), "head_to_seq")
    assert torch.equal(z, X[:, first:first + rows]), "head_to_seq"


@pytest.mark.parametrize("s, N, K", [(67, 200, 72), (300, 264, 520)])
def test_all_gather_matmul(env, s, N, K):
    rank, W, seed = env
    A = rand((W * s, K), BF, seed, "A")
    B = rand((K, N), BF, seed, "B", rank)  # each rank its own column shard of the weight
    Wt = rand((40, K), BF, seed, "W", rank)
    Ag, (C1, C2) = weave.all_gather_matmul(A[rank * s:(rank + 1) * s], [B, Wt.t()])
    assert torch.equal(Ag, A), "gathered A"
    check_gemm(C1, A, B, "ag_gemm")
    check_gemm(C2, A, Wt.t(), "ag_gemm second B")
    _, (C,) = weave.all_gather_matmul(A[rank * s:(rank + 1) * s], [Wt.t()], return_A=False)
    check_gemm(C, A, Wt.t(), "ag_gemm nn.Linear weight")


@pytest.mark.parametrize("M, N, k", [(333, 200, 72), (129, 264, 512)])
def test_matmul_reduce_scatter_and_all_reduce(env, M, N, k):
    rank, W, seed = env
    As = [rand((M, k), BF, seed, "A", r) for r in range(W)]  # each rank its K slice
    Ws = [rand((N, k), BF, seed, "W", r) for r in range(W)]
    A_cat, B_cat = torch.cat(As, dim=1), torch.cat([w.t() for w in Ws], dim=0)  # sum_r A_r B_r = A_cat B_cat
    first, rows = weave.shard(M)
    out = weave.matmul_reduce_scatter(As[rank], Ws[rank].t())
    check_gemm(out, A_cat[first:first + rows], B_cat, "gemm_rs", partials=W)
    out = weave.matmul_reduce_scatter(As[rank], Ws[rank].t(), "avg")
    check_gemm(out * W, A_cat[first:first + rows], B_cat, "gemm_rs avg", partials=2 * W)
    check_gemm(weave.matmul_all_reduce(As[rank], Ws[rank].t()), A_cat, B_cat, "gemm_ar", partials=W)


@pytest.mark.parametrize("s, N, K", [(67, 200, 272), (300, 264, 528)])
def test_fp8_all_gather_scaled_matmul(env, s, N, K):
    """fp8 AG+GEMM: the gathered A byte for byte, each rank's outputs with its own fp8 weight shards and
    scales; the second weight by the fp8 GEMM on the rows the peers pushed."""
    rank, W, seed = env
    A = fp8((W * s, K), E4, seed, "A")
    w, w2 = fp8((N, K), E4, seed, "w", rank), fp8((40, K), E4, seed, "w2", rank)
    sa = torch.tensor(0.5, device="cuda")  # the whole gathered A's scale: the same on every rank
    sb, sb2 = torch.tensor(0.25 * (rank + 1), device="cuda"), torch.tensor(2.0 ** -rank, device="cuda")
    Ag, (C, C2) = weave.all_gather_scaled_matmul(A[rank * s:(rank + 1) * s], [w.t(), w2.t()], sa, [sb, sb2])
    assert torch.equal(Ag.view(torch.uint8), A.view(torch.uint8)), "gathered A"
    check_fp8_partials(C, [(A.float() * sa, w.float().t() * sb)], K, "ag_gemm fp8")
    check_fp8_partials(C2, [(A.float() * sa, w2.float().t() * sb2)], K, "ag_gemm fp8 second B")


@pytest.mark.parametrize("M, N, k", [(333, 200, 272), (129, 264, 512)])
def test_fp8_scaled_matmul_reduce_scatter(env, M, N, k):
    """fp8 GEMM+RS: each rank its own K slice, weight slice and scales (their products 1/4, 1, 4, 2 for
    ranks 0..3: a partial scaled by another rank's scales is off by 2x or more)."""
    rank, W, seed = env
    As = [fp8((M, k), E4, seed, "A", r) for r in range(W)]
    Ws = [fp8((N, k), E4, seed, "W", r) for r in range(W)]
    sas = [2.0 ** (r % 4 - 2) for r in range(W)]
    sbs = [2.0 ** (r % 3) for r in range(W)]
    first, rows = weave.shard(M)
    parts = [(As[r][first:first + rows].float() * sas[r], Ws[r].float().t() * sbs[r]) for r in range(W)]
    sa, sb = torch.tensor(sas[rank], device="cuda"), torch.tensor(sbs[rank], device="cuda")
    check_fp8_partials(weave.scaled_matmul_reduce_scatter(As[rank], Ws[rank].t(), sa, sb), parts, k, "gemm_rs fp8")
    out = weave.scaled_matmul_reduce_scatter(As[rank], Ws[rank].t(), sa, sb, "avg")
    # avg's division and the product by W here: two more roundings at most (none for W a power of 2).
    check_fp8_partials((out.float() * W).to(BF), parts, k, "gemm_rs fp8 avg", 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [333, 1024])
def test_sequence_parallel(env, causal, S):
    rank, W, seed = env
    q, k, v = qkv(2, S, 2 * W, 2, 128, seed, S)
    ref_o, ref_lse = attention_ref(q, k, v, causal)
    for sharding in ("zigzag", "contiguous"):
        ch = weave.ring_chunks(S, sharding)
        lq, lk, lv = (rows_of(ch, t).contiguous() for t in (q, k, v))
        o, lse = weave.ring_attention(lq, lk, lv, causal, sharding=sharding, seq_len=S)
        check_attention(o, lse, rows_of(ch, ref_o), rows_of(ch, ref_lse, dim=2), f"ring {sharding}")
    first, rows = weave.shard(S)
    lq, lk, lv = (t[:, first:first + rows].contiguous() for t in (q, k, v))
    o = weave.ulysses_attention(lq, lk, lv, causal, seq_len=S)
    check_attention(o, None, ref_o[:, first:first + rows], None, "ulysses")


def test_symmetric_inputs(env):
    rank, W, seed = env
    x = weave.empty((1000, 7), F32)  # collective: every rank, same order
    x.copy_(rand((1000, 7), F32, seed, "sym", rank))
    assert weave.is_symmetric(x)
    ref = sum(rand((1000, 7), F32, seed, "sym", r) for r in range(W))
    check_close(weave.all_reduce(x), ref, 1e-5 * W, "all_reduce of a symmetric tensor")


def test_two_groups_alternately(env):
    rank, W, seed = env
    main = weave.init()
    sub = dist.new_group(list(range(W)))  # the same ranks, another group: another communicator
    singles = [dist.new_group([r]) for r in range(W)]  # every rank makes every group
    mine = weave.init(sub)
    assert mine is not main and weave.init(sub) is mine and mine.world == W
    alone = weave.init(singles[rank])
    assert alone.world == 1
    for i in range(10):
        x = rand((4099,), F32, seed, "alt", i, rank)
        ref = sum(rand((4099,), F32, seed, "alt", i, r) for r in range(W))
        check_close(weave.all_reduce(x, group=main if i % 2 else sub), ref, 1e-5 * W, f"call {i}")
        assert torch.equal(weave.all_reduce(x, group=singles[rank]), x)


def test_tp_subgroups_alternate_with_the_whole_group(env):
    """A TP x DP layout at a world of 4 (WEAVE_SHARE_GPUS=1 lets ranks share GPUs): the TP pairs
    (0, 1) and (2, 3) from torch.distributed.new_subgroups(group_size=2), each with its own
    communicator, used alternately with the whole group's. Both pairs run at once, each on its own
    data (every rank's inputs are tagged with its global rank, so a pair reading the other pair's
    buffers, or the whole group's, gets another rank's values): collectives and the TP operators on
    the pair, collectives on the whole group, every call against its reference."""
    rank, W, seed = env
    if W != 4:
        pytest.skip(f"needs a world of 4 (torchrun --nproc_per_node 4, WEAVE_SHARE_GPUS=1 to share GPUs); "
                    f"this one has {W}")
    tp, _ = dist.new_subgroups(group_size=2)  # collective: every rank makes both pairs
    pair = dist.get_process_group_ranks(tp)
    assert pair == [rank - rank % 2, rank - rank % 2 + 1], pair
    whole = weave.init()
    mine = weave.init(tp)
    assert mine is not whole and weave.init(tp) is mine and (mine.rank, mine.world) == (rank % 2, 2)
    r = rank % 2
    s, K, N = 67, 136, 264  # TP shapes: ragged against the kernels' tiles
    for i in range(6):
        # The pair: all_reduce (fp16), then the whole group's all_reduce, so that consecutive calls
        # switch communicators.
        xs = {g: rand((4099,), F16, seed, "sub-ar", i, g) for g in pair}
        check_close(weave.all_reduce(xs[rank], group=tp), sum(x.float() for x in xs.values()),
                    4 * EPS[F16] * sum(x.float().abs() for x in xs.values()) + 1e-30, f"pair all_reduce {i}")
        ys = [rand((1001, 3), F32, seed, "whole-ar", i, g) for g in range(W)]
        check_close(weave.all_reduce(ys[rank]), sum(ys), 2 * W * EPS[F32] * sum(y.abs() for y in ys) + 1e-30,
                    f"whole all_reduce {i}")

        # The pair's ragged all_gather (bf16), then the whole group's reduce_scatter (bf16).
        full = 2 * 77 + 1
        parts = [rand((_share(full, 2, j), 5), BF, seed, "sub-ag", i, g) for j, g in enumerate(pair)]
        assert torch.equal(weave.all_gather(parts[r], 0, group=tp, full_size=full), torch.cat(parts)), \
            f"pair all_gather {i}"
        zs = [rand((4 * 33 + 3, 5), BF, seed, "whole-rs", i, g) for g in range(W)]
        first, size = weave.shard(zs[0].shape[0])
        check_close(weave.reduce_scatter(zs[rank], 0), sum(z.float() for z in zs).narrow(0, first, size),
                    2 * W * EPS[BF] * sum(z.float().abs() for z in zs).narrow(0, first, size) + 1e-30,
                    f"whole reduce_scatter {i}")

        # The pair's AG+GEMM (gathered A returned) and GEMM+RS: each rank its own weight shard.
        A = torch.cat([rand((s, K), BF, seed, "sub-A", i, g) for g in pair])
        Wt = rand((N, K), BF, seed, "sub-W", i, rank)
        Ag, (C,) = weave.all_gather_matmul(A[r * s:(r + 1) * s], [Wt.t()], group=tp)
        assert torch.equal(Ag, A), f"pair all_gather_matmul's gathered A {i}"
        check_gemm(C, A, Wt.t(), f"pair all_gather_matmul {i}")
        M = 2 * s + 1
        As = [rand((M, K), BF, seed, "sub-R", i, g) for g in pair]
        Ws = [rand((N, K), BF, seed, "sub-RW", i, g) for g in pair]
        f0, n0 = weave.shard(M, group=tp)
        out = weave.matmul_reduce_scatter(As[r], Ws[r].t(), group=tp)
        check_gemm(out, torch.cat(As, dim=1)[f0:f0 + n0], torch.cat([w.t() for w in Ws]), f"pair gemm_rs {i}",
                   partials=2)
    dist.barrier()


def test_ragged_shards_and_misaligned_views_stage_alike(env):
    """Staging buffers grow collectively, so every rank must grow them alike: by the largest shard,
    not its own (rank 0's shard below is just past 2 MiB, the others' exactly 2 MiB, the
    allocation granule), and whether or not its own view is aligned (a bf16 view one element in,
    on rank 1 only, of a call the LL path takes without staging)."""
    rank, W, seed = env
    g = dist.new_group(list(range(W)))  # a fresh communicator: nothing staged yet
    weave.init(g)
    rows = W * 1024 + 1
    parts = [rand((_share(rows, W, r), 512), F32, seed, "stage-ag", r) for r in range(W)]
    out = weave.all_gather(parts[rank], 0, full_size=rows, group=g)
    assert torch.equal(out, torch.cat(parts)), "all_gather"
    xs = [rand((rows, 512), F32, seed, "stage-rs", r) for r in range(W)]
    first, size = weave.shard(rows)
    y = weave.reduce_scatter(xs[rank], 0, group=g)
    tot = sum(x.float() for x in xs)
    check_close(y, tot[first:first + size], 2 * W * EPS[F32] * sum(x.abs() for x in xs)[first:first + size] + 1e-30,
                "reduce_scatter")
    xs = [rand((1001,), BF, seed, "stage-ar", r) for r in range(W)]
    buf = torch.empty(1002, dtype=BF, device="cuda")
    x = buf[1:] if rank == 1 else buf[:1001]
    x.copy_(xs[rank])
    y = weave.all_reduce(x, group=g)
    check_close(y, sum(v.float() for v in xs), 2 * W * EPS[BF] * sum(v.float().abs() for v in xs) + 1e-30,
                "all_reduce of a misaligned view on rank 1")
    dist.barrier()


def test_mismatched_shapes_raise_on_every_rank(env):
    rank, W, seed = env
    g = dist.new_group(list(range(W)))  # a communicator of its own: a rejected call may leave it unusable
    weave.init(g)
    with pytest.raises(RuntimeError):
        weave.all_reduce(torch.ones(1000 + rank, device="cuda"), group=g)
    dist.barrier()


def test_a_rule_broken_on_one_rank_raises_on_every_rank(env):
    """The last rank's shard is a row short (its own rule: ValueError there); its peers, whose
    arguments pass, fail in the operator's cross-rank agreement with it instead of waiting."""
    rank, W, seed = env
    g = dist.new_group(list(range(W)))
    weave.init(g)
    rows = _share(1001, W, rank) - (1 if rank == W - 1 else 0)
    with pytest.raises(ValueError if rank == W - 1 else RuntimeError) as e:
        weave.all_gather(torch.ones((rows, 8), device="cuda"), 0, full_size=1001, group=g)
    assert ("share" if rank == W - 1 else "different operators") in str(e.value), str(e.value)
    dist.barrier()


def test_symmetric_input_on_one_rank_only_raises_on_every_rank(env):
    """Rank 0 passes a weave.empty tensor (used in place), its peers ordinary ones (staged): the
    kernel would read each peer's input at rank 0's place in the heap. Every rank raises (the plan's
    first call), and the same call with ordinary tensors everywhere then works."""
    rank, W, seed = env
    g = dist.new_group(list(range(W)))
    weave.init(g)
    n = 5_000_011  # 10 MB of bf16: two-shot or push, which read or write every rank's buffers
    x = rand((n,), BF, seed, "mixed", rank)
    sym = weave.empty((n,), BF, group=g)  # collective: made on every rank, passed by rank 0 only
    if rank == 0:
        sym.copy_(x)
        x = sym
    with pytest.raises(RuntimeError, match="different places"):
        weave.all_reduce(x, group=g)
    ys = [rand((n,), BF, seed, "mixed", r) for r in range(W)]
    out = weave.all_reduce(ys[rank].clone(), group=g)
    check_close(out, sum(y.float() for y in ys), 2 * W * EPS[BF] * sum(y.float().abs() for y in ys) + 1e-30,
                "all_reduce after the refused call")
    dist.barrier()


def test_collectives_and_sp_graph_capture_and_replay(env):
    """The collectives (LL-, two-shot- and push-sized all_reduce, all_gather, reduce_scatter, the
    Ulysses all_to_all) and ring / Ulysses attention captured in one CUDA graph after an eager
    warm-up, replayed graph_replays() times with fresh inputs copied into the captured tensors and
    the outputs poisoned before each replay: every replay's small all_reduce, all_gather,
    reduce_scatter and all_to_all against their references, all outputs at every 50th replay and
    the last (the counts are read on the device); eager calls in between and after, and a second
    graph captured and never replayed."""
    rank, W, seed = env
    sizes = (4099, 300001, 1000003)
    full = 2 * 77 * W + 1  # all_gather: ragged shards
    S, H = 333, 2 * W
    first, rows = weave.shard(S)
    chunks = weave.ring_chunks(S, "zigzag")
    static = {f"ar{n}": torch.empty((n,), dtype=BF, device="cuda") for n in sizes}
    static["ag"] = torch.empty((_share(full, W, rank), 5), dtype=F32, device="cuda")
    static["rs"] = torch.empty((full, 5), dtype=F32, device="cuda")
    static["a2a"] = torch.empty((2, rows, H, 64), dtype=BF, device="cuda")
    for t in ("q", "k", "v"):
        static["ring" + t] = torch.empty((2, sum(n for _, n in chunks), H, 128), dtype=BF, device="cuda")
        static["uly" + t] = torch.empty((2, rows, H, 128), dtype=BF, device="cuda")

    def fill(i, whole=True):
        """Replay i's inputs of this rank, copied into the static tensors, and the references from
        every rank's inputs (each rank regenerates them): of the small outputs always, of the large
        all_reduces and the attention (their peers' inputs and references cost more than the
        replay) only where `whole`."""
        ref = {}
        for n in sizes:
            ranks = range(W) if whole or n == sizes[0] else [rank]
            xs = {r: rand((n,), BF, seed, "gar", n, i, r) for r in ranks}
            static[f"ar{n}"].copy_(xs[rank])
            if len(xs) == W:
                ref[f"ar{n}"] = (sum(x.float() for x in xs.values()), sum(x.float().abs() for x in xs.values()))
        parts = [rand((_share(full, W, r), 5), F32, seed, "gag", i, r) for r in range(W)]
        static["ag"].copy_(parts[rank])
        fulls = [rand((full, 5), F32, seed, "grs", i, r) for r in range(W)]
        static["rs"].copy_(fulls[rank])
        X = rand((2, S, H, 64), BF, seed, "ga2a", i)
        static["a2a"].copy_(X[:, first:first + rows])
        q, k, v = qkv(2, S, H, H, 128, seed, S, i)
        for t, x in zip("qkv", (q, k, v)):
            static["ring" + t].copy_(rows_of(chunks, x))
            static["uly" + t].copy_(x[:, first:first + rows])
        ref["ag"] = torch.cat(parts)
        f0, n0 = weave.shard(full)
        ref["rs"] = sum(f.float() for f in fulls)[f0:f0 + n0]
        ref["a2a"] = X[:, :, rank * H // W:(rank + 1) * H // W]
        if whole:
            ref["attn"] = attention_ref(q, k, v, True)
        return ref

    def calls():
        out = {f"ar{n}": weave.all_reduce(static[f"ar{n}"]) for n in sizes}
        out["ag"] = weave.all_gather(static["ag"], 0, full_size=full)
        out["rs"] = weave.reduce_scatter(static["rs"], 0)
        out["a2a"] = weave.all_to_all(static["a2a"], "seq_to_head", seq_len=S)
        out["ring"] = weave.ring_attention(static["ringq"], static["ringk"], static["ringv"], True, seq_len=S)
        out["uly"] = weave.ulysses_attention(static["ulyq"], static["ulyk"], static["ulyv"], True, seq_len=S)
        return out

    def check(out, ref, what):
        """The outputs `ref` has references for (fill's `whole`: all of them)."""
        for n in sizes:
            if f"ar{n}" in ref:
                want, mag = ref[f"ar{n}"]
                check_close(out[f"ar{n}"], want, 2 * W * EPS[BF] * mag + 1e-30, f"{what}: all_reduce {n}")
        assert torch.equal(out["ag"], ref["ag"]), f"{what}: all_gather"
        check_close(out["rs"], ref["rs"], 4 * W * EPS[F32] * ref["rs"].abs() + 1e-30, f"{what}: reduce_scatter")
        assert torch.equal(out["a2a"], ref["a2a"]), f"{what}: all_to_all"
        if "attn" in ref:
            ref_o, ref_lse = ref["attn"]
            o, lse = out["ring"]
            check_attention(o, lse, rows_of(chunks, ref_o), rows_of(chunks, ref_lse, dim=2), f"{what}: ring")
            check_attention(out["uly"], None, ref_o[:, first:first + rows], None, f"{what}: ulysses")

    def poison_outs(out):
        for o in out.values():
            for t in (o if isinstance(o, tuple) else (o,)):
                t.fill_(float("nan"))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up: signal sets, scratch, tuner choices, staging sizes
        ref = fill(0)
        for _ in range(2):
            out = calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    check(out, ref, "eager warm-up")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = calls()
    replays = graph_replays()
    for i in range(1, replays + 1):
        ref = fill(i, i % 50 == 1 or i == replays)
        poison_outs(outs)
        g.replay()
        torch.cuda.synchronize()
        check(outs, ref, f"replay {i}")
        if i % 40 == 7:  # eager calls between replays share the graph's counts
            ref = fill(10_000 + i)
            out = calls()
            torch.cuda.synchronize()
            check(out, ref, f"eager call after replay {i}")
        if i == replays // 2:  # a graph captured and never replayed leaves no count behind
            unplayed = torch.cuda.CUDAGraph()
            with torch.cuda.graph(unplayed):
                calls()
            del unplayed
    ref = fill(replays + 1)
    out = calls()
    torch.cuda.synchronize()
    check(out, ref, "eager after the replays")


def test_tp_graph_capture_and_replay(env):
    """The TP operators captured in one CUDA graph after an eager warm-up of the same shapes, among
    them all_gather_matmul returning the gathered A with a second B given as an nn.Linear weight's
    .t(), then replayed graph_replays() times with fresh inputs copied into the captured tensors and
    the outputs poisoned: every replay's outputs match their own reference (device rounds: a replay
    waits for its own round, not the captured one); eager calls after the replays too."""
    rank, W, seed = env
    s, K, N, M = 67, 136, 264, 333
    first, rows = weave.shard(M)
    static = {
        "ag": torch.empty((s, K), dtype=BF, device="cuda"), "B": torch.empty((K, N), dtype=BF, device="cuda"),
        "Wt": torch.empty((40, K), dtype=BF, device="cuda"), "rs": torch.empty((M, K), dtype=BF, device="cuda"),
    }

    def fill(i):
        """Replay i's inputs, this rank's copied into the static tensors, and the references."""
        A = rand((W * s, K), BF, seed, "gA", i)
        Bs = [rand((K, N), BF, seed, "gB", i, r) for r in range(W)]
        Wt = rand((40, K), BF, seed, "gW", i, rank)
        As = [rand((M, K), BF, seed, "gR", i, r) for r in range(W)]
        static["ag"].copy_(A[rank * s:(rank + 1) * s])
        static["B"].copy_(Bs[rank])
        static["Wt"].copy_(Wt)
        static["rs"].copy_(As[rank])
        return A, Bs, Wt, As

    def calls():
        _, (C,) = weave.all_gather_matmul(static["ag"], [static["B"]], return_A=False)
        Ag, (C1, C2) = weave.all_gather_matmul(static["ag"], [static["B"], static["Wt"].t()])
        return (C, weave.matmul_reduce_scatter(static["rs"], static["B"]), weave.matmul_all_reduce(static["rs"], static["B"]),
                Ag, C1, C2)

    def check(outs, inputs, what):
        A, Bs, Wt, As = inputs
        C, R, Q, Ag, C1, C2 = outs
        A_cat, B_cat = torch.cat(As, dim=1), torch.cat(Bs, dim=0)  # sum_r As[r] Bs[r]
        check_gemm(C, A, Bs[rank], f"ag_gemm {what}")
        check_gemm(R, A_cat[first:first + rows], B_cat, f"gemm_rs {what}", partials=W)
        check_gemm(Q, A_cat, B_cat, f"gemm_ar {what}", partials=W)
        assert torch.equal(Ag, A), f"ag_gemm's gathered A {what}"
        check_gemm(C1, A, Bs[rank], f"ag_gemm returning A {what}")
        check_gemm(C2, A, Wt.t(), f"ag_gemm second B (weight.t()) {what}")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager warm-up: the shapes' signal sets, tuner choices, staging sizes
        inputs = fill(0)
        for _ in range(2):
            out = calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    check(out, inputs, "eager warm-up")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = calls()
    replays = graph_replays()
    for i in range(1, replays + 1):
        inputs = fill(i)
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(outs, inputs, f"replay {i}")
    # Eager calls after the replays still agree with the graph's rounds.
    inputs = fill(replays + 1)
    out = calls()
    torch.cuda.synchronize()
    check(out, inputs, "eager after the replays")
