#include "plan/bwd_plan.h"

#include <algorithm>
#include <numeric>

#include "common/mask.h"

namespace anyattn::plan {
namespace {

using cpu::BwdCopies;
using cpu::BwdLayout;
using cpu::BwdSeq;
using cpu::BwdTask;
using cpu::kBwdBlock;

// Head splits and chunking (plan/bwd_layout.h). Enough tasks for this many threads to share the
// work evenly...
constexpr int64_t kWantedTasks = 16;
// ...but never more chunks than this, and no more dK/dV partials (head_splits x total key rows x
// (d_pad + dv_pad) floats) or dq partials (num_chunks x total query rows x d_pad floats) than
// kPartialBudgetBytes each: the partials trade memory for parallelism only where a call has few
// (sequence, kv head) pairs. None of these depends on the thread count.
constexpr int64_t kMaxChunks = 16;
// Key blocks per chunk before head splits are used: each chunk packs Q and dout of every query
// block of its heads again, to use them for at most as many tiles as the chunk has blocks.
constexpr int64_t kMinChunkBlocks = 8;
constexpr int64_t kPartialBudgetBytes = int64_t{128} << 20;

int64_t ceil_div64(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t key_blocks(const BwdSeq& s) {
  return ceil_div64(s.seq.seqlen_k, kBwdBlock);
}

// The cost of a task in tile products: per query head, the key blocks of its chunk that each
// query block sees, plus one per query block for packing.
int64_t task_cost(const cpu::FwdArgs& f, const BwdTask& task) {
  const cpu::SeqInfo& seq = task.seq.seq;
  const Mask mask(f, seq);
  int64_t cost = 0;
  for (int64_t i0 = 0; i0 < seq.seqlen_q; i0 += kBwdBlock) {
    const int64_t rows = std::min(kBwdBlock, seq.seqlen_q - i0);
    const KeyRange blocks = cpu::chunk_blocks_seen(mask, task, i0, rows);
    cost += 1 + blocks.end - blocks.begin;
  }
  return cost * (task.group_end - task.group_begin) +
         ceil_div64(task.key_end - task.key_begin, kBwdBlock);
}

// The layout: padded head dims, and the head split and chunk counts from the shape (see the
// constants above). A call with too few (sequence, kv head) pairs for kWantedTasks splits the keys
// into chunks of at least kMinChunkBlocks blocks, then each GQA group's query heads, and only
// where that still gives too few tasks (MHA, small groups) into shorter chunks. A chunk packs Q
// and dout of every query block of its heads again (for a one-block chunk, once per tile), a head
// split the pair's K and V, one head's worth of rows. So MQA with 16 query heads at Sk 1024 runs
// 2 chunks times 8 head splits of 2 heads, not 16 chunks of one block (bench/MEASUREMENTS.md,
// "Backward head splits").
BwdLayout chunked_layout(const cpu::FwdArgs& f, const std::vector<BwdSeq>& seqs,
                         int64_t total_rows, int64_t total_key_rows, const BwdCopies& copies) {
  int64_t max_blocks = 0, pairs = 0;
  for (const BwdSeq& s : seqs) {
    max_blocks = std::max(max_blocks, key_blocks(s));
    if (key_blocks(s) > 0) pairs += f.heads_k;
  }
  BwdLayout layout;
  layout.d_pad = (f.head_dim + 15) / 16 * 16;
  layout.dv_pad = (f.head_dim_v + 15) / 16 * 16;
  layout.bf16_tiles = copies.bf16_tiles;
  layout.rows16 = copies.rows16;
  layout.bf16_pairs = copies.bf16_pairs;
  pairs = std::max<int64_t>(pairs, 1);
  const int64_t wanted_parts = ceil_div64(kWantedTasks, pairs);  // tasks wanted per pair
  // Chunks for `wanted` parts, at most `most` (at least 1), within kMaxChunks and the dq partial
  // budget.
  const int64_t partial_row_bytes = std::max<int64_t>(total_rows * layout.d_pad * 4, 1);
  auto chunks_within = [&](int64_t wanted, int64_t most) {
    return std::min({wanted, kMaxChunks, std::max<int64_t>(most, 1),
                     std::max<int64_t>(kPartialBudgetBytes / partial_row_bytes, 1)});
  };
  // Key chunks first, each of at least kMinChunkBlocks blocks...
  int64_t chunks = chunks_within(wanted_parts, max_blocks / kMinChunkBlocks);
  // ...then as many head splits as the tasks still want, within the dK/dV partial budget.
  const int64_t dkv_split_bytes =
      std::max<int64_t>(total_key_rows * layout.dkv_row_floats() * 4, 1);
  layout.head_splits =
      std::min({ceil_div64(wanted_parts, chunks), f.group_size(),
                std::max<int64_t>(kPartialBudgetBytes / dkv_split_bytes, 1)});
  // Where the head splits fall short too (MHA, small groups), shorter chunks after all.
  if (chunks * layout.head_splits < wanted_parts) {
    chunks = chunks_within(ceil_div64(wanted_parts, layout.head_splits), max_blocks);
  }
  layout.num_chunks = chunks;
  layout.chunk_keys = ceil_div64(max_blocks, chunks) * kBwdBlock;
  return layout;
}

}  // namespace

int64_t BwdPlan::chunks_of(const BwdSeq& s) const {
  return layout.chunks_for(key_blocks(s));
}

void BwdPlan::bind_partials(float* dq_partials, float* dkv_partials) {
  for (size_t t = 0; t < tasks.size(); ++t) {
    tasks[t].dq_partial =
        task_chunks[t] < 0 ? nullptr : dq_partials + task_chunks[t] * chunk_stride;
    tasks[t].dkv_partial =
        task_head_splits[t] < 0 ? nullptr : dkv_partials + task_head_splits[t] * head_split_stride;
  }
}

BwdPlan make_bwd_plan(const cpu::BwdArgs& args, const BwdCopies& copies) {
  const cpu::FwdArgs& f = args.fwd;
  BwdPlan plan;
  plan.seqs.resize(static_cast<size_t>(f.batch));
  int64_t total_key_rows = 0;
  for (int64_t b = 0; b < f.batch; ++b) {
    plan.seqs[b] = cpu::bwd_sequence(args, b, plan.total_rows, total_key_rows);
    plan.total_rows += plan.seqs[b].seq.seqlen_q * f.heads_q;
    total_key_rows += plan.seqs[b].seq.seqlen_k * f.heads_k;
  }
  plan.layout = chunked_layout(f, plan.seqs, plan.total_rows, total_key_rows, copies);
  const BwdLayout& layout = plan.layout;
  plan.delta_floats = (plan.total_rows + 15) / 16 * 16;
  plan.chunk_stride = plan.total_rows * layout.d_pad;
  plan.partial_floats = layout.num_chunks > 1 ? layout.num_chunks * plan.chunk_stride : 0;
  plan.head_split_stride = total_key_rows * layout.dkv_row_floats();
  plan.dkv_partial_floats =
      layout.head_splits > 1 ? layout.head_splits * plan.head_split_stride : 0;

  std::vector<BwdTask> tasks;
  std::vector<int64_t> chunk_of_task, head_split_of_task, costs;
  for (const BwdSeq& s : plan.seqs) {
    const int64_t blocks = key_blocks(s);
    const int64_t seq_chunks = plan.chunks_of(s);
    for (int64_t head_k = 0; head_k < f.heads_k; ++head_k) {
      for (int64_t split = 0; split < layout.head_splits; ++split) {
        for (int64_t c = 0; c < seq_chunks; ++c) {
          BwdTask task;
          task.seq = s;
          task.head_k = head_k;
          task.group_begin = layout.split_first_head(f.group_size(), split);
          task.group_end = layout.split_first_head(f.group_size(), split + 1);
          task.key_begin = BwdLayout::chunk_first_block(blocks, seq_chunks, c) * kBwdBlock;
          task.key_end = std::min(s.seq.seqlen_k,
                                  BwdLayout::chunk_first_block(blocks, seq_chunks, c + 1) *
                                      kBwdBlock);
          tasks.push_back(task);
          chunk_of_task.push_back(seq_chunks > 1 ? c : -1);
          head_split_of_task.push_back(layout.head_splits > 1 ? split : -1);
          costs.push_back(task_cost(f, task));
        }
      }
    }
  }
  std::vector<int64_t> order(tasks.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  for (int64_t t : order) {
    plan.tasks.push_back(tasks[t]);
    plan.task_chunks.push_back(chunk_of_task[t]);
    plan.task_head_splits.push_back(head_split_of_task[t]);
  }
  return plan;
}

}  // namespace anyattn::plan
