// The adaptive compute / communication SM split (mKernel section 3.2): the blocks of a persistent
// kernel change role at task boundaries, toward a target number of communication blocks that
// equalises the predicted completion times of the two roles (the paper's eq. 2),
//   n_s = B * R_s C_s / (R_p C_p + R_s C_s),
// R the tasks left to each role, C their mean cost per task from the cycle counts the blocks
// accumulate (the launch's priors before the first). Pure __host__ __device__ functions of a
// snapshot of the shared ledger, so that a kernel and the CPU event simulation in
// tests/tp/test_sm_split_cpu.cu run the same policy; gemm_ar v2 and gemm_rs v6 run it over the
// ledger and claims of sm_ledger.cuh (per role the tasks claimed, done and their summed cycles,
// the blocks in the communication role; tp_common/README.md), and so does ag_gemm v10, whose
// compute consumes what the peers' communication produces (compute_next_ready below).
#pragma once

namespace weave::tp::sm_split {

enum class Role : int { Compute = 0, Comm = 1, Done = 2 };

// What a block reads at a task boundary.
struct View {
  int blocks = 0;       // B: the persistent grid
  int comm_blocks = 0;  // blocks in the communication role now (this one included if it is one)
  long long compute_tasks = 0, compute_claimed = 0, compute_done = 0;
  double compute_cycles = 0;  // summed over the done compute tasks
  long long comm_tasks = 0, comm_claimed = 0, comm_done = 0;
  double comm_cycles = 0;        // summed over the done communication tasks
  bool comm_next_ready = false;  // the next unclaimed communication task's input has begun to
                                 // arrive (its ready count is not zero)
  bool compute_next_ready = true;  // the next unclaimed compute task's input is in place: always
                                   // where the compute needs none (GEMM + RS / AR); AG + GEMM: a
                                   // peer's row tile, which that peer's communication pushes
  double compute_prior = 1.0;    // cycles per task before one is measured (the launch's model)
  double comm_prior = 1.0;
};

// Mean cycles per done task, or the prior before the first.
__host__ __device__ inline double mean_cost(double cycles, long long done, double prior) {
  return done > 0 ? cycles / static_cast<double>(done) : prior;
}

// The target number of communication blocks: eq. 2 on the tasks not yet done, rounded, at least
// one while communication work is left and at most B - 1 while compute work is left (someone must
// produce what the communication waits for; with B = 1 the compute keeps the block); all B once
// the compute is done.
__host__ __device__ inline int target_comm_blocks(const View& v) {
  const double rp = static_cast<double>(v.compute_tasks - v.compute_done);
  const double rs = static_cast<double>(v.comm_tasks - v.comm_done);
  if (rs <= 0) return 0;
  if (rp <= 0) return v.blocks;
  const double ps = rp * mean_cost(v.compute_cycles, v.compute_done, v.compute_prior);
  const double ss = rs * mean_cost(v.comm_cycles, v.comm_done, v.comm_prior);
  int n = static_cast<int>(v.blocks * ss / (ps + ss) + 0.5);
  if (n < 1) n = 1;
  if (n > v.blocks - 1) n = v.blocks - 1;
  return n;
}

// The most blocks the communication role may hold while compute tasks are unclaimed (sm_ledger.cuh's
// join_comm undoes a join past it): the target, or all B while the next compute task's input is
// not in place (the stalled compute role has nothing to run; never where the compute needs no
// input, so GEMM + RS / AR keep at most B - 1 blocks communicating while a tile is unclaimed).
__host__ __device__ inline int comm_cap(const View& v) {
  return v.compute_next_ready ? target_comm_blocks(v) : v.blocks;
}

// The role a block takes for its next task. Compute: claim the next compute task; Comm: the next
// communication task once its input is in place on every rank (waiting for it); Done: nothing left
// to claim. Once every compute task is claimed, every block communicates. Before, a compute block
// moves to communication only when the next task's input has begun to arrive and the
// communication role is below its target; a communication block goes back to
// compute when the role is above its target, or when the next task's input has not begun to
// arrive while compute work is left (the paper's stalled-work rule, in the direction GEMM +
// all-reduce needs: there the communication consumes what the compute produces). In the other
// direction (AG + GEMM: the compute consumes rows that the peers' communication pushes), a block
// whose next compute task's input is not in place communicates, whatever the target, when the
// next communication task can start: computing, it could only poll (comm_cap lets every block
// join then).
__host__ __device__ inline Role next_role(const View& v, Role current) {
  const bool compute_left = v.compute_claimed < v.compute_tasks;
  const bool comm_left = v.comm_claimed < v.comm_tasks;
  if (!compute_left && !comm_left) return Role::Done;
  if (!compute_left) return Role::Comm;
  if (!comm_left) return Role::Compute;
  if (!v.compute_next_ready && v.comm_next_ready) return Role::Comm;
  const int target = target_comm_blocks(v);
  if (current == Role::Comm) return v.comm_blocks > target || !v.comm_next_ready ? Role::Compute : Role::Comm;
  return v.comm_next_ready && v.comm_blocks < target ? Role::Comm : Role::Compute;
}

}  // namespace weave::tp::sm_split
