// The forward dispatcher's decisions for one call, or for the sequences of one path within a varlen
// call: how the work is partitioned, how much memory it takes. Pure function of the arguments,
// the shape and the thread count, except that the key split count depends
// on the shape only (never on threads), so results are the same bits for any thread count.
// ANYATTN_VERBOSE=1 prints the plan to stderr.
#ifndef ANYATTN_PLAN_FWD_PLAN_H_
#define ANYATTN_PLAN_FWD_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/fwd_args.h"
#include "plan/fwd_layout.h"

namespace anyattn::plan {

// How a sequence's query rows run, chosen by their count per kv head (group size x Sq):
//   kDirect     at most direct_rows (the kernel's FwdKernel::direct_rows; at most
//               kF16ReadDirectRows for a cache read through f16): one task per few kv heads reads
//               K and V rows in place;
//   kStreaming  at most kMaxQBlockRows: one task per kv head packs each block into its scratch;
//   kPacked     more: K and V are packed once per (sequence, kv head), shared by the tasks of
//               its query rows (packed_heads_per_task of the group's heads each, a q block of
//               their positions).
enum class FwdPath { kDirect, kStreaming, kPacked };
FwdPath fwd_path(const cpu::FwdArgs& args, int64_t seqlen_q, int64_t direct_rows);

// The sequences one plan covers: every sequence of a dense or KV-cache call (they share Sq), and
// the sequences of one FwdPath in a varlen call, whose decode steps and prefill chunks would
// otherwise all run the path of the longest. Lengths are the longest among those sequences.
struct PlanShape {
  int64_t sequences = 0;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
};

struct FwdPlan {
  const char* kernel_name = "";  // the kernel that runs the plan, for describe()
  int threads = 1;
  cpu::PackedLayout layout;
  // Streaming: all query rows of a kv head (group size x Sq) fit one task, so each K/V block is
  // used once; tasks pack blocks into their own scratch instead of a shared packed buffer.
  bool streaming = false;
  int64_t stream_heads_k = 0;  // kv heads per streaming task (their rows fit one task)
  // Streaming with at most direct_rows query rows per kv head: tasks read K and V rows in place
  // (FwdKernel::attend_direct) and need no packed panels.
  bool direct = false;
  int64_t q_block_rows = 0;    // query positions per AttendTask (x group size when streaming)
  int64_t num_splits = 1;      // key-range splits per q block, merged by LSE
  int64_t wanted_tasks = 0;    // attend tasks per packing group that keep every thread busy
  int64_t scratch_floats = 0;  // per thread

  // Packed panels in each thread's scratch: streaming tasks that pack need one per kv head.
  int64_t panel_heads_k() const { return streaming && !direct ? stream_heads_k : 0; }
  // Attend tasks of one (sequence, kv head) of seqlen_q positions before key splits: streaming
  // one, packed its q blocks times its head groups (packed_heads_per_task).
  int64_t tasks_per_pair(const cpu::FwdArgs& args, int64_t seqlen_q) const;
  // Key blocks per split for a sequence with `blocks` key blocks.
  int64_t blocks_per_split(int64_t blocks) const { return cpu::ceil_div(blocks, num_splits); }

  PlanShape shape;

  std::string describe(const cpu::FwdArgs& args) const;
};

// Query heads of one kv head per task of the packed path, for a sequence of seqlen_q positions.
// Where one q block holds every position (seqlen_q <= kMaxQBlockRows) a task takes as many of the
// group's heads as fit its kMaxQBlockRows rows, spread evenly over the fewest tasks: a decode step
// of a large group (MQA, absorbed MLA: 64 to 128 query heads on one kv head) then runs tasks of
// up to 64 rows, not one single-row task per head. 1 where a head's positions fill a task.
inline int64_t packed_heads_per_task(int64_t group_size, int64_t seqlen_q) {
  const int64_t most =
      std::clamp<int64_t>(cpu::kMaxQBlockRows / std::max<int64_t>(seqlen_q, 1), 1, group_size);
  return cpu::ceil_div(group_size, cpu::ceil_div(group_size, most));
}

// Most key-range splits of one q block (a bound of the merge).
constexpr int64_t kMaxSplits = 64;
// Bytes of packed K/V held at once: a pair ((batch, kv head)) beyond it is packed a piece of whole
// key splits at a time where the plan has enough splits (make_fwd_plan), else whole.
constexpr int64_t kPackBudgetBytes = int64_t{48} << 20;
// Attend tasks per thread in one packing group: enough for the cost-ordered queue to balance.
constexpr int64_t kTasksPerThread = 8;
// A packing group keeps growing until it holds this many packed bytes (or the task count above):
// small enough to stay in the last-level cache while attended, large enough that the barrier
// between packing and attending is paid rarely.
constexpr int64_t kPackGroupTargetBytes = int64_t{8} << 20;

// Pair-local pairs (fwd_driver.cc): each (sequence, kv head) pair is packed and then attended by
// the one thread that takes it, so that its packed K/V are read back from that core's L2 by its
// q-block tasks, instead of being packed by every thread, written out to memory and read back
// from there by every thread. For groups whose pairs each pack within kPairLocalMaxBytes (short
// sequences: packing is then a large share of the call), as many of the most expensive pairs as
// whole pairs keep every thread busy (pair_local_count).
constexpr int64_t kPairLocalMaxBytes = int64_t{5} << 18;

// Whether pairs of the attend costs `pair_costs`, each run whole by one of `threads` threads
// and handed out most expensive first, finish within 1/32 of an even share of their total: the
// makespan of that greedy schedule, which the thread pool's queue follows when its threads run
// at one speed. 8 equal pairs balance on 1, 2, 4 or 8 threads, not on 3.
bool pairs_balance_on_threads(std::vector<int64_t> pair_costs, int threads);

// How many pairs of a group run pair-local, given their attend costs in the order the group hands
// them out (most expensive first): the most pairs from the front, in whole rounds of `threads`,
// that balance on the threads (pairs_balance_on_threads); all of them where every pair does. The
// rest are packed by every thread and then attended by every thread. 8 equal pairs on 3 threads:
// 6.
int64_t pair_local_count(const std::vector<int64_t>& sorted_pair_costs, int threads);

// The plan for the sequences `shape` describes, all of one FwdPath, run by the kernel named
// kernel_name (static storage), whose direct loop takes up to direct_rows rows per kv head, on
// `threads` threads.
FwdPlan make_fwd_plan(const cpu::FwdArgs& args, const PlanShape& shape, const char* kernel_name,
                      int64_t direct_rows, int threads);

// True when ANYATTN_VERBOSE is set to a non-empty value other than "0".
bool verbose_enabled();

}  // namespace anyattn::plan

#endif  // ANYATTN_PLAN_FWD_PLAN_H_
