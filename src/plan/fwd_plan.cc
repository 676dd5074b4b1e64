#include "plan/fwd_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>

#include "cpu/decode/e4m3_read.h"
#include "runtime/str_cat.h"

namespace anyattn::plan {
namespace {

// Below this many (batch, head, q-block) units the key range is split so that a machine with
// many cores still has work. A constant, not the thread count: splitting changes rounding.
constexpr int64_t kTargetParallelUnits = 64;
// Each split covers at least this many key blocks (256 keys), so the merge stays cheap.
constexpr int64_t kMinBlocksPerSplit = 4;
// Packed-panel floats per streaming task (1 MiB: comfortably inside L2).
constexpr int64_t kStreamPanelFloats = int64_t{1} << 18;

// `units`: attend tasks without splitting.
int64_t choose_splits(const cpu::FwdArgs& args, int64_t units, int64_t num_key_blocks) {
  if (num_key_blocks == 0) return 1;
  int64_t splits = args.num_splits;
  if (splits == 0) {
    if (units >= kTargetParallelUnits) return 1;
    splits = cpu::ceil_div(kTargetParallelUnits, units);
    splits = std::min(splits, num_key_blocks / kMinBlocksPerSplit);
  }
  return std::clamp<int64_t>(std::min(splits, num_key_blocks), 1, kMaxSplits);
}

}  // namespace

FwdPath fwd_path(const cpu::FwdArgs& args, int64_t seqlen_q, int64_t direct_rows) {
  const int64_t rows = args.group_size() * seqlen_q;
  const bool read_through_f16 =
      args.kv_dtype == cpu::DType::kFp8E5M2 ||
      (args.kv_dtype == cpu::DType::kFp8E4M3 && !cpu::e4m3_reads_as_f32_bits());
  if (rows <= (read_through_f16 ? std::min(direct_rows, cpu::kF16ReadDirectRows) : direct_rows)) {
    return FwdPath::kDirect;
  }
  return rows <= cpu::kMaxQBlockRows ? FwdPath::kStreaming : FwdPath::kPacked;
}

FwdPlan make_fwd_plan(const cpu::FwdArgs& args, const PlanShape& shape, const char* kernel_name,
                      int64_t direct_rows, int threads) {
  FwdPlan plan;
  plan.kernel_name = kernel_name;
  plan.threads = threads;
  plan.shape = shape;
  plan.layout = cpu::PackedLayout::for_args(args);
  const FwdPath path = fwd_path(args, shape.max_seqlen_q, direct_rows);
  plan.streaming = path != FwdPath::kPacked;
  plan.direct = path == FwdPath::kDirect;
  plan.q_block_rows = std::clamp<int64_t>(shape.max_seqlen_q, 1, cpu::kMaxQBlockRows);
  if (plan.streaming) {
    // As many kv heads per task as fit its 64 rows and ~1 MiB of packed panels: one task then
    // sweeps whole key rows (all heads are contiguous in memory), which streams far better.
    const int64_t by_rows =
        cpu::kMaxQBlockRows / (args.group_size() * std::max<int64_t>(shape.max_seqlen_q, 1));
    const int64_t by_memory = std::max<int64_t>(1, kStreamPanelFloats / plan.layout.block_floats);
    plan.stream_heads_k =
        std::clamp<int64_t>(plan.direct ? by_rows : std::min(by_rows, by_memory), 1, args.heads_k);
  }
  const int64_t units = plan.streaming
                            ? shape.sequences * cpu::ceil_div(args.heads_k, plan.stream_heads_k)
                            : shape.sequences * args.heads_k *
                                  plan.tasks_per_pair(args, shape.max_seqlen_q);
  const int64_t key_blocks = cpu::ceil_div(shape.max_seqlen_k, cpu::kKeyBlock);
  plan.num_splits = choose_splits(args, units, key_blocks);
  if (!plan.streaming && args.num_splits == 0) {
    // K/V of one (sequence, kv head) beyond kPackBudgetBytes are packed and attended a piece of
    // whole key splits at a time (fwd_driver.cc), so that the packed buffer stays bounded (and
    // within the kept workspace) instead of holding the whole cache as f32: enough splits for
    // pieces within the budget, where the merge's partial rows (group size x Sq per split) stay
    // within it too, as in decode and short chunks against a long cache.
    const int64_t pair_bytes = key_blocks * plan.layout.block_floats * 4;
    const int64_t pieces = cpu::ceil_div(pair_bytes, kPackBudgetBytes);
    const int64_t partial_bytes_per_split =
        args.group_size() * shape.max_seqlen_q * (plan.layout.dv_pad + 2) * 4;
    if (pieces > 1 && pieces * partial_bytes_per_split <= kPackBudgetBytes) {
      plan.num_splits = std::clamp<int64_t>(std::max(plan.num_splits, pieces), 1,
                                            std::min(kMaxSplits, key_blocks));
    }
  }
  if (plan.streaming) {
    // Too few tasks to occupy every thread (a short cache: few key splits): fewer kv heads per
    // task until there are enough. Unlike the split count this may depend on the thread count:
    // each kv head's rows are computed alike whichever task holds them.
    while (plan.stream_heads_k > 1 &&
           shape.sequences * cpu::ceil_div(args.heads_k, plan.stream_heads_k) * plan.num_splits <
               threads) {
      plan.stream_heads_k = cpu::ceil_div(plan.stream_heads_k, 2);
    }
  }
  plan.wanted_tasks = kTasksPerThread * threads;
  plan.scratch_floats =
      cpu::round_up(cpu::Scratch::floats_needed(plan.layout, plan.panel_heads_k()), 16);
  return plan;
}

int64_t FwdPlan::tasks_per_pair(const cpu::FwdArgs& args, int64_t seqlen_q) const {
  if (streaming) return 1;
  const int64_t q_blocks = cpu::ceil_div(seqlen_q, q_block_rows);
  return cpu::ceil_div(args.group_size(), packed_heads_per_task(args.group_size(), seqlen_q)) *
         q_blocks;
}

namespace {

// Hands out `sorted_costs` (most expensive first) greedily on `threads` threads, each pair to the
// thread that frees up first (the one with the least work so far), and calls
// after_each(pairs_so_far, makespan, total) after each pair. The schedule of the first n pairs is
// the first n steps of the whole schedule, so one pass serves every prefix.
template <class AfterEach>
void schedule_most_expensive_first(const std::vector<int64_t>& sorted_costs, int threads,
                                   AfterEach&& after_each) {
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> loads;
  for (int t = 0; t < threads; ++t) loads.push(0);
  int64_t total = 0;
  int64_t makespan = 0;
  for (size_t i = 0; i < sorted_costs.size(); ++i) {
    const int64_t load = loads.top() + sorted_costs[i];
    loads.pop();
    loads.push(load);
    total += sorted_costs[i];
    makespan = std::max(makespan, load);
    after_each(static_cast<int64_t>(i) + 1, makespan, total);
  }
}

// The balance rule: a makespan within 1/32 of an even share of the total.
bool within_even_share(int64_t makespan, int64_t total, int threads) {
  return makespan * 32 * threads <= total * 33;
}

}  // namespace

bool pairs_balance_on_threads(std::vector<int64_t> pair_costs, int threads) {
  if (pair_costs.empty() || threads <= 1) return true;
  std::sort(pair_costs.begin(), pair_costs.end(), std::greater<int64_t>());
  bool balanced = true;
  schedule_most_expensive_first(pair_costs, threads, [&](int64_t, int64_t makespan,
                                                         int64_t total) {
    balanced = within_even_share(makespan, total, threads);
  });
  return balanced;
}

int64_t pair_local_count(const std::vector<int64_t>& sorted_pair_costs, int threads) {
  const int64_t pairs = static_cast<int64_t>(sorted_pair_costs.size());
  if (threads <= 1) return pairs;
  int64_t count = 0;
  schedule_most_expensive_first(sorted_pair_costs, threads, [&](int64_t front, int64_t makespan,
                                                                int64_t total) {
    if ((front == pairs || front % threads == 0) && within_even_share(makespan, total, threads)) {
      count = front;
    }
  });
  return count;
}

std::string FwdPlan::describe(const cpu::FwdArgs& args) const {
  const char* path = direct ? " direct" : streaming ? " streaming" : " packed";
  return runtime::str_cat(
      "anyattn: fwd kernel=", kernel_name, path, " threads=", threads, " B=", shape.sequences,
      " Sq=", shape.max_seqlen_q, " Sk=", shape.max_seqlen_k, " Hq=", args.heads_q,
      " Hk=", args.heads_k, " D=", args.head_dim, " Dv=", args.head_dim_v,
      args.cu_seqlens_q != nullptr ? " varlen" : "", args.block_table != nullptr ? " paged" : "",
      " q_block=", q_block_rows, " stream_heads_k=", stream_heads_k, " splits=", num_splits,
      " scratch_bytes_per_thread=", scratch_floats * 4);
}

bool verbose_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("ANYATTN_VERBOSE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

}  // namespace anyattn::plan
