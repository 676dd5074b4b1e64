#include "cpu/forward/fwd_driver.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cpu/forward/finalize.h"
#include "cpu/kernel_registry.h"
#include "cpu/shared/unit_head_dims.h"
#include "plan/fwd_layout.h"
#include "plan/fwd_plan.h"
#include "runtime/aligned_buffer.h"
#include "runtime/kept_workspace.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {
namespace {

using runtime::AlignedBuffer;

// One (sequence, kv head) pair: the unit of K/V packing.
struct Pair {
  SeqInfo seq;
  int64_t head_k = 0;
  int64_t blocks = 0;         // key blocks of the sequence
  int64_t packed_first = 0;   // index of its first packed block within its group
  int64_t partial_first = 0;  // index of its first partial row within its group (split plans)
};

// Pairs packed together, then attended, then merged, before the next group is packed; or a piece
// of one pair: its key splits [split_begin, split_end), whose blocks from first_block on are
// packed and attended, the pair merged after its last piece.
struct Group {
  int64_t first_pair = 0;
  int64_t pairs = 0;
  int64_t packed_blocks = 0;
  int64_t partial_rows = 0;
  int64_t split_begin = 0;
  int64_t split_end = 0;    // the plan's num_splits for a group of whole pairs
  int64_t first_block = 0;  // of the pair, for a piece; 0 otherwise
  bool merges = true;       // false for a piece before its pair's last
  std::vector<AttendTask> tasks;  // pair by pair, most expensive pair first (build_tasks)
  // The pairs in the order of `tasks`, and where each one's tasks begin (a last entry: the end).
  std::vector<int64_t> pair_order;
  std::vector<int64_t> task_begin;
  // Pair-local pairs (plan::kPairLocalMaxBytes): the first local_pairs of pair_order, each
  // packed and attended by one thread. Every thread then packs the other pairs' blocks (the
  // shared runs) and attends their tasks.
  int64_t local_pairs = 0;
  struct SharedRun {
    int64_t pair = 0;    // index into the part's pairs
    int64_t first = 0;   // its first block in the group's packed blocks
    int64_t offset = 0;  // the run's first index among the shared blocks
  };
  std::vector<SharedRun> shared_runs;  // in pair_order, from local_pairs on; none if streaming
  int64_t shared_blocks = 0;
};

// Appends the pieces of `pair` (index p; packed blocks beyond kPackBudgetBytes): runs of equally
// many consecutive key splits, as few as fit the budget (a piece holds at least one split).
void add_pieces(const plan::FwdPlan& plan, int64_t p, int64_t group_size, int64_t block_bytes,
                Pair& pair, std::vector<Group>& groups) {
  const int64_t splits = plan.num_splits;
  const int64_t per_split = plan.blocks_per_split(pair.blocks);
  const int64_t fewest_pieces = ceil_div(pair.blocks * block_bytes, plan::kPackBudgetBytes);
  const int64_t splits_per_piece =
      std::clamp<int64_t>(std::min(ceil_div(splits, fewest_pieces),
                                   plan::kPackBudgetBytes / (per_split * block_bytes)),
                          1, splits);
  auto split_block = [&](int64_t s) { return std::min(s * per_split, pair.blocks); };
  pair.packed_first = 0;
  pair.partial_first = 0;
  for (int64_t begin = 0; begin < splits; begin += splits_per_piece) {
    const int64_t end = std::min(begin + splits_per_piece, splits);
    Group piece;
    piece.first_pair = p;
    piece.pairs = 1;
    piece.split_begin = begin;
    piece.split_end = end;
    piece.first_block = split_block(begin);
    piece.packed_blocks = split_block(end) - piece.first_block;
    piece.partial_rows = group_size * pair.seq.seqlen_q;
    piece.merges = end == splits;
    groups.push_back(std::move(piece));
  }
}

// Splits the pairs into groups: each packs at most kPackBudgetBytes (but at least one pair) and
// stops growing once it holds enough attend tasks to keep every thread busy and about
// kPackGroupTargetBytes of packed K/V, which is then still in the caches when it is used. A pair
// beyond the budget forms pieces of its own where the plan splits its keys (add_pieces).
// Streaming plans pack nothing: one group.
std::vector<Group> make_groups(const FwdArgs& args, const plan::FwdPlan& plan,
                               std::vector<Pair>& pairs) {
  const int64_t group_size = args.group_size();
  const int64_t block_bytes = plan.layout.block_floats * 4;
  std::vector<Group> groups;
  Group current;
  int64_t current_tasks = 0;
  // Closes the current group (if it holds a pair) and opens one of whole pairs from `first`.
  auto start_group = [&](int64_t first) {
    if (current.pairs > 0) groups.push_back(std::move(current));
    current = Group{};
    current.first_pair = first;
    current.split_end = plan.num_splits;
    current_tasks = 0;
  };
  start_group(0);
  for (int64_t p = 0; p < static_cast<int64_t>(pairs.size()); ++p) {
    Pair& pair = pairs[p];
    const int64_t packed = plan.streaming ? 0 : pair.blocks;
    if (packed * block_bytes > plan::kPackBudgetBytes && plan.num_splits > 1) {
      start_group(p);  // pushes the pairs before p
      add_pieces(plan, p, group_size, block_bytes, pair, groups);
      current.first_pair = p + 1;
      continue;
    }
    const bool over_budget =
        (current.packed_blocks + packed) * block_bytes > plan::kPackBudgetBytes;
    const bool big_enough = current_tasks >= plan.wanted_tasks &&
                            current.packed_blocks * block_bytes >= plan::kPackGroupTargetBytes;
    if (current.pairs > 0 && !plan.streaming && (over_budget || big_enough)) start_group(p);
    pair.packed_first = current.packed_blocks;
    pair.partial_first = current.partial_rows;
    current.packed_blocks += packed;
    current.partial_rows += group_size * pair.seq.seqlen_q;
    current.pairs += 1;
    current_tasks += plan.tasks_per_pair(args, pair.seq.seqlen_q) * plan.num_splits;
  }
  if (current.pairs > 0) groups.push_back(std::move(current));
  return groups;
}

// Everything one group needs, carved from the call's one allocation (sized for the largest group of
// the largest part).
struct Workspace {
  float* packed = nullptr;         // packed_blocks * block_floats
  uint8_t* block_flags = nullptr;  // packed_blocks
  float* scratch = nullptr;        // threads * scratch_floats
  float* partial_o = nullptr;      // partial_rows * splits * dv_pad (split plans only)
  float* partial_ml = nullptr;     // 2 * partial_rows * splits (split plans only)
  int64_t partial_rows = 0;        // capacity, rows
};

// The sizes of the parts of a Workspace for `plan` and its groups, in floats.
struct WorkspaceSizes {
  int64_t packed_blocks = 0;
  int64_t partial_rows = 0;  // split plans only
  int64_t packed = 0, flags = 0, scratch = 0, partial_o = 0, partial_ml = 0;
  int64_t total() const { return packed + flags + scratch + partial_o + partial_ml; }
};

WorkspaceSizes workspace_sizes(const plan::FwdPlan& plan, const std::vector<Group>& groups) {
  WorkspaceSizes sizes;
  for (const Group& group : groups) {
    sizes.packed_blocks = std::max(sizes.packed_blocks, group.packed_blocks);
    sizes.partial_rows = std::max(sizes.partial_rows, group.partial_rows);
  }
  if (plan.num_splits == 1) sizes.partial_rows = 0;
  sizes.packed = sizes.packed_blocks * plan.layout.block_floats;
  sizes.flags = round_up(sizes.packed_blocks, 64) / 4;
  sizes.scratch = plan.threads * plan.scratch_floats;
  sizes.partial_o = round_up(sizes.partial_rows * plan.num_splits * plan.layout.dv_pad, 16);
  sizes.partial_ml = round_up(2 * sizes.partial_rows * plan.num_splits, 16);
  return sizes;
}

// The Workspace of sizes `sizes` (workspace_sizes of `plan`), carved from `base`, which holds at
// least sizes.total() floats.
Workspace carve_workspace(const plan::FwdPlan& plan, const WorkspaceSizes& sizes, float* base) {
  const bool split = plan.num_splits > 1;
  Workspace ws;
  ws.partial_rows = sizes.partial_rows;
  ws.packed = base;
  ws.block_flags = reinterpret_cast<uint8_t*>(base + sizes.packed);
  ws.scratch = base + sizes.packed + sizes.flags;
  ws.partial_o = split ? ws.scratch + sizes.scratch : nullptr;
  ws.partial_ml = split ? ws.partial_o + sizes.partial_o : nullptr;
  return ws;
}

// Fills the attend tasks of `group`, pair by pair: pairs in decreasing total cost, and each pair's
// tasks most expensive first. Expensive work first keeps the threads' finishing times close
// (causal q blocks differ in cost up to Sk/64 times, varlen sequences far more), and keeping a
// pair's tasks together keeps its packed K/V (up to a few MiB) in the caches while they run: a
// plain most-expensive-first order over the whole group interleaves every pair's causal q blocks,
// and each task then streams its panel from L3. Where every pair of the group packs whole within
// plan::kPairLocalMaxBytes, runs as many of them pair-local as plan::pair_local_count allows.
void build_tasks(const FwdArgs& args, const plan::FwdPlan& plan, const Workspace& ws,
                 const std::vector<Pair>& pairs, Group& group) {
  const PackedLayout& layout = plan.layout;
  const int64_t group_size = args.group_size();
  const int64_t splits = plan.num_splits;
  std::vector<AttendTask> tasks;
  std::vector<int64_t> costs;
  std::vector<int64_t> pair_of_task;
  std::vector<int64_t> pair_costs(group.pairs, 0);
  // Streaming: one task (per split) holds every query row of stream_heads_k consecutive kv heads
  // of one sequence; packed: one task per q block and plan::packed_heads_per_task query heads
  // (the group's last task may hold fewer).
  int64_t p = group.first_pair;
  while (p < group.first_pair + group.pairs) {
    const Pair& pair = pairs[p];
    int64_t heads_k = 1;
    while (plan.streaming && heads_k < plan.stream_heads_k &&
           p + heads_k < group.first_pair + group.pairs &&
           pairs[p + heads_k].seq.batch == pair.seq.batch) {
      ++heads_k;
    }
    const int64_t q_blocks = ceil_div(pair.seq.seqlen_q, plan.q_block_rows);
    const int64_t blocks_per_split = plan.blocks_per_split(pair.blocks);
    const int64_t task_heads = heads_k * group_size;  // query heads of this pair (or these)
    const int64_t heads_per_task =
        plan.streaming ? task_heads : plan::packed_heads_per_task(group_size, pair.seq.seqlen_q);
    for (int64_t g = 0; g < task_heads; g += heads_per_task) {
      for (int64_t qb = 0; qb < q_blocks; ++qb) {
        AttendTask task;
        task.seq = pair.seq;
        task.head_q_begin = pair.head_k * group_size + g;
        task.heads = std::min(heads_per_task, task_heads - g);
        task.heads_k = plan.streaming ? heads_k : 1;
        task.q_begin = qb * plan.q_block_rows;
        task.q_end = std::min(task.q_begin + plan.q_block_rows, pair.seq.seqlen_q);
        const KeyRange visible =
            Mask(args, pair.seq).visible_blocks(task.q_begin, task.q_end, kKeyBlock);
        for (int64_t s = group.split_begin; s < group.split_end; ++s) {
          task.block_begin = std::min(s * blocks_per_split, pair.blocks);
          task.block_end = std::min(task.block_begin + blocks_per_split, pair.blocks);
          if (!plan.streaming) {
            const int64_t first = pair.packed_first + task.block_begin - group.first_block;
            task.packed = ws.packed + first * layout.block_floats;
            task.block_flags = ws.block_flags + first;
          }
          if (splits > 1) {
            // Partial rows are ordered (pair, head in group, position); a task's rows are
            // consecutive in that order (a task of several heads covers every position).
            const int64_t row = pair.partial_first + g * pair.seq.seqlen_q + task.q_begin;
            const int64_t slot = row * splits + s;
            task.partial.o = ws.partial_o + slot * layout.dv_pad;
            task.partial.m = ws.partial_ml + slot;
            task.partial.l = ws.partial_ml + ws.partial_rows * splits + slot;
            task.partial.o_row_stride = splits * layout.dv_pad;
            task.partial.ml_row_stride = splits;
          }
          const int64_t blocks = std::max<int64_t>(
              0, std::min(task.block_end, visible.end) - std::max(task.block_begin, visible.begin));
          tasks.push_back(task);
          costs.push_back((task.q_end - task.q_begin) * task.heads * (blocks + 1));
          pair_of_task.push_back(p - group.first_pair);
          pair_costs[p - group.first_pair] += costs.back();
        }
      }
    }
    p += plan.streaming ? heads_k : 1;
  }
  std::vector<int64_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const int64_t pair_a = pair_of_task[a];
    const int64_t pair_b = pair_of_task[b];
    if (pair_a != pair_b) {
      if (pair_costs[pair_a] != pair_costs[pair_b]) return pair_costs[pair_a] > pair_costs[pair_b];
      return pair_a < pair_b;
    }
    return costs[a] > costs[b];
  });
  group.tasks.clear();
  group.tasks.reserve(tasks.size());
  group.pair_order.clear();
  group.task_begin.clear();
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t pair = pair_of_task[order[i]];
    if (i == 0 || pair != pair_of_task[order[i - 1]]) {
      group.pair_order.push_back(group.first_pair + pair);
      group.task_begin.push_back(static_cast<int64_t>(i));
    }
    group.tasks.push_back(tasks[order[i]]);
  }
  group.task_begin.push_back(static_cast<int64_t>(tasks.size()));

  // Every pair packed whole (not a piece) and within the limit.
  bool pairs_fit = !plan.streaming;
  int64_t pair_blocks = 0;
  for (int64_t i = group.first_pair; i < group.first_pair + group.pairs; ++i) {
    pairs_fit = pairs_fit &&
                pairs[i].blocks * layout.block_floats * 4 <= plan::kPairLocalMaxBytes;
    pair_blocks += pairs[i].blocks;
  }
  pairs_fit = pairs_fit && pair_blocks == group.packed_blocks;
  std::vector<int64_t> sorted_pair_costs;
  for (const int64_t pair : group.pair_order) {
    sorted_pair_costs.push_back(pair_costs[pair - group.first_pair]);
  }
  group.local_pairs = pairs_fit ? plan::pair_local_count(sorted_pair_costs, plan.threads) : 0;
  group.shared_runs.clear();
  group.shared_blocks = 0;
  if (plan.streaming) return;
  for (size_t i = static_cast<size_t>(group.local_pairs); i < group.pair_order.size(); ++i) {
    const Pair& pair = pairs[group.pair_order[i]];
    group.shared_runs.push_back({group.pair_order[i], pair.packed_first, group.shared_blocks});
    // A piece (one pair) packs only its own blocks.
    group.shared_blocks += std::min(pair.blocks, group.packed_blocks);
  }
}

// Merges the split partials of one group into out and lse, in split order.
void merge_splits(const FwdArgs& args, const plan::FwdPlan& plan, const Workspace& ws,
                  const runtime::PoolLease& lease, const std::vector<Pair>& pairs,
                  const Group& group) {
  const int64_t group_size = args.group_size();
  const int64_t splits = plan.num_splits;
  const int64_t dv_pad = plan.layout.dv_pad;
  const ScoreModifiers modifiers = ScoreModifiers::of(args);
  lease.run_each(group.pairs * group_size, [&](int64_t t, int) {
    const Pair& pair = pairs[group.first_pair + t / group_size];
    const int64_t g = t % group_size;
    const int64_t head_q = pair.head_k * group_size + g;
    for (int64_t i = 0; i < pair.seq.seqlen_q; ++i) {
      const int64_t slot = (pair.partial_first + g * pair.seq.seqlen_q + i) * splits;
      RowPartials parts;
      parts.count = splits;
      parts.o = ws.partial_o + slot * dv_pad;
      parts.m = ws.partial_ml + slot;
      parts.l = ws.partial_ml + ws.partial_rows * splits + slot;
      parts.o_stride = dv_pad;
      parts.ml_stride = 1;
      void* out_row = element_address(
          args.out, args.dtype,
          pair.seq.out_offset + i * args.out_row_stride + head_q * args.out_head_stride);
      float* lse = args.lse == nullptr
                       ? nullptr
                       : args.lse + pair.seq.lse_offset + head_q * args.lse_head_stride +
                             i * args.lse_row_stride;
      combine_and_store_row(parts, modifiers.sinks, modifiers.sink(head_q), args.head_dim_v,
                            args.dtype, out_row, lse);
    }
  });
}

// The sequences of one plan: their (sequence, kv head) pairs, packing groups and tasks.
struct PlannedPart {
  plan::FwdPlan plan;
  std::vector<Pair> pairs;
  std::vector<Group> groups;
  WorkspaceSizes sizes;
  Workspace ws;
};

// The plan, pairs, packing groups and workspace sizes of `seqs` (non-empty, all of one FwdPath);
// the workspace and tasks are filled in by the caller once every part is planned.
PlannedPart plan_part(const FwdArgs& args, const FwdKernel& kernel, int threads,
                      const std::vector<SeqInfo>& seqs) {
  plan::PlanShape shape;
  shape.sequences = static_cast<int64_t>(seqs.size());
  for (const SeqInfo& seq : seqs) {
    shape.max_seqlen_q = std::max(shape.max_seqlen_q, seq.seqlen_q);
    shape.max_seqlen_k = std::max(shape.max_seqlen_k, seq.seqlen_k);
  }
  PlannedPart part;
  part.plan = plan::make_fwd_plan(args, shape, kernel.name, kernel.direct_rows, threads);
  part.pairs.reserve(seqs.size() * static_cast<size_t>(args.heads_k));
  for (const SeqInfo& seq : seqs) {
    for (int64_t head_k = 0; head_k < args.heads_k; ++head_k) {
      Pair pair;
      pair.seq = seq;
      pair.head_k = head_k;
      pair.blocks = key_blocks(seq);
      part.pairs.push_back(pair);
    }
  }
  part.groups = make_groups(args, part.plan, part.pairs);
  part.sizes = workspace_sizes(part.plan, part.groups);
  return part;
}

// Packs, attends and merges one part, group by group, on the leased pool; writes only the rows of
// out and lse of the part's sequences.
void run_part(const FwdArgs& args, const FwdKernel& kernel, const runtime::PoolLease& lease,
              const PlannedPart& part) {
  const plan::FwdPlan& plan = part.plan;
  const PackedLayout& layout = plan.layout;
  const std::vector<Pair>& pairs = part.pairs;
  const Workspace& ws = part.ws;
  const AttendFn attend_fn = plan.direct ? kernel.attend_direct : kernel.attend;
  auto scratch_of = [&](int worker) {
    return Scratch::carve(ws.scratch + worker * plan.scratch_floats, layout, plan.panel_heads_k());
  };
  for (const Group& group : part.groups) {
    // Packs the group's block t, of `pair`, on `worker`.
    auto pack = [&](const Pair& pair, int64_t t, int worker) {
      kernel.pack_block(args, layout, pair.seq, pair.head_k,
                        group.first_block + t - pair.packed_first,
                        ws.packed + t * layout.block_floats, ws.block_flags + t,
                        scratch_of(worker).staging);
    };
    auto attend = [&](int64_t t, int worker) {
      attend_fn(args, layout, group.tasks[t], scratch_of(worker));
    };
    lease.run_each(group.local_pairs, [&](int64_t i, int worker) {
      const Pair& pair = pairs[group.pair_order[i]];
      for (int64_t t = pair.packed_first; t < pair.packed_first + pair.blocks; ++t) {
        pack(pair, t, worker);
      }
      for (int64_t t = group.task_begin[i]; t < group.task_begin[i + 1]; ++t) attend(t, worker);
    });
    // Then every thread packs the other pairs' blocks, and every thread attends their tasks.
    const int64_t shared_task_begin = group.task_begin[group.local_pairs];
    const int64_t shared_tasks = static_cast<int64_t>(group.tasks.size()) - shared_task_begin;
    lease.run_each(group.shared_blocks, [&](int64_t i, int worker) {
      // The run that holds shared block i: the last one whose offset is <= i.
      const auto run = std::upper_bound(group.shared_runs.begin() + 1, group.shared_runs.end(), i,
                                        [](int64_t block, const Group::SharedRun& candidate) {
                                          return block < candidate.offset;
                                        }) -
                       1;
      pack(pairs[run->pair], run->first + i - run->offset, worker);
    });
    lease.run_each(shared_tasks,
                   [&](int64_t t, int worker) { attend(shared_task_begin + t, worker); });
    if (plan.num_splits > 1 && group.merges) merge_splits(args, plan, ws, lease, pairs, group);
  }
}

}  // namespace

void run_fwd(const FwdArgs& args, anyattn_isa isa) {
  if (args.batch == 0 || args.seqlen_q == 0 || args.heads_q == 0) return;  // out and lse empty
  if (args.head_dim == 0 || args.head_dim_v == 0) {
    if (args.head_dim_v == 0 && args.lse == nullptr) return;  // out has no columns, no lse
    std::vector<float> out_scratch;
    run_fwd(with_unit_head_dims(args, &out_scratch), isa);
    return;
  }
  const FwdKernel* kernel = find_fwd_kernel(isa);
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());

  // Sequences by path (a varlen call's decode steps, short and long prefill chunks), each part
  // planned on its own: one plan for the longest would pack every decode step's K/V. Parts run one
  // after the other; they write disjoint rows of out and lse.
  std::vector<SeqInfo> seqs_by_path[3];
  for (int64_t b = 0; b < args.batch; ++b) {
    const SeqInfo seq = sequence_info(args, b);
    if (seq.seqlen_q == 0) continue;
    const plan::FwdPath path = plan::fwd_path(args, seq.seqlen_q, kernel->direct_rows);
    seqs_by_path[static_cast<int>(path)].push_back(seq);
  }
  std::vector<PlannedPart> parts;
  for (const std::vector<SeqInfo>& seqs : seqs_by_path) {
    if (!seqs.empty()) parts.push_back(plan_part(args, *kernel, lease.num_threads(), seqs));
  }
  // Every allocation happens before the first output is written: one workspace, large enough for
  // any part, serves each in turn.
  int64_t workspace_floats = 0;
  for (const PlannedPart& part : parts) {
    workspace_floats = std::max(workspace_floats, part.sizes.total());
  }
  AlignedBuffer<float> owned;
  float* base = runtime::reserve_workspace(workspace_floats, lease, &owned);
  for (PlannedPart& part : parts) {
    part.ws = carve_workspace(part.plan, part.sizes, base);
    int64_t pair_local_pairs = 0;
    for (Group& group : part.groups) {
      build_tasks(args, part.plan, part.ws, part.pairs, group);
      pair_local_pairs += group.local_pairs;
    }
    if (plan::verbose_enabled()) {
      std::fprintf(stderr, "%s groups=%lld pair_local=%lld\n", part.plan.describe(args).c_str(),
                   static_cast<long long>(part.groups.size()),
                   static_cast<long long>(pair_local_pairs));
    }
  }
  for (const PlannedPart& part : parts) run_part(args, *kernel, lease, part);
}

}  // namespace anyattn::cpu
