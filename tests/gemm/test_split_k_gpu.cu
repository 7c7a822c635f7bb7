// Split-K GEMM (kernels/gemm/split_k.cuh) against the independent float32 reference (cuBLASLt,
// check/gemm_ref.hpp) element by element, per tile, on fresh random inputs with the output
// poisoned before every call. The split count is forced, and the worker count cut down
// (lcsc.max_compute_blocks) so that the last partial round has many items, split many ways;
// back-to-back calls with new inputs on one stream check that the counters start every
// launch at zero and that no call reads another call's partials. The bound is the plain GEMM's
// (test_gemm_gpu.cu says why one missing K step of 64 fails it): a lost or doubled partial moves
// an element by the order of s itself.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "check/device_buffer.hpp"
#include "check/gemm_ref.hpp"
#include "check/seed.hpp"
#include "check/tile_check.hpp"
#include "gemm/gemm.hpp"
#include "gemm/plan.hpp"
#include "check/gemm_baseline.cuh"

using namespace weave;
using bf16 = __nv_bfloat16;

namespace {

template <class T>
using DevBuf = check::DeviceBuffer<T>;

using check::case_seed;

using check::gemm_ref;

struct SkCase {
  int M, N, K;
  gemm::BLayout bl;
  gemm::Tile tile;
  int workers;  // max_compute_blocks; 0 = the whole device
  bool accumulate;
  int splits;
};

std::string name_of(const SkCase& r) {
  return std::to_string(r.M) + "x" + std::to_string(r.N) + "x" + std::to_string(r.K) +
         (r.bl == gemm::BLayout::KN ? " KN " : " NK ") + gemm::tile_name(r.tile) + " blocks " +
         std::to_string(r.workers) + " splits " + std::to_string(r.splits) + (r.accumulate ? " C+=" : "");
}

gemm::Options options_of(const SkCase& r) {
  gemm::Options o;
  o.tile = r.tile;
  o.split_k = r.splits;
  o.accumulate = r.accumulate;
  o.lcsc.max_compute_blocks = r.workers;
  return o;
}

// `calls` back-to-back calls on one stream, each with its own inputs and its own poisoned output,
// all launched before any is checked.
void run_calls(const SkCase& r, int calls) {
  SCOPED_TRACE(name_of(r));
  const size_t nc = size_t(r.M) * r.N;
  std::vector<DevBuf<bf16>*> A, B, C, C0;
  std::vector<DevBuf<float>*> ref, s;
  for (int i = 0; i < calls; ++i) {
    A.push_back(new DevBuf<bf16>(size_t(r.M) * r.K));
    B.push_back(new DevBuf<bf16>(size_t(r.K) * r.N));
    C.push_back(new DevBuf<bf16>(nc));
    C0.push_back(new DevBuf<bf16>(r.accumulate ? nc : 0));
    ref.push_back(new DevBuf<float>(nc));
    s.push_back(new DevBuf<float>(nc));
    gemm::ref::fill_uniform(A[i]->p, A[i]->n, case_seed(1));
    gemm::ref::fill_uniform(B[i]->p, B[i]->n, case_seed(2));
    if (r.accumulate) {
      gemm::ref::fill_uniform(C[i]->p, nc, case_seed(3), 4.f);
      WEAVE_CUDA_CHECK(cudaMemcpy(C0[i]->p, C[i]->p, nc * 2, cudaMemcpyDeviceToDevice));
    } else {
      check::poison(C[i]->p, nc);
    }
    gemm_ref().run(A[i]->p, B[i]->p, r.M, r.N, r.K, r.bl, ref[i]->p, s[i]->p);
    check::sqrt_inplace(s[i]->p, nc);
    if (r.accumulate) {
      check::add_bf16(ref[i]->p, C0[i]->p, nc);
      check::add_abs_bf16(s[i]->p, C0[i]->p, 4.f, nc);  // the |C0| term of test_gemm_gpu.cu's bound
    }
  }
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  const gemm::Options o = options_of(r);
  for (int i = 0; i < calls; ++i) gemm::gemm(A[i]->p, B[i]->p, C[i]->p, r.M, r.N, r.K, r.bl, o, nullptr);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  check::Bound b = check::gemm_bound();
  if (r.accumulate) b.rel *= 2;
  for (int i = 0; i < calls; ++i) {
    const check::Report rep = check::compare({C[i]->p, r.N}, {ref[i]->p, r.N}, {s[i]->p, r.N}, r.M, r.N, b);
    std::printf("check split-K gemm %s call %d: %s\n", name_of(r).c_str(), i, rep.str().c_str());
    EXPECT_TRUE(rep.ok) << "call " << i << ": " << rep.str();
  }
  for (int i = 0; i < calls; ++i) delete A[i], delete B[i], delete C[i], delete C0[i], delete ref[i], delete s[i];
}

}  // namespace

// The whole device: decode-sized M, ragged M, N and K, both B layouts, both 128x256 tiles.
TEST(GemmSplitK, WholeDevice) {
  const gemm::BLayout layouts[] = {gemm::BLayout::NK, gemm::BLayout::KN};
  for (gemm::BLayout bl : layouts) {
    run_calls({1, 11008, 4096, bl, gemm::Tile::M128N256, 0, false, 3}, 2);
    run_calls({16, 4096, 14336, bl, gemm::Tile::M128N256, 0, false, 8}, 2);
    run_calls({77, 14344, 4104, bl, gemm::Tile::M128N256, 0, false, 2}, 2);
    run_calls({200, 4104, 11016, bl, gemm::Tile::M128N256, 0, false, 5}, 2);
    run_calls({1000, 13832, 5128, bl, gemm::Tile::M128N256C2, 0, false, 2}, 2);
    run_calls({2047, 5128, 13832, bl, gemm::Tile::M128N256C2, 0, false, 3}, 1);
    run_calls({1, 4096, 11008, bl, gemm::Tile::M64N128, 0, false, 4}, 2);
    run_calls({64, 5128, 13832, bl, gemm::Tile::M64N128, 0, false, 3}, 2);
    run_calls({33, 1000, 520, bl, gemm::Tile::M64N128, 5, false, 4}, 2);
  }
}

// Few workers: a long last partial round, split up to 16 ways (more splits than some items'
// iterations allow is clamped); an odd tile-row count for the cluster tile; one K iteration.
TEST(GemmSplitK, FewWorkersManySplits) {
  run_calls({300, 1000, 2056, gemm::BLayout::NK, gemm::Tile::M128N256, 7, false, 16}, 3);
  run_calls({129, 520, 8200, gemm::BLayout::KN, gemm::Tile::M128N256, 5, false, 7}, 3);
  run_calls({385, 776, 1032, gemm::BLayout::NK, gemm::Tile::M128N256C2, 6, false, 4}, 3);
  run_calls({64, 264, 64, gemm::BLayout::NK, gemm::Tile::M128N256, 3, false, 4}, 2);
}

// C += A*B: only the finishing split stores, once, with the reduce-add store.
TEST(GemmSplitK, Accumulate) {
  run_calls({333, 2056, 4104, gemm::BLayout::NK, gemm::Tile::M128N256, 9, true, 3}, 2);
  run_calls({16, 4096, 14336, gemm::BLayout::KN, gemm::Tile::M128N256, 0, true, 8}, 2);
  run_calls({385, 776, 1032, gemm::BLayout::KN, gemm::Tile::M128N256C2, 6, true, 2}, 2);
  run_calls({40, 2056, 4104, gemm::BLayout::NK, gemm::Tile::M64N128, 0, true, 5}, 2);
}

// The planner's own choices (split-K where it says so) on decode and ragged shapes.
TEST(GemmSplitK, AutoChoice) {
  const int shapes[][3] = {{1, 18432, 7168}, {64, 5120, 13824}, {16, 4096, 14336}, {256, 7168, 18432},
                           {3000, 7176, 18440}};
  for (auto& sh : shapes) {
    SkCase r{sh[0], sh[1], sh[2], gemm::BLayout::NK, gemm::Tile::Auto, 0, false, 0};
    SCOPED_TRACE(name_of(r));
    const size_t nc = size_t(r.M) * r.N;
    DevBuf<bf16> A(size_t(r.M) * r.K), B(size_t(r.K) * r.N), C(nc);
    DevBuf<float> ref(nc), s(nc);
    gemm::ref::fill_uniform(A.p, A.n, case_seed(1));
    gemm::ref::fill_uniform(B.p, B.n, case_seed(2));
    check::poison(C.p, nc);
    gemm_ref().run(A.p, B.p, r.M, r.N, r.K, r.bl, ref.p, s.p);
    check::sqrt_inplace(s.p, nc);
    gemm::gemm(A.p, B.p, C.p, r.M, r.N, r.K, r.bl, gemm::Options{}, nullptr);
    WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
    const check::Report rep = check::compare({C.p, r.N}, {ref.p, r.N}, {s.p, r.N}, r.M, r.N, check::gemm_bound());
    std::printf("check auto gemm %s: %s\n", name_of(r).c_str(), rep.str().c_str());
    EXPECT_TRUE(rep.ok) << rep.str();
  }
}

// A graph captured with a split launch keeps its workspace: eager launches on the capture stream
// that grow theirs afterwards (the old buffers freed, the new ones scribbled over) must not touch
// what the graph's replays write.
TEST(GemmSplitK, CapturedGraphKeepsItsWorkspace) {
  const SkCase small{200, 1000, 4104, gemm::BLayout::NK, gemm::Tile::M128N256, 3, false, 2};
  const SkCase big{2000, 8192, 4104, gemm::BLayout::NK, gemm::Tile::M128N256, 0, false, 4};
  cudaStream_t st;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t nc = size_t(small.M) * small.N, nb = size_t(big.M) * big.N;
  DevBuf<bf16> A(size_t(small.M) * small.K), B(size_t(small.K) * small.N), C(nc);
  DevBuf<bf16> A2(size_t(big.M) * big.K), B2(size_t(big.K) * big.N), C2(nb);
  DevBuf<float> ref(nc), s(nc);
  gemm::ref::fill_uniform(A.p, A.n, case_seed(1));
  gemm::ref::fill_uniform(B.p, B.n, case_seed(2));
  gemm::ref::fill_uniform(A2.p, A2.n, case_seed(3));
  gemm::ref::fill_uniform(B2.p, B2.n, case_seed(4));
  gemm_ref().run(A.p, B.p, small.M, small.N, small.K, small.bl, ref.p, s.p);
  check::sqrt_inplace(s.p, nc);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  // Eager first (the workspace exists before the capture), then the capture.
  gemm::gemm(A.p, B.p, C.p, small.M, small.N, small.K, small.bl, options_of(small), st);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  WEAVE_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  gemm::gemm(A.p, B.p, C.p, small.M, small.N, small.K, small.bl, options_of(small), st);
  WEAVE_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  WEAVE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int round = 0; round < 3; ++round) {
    // A larger split on the same stream grows the workspace, then scribbles over whatever it got.
    for (int i = 0; i < 2; ++i)
      gemm::gemm(A2.p, B2.p, C2.p, big.M, big.N, big.K, big.bl, options_of(big), st);
    check::poison(C.p, nc, st);
    WEAVE_CUDA_CHECK(cudaGraphLaunch(exec, st));
    WEAVE_CUDA_CHECK(cudaStreamSynchronize(st));
    const check::Report rep =
        check::compare({C.p, small.N}, {ref.p, small.N}, {s.p, small.N}, small.M, small.N, check::gemm_bound());
    std::printf("check replay %d after a growth: %s\n", round, rep.str().c_str());
    EXPECT_TRUE(rep.ok) << "replay " << round << ": " << rep.str();
  }
  WEAVE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  WEAVE_CUDA_CHECK(cudaGraphDestroy(graph));
  WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
}

// Graphs captured on one stream (torch's one capture stream, for one) replayed on two other streams
// at once, beside an eager split call on the capture stream itself: each capture's launches take
// buffers that its graph owns, so none of the three shares partials or counters with another.
// Sharing one workspace makes their last-round items count on each other's counters (tiles stored
// half-summed, or never). The eager call before the captures makes the capture stream's cached
// workspace large enough, so a capture that took the cache would use it. The graphs are destroyed
// and captured again (their buffers go back to a spare list and are taken again, their counters
// left zero by the completed launches), and they hold no node but the GEMM's kernel: the
// workspace costs a replay nothing.
TEST(GemmSplitK, GraphsOnOneCaptureStreamReplayAtOnce) {
  int dev = 0, sms = 0;
  WEAVE_CUDA_CHECK(cudaGetDevice(&dev));
  WEAVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int workers = sms / 4 > 0 ? sms / 4 : 1;  // three kernels resident at once, one block per SM each
  const SkCase c1{1000, 2000, 4104, gemm::BLayout::NK, gemm::Tile::M128N256, workers, false, 4};
  const SkCase c2{1100, 1800, 3000, gemm::BLayout::NK, gemm::Tile::M128N256, workers, false, 3};
  struct Problem {
    SkCase r;
    DevBuf<bf16> A, B, C;
    DevBuf<float> ref, s;
    Problem(const SkCase& c, uint64_t seed)
        : r(c), A(size_t(c.M) * c.K), B(size_t(c.K) * c.N), C(size_t(c.M) * c.N), ref(size_t(c.M) * c.N),
          s(size_t(c.M) * c.N) {
      gemm::ref::fill_uniform(A.p, A.n, case_seed(seed));
      gemm::ref::fill_uniform(B.p, B.n, case_seed(seed + 1));
      gemm_ref().run(A.p, B.p, r.M, r.N, r.K, r.bl, ref.p, s.p);
      check::sqrt_inplace(s.p, s.n);
    }
    void check_output(const char* what, int round) {
      const check::Report rep = check::compare({C.p, r.N}, {ref.p, r.N}, {s.p, r.N}, r.M, r.N, check::gemm_bound());
      std::printf("check %s round %d (%s): %s\n", what, round, name_of(r).c_str(), rep.str().c_str());
      EXPECT_TRUE(rep.ok) << what << " round " << round << ": " << rep.str();
    }
  };
  Problem p1(c1, 11), p2(c2, 13), p3(c1, 17);
  WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t cap, s1, s2;
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  WEAVE_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  gemm::gemm(p3.A.p, p3.B.p, p3.C.p, c1.M, c1.N, c1.K, c1.bl, options_of(c1), cap);  // the cache, sized
  Problem* captured[2] = {&p1, &p2};
  for (int generation = 0; generation < 2; ++generation) {
    cudaGraph_t graph[2];
    cudaGraphExec_t exec[2];
    for (int i = 0; i < 2; ++i) {
      Problem& p = *captured[i];
      WEAVE_CUDA_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal));
      gemm::gemm(p.A.p, p.B.p, p.C.p, p.r.M, p.r.N, p.r.K, p.r.bl, options_of(p.r), cap);
      WEAVE_CUDA_CHECK(cudaStreamEndCapture(cap, &graph[i]));
      size_t n = 0;
      WEAVE_CUDA_CHECK(cudaGraphGetNodes(graph[i], nullptr, &n));
      std::vector<cudaGraphNode_t> nodes(n);
      WEAVE_CUDA_CHECK(cudaGraphGetNodes(graph[i], nodes.data(), &n));
      int kernels = 0;
      for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType t;
        WEAVE_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
        kernels += t == cudaGraphNodeTypeKernel;
      }
      EXPECT_EQ(n, 1u) << "graph " << i << ": the GEMM's kernel and nothing else";
      EXPECT_EQ(kernels, 1) << "graph " << i;
      WEAVE_CUDA_CHECK(cudaGraphInstantiate(&exec[i], graph[i], 0));
    }
    for (int round = 0; round < 20; ++round) {
      check::poison(p1.C.p, p1.C.n, s1);
      check::poison(p2.C.p, p2.C.n, s2);
      check::poison(p3.C.p, p3.C.n, cap);
      WEAVE_CUDA_CHECK(cudaGraphLaunch(exec[0], s1));
      WEAVE_CUDA_CHECK(cudaGraphLaunch(exec[1], s2));
      gemm::gemm(p3.A.p, p3.B.p, p3.C.p, c1.M, c1.N, c1.K, c1.bl, options_of(c1), cap);
      WEAVE_CUDA_CHECK(cudaDeviceSynchronize());
      const int r = generation * 100 + round;
      p1.check_output("graph 1 on stream 1", r);
      p2.check_output("graph 2 on stream 2", r);
      p3.check_output("eager on the capture stream", r);
      if (::testing::Test::HasFailure()) break;
    }
    for (int i = 0; i < 2; ++i) {
      WEAVE_CUDA_CHECK(cudaGraphExecDestroy(exec[i]));
      WEAVE_CUDA_CHECK(cudaGraphDestroy(graph[i]));
    }
    if (::testing::Test::HasFailure()) break;
  }
  for (cudaStream_t st : {cap, s1, s2}) WEAVE_CUDA_CHECK(cudaStreamDestroy(st));
}
