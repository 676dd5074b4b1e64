#include "cpu/fwd_driver.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cpu/finalize.h"
#include "cpu/fwd_layout.h"
#include "cpu/kernel_registry.h"
#include "plan/fwd_plan.h"
#include "runtime/aligned_buffer.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {
namespace {

using runtime::AlignedBuffer;

// Everything one group of (batch, kv head) pairs needs, carved from one allocation.
struct Workspace {
  float* packed = nullptr;       // pairs_per_group * num_blocks * block_floats
  uint8_t* nonfinite = nullptr;  // pairs_per_group * num_blocks
  float* scratch = nullptr;      // threads * scratch_floats
  float* partial_o = nullptr;    // rows_per_group * splits * dv_pad (split plans only)
  float* partial_ml = nullptr;   // 2 * rows_per_group * splits (split plans only)
  int64_t rows_per_group = 0;    // pairs_per_group * group_size * Sq
  AlignedBuffer<float> owned;    // when the cached arena could not be used
};

// Workspace kept between calls, used only by the caller that holds the pool: re-faulting tens of
// MiB of fresh pages on every call costs as much as packing them. Bounded by kArenaLimitFloats;
// larger requests allocate per call.
constexpr int64_t kArenaLimitFloats = int64_t{96} << 18;  // 96 MiB
struct Arena {
  AlignedBuffer<float> buffer;
  int64_t floats = 0;
};
Arena& shared_arena() {
  static Arena arena;
  return arena;
}

Workspace allocate_workspace(const FwdArgs& args, const plan::FwdPlan& plan, bool may_use_arena) {
  const PackedLayout& layout = plan.layout;
  Workspace ws;
  ws.rows_per_group = plan.pairs_per_group * args.group_size() * args.seqlen_q;
  const bool split = plan.num_splits > 1;
  const int64_t packed_floats = plan.pairs_per_group * layout.num_blocks * layout.block_floats;
  const int64_t flag_floats = round_up(plan.pairs_per_group * layout.num_blocks, 64) / 4;
  const int64_t scratch_floats = plan.threads * plan.scratch_floats;
  const int64_t partial_o_floats =
      split ? round_up(ws.rows_per_group * plan.num_splits * layout.dv_pad, 16) : 0;
  const int64_t partial_ml_floats =
      split ? round_up(2 * ws.rows_per_group * plan.num_splits, 16) : 0;
  const int64_t total =
      packed_floats + flag_floats + scratch_floats + partial_o_floats + partial_ml_floats;
  float* base = nullptr;
  if (may_use_arena && total <= kArenaLimitFloats) {
    Arena& arena = shared_arena();
    if (arena.floats < total) {
      arena.buffer.allocate(0);
      arena.floats = 0;
      arena.buffer.allocate(total);
      arena.floats = total;
    }
    base = arena.buffer.get();
  } else {
    ws.owned.allocate(total);
    base = ws.owned.get();
  }
  ws.packed = base;
  ws.nonfinite = reinterpret_cast<uint8_t*>(base + packed_floats);
  ws.scratch = base + packed_floats + flag_floats;
  ws.partial_o = split ? ws.scratch + scratch_floats : nullptr;
  ws.partial_ml = split ? ws.partial_o + partial_o_floats : nullptr;
  return ws;
}

// The attend tasks of pairs [pair0, pair0 + pairs), most expensive first (longest-processing-time
// order keeps the threads' finishing times close; causal q blocks differ in cost up to Sk/64x).
std::vector<AttendTask> build_tasks(const FwdArgs& args, const plan::FwdPlan& plan,
                                    const Workspace& ws, int64_t pair0, int64_t pairs) {
  const PackedLayout& layout = plan.layout;
  const int64_t group = args.group_size();
  const int64_t splits = plan.num_splits;
  std::vector<AttendTask> tasks;
  std::vector<int64_t> costs;
  tasks.reserve(static_cast<size_t>(pairs * group * plan.num_q_blocks * splits));
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t batch = (pair0 + p) / args.heads_k;
    const int64_t head_k = (pair0 + p) % args.heads_k;
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t qb = 0; qb < plan.num_q_blocks; ++qb) {
        AttendTask task;
        task.batch = batch;
        task.head_q = head_k * group + g;
        task.q_begin = qb * plan.q_block_rows;
        task.q_end = std::min(task.q_begin + plan.q_block_rows, args.seqlen_q);
        task.packed = ws.packed + p * layout.num_blocks * layout.block_floats;
        task.v_nonfinite = ws.nonfinite + p * layout.num_blocks;
        const BlockRange visible = visible_key_blocks(args, task.q_begin, task.q_end);
        for (int64_t s = 0; s < splits; ++s) {
          task.block_begin = s * plan.blocks_per_split;
          task.block_end = std::min(task.block_begin + plan.blocks_per_split, layout.num_blocks);
          if (splits > 1) {
            const int64_t row = (p * group + g) * args.seqlen_q + task.q_begin;
            const int64_t slot = row * splits + s;
            task.partial.o = ws.partial_o + slot * layout.dv_pad;
            task.partial.m = ws.partial_ml + slot;
            task.partial.l = ws.partial_ml + ws.rows_per_group * splits + slot;
            task.partial.o_row_stride = splits * layout.dv_pad;
            task.partial.ml_row_stride = splits;
          }
          const int64_t blocks = std::max<int64_t>(
              0, std::min(task.block_end, visible.end) - std::max(task.block_begin, visible.begin));
          tasks.push_back(task);
          costs.push_back((task.q_end - task.q_begin) * (blocks + 1));
        }
      }
    }
  }
  std::vector<int64_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  std::vector<AttendTask> sorted;
  sorted.reserve(tasks.size());
  for (int64_t index : order) sorted.push_back(tasks[index]);
  return sorted;
}

// Merges the split partials of pairs [pair0, pair0 + pairs) into out and lse.
void merge_splits(const FwdArgs& args, const plan::FwdPlan& plan, const Workspace& ws,
                  const runtime::PoolLease& lease, int64_t pair0, int64_t pairs) {
  const int64_t group = args.group_size();
  const int64_t splits = plan.num_splits;
  const int64_t dv_pad = plan.layout.dv_pad;
  const int64_t row_chunks = plan.num_q_blocks;
  lease.run_each(pairs * group * row_chunks, [&](int64_t t, int) {
    const int64_t chunk = t % row_chunks;
    const int64_t pg = t / row_chunks;  // p * group + g
    const int64_t p = pg / group;
    const int64_t batch = (pair0 + p) / args.heads_k;
    const int64_t head_q = ((pair0 + p) % args.heads_k) * group + pg % group;
    const bool has_sink = args.sinks != nullptr;
    const float sink = has_sink ? args.sinks[head_q * args.sinks_stride] : 0.f;
    const int64_t i_end = std::min((chunk + 1) * plan.q_block_rows, args.seqlen_q);
    for (int64_t i = chunk * plan.q_block_rows; i < i_end; ++i) {
      const int64_t slot = (pg * args.seqlen_q + i) * splits;
      RowPartials parts;
      parts.count = splits;
      parts.o = ws.partial_o + slot * dv_pad;
      parts.m = ws.partial_ml + slot;
      parts.l = ws.partial_ml + ws.rows_per_group * splits + slot;
      parts.o_stride = dv_pad;
      parts.ml_stride = 1;
      void* out_row = element_address(
          args.out, args.dtype,
          batch * args.out_batch_stride + i * args.out_row_stride + head_q * args.out_head_stride);
      float* lse = args.lse == nullptr ? nullptr
                                       : args.lse + batch * args.lse_batch_stride +
                                             head_q * args.lse_head_stride + i * args.lse_row_stride;
      combine_and_store_row(parts, has_sink, sink, args.head_dim_v, args.dtype, out_row, lse);
    }
  });
}

}  // namespace

void run_fwd(const FwdArgs& args, anyattn_isa isa) {
  if (args.batch == 0 || args.seqlen_q == 0) return;
  const FwdKernel* kernel = find_fwd_kernel(isa);
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  const plan::FwdPlan plan = plan::make_fwd_plan(args, *kernel, lease.num_threads());
  if (plan::verbose_enabled()) std::fprintf(stderr, "%s\n", plan.describe(args).c_str());
  const Workspace ws = allocate_workspace(args, plan, lease.owns_pool());
  const PackedLayout& layout = plan.layout;
  const int64_t total_pairs = args.batch * args.heads_k;

  // Every allocation happens before the first output is written.
  std::vector<std::vector<AttendTask>> group_tasks;
  for (int64_t pair0 = 0; pair0 < total_pairs; pair0 += plan.pairs_per_group) {
    const int64_t pairs = std::min(plan.pairs_per_group, total_pairs - pair0);
    group_tasks.push_back(build_tasks(args, plan, ws, pair0, pairs));
  }

  for (int64_t pair0 = 0, group = 0; pair0 < total_pairs; pair0 += plan.pairs_per_group, ++group) {
    const int64_t pairs = std::min(plan.pairs_per_group, total_pairs - pair0);
    lease.run_each(pairs * layout.num_blocks, [&](int64_t t, int) {
      const int64_t pair = pair0 + t / layout.num_blocks;
      const int64_t block = t % layout.num_blocks;
      kernel->pack_block(args, layout, pair / args.heads_k, pair % args.heads_k, block,
                         ws.packed + t * layout.block_floats, ws.nonfinite + t);
    });
    const std::vector<AttendTask>& tasks = group_tasks[group];
    lease.run_each(static_cast<int64_t>(tasks.size()), [&](int64_t t, int worker) {
      const Scratch scratch =
          Scratch::carve(ws.scratch + worker * plan.scratch_floats, layout);
      kernel->attend(args, layout, tasks[t], scratch);
    });
    if (plan.num_splits > 1) merge_splits(args, plan, ws, lease, pair0, pairs);
  }
}

}  // namespace anyattn::cpu
