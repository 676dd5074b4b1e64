// The backward dispatcher's decisions for one call: how each GQA group's query heads and each
// sequence's keys are split (cpu::BwdLayout), the tasks (sequence, kv head, head split, key chunk)
// in the order they run, and the sizes of the workspace. A pure function of the arguments and of
// whether the kernel runs the products of bf16 calls on tiles: the splits depend on the shape only,
// never on the thread count, so the results are the same bits for any thread count.
#ifndef ANYATTN_PLAN_BWD_PLAN_H_
#define ANYATTN_PLAN_BWD_PLAN_H_

#include <cstdint>
#include <vector>

#include "common/bwd_args.h"
#include "plan/bwd_layout.h"

namespace anyattn::plan {

struct BwdPlan {
  cpu::BwdLayout layout;
  std::vector<cpu::BwdSeq> seqs;  // sequence b at index b, with its workspace rows
  int64_t total_rows = 0;         // workspace rows: query rows of every (sequence, query head)
  // The tasks, most expensive first (causal chunks differ in cost by up to the number of key
  // blocks). Those of a sequence with several chunks write their chunk's dq partial, those of a
  // call with several head splits their split's dK/dV partials: bind_partials points them at
  // these once the workspace exists.
  std::vector<cpu::BwdTask> tasks;
  int64_t delta_floats = 0;    // delta, one float per workspace row, rounded up to 16
  int64_t chunk_stride = 0;    // floats of one chunk's dq partials (total_rows * d_pad)
  int64_t partial_floats = 0;  // dq partials of every chunk; 0 with one chunk per sequence
  // Floats of one head split's dK/dV partials (total key rows * (d_pad + dv_pad)), and of all of
  // them (0 with one head split).
  int64_t head_split_stride = 0;
  int64_t dkv_partial_floats = 0;

  // The chunk of each task, in `tasks` order, or -1 for one that writes dq directly; its head
  // split, or -1 for one that writes dk and dv directly.
  std::vector<int64_t> task_chunks;
  std::vector<int64_t> task_head_splits;

  // Key chunks of sequence `s` (0 when it has no keys).
  int64_t chunks_of(const cpu::BwdSeq& s) const;
  // Sets the dq and dK/dV partials of every task that writes them; dq_partials holds
  // partial_floats floats, dkv_partials dkv_partial_floats.
  void bind_partials(float* dq_partials, float* dkv_partials);
};

// The plan of a validated backward call with at least one sequence and one query head, and head
// dims of at least 1, whose kernel packs `copies` of the operands (the path's bwd_copies).
BwdPlan make_bwd_plan(const cpu::BwdArgs& args, const cpu::BwdCopies& copies);

}  // namespace anyattn::plan

#endif  // ANYATTN_PLAN_BWD_PLAN_H_
