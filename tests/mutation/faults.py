# Injected faults for scripts/mutate.py (README.md in this folder says how to run it and how to
# add faults). Python data, no imports: the script reads FAULTS.
#
# A fault is a dict:
#   name     unique, [a-z0-9_]
#   what     one line: the bug, and when it bites
#   edits    [{"file": path from the repo root, "find": text that must occur exactly once in the
#            file, "replace": its replacement}, ...] (usually one edit)
#   tests    CTest names expected to catch it (run as ctest -R '^name$'); at least one must fail.
#            "name:Filter" runs only the GoogleTest tests that GTEST_FILTER=Filter selects
#   bench    optional [{"ranks": N, "args": "SUITE --opt v ..."}]: weave-bench SUITE run through
#            build/bin/weave-run -n N with --json; caught when a row says "correct": false or the
#            command exits non-zero
#   repeat   optional (default 1): a race that a single run may miss; the checks are run up to
#            this many times until one of them catches it
#   race     optional: True for a fault that only bites when ranks run side by side; with ranks
#            sharing one GPU (WEAVE_SHARE_GPUS=1) it is reported "not run" instead
#   targets  optional extra CMake targets to rebuild (the tests' and weave-bench's executables
#            are found from CTest)
#
# Faults are meant to be rare in effect: one tile, one row block, one rank's contribution, the
# ragged edge, one call of a back-to-back sequence, a race. A check that samples a few rows or
# compares a norm of the whole output can miss them; a per-tile (per-element) check cannot.

FAULTS = [
    # ---- single-GPU GEMM (kernels/gemm) ---------------------------------------------------------
    {
        "name": "gemm_last_k_step_skipped_one_tile",
        "what": "work item 1 of every GEMM launch (K > 64) runs one K step less: its tile misses the last 64 of K "
                "(the TP kernels derive from this GEMM, so they inherit it)",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "static __device__ __forceinline__ int num_iters(const Globals& g, int) { return (g.K + BK - 1) / BK; }",
            "replace": "static __device__ __forceinline__ int num_iters(const Globals& g, int w) {\n"
                       "    return (g.K + BK - 1) / BK - (w == 1 && g.K > BK ? 1 : 0);\n"
                       "  }",
        }],
        "tests": ["test_gemm_gpu", "test_tp_gpu:TpGpu.GemmRs*:TpGpu.AgGemm*"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1000x1000x1000,2048x2048x512 --target-ms 2"}],
    },
    {
        "name": "gemm_ragged_n_last_column_block_dropped",
        "what": "the GEMM epilogue stops before a partial last 64-column block (N % 64 != 0): those columns are "
                "never stored (ragged edge only)",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "if (n >= g.N) break;",
            "replace": "if (n + 64 > g.N) break;",
        }],
        "tests": ["test_gemm_gpu", "test_tp_gpu:TpGpu.GemmRs*:TpGpu.AgGemm*"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1000x1000x1000 --target-ms 2"}],
    },
    {
        "name": "gemm_swapped_wide_partial_column_block_dropped",
        "what": "swapped 128 x w and 256 x w tiles: a staging block whose 64 output columns run past N is not "
                "stored, so when N % 64 != 0 the last N % 64 columns of C are never written (the tokens are whole)",
        "edits": [{
            "file": "kernels/gemm/transposed_staging.cuh",
            "find": "                                                       int rows, bool accumulate) {\n  if (n >= rows) return;",
            "replace": "                                                       int rows, bool accumulate) {\n  if (n + 64 > rows) return;",
        }],
        "tests": ["test_gemm_gpu:Gemm.SwappedWideTiles", "test_gemm_gpu:Gemm.Swapped256Tiles",
                  "test_gemm_fp8_gpu:GemmFp8.SwappedWideTiles"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 77x14344x4104,40x1000x512 --tile sw96 --target-ms 2"}],
    },
    {
        "name": "gemm_swapped256_second_consumer_b_offset",
        "what": "swapped 256 x w tile: the second consumer reads its token (B) operand at the 64-row tile's "
                "per-consumer offset, past the stage's B, so weight rows 128-255 of every tile are garbage",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "const uint32_t b0 = tile::smem_u32(s.b) + (BM == 64 ? c * kWN * 128 : 0);",
            "replace": "const uint32_t b0 = tile::smem_u32(s.b) + (BM != 128 ? c * kWN * 128 : 0);",
        }],
        "tests": ["test_gemm_gpu:Gemm.Swapped256Tiles"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1000x1000x2048 --tile sw256x144 --target-ms 2"}],
    },
    {
        "name": "gemm_swapped256_second_part_over_first",
        "what": "swapped 256 x w tile: the second output part is stored at the first part's weight rows, so "
                "rows 64-127 of each consumer's share are never written and rows 0-63 get the wrong values",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "t.m * BM + (BM / 2) * c + 64 * p, t.n * BN",
            "replace": "t.m * BM + (BM / 2) * c, t.n * BN",
        }],
        "tests": ["test_gemm_gpu:Gemm.Swapped256Tiles"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1000x1000x2048 --tile sw256x144 --target-ms 2"}],
    },
    # ---- GEMM + reduce-scatter (kernels/gemm_rs) -------------------------------------------------
    {
        "name": "gemm_rs_drop_rank_contribution_one_tile",
        "what": "variants 0/1: rank 1 skips its reduce-add into owner 0's tile (row tile 1, column tile 0); every "
                "other tile is right",
        "edits": [{
            "file": "kernels/gemm_rs/gemm_rs_kernel.cuh",
            "find": "      if (own) tile::tma::store_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);\n"
                    "      else tile::tma::reduce_add_2d(",
            "replace": "      if (own) tile::tma::store_2d(&g.out[t.owner], o.c + j * BM * 64, n, t.i * BM);\n"
                       "      else if (!(g.rank == 1 && t.owner == 0 && t.i == 1 && t.n == 0)) tile::tma::reduce_add_2d(",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmRs*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_rs --variant 0"}],
    },
    {
        "name": "gemm_rs_inter_sm_drop_rank_one_tile",
        "what": "variant 2 (inter-SM): the owner's communicator sums W - 1 ranks' scratch for its tile j == 1 "
                "(the last rank's partial is dropped)",
        "edits": [{
            "file": "kernels/gemm_rs/gemm_rs_kernel.cuh",
            "find": "reduce_tile(g.scr, g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, rows * g.N + c0,\n"
                    "                  min(kBM, sh.size - t.m * kBM),",
            "replace": "reduce_tile(g.scr, j == 1 ? g.L.W - 1 : g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, "
                       "rows * g.N + c0,\n                  min(kBM, sh.size - t.m * kBM),",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmRs*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_rs --variant 2 --num-comm-sms 8"}],
    },
    {
        "name": "gemm_rs_adaptive_drop_rank_one_tile",
        "what": "variant 6 (adaptive split): the reduction of the rank's tile j == 1 sums W - 1 ranks' scratch",
        "edits": [{
            "file": "kernels/gemm_rs/gemm_rs_kernel.cuh",
            "find": "reduce_tile(g.scr, g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, rows * g.N + c0,\n"
                    "                      min(kBM, sh.size - c.m * kBM),",
            "replace": "reduce_tile(g.scr, j == 1 ? g.L.W - 1 : g.L.W, (sh.begin + rows) * g.N + c0, &g.own, 1, "
                       "rows * g.N + c0,\n                      min(kBM, sh.size - c.m * kBM),",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmRs*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_rs --variant 6 --num-comm-sms 0"}],
    },
    # ---- GEMM + all-reduce (kernels/gemm_ar) -----------------------------------------------------
    {
        "name": "gemm_ar_drop_rank_contribution_one_tile",
        "what": "inter-SM: the owner's reduction of tile 1 sums W - 1 ranks (the last rank's partial is dropped)",
        "edits": [{
            "file": "kernels/gemm_ar/gemm_ar_kernel.cuh",
            "find": "tp::reduce_tile(g.buf, g.L.W, off, g.buf, g.L.W, off,",
            "replace": "tp::reduce_tile(g.buf, w == 1 ? g.L.W - 1 : g.L.W, off, g.buf, g.L.W, off,",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmAr*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_ar --num-comm-sms 8"}],
    },
    {
        "name": "gemm_ar_intra_drop_add_one_tile",
        "what": "intra-SM: rank 1 neither waits for nor adds its partial into its peers' copy of tile 1",
        "edits": [{
            "file": "kernels/gemm_ar/gemm_ar_kernel.cuh",
            "find": "      const int d = g.rank + k < W ? g.rank + k : g.rank + k - W;\n",
            "replace": "      const int d = g.rank + k < W ? g.rank + k : g.rank + k - W;\n"
                       "      if (k > 0 && w == 1 && g.rank == 1) continue;\n",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmAr*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_ar --num-comm-sms 0"}],
    },
    {
        "name": "gemm_ar_reduce_without_waiting_for_partials",
        "what": "inter-SM: the owner's communicator reduces a tile without waiting (acquire) for every rank's "
                "ready signal: it reads partials that are not written yet",
        "edits": [{
            "file": "kernels/gemm_ar/gemm_ar_kernel.cuh",
            "find": "      if (threadIdx.x == 0) wait(g.ready, w, g.ready_round * ar_ready_expected(g.L));\n",
            "replace": "      // (the wait for every rank's partial of tile w is missing)\n",
        }],
        "tests": ["test_tp_gpu:TpGpu.GemmAr*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_ar --num-comm-sms 8"}],
    },
    # ---- AllGather + GEMM (kernels/ag_gemm) ------------------------------------------------------
    {
        "name": "ag_gemm_signal_before_store_wait",
        "race": True,
        "what": "TMA push (variants 0 and 2): a unit's ready signal goes out before store_wait(), so a peer may "
                "load the row tile before the bulk stores landed (a race)",
        "edits": [{
            "file": "kernels/ag_gemm/ag_gemm_kernel.cuh",
            "find": "        store_wait();\n        signal_unit(u_store);\n",
            "replace": "        signal_unit(u_store);\n        store_wait();\n",
        }],
        "tests": ["test_tp_gpu:TpGpu.AgGemm*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048,4096 --kernels ag_gemm --variant 0 --num-comm-sms 4"}],
        "repeat": 3,
    },
    {
        "name": "ag_gemm_peer_tile_loaded_without_wait",
        "what": "the GEMM loader reads a peer's row tile of the gathered A without waiting (acquire) for its "
                "ready counter (bites where the tile has not arrived yet: small shapes, early tiles)",
        "edits": [{
            "file": "kernels/ag_gemm/ag_gemm_kernel.cuh",
            "find": "      wait(g.ready, t.vrow, g.ready_round * ag_ready_expected(g.slices));\n",
            "replace": "",
        }],
        "tests": ["test_tp_gpu:TpGpu.AgGemm*"],
        "bench": [{"ranks": 2, "args": "tp --sizes 2048 --kernels ag_gemm --variant 0 --num-comm-sms 4"}],
        "repeat": 2,
    },
    # ---- fp8 inputs of the TP kernels (kernels/ag_gemm, kernels/gemm_rs) ------------------------
    {
        "name": "ag_gemm_fp8_last_k_block_dropped",
        "what": "fp8 ag_gemm, fused variants 0..7: the kernel's K-block count is one short for K > 128, so every "
                "tile misses the last 128-K block (K = 528: its last 16 of K)",
        "edits": [{
            "file": "kernels/ag_gemm/ag_gemm.cu",
            "find": "g.kblocks = gemm_fp8::k_blocks(K);",
            "replace": "g.kblocks = gemm_fp8::k_blocks(K) - (K > 128);",
        }],
        "tests": ["test_tp_gpu:TpGpu.Fp8AgGemm*"],
        "bench": [{"ranks": 2, "args": "tp --dtype fp8 --sizes 2048 --kernels ag_gemm --variant 0 --num-comm-sms 4"}],
    },
    {
        "name": "gemm_rs_fp8_scale_b_for_scale_a",
        "what": "fp8 gemm_rs, fused variants 0, 1, 2 and 5: the kernel gets scale_b in place of scale_a, so every "
                "rank's partial is scale_b^2 A B^T",
        "edits": [{
            "file": "kernels/gemm_rs/gemm_rs.cu",
            "find": "g.scale_a = in.scale_a, g.scale_b = in.scale_b;",
            "replace": "g.scale_a = in.scale_b, g.scale_b = in.scale_b;",
        }],
        "tests": ["test_tp_gpu:TpGpu.Fp8GemmRs*"],
        "bench": [{"ranks": 2, "args": "tp --dtype fp8 --sizes 2048 --kernels gemm_rs --variant 0 --num-comm-sms 0"}],
    },
    # ---- tensor-parallel schedule (kernels/tp_common) --------------------------------------------
    {
        "name": "tp_row_split_ignores_remainder",
        "what": "owner q's first A row is q * (M / W), not shard(M, W, q).begin: off by one row per owner past "
                "the first M % W (ragged M only; gemm_rs computes the wrong rows)",
        "edits": [{
            "file": "kernels/tp_common/schedule.hpp",
            "find": "it.a_row = shard(L.M, L.W, q).begin + t.m * kBM;",
            "replace": "it.a_row = q * (L.M / L.W) + t.m * kBM;",
        }],
        "tests": ["test_tp_schedule", "test_tp_gpu:TpGpu.GemmRs*:TpGpu.AgGemm*"],
    },
    {
        "name": "tp_nk_map_drops_last_k_columns",
        "what": "the TP kernels' N x K map of B ends 8 columns short of K: the last 8 k of every dot product read as "
                "zero (TMA's out-of-bounds fill), B as N x K only, in every family",
        "edits": [{
            "file": "kernels/tp_common/host.hpp",
            "find": "tile::tma_2d(p, N, K, K, kBN, 64, tile::Swizzle::B128)",
            "replace": "tile::tma_2d(p, N, K - 8, K, kBN, 64, tile::Swizzle::B128)",
        }],
        "tests": ["test_tp_gpu:TpGpu.NkWeights*"],
        # B as N x K: the fault shortens only that map.
        "bench": [
            {"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_rs --b-layout nk --variant 0"}],
    },
    {
        "name": "torch_op_ag_gemm_reads_nk_weight_as_kn",
        "what": "torch.ops.weave.all_gather_matmul passes a weight.t() first B to the fused kernel as K x N: the "
                "N x K storage is read as if it were K x N (in bounds, wrong values; square weights included)",
        "edits": [{
            "file": "python/src/torch_ops.cpp",
            "find": "-1, -1, p.nks[0]);",
            "replace": "-1, -1, false);",
        }],
        "tests": ["python"],
        "targets": ["_C", "weave_py_package"],
    },
    # ---- device primitives (include/weave) -------------------------------------------------------
    {
        "name": "store_wait_only_waits_for_smem_reads",
        "race": True,
        "what": "store_wait() waits for the TMA stores' shared-memory reads (.read), not their writes: every "
                "signal after it may overtake the data (a race)",
        "edits": [{
            "file": "include/weave/store.cuh",
            "find": "__device__ __forceinline__ void store_wait() { tile::tma::wait_group<0>(); }",
            "replace": "__device__ __forceinline__ void store_wait() { tile::tma::wait_group_read<0>(); }",
        }],
        "tests": ["test_primitives:Signal.*:StoreAsync.Bf16:StoreAddAsync.Bf16", "test_tp_gpu:TpGpu.AgGemm*", "test_sp_gpu"],
        "repeat": 3,
        # Both races are in the primitives ag_gemm signals with (the row of ag_gemm_signal_before_store_wait).
        "bench": [
            {"ranks": 2, "args": "tp --sizes 2048,4096 --kernels ag_gemm --variant 0 --num-comm-sms 4"}],
    },
    {
        "name": "wait_polls_relaxed_without_acquire",
        "race": True,
        "what": "wait() polls with ld.relaxed.sys instead of ld.acquire.sys: reads after a wait are not ordered "
                "after the peer's release (a race the hardware rarely shows)",
        "edits": [{
            "file": "include/weave/signal.cuh",
            "find": "(v = ld_acquire_sys(p)) >= expected",
            "replace": "(v = ld_relaxed_sys(p)) >= expected",
        }],
        "tests": ["test_primitives:Signal.*:StoreAsync.Bf16:StoreAddAsync.Bf16", "test_tp_gpu:TpGpu.AgGemm*", "test_sp_gpu", "test_collectives"],
        "repeat": 3,
        "bench": [
            {"ranks": 2, "args": "tp --sizes 2048,4096 --kernels ag_gemm --variant 0 --num-comm-sms 4"}],
    },
    # ---- collectives (kernels/collectives) -------------------------------------------------------
    {
        "name": "ll_scratch_slot_reused_one_call_early",
        "race": True,
        "what": "LL/LL128 scratch parity flips every second call: calls 2k and 2k+1 share a slot, so a fast rank "
                "overwrites lines a slow peer has not read yet (back-to-back calls; a race)",
        "edits": [{
            "file": "kernels/collectives/plan.hpp",
            "find": "return static_cast<int>(n & 1);",
            "replace": "return static_cast<int>((n >> 1) & 1);",
        }],
        "tests": ["test_collectives_schedule", "test_collectives", "test_collectives_graph"],
        "bench": [{"ranks": 2, "args": "collectives --sizes 64K --kernels all_reduce,all_gather --ar-algo ll "
                                       "--ag-algo ll128 --target-ms 5 --repeats 2"}],
        "repeat": 2,
    },
    {
        "name": "collectives_call_counts_not_advanced",
        "what": "the last block of a collective never applies the call's increments to the device counts "
                "(state.cuh, leave): every later call waits for counts the first call already met and takes "
                "the first call's LL flag and parity",
        "edits": [{
            "file": "kernels/collectives/state.cuh",
            "find": "  advance(*st);",
            "replace": "  (void)advance;",
        }],
        "tests": ["test_collectives_graph", "test_collectives"],
        # LL calls back to back on alternating inputs: with the counts never advanced every call after
        # the first takes the first call's flag, so stale lines pass for new ones.
        "bench": [
            {"ranks": 2, "args": "collectives --sizes 64K --kernels all_reduce,all_gather --ar-algo ll --ag-algo ll "
                                 "--target-ms 5 --repeats 2"}],
    },
    {
        "name": "ll_restart_never_zeroes",
        "what": "the LL scratch restart never happens (ll_restart_at always false): after 2 (2^32 - 1) calls a stale "
                "line passes for a new one",
        "edits": [{
            "file": "kernels/collectives/plan.hpp",
            "find": "return n > 1 && (n - 1) % (2ull * period) == 0;",
            "replace": "return false && n > 1 && (n - 1) % (2ull * period) == 0;",
        }],
        "tests": ["test_collectives_schedule", "test_collectives_graph"],
    },
    {
        "name": "all_gather_ragged_rank_offset",
        "what": "direct all_gather: rank r's shard lands at r * size_r along the gathered dimension, not at its "
                "begin (wrong place for the ranks past the first n % W; ragged shards only)",
        "edits": [{
            "file": "kernels/collectives/plan.hpp",
            "find": "x.dst_off = sh.begin * v.inner * elt;",
            "replace": "x.dst_off = r * sh.size * v.inner * elt;",
        }],
        "tests": ["test_collectives_schedule", "test_collectives"],
    },
    {
        "name": "tuner_memory_answers_every_group",
        "what": "the tuner's in-memory choice answers a communicator's call without communication even when "
                "another communicator (another torch group of the process) made it: two ranks of a group across "
                "two TP groups that chose differently launch different variants and wait for each other's signals",
        "edits": [{
            "file": "src/runtime/tuner.cpp",
            "find": "    } else if (auto it = mem_.find(key); it != mem_.end() && usable(it->second)) {",
            "replace": "    }\n    if (auto it = mem_.find(key); it != mem_.end() && usable(it->second)) {",
        }],
        "tests": ["test_tp_schedule:Tuner.*"],
    },
    {
        "name": "tuner_model_pick_written_to_file",
        "what": "the tuner writes the cost model's pick to its cache file as if measured: the next process "
                "takes it for a searched choice, and a later search's winner no longer replaces it there",
        "edits": [{
            "file": "src/runtime/tuner.cpp",
            "find": "  if (!write_file || v.from_model || path_ == \"off\") return;",
            "replace": "  if (!write_file || path_ == \"off\") return;",
        }, {
            "file": "src/runtime/tuner.cpp",
            "find": "    if (rank != 0 || fresh) remember(key, r, false);",
            "replace": "    if (rank != 0 || fresh) remember(key, r, fresh);",
        }],
        "tests": ["test_tuner_model_cpu"],
    },
    {
        "name": "tune_model_comm_sms_cost_nothing",
        "what": "the TP cost model lets ag_gemm's communicator blocks (v0, v1) cost the GEMM no SM: it then takes "
                "the most communicators on offer wherever the push is the longer side",
        "edits": [{
            "file": "kernels/tp_common/tune_model.hpp",
            "find": "      return fused_us(waves_us(L.work(), r.sms - c.num_comm_sms, t),",
            "replace": "      return fused_us(waves_us(L.work(), r.sms, t),",
        }],
        "tests": ["test_tune_model_cpu"],
    },
    {
        "name": "collectives_empty_rank_grid_from_own_plan",
        "what": "direct path: a rank whose plan is empty (its shard is; a Ulysses rank without sequence rows) "
                "sizes its grid with the reduction shape's smaller blocks, not its peers' shape, and waits for "
                "\"done\" signals from blocks its peers never launch (the hang test_collectives_lifetime met)",
        "edits": [{
            "file": "kernels/collectives/collectives.cu",
            "find": "const DirectShape shape = direct_shape(kind, W);",
            "replace": "const DirectShape shape = plan.n == 0 ? DirectShape::reduce : direct_shape(kind, W);",
        }],
        "tests": ["test_collectives:Collectives.AllGather:Collectives.ReduceScatter:Collectives.UlyssesAllToAll"],
    },
    # ---- single-GPU attention (kernels/attention/attention_kernel.cuh) ---------------------------
    {
        "name": "attention_final_rescale_skipped_one_row_block",
        "what": "the epilogue skips O / l for query rows 128..255 (every batch and head; the consumer loop the "
                "gathered ring/Ulysses kernel shares): those rows are unnormalised",
        "edits": [{
            "file": "kernels/attention/pipeline.cuh",
            "find": "      inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;",
            "replace": "      inv[r] = l[r] > 0.f ? (mk.row0 + 8 * r >= 128 && mk.row0 + 8 * r < 256 ? 1.f : 1.f / l[r]) : 0.f;",
        }],
        "tests": ["test_attention_gpu", "test_sp_gpu_w1"],
        "bench": [{"ranks": 1, "args": "attention --seqs 1024 --tokens 2048 --heads 2 --d 128 --causal 0 "
                                       "--variants auto --target-ms 2"}],
    },
    {
        "name": "attention_causal_mask_off_by_one_one_block",
        "what": "causal mask of key block 1 lets each row see one future key (col == row + 1): only query rows "
                "128..255 are affected (shared by the gathered ring/Ulysses kernel)",
        "edits": [{
            "file": "kernels/attention/pipeline.cuh",
            "find": "if (col >= S || (causal && col > row)) s[4 * j + 2 * r + e] = -INFINITY;",
            "replace": "if (col >= S || (causal && col > row + (col0 == BN ? 1 : 0))) s[4 * j + 2 * r + e] = -INFINITY;",
        }],
        "tests": ["test_attention_gpu", "test_sp_gpu", "test_sp_gpu_w1"],
        "bench": [{"ranks": 1, "args": "attention --seqs 1024 --tokens 2048 --heads 2 --d 128 --causal 1 "
                                       "--variants auto --target-ms 2"}],
    },
    {
        "name": "attention_lse_missing_last_row_block",
        "what": "the LSE of the last query block of every head is never written",
        "edits": [{
            "file": "kernels/attention/attention_kernel.cuh",
            "find": "if (row < g.S) g.lse[static_cast<size_t>(bh) * g.S + row] = m[r] * g.scale + logf(l[r]);",
            "replace": "if (row < g.S && mb != g.m_blocks - 1) g.lse[static_cast<size_t>(bh) * g.S + row] = "
                       "m[r] * g.scale + logf(l[r]);",
        }],
        "tests": ["test_attention_gpu"],
        "bench": [{"ranks": 1, "args": "attention --seqs 1024 --tokens 2048 --heads 2 --d 128 --causal 0 "
                                       "--variants auto --target-ms 2"}],
    },
    # ---- sequence parallel (kernels/ring_attention, kernels/ulysses, gathered_attention) ---------
    {
        "name": "ring_attention_peer_v_reads_zero",
        "what": "ring: the gathered V's tensor map has the local row count L instead of S, so V rows past L "
                "read as zeros (rank 0's peer half under contiguous sharding; no effect at W = 1)",
        "edits": [{
            "file": "kernels/ring_attention/ring_attention.cu",
            "find": "g.v = attention::map_rows(gv, D, Hkv, S, s.B,",
            "replace": "g.v = attention::map_rows(gv, D, Hkv, L, s.B,",
        }],
        "tests": ["test_sp_gpu"],
        "bench": [{"ranks": 2, "args": "sp --seqs 4096 --batch 1 --heads-ring 4 --head-dim 128 --causal 0 "
                                       "--kernels ring_attention --single 0 --target-ms 5"}],
    },
    {
        "name": "ulysses_o_heads_swapped",
        "what": "Ulysses: the O all-to-all back to the owners writes local heads 0 and 1 into each other's place "
                "(TMA path; rows written from registers at shard boundaries stay right)",
        "edits": [{
            "file": "kernels/gathered_attention/gathered_kernel.cuh",
            "find": "64 * j, g.head_base + t.h,",
            "replace": "64 * j, g.head_base + (g.o_by_owner && g.H > 1 && t.h < 2 ? 1 - t.h : t.h),",
        }],
        "tests": ["test_sp_gpu", "test_sp_gpu_w1"],
        "bench": [{"ranks": 2, "args": "sp --seqs 4096 --batch 1 --heads-ulysses 8 --head-dim 128 --causal 0 "
                                       "--kernels ulysses --single 0 --target-ms 5"}],
    },
    # ---- GEMM split-K, layouts, epilogues, decode tile (kernels/gemm) -------------------------------
    {
        "name": "gemm_split_k_partial_dropped",
        "what": "split-K (the dense GEMM's and the grouped GEMM's exchange): the warpgroup that finishes a split "
                "item adds every other split's partial but one (one K range of every split tile missing)",
        "edits": [{
            "file": "kernels/gemm/split_k.cuh",
            "find": "      if (j == split) continue;",
            "replace": "      if (j == split || j == (split == 0 ? 1 : 0)) continue;",
        }],
        "tests": ["test_split_k_gpu", "test_grouped_gemm_gpu"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 16x4096x14336,300x1000x2056 --split-k 4 --target-ms 2"}],
    },
    {
        "name": "gemm_split_k_counter_not_reset",
        "what": "split-K: the finishing warpgroup leaves its counter at the split count, so on the next launch on "
                "that stream nobody finishes the tile (its output is never stored)",
        "edits": [{
            "file": "kernels/gemm/split_k.cuh",
            "find": "    if (last) *counter = 0;  // the next launch starts from zero (kernel boundaries order it)",
            "replace": "    (void)counter;",
        }],
        "tests": ["test_split_k_gpu", "test_grouped_gemm_gpu:GroupedGemm.BackToBackChangingCounts"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 16x4096x14336 --split-k 4 --target-ms 2"}],
    },
    {
        "name": "gemm_split_k_capture_takes_stream_workspace",
        "what": "split-K workspace: a captured launch takes its capture stream's cached buffers instead of "
                "the graph's own, so graphs captured on one stream (and eager calls there) share partials and "
                "counters, and a later eager growth frees what the graph's replays write",
        "edits": [{
            "file": "kernels/gemm/split_k_workspace.cpp",
            "find": "  if (capturing(stream)) return for_capture(stream, dev, pb, cb);",
            "replace": "  if (false && capturing(stream)) return for_capture(stream, dev, pb, cb);",
        }],
        "tests": ["test_split_k_gpu:GemmSplitK.GraphsOnOneCaptureStreamReplayAtOnce",
                  "test_split_k_gpu:GemmSplitK.CapturedGraphKeepsItsWorkspace"],
    },
    {
        "name": "gemm_decode_tile_consumers_same_columns",
        "what": "64x128 tile: the second consumer warpgroup reads the first one's B columns, so columns 64-127 "
                "of every tile hold columns 0-63's results",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "const uint32_t b0 = tile::smem_u32(s.b) + (BM == 64 ? c * kWN * 128 : 0);",
            "replace": "const uint32_t b0 = tile::smem_u32(s.b);",
        }],
        "tests": ["test_gemm_gpu:Gemm.DecodeTile", "test_split_k_gpu"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 16x4096x4096 --tile 64 --target-ms 2"}],
    },
    {
        "name": "gemm_transposed_a_read_k_major",
        "what": "A stored K x M: the wgmma reads A K-major (tnspA 0) from the M-major tile",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "constexpr int kTransA = LA == ALayout::KM ? 1 : 0;",
            "replace": "constexpr int kTransA = 0;",
        }],
        "tests": ["test_gemm_gpu:Gemm.TransposedA*"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1024x1024x1024 --a-layout km --target-ms 2"}],
    },
    {
        "name": "gemm_bias_last_column_pair_dropped",
        "what": "bias epilogue: the last two columns of C get no bias (ragged edge only)",
        "edits": [{
            "file": "kernels/gemm/gemm_kernel.cuh",
            "find": "      if (n < N) {",
            "replace": "      if (n < N - 2) {",
        }],
        "tests": ["test_gemm_gpu:Gemm.Bias"],
    },
    {
        "name": "gemm_dense_staging_last_column_pair_dropped",
        "what": "128 x w tiles (dense output staging): the epilogue leaves each warp's last 16 columns unstaged, "
                "so they are stored from whatever the staging tile held",
        "edits": [{
            "file": "include/weave/tile/fragment.cuh",
            "find": "  for (int j = 0; j < N / 8; j += 2) {",
            "replace": "  for (int j = 0; j < N / 8 - 2; j += 2) {",
        }],
        "tests": ["test_gemm_gpu:Gemm.WideTiles", "test_gemm_fp8_gpu:GemmFp8.WideTiles"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 256x14336x4096 --layout nk --tile w112 --target-ms 2"}],
    },
    {
        "name": "gemm_plan_wide_counts_256_columns",
        "what": "planner: the 128 x w tiles' tile count uses 256 columns per tile, so they look as cheap per "
                "round as 128x256 and are chosen where they do not fill the machine",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "      const int items = tm * ceil_div(in.N, w);",
            "replace": "      const int items = tm * ceil_div(in.N, 256);",
        }],
        "tests": ["test_split_k_cpu"],
    },
    {
        "name": "gemm_cluster_tile_a_mk_only",
        "what": "planner: the 2-CTA cluster tile only with A stored M x K (as before 2026-12-06), so ragged "
                "weight gradients (A K x M) run on the single-CTA 128x256 tile (0.73 of cuBLAS against 0.88)",
        "edits": [{
            "file": "kernels/gemm/gemm.cu",
            "find": "  return pair_epilogue(opt, f32_out) && opt.lcsc.num_comm_sms % 2 == 0;",
            "replace": "  return default_epilogue(opt, f32_out) && opt.lcsc.num_comm_sms % 2 == 0;",
        }],
        "tests": ["test_gemm_cpu"],
    },
    {
        "name": "gemm_plan_wide_discount_on_many_rounds",
        "what": "planner: the 128 x w tiles keep their fitted discount on rows of many rounds (as before "
                "2026-12-06), so 128 x 208 takes rows of 6-50 rounds from 128x256 (0.85 against 1.00 of cuBLAS)",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "    if (kWideWidths[i] == w) return rounds >= kWideManyRounds ? kWideMeasuredCosts[i] : kWideCosts[i];",
            "replace": "    if (kWideWidths[i] == w) return kWideCosts[i];",
        }],
        "tests": ["test_split_k_cpu", "test_gemm_fp8_cpu"],
    },
    {
        "name": "gemm_plan_wide_pair_on_aligned_pitch",
        "what": "planner: the 128x320 cluster tile is offered on aligned pitches too, at its misaligned-pitch "
                "cost (cheaper per FLOP than 128x256 there), so compute-bound aligned rows leave 128x256",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "  if (in.pair_clusters > 0 && in.wide_pair && !in.aligned)\n    consider(best, best_of(Tile::M128N320C2,",
            "replace": "  if (in.pair_clusters > 0 && in.wide_pair)\n    consider(best, best_of(Tile::M128N320C2,",
        }],
        "tests": ["test_split_k_cpu"],
    },
    {
        "name": "gemm_fp8_wide_pair_any_b",
        "what": "fp8 planner: the 128 x w and swapped 128 x w tiles offered for an e5m2 B too, which has no "
                "instantiation (e4m3 x e5m2 would throw at the launch)",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8.cu",
            "find": "bool wide_pair(Fp8, Fp8 tb) { return tb == Fp8::E4M3; }",
            "replace": "bool wide_pair(Fp8, Fp8) { return true; }",
        }],
        "tests": ["test_gemm_fp8_cpu"],
    },
    {
        "name": "gemm_plan_misaligned_swapped_one_tile_as_small",
        "what": "planner: the single-CTA swapped tile on a misaligned pitch costed as the 128-row tiles over one "
                "token tile too, so 109 x 4040 x 14352 fp8 leaves it for 64x128 (0.89 -> 0.72 of cuBLASLt)",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "in.aligned ? 1.0 : pair || token_tiles == 1 ? kMisalignedSwapped : kMisalignedSmall;",
            "replace": "in.aligned ? 1.0 : pair ? kMisalignedSwapped : kMisalignedSmall;",
        }],
        "tests": ["test_gemm_fp8_cpu"],
    },
    {
        "name": "gemm_fp8_cluster_tile_with_odd_comm_sms",
        "what": "fp8 planner: the 128x256 cluster tile planned beside an odd number of communicator blocks, "
                "which the cluster launch refuses",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8.cu",
            "find": "  in.pair_clusters = opt.lcsc.num_comm_sms % 2 == 0 ? pair_clusters : 0;",
            "replace": "  in.pair_clusters = pair_clusters;",
        }],
        "tests": ["test_gemm_fp8_cpu"],
    },
    {
        "name": "gemm_swapped_not_for_input_gradients",
        "what": "bf16 planner: the swapped 128 x w tile only for B stored N x K again, so input gradients of "
                "few tokens go back to 128-row tiles (266 x 14336 x 8192: 0.91 -> 0.59 of cuBLAS)",
        "edits": [{
            "file": "kernels/gemm/gemm.cu",
            "find": "  in.swapped_wide = in.swapped_tiles = in.swapped_splits = plain;",
            "replace": "  in.swapped_wide = in.swapped_tiles = in.swapped_splits = plain && bl == BLayout::NK;",
        }],
        "tests": ["test_gemm_cpu"],
    },
    {
        "name": "gemm_plan_swapped_split_floor_dropped",
        "what": "planner: above 128 tokens the swapped tile splits up to 4 ways whatever K is, so short K "
                "(4096: 64 iterations) is cut into splits of 16-21 iterations, which measured 4-7 % slower",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "padded ? std::max(1, std::min(kMaxSplitsSwappedPadded, iters / kMinSplitItersSwapped))\n",
            "replace": "padded ? kMaxSplitsSwappedPadded\n",
        }],
        "tests": ["test_split_k_cpu"],
    },
    {
        "name": "gemm_plan_swapped_pair_splits_two",
        "what": "planner: the swapped tile in 2-CTA clusters splits at most twice up to 128 tokens, so "
                "109 x 4040 x 14352 (16 pairs of panels on 66 clusters) runs the 128x256 cluster tile in "
                "4 splits at 0.66 of cuBLAS instead of sw128x112c2 in 4 at 0.93",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": ": pair && in.M <= 128 ? kMaxSplitsSwappedPair",
            "replace": ": false ? kMaxSplitsSwappedPair",
        }],
        "tests": ["test_split_k_cpu"],
    },
    {
        "name": "gemm_swapped_config_pairs_few_strips",
        "what": "swapped decode tile: 9-16 tokens of 1-3 strips per SM run two strips per block, so 256 strips "
                "make 128 blocks on 132 SMs (fp8 16 x 4096 x 14336 10-15 % slower than one strip per block)",
        "edits": [{
            "file": "kernels/gemm/swapped_schedule.hpp",
            "find": "  if (s < kOneStripBelow * sms) return {1, 8, 2};\n",
            "replace": "",
        }],
        "tests": ["test_split_k_cpu"],
    },
    {
        "name": "gemm_plan_short_split_items_allowed",
        "what": "planner: above decode the only round splits into items of any length, so 128 x 4096 x 11008 "
                "fp8 runs 64x128 in two splits of 43 iterations, 11 % slower than unsplit",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "    if (decode || items >= workers) return bound;",
            "replace": "    if (decode || items >= workers || true) return bound;",
        }],
        "tests": ["test_split_k_cpu", "test_gemm_fp8_cpu"],
    },
    {
        "name": "gemm_plan_swapped_splits_flag_ignored",
        "what": "planner: the swapped tile's splits above 128 tokens are taken without PlanInputs::swapped_splits, "
                "so the fp8 GEMM (whose splits there lost: 0.91 -> 0.88 of cuBLASLt) takes them too",
        "edits": [{
            "file": "kernels/gemm/plan.hpp",
            "find": "const bool padded = in.swapped_splits && in.M > 128;",
            "replace": "const bool padded = in.M > 128;",
        }],
        "tests": ["test_split_k_cpu"],
    },
    # ---- fp8 GEMM (kernels/gemm_fp8) ---------------------------------------------------------------
    {
        "name": "gemm_fp8_last_k_block_skipped_one_tile",
        "what": "work item 1 of every fp8 launch runs one 128-K block less",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "static __device__ __forceinline__ int num_iters(const Globals& g, int) { return g.kblocks; }",
            "replace": "static __device__ __forceinline__ int num_iters(const Globals& g, int w) {\n"
                       "    return g.kblocks - (w == 1 && g.kblocks > 1 ? 1 : 0);\n"
                       "  }",
        }],
        "tests": ["test_gemm_fp8_gpu"],
        "bench": [{"ranks": 1, "args": "gemm --dtype fp8 --shapes 1024x1024x1024 --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_scale_b_ignored",
        "what": "per-tensor fp8: the epilogue multiplies by scale_a only",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "if (it == 0) st.scale = __ldg(g.scale_a) * __ldg(g.scale_b);",
            "replace": "if (it == 0) st.scale = __ldg(g.scale_a);",
        }],
        "tests": ["test_gemm_fp8_gpu"],
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 1024x1024x1024,200x1000x1040 --impl weave --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_scale_b_off_by_one_block",
        "what": "block-scaled fp8: every K block after the first takes the previous block's B scale",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "next_lo = __ldg(sb_lo + kb);",
            "replace": "next_lo = __ldg(sb_lo + (kb > 0 ? kb - 1 : 0));",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaled*"],
        # --lane-scales 1: B's scales loaded uniform, the branch the edit is in.
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 1024x1024x1024 --impl weave_block --lane-scales 1 --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_192_second_scale_block_at_128",
        "what": "block-scaled fp8, 128x192 tile: odd tile columns take B's second scale block from tile column 128 "
                "instead of 64 (columns 64-127 of those tiles scaled with the wrong block)",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "if (BN == 128 || split == 128)",
            "replace": "if (BN == 128 || split == 128 || split == 64)",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaled*"],
        # N = 1024 on the 128x192 tile: tiles 1, 3 and 5 start mid N block (split 64).
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 1024x1024x1024 --impl weave_block --block-tile 192 --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_lane_scales_swapped",
        "what": "block-scaled fp8, B's scales loaded per lane: even lanes load the second N block's scale and odd "
                "lanes the first's, so the shuffles hand every tile its two B scales swapped",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "next_lo = __ldg(((threadIdx.x & 1) ? sb_hi : sb_lo) + kb);",
            "replace": "next_lo = __ldg(((threadIdx.x & 1) ? sb_lo : sb_hi) + kb);",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaled*"],
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 1024x1024x1024 --impl weave_block --lane-scales 2 --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_transpose_read_unswizzled",
        "what": "fp8 transpose: the store side reads the shared tile without the XOR swizzle its word stores "
                "used, so every destination row's 16-byte chunks come from the wrong source rows (except chunk "
                "0 of rows d with (d / 16) % 8 == 0)",
        "edits": [{
            "file": "kernels/gemm_fp8/transpose.cu",
            "find": "tile + d * 32 + 4 * (x ^ ((d / 16) % 8))",
            "replace": "tile + d * 32 + 4 * x",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.Fp8Transpose"],
        # --shapes rows are all N x K (no transpose): the drawn set's first row of seed 47 is the dgrad
        # row 266 x 4096 x 14336 (B transposed by transpose_fp8, its bytes compared too).
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --set drawn --draw-seed 47 --draws 1 --impl weave --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_split_scales_from_block_0",
        "what": "block-scaled split-K: every split takes its scales from K block 0 on instead of its own first block "
                "(the operands still come from its own range)",
        "edits": [{
            "file": "kernels/gemm/split_k.cuh",
            "find": "Base::consume_range(g, st, pipe, s.item, s.k_begin + k_begin, iters, c);",
            "replace": "Base::consume_range(g, st, pipe, s.item, k_begin, iters, c);",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaledSplitK"],
        # One partial round of tiles, so that every tile splits (the second split starts past block 0).
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 200x392x2064 --impl weave_block --split-k 2 --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_pipe_promotes_block_in_flight",
        "what": "pipelined block-scaled 128x128: after issuing block k into the second temporary, the consumer "
                "promotes that temporary (still being written by the tensor core) instead of block k - 1's",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "step(g, st, pipe, st.part1, st.part0, prev, prev_index, k_begin + it, c);",
            "replace": "step(g, st, pipe, st.part1, st.part1, prev, prev_index, k_begin + it, c);",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaledRaggedShapes"],
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 300x392x1040,1024x1024x1024 --impl weave_block --block-tile 128 "
                                 "--target-ms 2"}],
    },
    {
        "name": "gemm_fp8_block_scale_a_wrong_row",
        "what": "block-scaled fp8: the lower 8 rows of each 16-row group take the upper rows' A scales",
        "edits": [{
            "file": "kernels/gemm_fp8/gemm_fp8_kernel.cuh",
            "find": "const int r1 = r0 + 8;",
            "replace": "const int r1 = r0;",
        }],
        "tests": ["test_gemm_fp8_gpu:GemmFp8.BlockScaled*"],
        "bench": [
            {"ranks": 1, "args": "gemm_fp8 --shapes 1024x1024x1024,300x392x1040 --impl weave_block --target-ms 2"}],
    },
    {
        "name": "gemm_fp8_quantize_qt_last_partial_row_block_dropped",
        "what": "fp8 quantiser: the transposed copy's stores skip every tile whose 128 source rows are cut short "
                "(rows % 128 != 0), so Qt's last rows % 128 columns (X's last rows) are never written; Q is right",
        "edits": [{
            "file": "kernels/gemm_fp8/quantize.cu",
            "find": "if (c0 + d < p.cols && r0 + 16 * x < p.rows) {",
            "replace": "if (c0 + d < p.cols && r0 + kTile <= p.rows) {",
        }],
        "tests": ["test_quantize_gpu:Quantize.PerTensor:Quantize.BlockScales"],
        "bench": [{"ranks": 1, "args": "quantize --shapes 4000x4096 --modes tensor,1x128 --transpose 1 --target-ms 2"}],
    },
    # ---- MoE (kernels/moe) -------------------------------------------------------------------------
    {
        "name": "grouped_gemm_cut_tile_writes_all_rows",
        "what": "grouped GEMM: an expert's cut last tile is stored whole (128 rows), over the next expert's rows "
                "and past sum(counts)",
        "edits": [{
            "file": "kernels/moe/grouped_gemm_kernel.cuh",
            "find": "      if (r0 == 0 && r1 == BM) {",
            "replace": "      if (r0 == 0) {",
        }],
        "tests": ["test_grouped_gemm_gpu"],
        "bench": [{"ranks": 1, "args": "moe --models qwen --tokens 4096 --proj down --routing dirichlet --no-dense"}],
    },
    {
        "name": "grouped_gemm_last_row_dropped",
        "what": "grouped GEMM: the last row of an expert whose count is not a multiple of 8 is never stored",
        "edits": [{
            "file": "kernels/moe/grouped_gemm_kernel.cuh",
            "find": "      for (int r = whole > r0 ? whole : r0; r < r1; ++r) {",
            "replace": "      for (int r = whole > r0 ? whole : r0; r + 1 < r1; ++r) {",
        }],
        "tests": ["test_grouped_gemm_gpu"],
        # The routing of grouped_gemm_cut_tile_writes_all_rows' row (routing seed 1): 54 of the 64
        # experts' counts are not multiples of 8, and expert 1 has 8 rows.
        "bench": [
            {"ranks": 1, "args": "moe --models qwen --tokens 4096 --proj down --routing dirichlet --no-dense"}],
    },
    {
        "name": "grouped_gemm_expert1_reads_expert0_weight",
        "what": "grouped GEMM (W as N x K): expert 1's tiles multiply by expert 0's weight",
        "edits": [{
            "file": "kernels/moe/grouped_gemm_kernel.cuh",
            "find": "      tile::tma::load_3d(s.b, &g.b, &full, k0, t.n * BN, t.expert);",
            "replace": "      tile::tma::load_3d(s.b, &g.b, &full, k0, t.n * BN, t.expert == 1 ? 0 : t.expert);",
        }],
        "tests": ["test_grouped_gemm_gpu"],
        "bench": [
            {"ranks": 1, "args": "moe --models qwen --tokens 4096 --proj down --routing dirichlet --no-dense"}],
    },
    {
        "name": "moe_layer_splits_by_default",
        "what": "MoE layer: the non-fused layer's grouped GEMMs take the grouped GEMM's default split (0, the "
                "model), so they stop rounding as the fused layer's never-split kernels do",
        "edits": [{
            "file": "kernels/moe/layer.cu",
            "find": "  if (o.split_k == 0) o.split_k = 1;",
            "replace": "  if (o.split_k == 0) o.split_k = 0;",
        }],
        # WiderRows' up projection (K = H = 1024: 16 K steps, a few dozen tiles) is one the model
        # splits; the fused output must then differ from the non-fused one in some bits.
        "tests": ["test_moe_layer_gpu"],
    },
    {
        "name": "moe_combine_slot1_dropped_first_chunk",
        "what": "combine: slot 1's expert output is left out of the first 8 columns of every token's sum "
                "(the sum moe_combine and gemm_combine share)",
        "edits": [{
            "file": "kernels/moe/combine_sum.cuh",
            "find": "      const float w = wt[j0 + q];",
            "replace": "      const float w = (j0 + q == 1 && v == 0) ? 0.f : wt[j0 + q];",
        }],
        "tests": ["test_moe_exchange_gpu", "test_gemm_combine_gpu"],
        # Every token's sum is wrong, so the rows' sampled tokens see it.
        "bench": [
            {"ranks": 2, "args": "moe --kernels combine --models qwen --tokens 1024 --routing balanced --target-ms 5"}],
    },
    {
        "name": "gemm_combine_push_skips_last_row",
        "what": "gemm_combine: each aux warp pushes one row of a tile fewer (a tile's last rows never land)",
        "edits": [{
            "file": "kernels/moe/gemm_combine_kernel.cuh",
            "find": "    for (int i = 0; i < n; ++i) {  // i is warp-uniform",
            "replace": "    for (int i = 0; i < n - 1; ++i) {  // i is warp-uniform",
        }],
        "tests": ["test_gemm_combine_gpu"],
    },
    {
        "name": "gemm_combine_push_previous_slot",
        "what": "gemm_combine: a row lands in its token's previous slot (slot j - 1, wrapping)",
        "edits": [{
            "file": "kernels/moe/gemm_combine_schedule.hpp",
            "find": "  return static_cast<long long>(m.token) * k + m.slot;",
            "replace": "  return static_cast<long long>(m.token) * k + (m.slot + k - 1) % k;",
        }],
        "tests": ["test_moe_gemm_combine_cpu", "test_gemm_combine_gpu"],
        "bench": [
            {"ranks": 2, "args": "moe --kernels layer_fused --models qwen --tokens 1024 --routing balanced --target-ms 5"}],
    },
    # ---- the swapped decode tile (kernels/gemm/swapped_*) ------------------------------------------
    {
        "name": "gemm_swapped_partial_last_chunk_dropped",
        "what": "swapped decode tile: the bounds-checked tail loop stops at the whole chunks, so a last partial "
                "256-byte chunk of K is never multiplied (ragged K only; bf16 and fp8)",
        "edits": [{
            "file": "kernels/gemm/swapped_kernel.cuh",
            "find": "  for (; ch < n_chunks; ch += kWarps) step(std::integral_constant<int, 1>{}, std::true_type{}, ch);",
            "replace": "  for (; ch < n_full; ch += kWarps) step(std::integral_constant<int, 1>{}, std::true_type{}, ch);",
        }],
        "tests": ["test_gemm_gpu:Gemm.SwappedTile", "test_gemm_fp8_gpu:GemmFp8.SwappedDecode"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 1x4104x4104,16x392x8200 --tile swapped --target-ms 2"}],
    },
    {
        "name": "gemm_swapped_second_strip_rows_swapped",
        "what": "swapped decode tile, two strips per block (9-16 tokens, mid-range N): the second strip's rows g and "
                "g + 8 trade places in the partial sums",
        "edits": [{
            "file": "kernels/gemm/swapped_kernel.cuh",
            "find": "        red[warp][8 * b + 2 * c + (e & 1)][st * kRows + g + 8 * (e >> 1)] = acc[st][b][e];",
            "replace": "        red[warp][8 * b + 2 * c + (e & 1)][st * kRows + g + 8 * ((e >> 1) ^ st)] = acc[st][b][e];",
        }],
        "tests": ["test_gemm_gpu:Gemm.SwappedTile", "test_gemm_fp8_gpu:GemmFp8.SwappedDecode"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 16x11008x4096 --tile swapped --target-ms 2"}],
    },
    {
        "name": "gemm_swapped_last_token_reads_previous",
        "what": "swapped decode tile: the last token's row reads the token before it (an off-by-one in the clamp "
                "that lets tokens past M read valid memory); only C's last row is wrong",
        "edits": [{
            "file": "kernels/gemm/swapped_kernel.cuh",
            "find": "(8 * b + g < p.M ? 8 * b + g : p.M - 1) * K;",
            "replace": "(8 * b + g < p.M - 1 ? 8 * b + g : (p.M > 1 ? p.M - 2 : 0)) * K;",
        }],
        "tests": ["test_gemm_gpu:Gemm.SwappedTile", "test_gemm_fp8_gpu:GemmFp8.SwappedDecode"],
        "bench": [{"ranks": 1, "args": "gemm --shapes 16x4096x4096 --tile swapped --target-ms 2"}],
    },
    # ---- the call path (src/runtime/communicator.cpp) --------------------------------------------
    {
        "name": "agree_call_leaves_first_call_early",
        "what": "agree_call: a rank leaves a plan's first call without waiting for its peers to read its post, so a "
                "burst of agreed calls can lap a slower peer's mailbox ring (a race: it bites when a rank runs "
                "a ring of calls ahead right after a first call)",
        "edits": [{
            "file": "src/runtime/call_mail.cpp",
            "find": "    if (r != me && waited &&",
            "replace": "    if (false && r != me && waited &&",
        }],
        "tests": ["test_call_mail_cpu", "test_moe_layer_gpu:MoeLayer.BackToBack*"],
        "repeat": 3,
    },
    {
        "name": "device_copy_first_tail_byte_skipped",
        "what": "runtime::device_copy: the first byte after the 16-byte vectors is never copied (copies whose "
                "length leaves a tail: the staging copies of the Python operators, ag_gemm v9's own rows)",
        "edits": [{
            "file": "include/weave/runtime/copy_split.hpp",
            "find": "for (size_t i = c.tail + t; i < bytes; i += stride)",
            "replace": "for (size_t i = c.tail + t + (t == 0 ? stride : 0); i < bytes; i += stride)",
        }],
        "tests": ["test_copy_split_cpu", "test_device_copy_gpu"],
    },
    # ---- the network path's hierarchical collectives (kernels/net_collectives) -------------------
    {
        "name": "net_hier_reduce_scatter_tail_not_collected",
        "what": "G > 1 reduce_scatter: the node's sum of the trailing partial 16-byte unit is never copied next to "
                "the last rank's shard, so its last bytes go out without the other ranks' partials (ragged sizes)",
        "edits": [{
            "file": "kernels/net_collectives/node_phase.hpp",
            "find": "      st.op = StageOp::copy, st.size = l == t.gpus - 1 ? tl.size : 0;",
            "replace": "      st.op = StageOp::copy, st.size = 0;",
        }],
        "tests": ["test_net_collectives_layout", "test_net_gpu_hier"],
    },
    {
        "name": "net_hier_all_gather_last_node_block_skipped",
        "what": "G > 1 all_gather: the NVLink all-gather of the last node's block is skipped, so each rank keeps only "
                "the shard of that node it received over the network",
        "edits": [{
            "file": "kernels/net_collectives/node_phase.hpp",
            "find": "    if (i < N) return ag_rows(node_block(L, i), t.gpus, l);",
            "replace": "    if (i < N - 1) return ag_rows(node_block(L, i), t.gpus, l);\n    if (i == N - 1) return {StageOp::copy, {0, 0}, tl, {Where::buffer, 0}, {Where::buffer, 0}, 0};",
        }],
        "tests": ["test_net_collectives_layout", "test_net_gpu_hier"],
    },
    # ---- the fused dispatch_gemm and the low-latency mode (kernels/moe) ---------------------------
    {
        "name": "dispatch_gemm_loader_skips_readiness",
        "what": "dispatch_gemm: the loader starts an expert's tiles without waiting until its rows have arrived "
                "and been copied (reads rows still being written: poison or the previous call's)",
        "edits": [{
            "file": "kernels/moe/dispatch_gemm_kernel.cuh",
            "find": "    if (it == 0 && t.expert > ready_upto()) {",
            "replace": "    if (false && it == 0 && t.expert > ready_upto()) {",
        }],
        "tests": ["test_dispatch_gemm_gpu", "test_moe_layer_gpu"],
    },
    {
        "name": "dispatch_gemm_last_expert_not_duplicated",
        "what": "dispatch_gemm: the duplicated rows of the last local expert are never copied from their primary rows "
                "(tokens with several experts on a rank, in the last expert only)",
        "edits": [{
            "file": "kernels/moe/dispatch_gemm_kernel.cuh",
            "find": "    if (!failed) copy_duplicates(g, l, warp, warps, lane);",
            "replace": "    if (!failed && l != g.experts - 1) copy_duplicates(g, l, warp, warps, lane);",
        }],
        "tests": ["test_dispatch_gemm_gpu", "test_moe_layer_gpu"],
    },
    {
        "name": "moe_primary_is_first_slot",
        "what": "the token's primary slot on a rank is its first slot there, not its smallest expert: a row's data "
                "can sit in a later expert than the row (the fused dispatch_gemm's readiness no longer holds)",
        "edits": [{
            "file": "kernels/moe/layout.hpp",
            "find": "    if (g.rank_of(idx_row[j]) == r && (idx_row[j] < idx_row[best] || (idx_row[j] == idx_row[best] && j < best)))\n"
                    "      best = j;",
            "replace": "    if (g.rank_of(idx_row[j]) == r && j < best) best = j;",
        }],
        "tests": ["test_moe_dispatch_gemm_cpu"],
    },
    {
        "name": "ll_dispatch_token_skips_last_remote_rank",
        "what": "low-latency dispatch: a token goes to every remote rank holding its experts but the last one (with two "
                "ranks: never to the peer)",
        "edits": [{
            "file": "kernels/moe/low_latency_kernels.cuh",
            "find": "sh.dst, sh.ndst, nv,",
            "replace": "sh.dst, sh.ndst - 1, nv,",
        }],
        "tests": ["test_moe_low_latency_gpu"],
        "bench": [
            {"ranks": 2, "args": "moe --kernels ll --models deepseek --tokens 128 --routing balanced --target-ms 5"}],
    },
    # ---- inter-node fused kernels (kernels/net_tp, kernels/net_ring_attention) --------------------
    {
        "name": "net_ag_unit_counted_not_copied",
        "what": "inter-node AG+GEMM: the receive blocks count unit 1 of step 0 in without copying it into the gathered "
                "A (the loader's wait passes; those rows of C and of the gathered A are wrong)",
        "edits": [{
            "file": "kernels/net_tp/net_ag_gemm_kernel.cuh",
            "find": "        take_unit(g, s, q, b0, b1, threadIdx.x, blockDim.x);",
            "replace": "        if (s != 0 || u != 1)\n"
                       "        take_unit(g, s, q, b0, b1, threadIdx.x, blockDim.x);",
        }],
        "tests": ["test_net_tp_gpu:NetTpGpu.AgGemm*"],
    },
    {
        "name": "net_ag_adaptive_unit_counted_not_copied",
        "what": "inter-node AG+GEMM, adaptive split: a receive task counts unit 1 of step 0 in without copying it into "
                "the gathered A (the tile claim passes; those rows of C and of the gathered A are wrong)",
        "edits": [{
            "file": "kernels/net_tp/net_ag_adaptive_kernel.cuh",
            "find": "    else take_unit(g, task.s, task.peer, b0, b1, t, n);",
            "replace": "    else if (task.s != 0 || task.u != 1) take_unit(g, task.s, task.peer, b0, b1, t, n);",
        }],
        "tests": ["test_net_tp_gpu:NetTpGpu.AdaptiveAgGemm*"],
    },
    {
        "name": "net_coll_fused_node_sum_skips_last_local_rank",
        "what": "fused hierarchical collectives (G > 1): the node's sum leaves out the last local rank's 16-byte groups "
                "(all_reduce and reduce_scatter outputs miss that rank's contribution)",
        "edits": [{
            "file": "kernels/net_collectives/net_coll_fused_kernel.cuh",
            "find": "    for (int d = 1; d < G; ++d) {\n      Vec<T>::load(__ldcg(",
            "replace": "    for (int d = 1; d < G - 1; ++d) {\n      Vec<T>::load(__ldcg(",
        }],
        "tests": ["test_net_gpu_hier:*/fused"],
    },
    {
        "name": "net_coll_fused_own_piece_waits_for_wrong_partial",
        "what": "fused hierarchical reduce_scatter: the receive of an own-shard piece waits for the node's partial of "
                "the previous step's item instead of its own (it may add the own partial before the node summed it)",
        "edits": [{
            "file": "kernels/net_collectives/net_coll_fused_schedule.hpp",
            "find": "  for (int s = 0; s < L.plan.topo.nodes - 1; ++s) j += rs_item_pieces(L, r, s);",
            "replace": "  for (int s = 0; s < L.plan.topo.nodes - 2; ++s) j += rs_item_pieces(L, r, s);",
        }],
        "tests": ["test_net_collectives_layout:NetCollectivesLayout.Fused*", "test_net_gpu_hier:*/fused"],
    },
    {
        "name": "net_ag_adaptive_receives_before_sends",
        "what": "inter-node AG+GEMM's adaptive task list: the receives before the sends (every rank's first "
                "communication task waits for a peer's send that the peer hands out only after its own receives)",
        "edits": [{
            "file": "kernels/net_tp/layout.hpp",
            "find": "  if (k < units(a, r)) return {AgCommKind::Send, 0, static_cast<int>(k), r};\n"
                    "  const StepUnit x = step_unit(a, r, true, k - units(a, r));",
            "replace": "  const long long nr = step_units(a, r, true);\n"
                       "  if (k >= nr) return {AgCommKind::Send, 0, static_cast<int>(k - nr), r};\n"
                       "  const StepUnit x = step_unit(a, r, true, k);",
        }],
        "tests": ["test_net_tp_layout:NetTpLayout.AdaptiveAg*", "test_net_ag_adaptive_model_cpu"],
    },
    {
        "name": "net_rs_first_unit_misses_last_peer",
        "what": "inter-node GEMM+RS/AR, fixed and adaptive split (one reduce_unit since 2026-12-06): each rank's first "
                "unit sums its own partial and all peers' but the last step's (at 2 nodes: the peer's partial of the "
                "first rows is missing)",
        "edits": [{
            "file": "kernels/net_tp/net_gemm_rs_kernel.cuh",
            "find": "      for (int s = 0; s < steps(U); ++s)\n        add_bf16x8(acc, ld_volatile_v4(",
            "replace": "      for (int s = 0; s < steps(U) - (b0 == 0 ? 1 : 0); ++s)\n        add_bf16x8(acc, ld_volatile_v4(",
        }],
        "tests": ["test_net_tp_gpu:NetTpGpu.GemmRs*:NetTpGpu.GemmAr*:NetTpGpu.Adaptive*"],
    },
    {
        "name": "net_ar_gather_into_own_rows",
        "what": "inter-node GEMM+AR: the peers' reduced units land in this rank's own rows instead of their owner's "
                "(the output's peer rows stay unwritten, the own rows are overwritten)",
        "edits": [{
            "file": "kernels/net_tp/net_gemm_rs_kernel.cuh",
            "find": "    const long long off = shard_byte(U, q) + b0;",
            "replace": "    const long long off = shard_byte(U, g.rank) + b0;",
        }],
        "tests": ["test_net_tp_gpu:NetTpGpu.GemmAr*"],
    },
    {
        "name": "net_adaptive_reductions_handed_out_before_sends",
        "what": "the adaptive split's task list puts the own shard's reductions before the sends: every rank's "
                "reduction then waits for a peer's send that the peer hands out only after its own reductions",
        "edits": [{
            "file": "kernels/net_tp/layout.hpp",
            "find": "  const long long sends = step_units(a, r, false);\n  if (k < sends) {",
            "replace": "  const long long sends = step_units(a, r, false);\n"
                       "  if (k < sends + units(a, r)) k = k < units(a, r) ? sends + k : k - units(a, r);\n"
                       "  if (k < sends) {",
        }],
        "tests": ["test_net_tp_layout:NetTpLayout.Adaptive*"],
    },
    {
        "name": "net_ring_first_slice_v_not_copied",
        "what": "inter-node ring attention: the V rows of batch 0's first slice from each peer are counted in but never "
                "copied into the gathered V (those keys' values are garbage)",
        "edits": [{
            "file": "kernels/net_ring_attention/net_ring_kernel.cuh",
            "find": "        block_copy_in(g.gv + dst, src_v, static_cast<uint64_t>(x.bytes));",
            "replace": "        if (x.b != 0 || x.slice != 0) block_copy_in(g.gv + dst, src_v, static_cast<uint64_t>(x.bytes));",
        }],
        "tests": ["test_net_ring_gpu"],
    },
    {
        "name": "net_hier_forward_skips_last_node_rank",
        "what": "hierarchical AG+GEMM (G > 1): the receive blocks copy a rail peer's unit into every gathered A of the "
                "node but the last node rank's (its loader is still signalled: those rows of its C are wrong)",
        "edits": [{
            "file": "kernels/net_tp/net_ag_gemm_hier_kernel.cuh",
            "find": "        copy_to_node<true>(g.node_gathered, A.G, -1, shard_byte(A, q) + b0,",
            "replace": "        copy_to_node<true>(g.node_gathered, A.G - 1, -1, shard_byte(A, q) + b0,",
        }],
        "tests": ["test_net_tp_gpu_hier"],
    },
    {
        "name": "net_ring_hier_forward_skips_last_node_rank",
        "what": "hierarchical ring attention (G > 1): the receive blocks copy a rail peer's K rows into every gathered "
                "K of the node but the last node rank's (its producers are still signalled: those keys are garbage)",
        "edits": [{
            "file": "kernels/net_ring_attention/net_ring_kernel.cuh",
            "find": "        copy_to_node<true>(g.node_gk, R.G, -1, dst, src_k, x.bytes);",
            "replace": "        copy_to_node<true>(g.node_gk, R.G - 1, -1, dst, src_k, x.bytes);",
        }],
        "tests": ["test_net_ring_gpu_hier"],
    },
    {
        "name": "net_hier_rs_node_sum_skips_last_node_rank",
        "what": "hierarchical GEMM+RS/AR (G > 1): the collector's sum of its node's partials of a remote owner's "
                "rows leaves out the last node rank's partial (what crosses the network misses a rank's product)",
        "edits": [{
            "file": "kernels/net_tp/net_gemm_rs_kernel.cuh",
            "find": "      for (int d = 0; d < node_ranks(g); ++d)\n        add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(part(g, d) + off)",
            "replace": "      for (int d = 0; d < node_ranks(g) - 1; ++d)\n        add_bf16x8(acc, __ldcg(reinterpret_cast<const uint4*>(part(g, d) + off)",
        }],
        "tests": ["test_net_tp_gpu_hier"],
    },
    # ---- the network path's calls' mailbox (src/net/proxy.cpp, kernels/net_common/call.cpp) ----------
    {
        "name": "net_transport_domain_hint_trusted",
        "what": "net transport: the first entry of libfabric's list is used whatever domain was named "
                "(ofi_rxm over tcp ignores the hint): --domain lo runs on eth0",
        "edits": [{
            "file": "src/net/transport.cpp",
            "find": "  if (domain.empty()) return info;\n",
            "replace": "  if (!domain.empty() || domain.empty()) return info;\n",
        }],
        "tests": ["test_net_local:NetTransport.UsesTheNamedDomainOrRefuses"],
    },
    {
        "name": "net_call_watchdog_off",
        "what": "the proxies never compare call posts: agreed keys that differ between ranks both launch and "
                "wait for each other until the wait timeout",
        "edits": [{
            "file": "src/net/proxy.cpp",
            "find": "        work |= compare_posts();\n",
            "replace": "",
        }],
        "tests": ["test_net_path:NetPath.CallWatchdog"],
    },
    {
        "name": "net_agreed_call_waits_for_peers",
        "what": "every call on the network path waits for every peer's post, as a new key does (a host "
                "rendezvous per call in the steady state)",
        "edits": [{
            "file": "kernels/net_common/call.cpp",
            "find": "  bool join = !agreed.count(key) || debug || !problem.empty();",
            "replace": "  bool join = true;",
        }],
        "tests": ["test_net_path:NetPath.CallAgreement"],
    },
    {
        "name": "net_agreed_call_unwound_keeps_path",
        "what": "a rank that fails between the agreement and its launch leaves the path as it is (the peer that "
                "launched waits for it until the wait timeout)",
        "edits": [{
            "file": "kernels/net_common/call.cpp",
            "find": "  if (std::uncaught_exceptions() <= exceptions_) return;",
            "replace": "  return;",
        }],
        "tests": ["test_net_path:NetPath.FailureAfterAgreementFailsThePath"],
    },
    {
        "name": "net_agreed_call_ignores_waiting_peer",
        "what": "an agreed key launches although a peer's post of the call waits for a joint verdict (the peer "
                "then rejects alone and fails the path)",
        "edits": [{
            "file": "kernels/net_common/call.cpp",
            "find": "    join = p.together != 0;",
            "replace": "    join = false;",
        }],
        "tests": ["test_net_path:NetPath.AgreedKeyJoinsAPeerWaitingForAVerdict"],
    },
    {
        "name": "bootstrap_send_wait_ignores_interrupt",
        "what": "bootstrap: a send that waits for room in a peer's socket never polls the interrupt (a rank sending "
                "more than the socket holds to a live peer that will not come waits until that peer exits)",
        "edits": [{
            "file": "src/runtime/bootstrap_star.hpp",
            "find": "        if (r == 0) waiting();",
            "replace": "        (void)r;",
        }],
        "tests": ["test_bootstrap:Bootstrap.InterruptEndsASendToAPeerThatIsNotReading"],
    },
    {
        "name": "call_mail_no_skew_bound",
        "what": "single-node agree_call: a rank reuses its post slot without first comparing the peers' posts of "
                "that slot's call (a rank a ring ahead overwrites posts nobody compared)",
        "edits": [{
            "file": "src/runtime/call_mail.cpp",
            "find": "  if (n <= static_cast<unsigned long long>(kCallRing) || world_ == 1) return;",
            "replace": "  return;",
        }],
        "tests": ["test_call_mail_cpu:CallMail.DifferingAgreedPlansEndOnEveryRank"],
    },
    {
        "name": "call_mail_reader_takes_the_claim",
        "what": "single-node agree_call: a host reader of its abort word takes a peer's claim (-1, the reason still "
                "being copied) as the answer: a rejected call is reported with rank -2 and an empty reason, or not at "
                "all (a busy host preempts the writer mid-copy)",
        "edits": [{
            "file": "src/runtime/call_mail.cpp",
            "find": "  while (from < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {",
            "replace": "  while (false) {",
        }],
        "tests": ["test_call_mail_cpu:CallMail.ReaderWaitsForAClaimedAbortWord"],
    },
    {
        "name": "call_mail_buffers_not_compared",
        "what": "single-node agree_call: the call's own comparison of the places of the buffers peers reach is off "
                "(the watchdog's remains): a plan's first call with a symmetric buffer on one rank and another one "
                "elsewhere runs, reading the wrong memory",
        "edits": [{
            "file": "src/runtime/call_mail.cpp",
            "find": "  auto same_plan = [&](const Posted& p) { return same_key(p) && p.values[key.size()] == digest; };",
            "replace": "  auto same_plan = [&](const Posted& p) { return same_key(p); };",
        }],
        "tests": ["test_call_mail_cpu:CallMail.BuffersComparedEveryCall",
                  "test_collectives:Collectives.RejectsBuffersAtDifferentPlaces"],
    },
    {
        "name": "collectives_peer_buffers_not_given",
        "what": "collectives: a call's agreement gets no places of the buffers peers reach (ranks passing them at "
                "different places read and write the wrong memory)",
        "edits": [{
            "file": "kernels/collectives/collectives.cu",
            "find": "    comm.agree_call(std::string(\"collectives.\") + kind, \"dtype, op, shape, dim, algorithm\", a, problem, s, peer_buffers);",
            "replace": "    comm.agree_call(std::string(\"collectives.\") + kind, \"dtype, op, shape, dim, algorithm\", a, problem, s);",
        }],
        "tests": ["test_collectives:Collectives.RejectsBuffersAtDifferentPlaces"],
    },
    {
        "name": "collectives_reached_shard_side_swapped",
        "what": "collectives: the agreement compares the places of the wrong side of an all_gather / reduce_scatter "
                "(the input of a gather, the output of a scatter), so ranks passing the reached side at different "
                "places run, and an in-place call, whose other side is at a rank-dependent place, is refused",
        "edits": [{
            "file": "kernels/collectives/collectives.hpp",
            "find": "  return local_buffers(a) ? Reached{} : Reached{!gather, gather};",
            "replace": "  return local_buffers(a) ? Reached{} : Reached{gather, !gather};",
        }],
        "tests": ["test_collectives_schedule:Schedule.ReachedBuffersAreThoseThePlansReachOnPeers",
                  "test_collectives:Collectives.RejectsBuffersAtDifferentPlaces"],
    },
    # ---- CUDA-graph capture: counts read on the device (include/weave/runtime/running_counts.hpp) -----
    {
        "name": "running_counts_stay_on_host_under_capture",
        "what": "a launch captured into a CUDA graph keeps the host's round and expected totals (every replay "
                "waits for the captured call's counts, which earlier calls already met)",
        "edits": [{
            "file": "src/runtime/running_counts.cu",
            "find": "  if (capturing) device_ = true;\n  else host_ = floor;",
            "replace": "  if (!capturing) host_ = floor;",
        }],
        "tests": ["test_moe_layer_gpu:MoeLayer.CapturedReplays", "test_tp_gpu:TpGpu.GraphCaptureAndReplay",
                  "test_sp_gpu:SpGpu.GraphCaptureAndReplay"],
    },
    {
        "name": "moe_dispatch_round_fixed_at_capture",
        "what": "moe dispatch: the count exchange takes the round fixed when the call was enqueued (a replay "
                "reads the count matrix half and waits for the rows of the captured call)",
        "edits": [{
            "file": "kernels/moe/exchange.cu",
            "find": "  a.round = tot[Impl::kRound];",
            "replace": "  a.round = Round{tot[Impl::kRound].host, nullptr};",
        }],
        "tests": ["test_moe_exchange_gpu:MoeExchange.CapturedReplays"],
    },
    {
        "name": "moe_gemm_combine_total_fixed_at_capture",
        "what": "gemm_combine: the final sum waits for the landed-signal total fixed when the call was enqueued "
                "(a replay sums its landing rows before the peers' rows land)",
        "edits": [{
            "file": "kernels/moe/gemm_combine.cu",
            "find": "  a.expected = expected;",
            "replace": "  a.expected = Round{expected.host, nullptr};",
        }],
        "tests": ["test_moe_layer_gpu:MoeLayer.CapturedReplays"],
    },
    # ---- the adaptive SM split (kernels/tp_common/sm_ledger.cuh, include/weave/lcsc.cuh) -------------
    {
        "name": "sm_ledger_claim_before_input_in_place",
        "what": "the adaptive split claims a reduction as soon as its input has begun to arrive, not once it is in "
                "place (the rule the simulation kept; the claim then waits)",
        "edits": [{
            "file": "kernels/tp_common/sm_ledger.cuh",
            "find": "    if (k < p.comm_tasks && !in_place(k)) {",
            "replace": "    if (false) {",
        }],
        "tests": ["test_sm_ledger_cpu"],
    },
    {
        "name": "sm_ledger_compute_claimed_before_rows_in_place",
        "what": "ag_gemm v10: the adaptive split claims a tile by fetch-and-add in order, whether or not its peer "
                "rows have arrived (the claim then waits inside the task: every block of two ranks can sit on a "
                "peer's tile while its own pushes are unclaimed)",
        "edits": [{
            "file": "kernels/tp_common/sm_ledger.cuh",
            "find": "      if constexpr (kComputeInput) {\n        const long long i = v.compute_claimed;",
            "replace": "      if constexpr (false) {\n        const long long i = v.compute_claimed;",
        }],
        "tests": ["test_sm_ledger_cpu"],
    },
    {
        "name": "sm_split_comm_cap_at_target_when_compute_stalls",
        "what": "ag_gemm v10: while the next tile's rows are not in place the communication role is still capped at "
                "eq. 2's target, so blocks with nothing to compute poll instead of pushing the units the peers wait for",
        "edits": [{
            "file": "kernels/tp_common/sm_split.hpp",
            "find": "  return v.compute_next_ready ? target_comm_blocks(v) : v.blocks;",
            "replace": "  return target_comm_blocks(v);",
        }],
        "tests": ["test_sm_ledger_cpu", "test_sm_split_cpu"],
    },
    {
        "name": "lcsc_dynamic_loader_does_not_wait_for_other_task",
        "what": "dynamic tasks: the loader chooses its next task without waiting for the end of an other task "
                "(a work item it then claims can be queued behind the other task that waits for it)",
        "edits": [{
            "file": "include/weave/lcsc.cuh",
            "find": "    else r.empty[ts.index].wait(ts.phase);  // the consumers finished it (see HasDynamicTasks)",
            "replace": "    else {}",
        }],
        "tests": ["test_lcsc_gpu:Lcsc.DynamicTasks"],
        # gemm_rs's adaptive split (v6) runs lcsc.cuh's dynamic tasks (as gemm_ar v2 and the inter-node split do).
        "bench": [
            {"ranks": 2, "args": "tp --sizes 2048 --kernels gemm_rs --variant 6 --num-comm-sms 0"}],
    },
]
