#include "plan/fwd_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace anyattn::plan {
namespace {

// Below this many (batch, head, q-block) units the key range is split so that a machine with
// many cores still has work. A constant, not the thread count: splitting changes rounding.
constexpr int64_t kTargetParallelUnits = 64;
// Each split covers at least this many key blocks (256 keys), so the merge stays cheap.
constexpr int64_t kMinBlocksPerSplit = 4;
// Attend tasks per thread in one packing group: enough for the cost-ordered queue to balance.
constexpr int64_t kTasksPerThread = 8;

int64_t choose_splits(const cpu::FwdArgs& args, int64_t num_q_blocks, int64_t num_key_blocks) {
  if (num_key_blocks == 0) return 1;
  int64_t splits = args.num_splits;
  if (splits == 0) {
    const int64_t units = args.batch * args.heads_q * num_q_blocks;
    if (units >= kTargetParallelUnits) return 1;
    splits = cpu::ceil_div(kTargetParallelUnits, units);
    splits = std::min(splits, num_key_blocks / kMinBlocksPerSplit);
  }
  return std::clamp<int64_t>(std::min(splits, num_key_blocks), 1, kMaxSplits);
}

}  // namespace

FwdPlan make_fwd_plan(const cpu::FwdArgs& args, const cpu::FwdKernel& kernel, int threads) {
  FwdPlan plan;
  plan.kernel = &kernel;
  plan.threads = threads;
  plan.layout = cpu::PackedLayout::for_args(args);
  plan.q_block_rows = std::clamp<int64_t>(args.seqlen_q, 1, cpu::kMaxQBlockRows);
  plan.num_q_blocks = cpu::ceil_div(args.seqlen_q, plan.q_block_rows);
  plan.num_splits = choose_splits(args, plan.num_q_blocks, plan.layout.num_blocks);
  plan.blocks_per_split = cpu::ceil_div(plan.layout.num_blocks, plan.num_splits);
  plan.num_splits = plan.layout.num_blocks == 0
                        ? 1
                        : cpu::ceil_div(plan.layout.num_blocks, plan.blocks_per_split);
  // Pack as few (batch, kv head) pairs at a time as keep every thread busy, so the packed K/V
  // stays in the caches while it is used; never more than the packing budget.
  const int64_t pair_bytes = plan.layout.num_blocks * plan.layout.block_floats * 4;
  const int64_t pairs = std::max<int64_t>(args.batch * args.heads_k, 1);
  const int64_t tasks_per_pair = args.group_size() * plan.num_q_blocks * plan.num_splits;
  const int64_t wanted = cpu::ceil_div(kTasksPerThread * threads, tasks_per_pair);
  const int64_t affordable = pair_bytes == 0 ? pairs : kPackBudgetBytes / pair_bytes;
  plan.pairs_per_group = std::clamp<int64_t>(std::min(wanted, affordable), 1, pairs);
  plan.scratch_floats = cpu::round_up(cpu::Scratch::floats_needed(plan.layout), 16);
  return plan;
}

std::string FwdPlan::describe(const cpu::FwdArgs& args) const {
  std::ostringstream text;
  text << "anyattn: fwd kernel=" << kernel->name << " threads=" << threads << " B=" << args.batch
       << " Sq=" << args.seqlen_q << " Sk=" << args.seqlen_k << " Hq=" << args.heads_q
       << " Hk=" << args.heads_k << " D=" << args.head_dim << " Dv=" << args.head_dim_v
       << " q_block=" << q_block_rows << "x" << num_q_blocks << " key_blocks=" << layout.num_blocks
       << " splits=" << num_splits << "x" << blocks_per_split << " pairs_per_group="
       << pairs_per_group << " packed_bytes="
       << pairs_per_group * layout.num_blocks * layout.block_floats * 4
       << " scratch_bytes_per_thread=" << scratch_floats * 4;
  return text.str();
}

bool verbose_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("ANYATTN_VERBOSE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

}  // namespace anyattn::plan
