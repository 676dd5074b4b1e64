#include "cpu/backward/bwd_driver.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/isa_table.h"
#include "cpu/shared/half.h"
#include "cpu/shared/unit_head_dims.h"
#include "plan/bwd_layout.h"
#include "plan/bwd_plan.h"
#include "runtime/aligned_buffer.h"
#include "runtime/kept_workspace.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {

// The backward kernels of every path this build compiles, declared from the ISA table.
#define ANYATTN_ISA(id, isa, arch, check, fwd_name, lanes, rows, keys, direct_rows,          \
                    bwd_name)                                                                \
  ANYATTN_IF_ARCH_##arch(namespace bwd_##id {                                                \
    BwdCopies bwd_copies(const FwdArgs& f);                                                  \
    void row_dots(const BwdArgs& args, const BwdSeq& s, int64_t h, float* delta);            \
    void bwd_task(const BwdArgs& args, const BwdLayout& layout, const BwdTask& task,         \
                  const float* delta, double* sink_terms, float* scratch);                   \
    void reduce_dq(const BwdArgs& args, const BwdLayout& layout, const BwdSeq& s, int64_t h, \
                   const float* partials, int64_t chunk_stride, int64_t chunks);             \
    void reduce_dkv(const BwdArgs& args, const BwdLayout& layout, const BwdSeq& s,           \
                    int64_t head_k, const float* partials, int64_t split_stride);            \
  })
#include "cpu/isa_table.inc"
#undef ANYATTN_ISA

namespace {

struct BwdKernel {
  anyattn_isa isa;
  const char* name;
  decltype(&bwd_portable::row_dots) row_dots;
  decltype(&bwd_portable::bwd_task) bwd_task;
  decltype(&bwd_portable::reduce_dq) reduce_dq;
  decltype(&bwd_portable::reduce_dkv) reduce_dkv;
  decltype(&bwd_portable::bwd_copies) bwd_copies;  // the operand copies it packs for a call
};

// Whether the CPU can run a path is the forward registry's answer for the same isa: both are
// compiled for the same target features.
#define ANYATTN_ISA(id, isa, arch, check, fwd_name, lanes, rows, keys, direct_rows,         \
                    bwd_name)                                                               \
  ANYATTN_IF_ARCH_##arch(BwdKernel{isa, bwd_name, &bwd_##id::row_dots, &bwd_##id::bwd_task, \
                                   &bwd_##id::reduce_dq, &bwd_##id::reduce_dkv,             \
                                   &bwd_##id::bwd_copies}, )
const BwdKernel kBwdKernels[] = {
#include "cpu/isa_table.inc"
};
#undef ANYATTN_ISA

const BwdKernel* find_bwd_kernel(anyattn_isa isa) {
  for (const BwdKernel& kernel : kBwdKernels) {
    if (kernel.isa == isa) return &kernel;
  }
  return nullptr;
}

// Writes exact zeros to dk and dv of every sequence's keys that no query attends: those beyond
// seqused_k (unused_only, varlen), or all of them (a call without query heads). A gradient
// without columns (D or Dv = 0) is not addressed.
void zero_key_gradients(const BwdArgs& args, const runtime::PoolLease& lease, bool unused_only) {
  const FwdArgs& f = args.fwd;
  lease.run_each(f.batch * f.heads_k, [&](int64_t t, int) {
    const int64_t b = t / f.heads_k;
    const int64_t head_k = t % f.heads_k;
    const SeqInfo seq = sequence_info(f, b);
    const int64_t available =
        f.cu_seqlens_k != nullptr ? f.cu_seqlens_k[b + 1] - f.cu_seqlens_k[b] : seq.seqlen_k;
    for (int64_t j = unused_only ? seq.seqlen_k : 0; j < available; ++j) {
      if (f.head_dim > 0) {
        void* dk = element_address(args.dk, f.dtype,
                                   key_row_offset(f, seq, j, head_k, args.dk_batch_stride,
                                                  args.dk_row_stride, args.dk_head_stride));
        for (int64_t c = 0; c < f.head_dim; ++c) store_element(dk, f.dtype, c, 0.f);
      }
      if (f.head_dim_v > 0) {
        void* dv = element_address(args.dv, f.dtype,
                                   key_row_offset(f, seq, j, head_k, args.dv_batch_stride,
                                                  args.dv_row_stride, args.dv_head_stride));
        for (int64_t c = 0; c < f.head_dim_v; ++c) store_element(dv, f.dtype, c, 0.f);
      }
    }
  });
}

// sum_b sum_i exp(sink_h - lse_bhi) delta_bhi over the query rows of head h, or over those that
// see no key (keyless_only), in a fixed order in f64: dsink_h is minus the sum over all rows.
double sink_row_terms(const FwdArgs& f, const std::vector<BwdSeq>& seqs, const float* delta,
                      int64_t h, bool keyless_only) {
  const double sink = ScoreModifiers::of(f).sink(h);
  double sum = 0.0;
  for (const BwdSeq& s : seqs) {
    const Mask mask(f, s.seq);
    for (int64_t i = 0; i < s.seq.seqlen_q; ++i) {
      if (keyless_only && !mask.visible_keys(i, i + 1).empty()) continue;
      const double lse = f.lse[s.seq.lse_offset + h * f.lse_head_stride + i * f.lse_row_stride];
      sum += std::exp(sink - lse) * delta[s.row_first + h * s.seq.seqlen_q + i];
    }
  }
  return sum;
}

}  // namespace

const char* bwd_kernel_name(anyattn_isa isa) {
  const BwdKernel* kernel = find_bwd_kernel(isa);
  return kernel == nullptr ? nullptr : kernel->name;
}

void run_bwd(const BwdArgs& args, anyattn_isa isa) {
  const FwdArgs& f = args.fwd;
  if (f.batch == 0) {
    for (int64_t h = 0; args.dsinks != nullptr && h < f.heads_q; ++h) {
      args.dsinks[h * args.dsinks_stride] = 0.f;  // an empty sum
    }
    return;
  }
  if (f.heads_q == 0) {  // no query attends to any key: dk = dv = 0 (dq and dsinks are empty)
    zero_key_gradients(args, runtime::acquire_pool(runtime::get_num_threads()), false);
    return;
  }
  if (f.head_dim == 0 || f.head_dim_v == 0) {
    UnitHeadDimsScratch scratch;
    run_bwd(with_unit_head_dims(args, &scratch), isa);
    return;
  }
  const BwdKernel* kernel = find_bwd_kernel(isa);
  plan::BwdPlan plan = plan::make_bwd_plan(args, kernel->bwd_copies(f));
  const std::vector<BwdSeq>& seqs = plan.seqs;

  // dsinks: from delta = <dout, out>, or in bf16 and f16 calls of the own forward from the tiles
  // (tile_gradients: one f64 term per task and query head of its group), where out's rounding
  // would otherwise be the largest error of every term.
  const bool sinks_from_tiles =
      args.dsinks != nullptr && args.own_forward && f.dtype != DType::kF32;
  const int64_t group = f.group_size();
  std::vector<double> sink_terms(sinks_from_tiles ? plan.tasks.size() * group : 0, 0.0);
  std::vector<double> sink_sums(sinks_from_tiles ? f.heads_q : 0, 0.0);

  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  const int64_t scratch_floats = plan.layout.scratch_floats();
  runtime::AlignedBuffer<float> owned;
  float* const workspace = runtime::reserve_workspace(
      plan.delta_floats + plan.partial_floats + plan.dkv_partial_floats +
          lease.num_threads() * scratch_floats,
      lease, &owned);
  float* delta = workspace;
  float* partial_base = plan.partial_floats > 0 ? workspace + plan.delta_floats : nullptr;
  float* dkv_partial_base =
      plan.dkv_partial_floats > 0 ? workspace + plan.delta_floats + plan.partial_floats : nullptr;
  float* scratch =
      workspace + plan.delta_floats + plan.partial_floats + plan.dkv_partial_floats;
  plan.bind_partials(partial_base, dkv_partial_base);

  // Every allocation is done; from here on outputs are written.
  lease.run_each(f.batch * f.heads_q, [&](int64_t t, int) {
    const BwdSeq& s = seqs[t / f.heads_q];
    const int64_t h = t % f.heads_q;
    kernel->row_dots(args, s, h, delta + s.row_first + h * s.seq.seqlen_q);
  });
  if (args.dsinks != nullptr && !sinks_from_tiles) {
    lease.run_each(f.heads_q, [&](int64_t h, int) {
      args.dsinks[h * args.dsinks_stride] =
          static_cast<float>(-sink_row_terms(f, seqs, delta, h, false));
    });
  }
  lease.run_each(static_cast<int64_t>(plan.tasks.size()), [&](int64_t t, int worker) {
    kernel->bwd_task(args, plan.layout, plan.tasks[static_cast<size_t>(t)], delta,
                     sinks_from_tiles ? sink_terms.data() + t * group : nullptr,
                     scratch + worker * scratch_floats);
  });
  if (sinks_from_tiles) {
    // dsink_h = -(the terms of its rows that see no key, which no tile has, from delta as above,
    // then its tasks' terms in task order): a fixed order in f64.
    lease.run_each(f.heads_q, [&](int64_t h, int) {
      sink_sums[static_cast<size_t>(h)] = sink_row_terms(f, seqs, delta, h, true);
    });
    for (size_t t = 0; t < plan.tasks.size(); ++t) {
      const BwdTask& task = plan.tasks[t];
      for (int64_t g = task.group_begin; g < task.group_end; ++g) {
        sink_sums[static_cast<size_t>(task.head_k * group + g)] +=
            sink_terms[t * static_cast<size_t>(group) + static_cast<size_t>(g)];
      }
    }
    for (int64_t h = 0; h < f.heads_q; ++h) {
      args.dsinks[h * args.dsinks_stride] = static_cast<float>(-sink_sums[static_cast<size_t>(h)]);
    }
  }
  // dq of sequences with several chunks (or none: no keys, so dq = 0).
  lease.run_each(f.batch * f.heads_q, [&](int64_t t, int) {
    const BwdSeq& s = seqs[t / f.heads_q];
    const int64_t seq_chunks = plan.chunks_of(s);
    if (seq_chunks != 1) {
      kernel->reduce_dq(args, plan.layout, s, t % f.heads_q, partial_base, plan.chunk_stride,
                        seq_chunks);
    }
  });
  // dk and dv of calls with several head splits, for every (sequence, kv head) with keys.
  if (plan.layout.head_splits > 1) {
    lease.run_each(f.batch * f.heads_k, [&](int64_t t, int) {
      const BwdSeq& s = seqs[t / f.heads_k];
      if (plan.chunks_of(s) > 0) {
        kernel->reduce_dkv(args, plan.layout, s, t % f.heads_k, dkv_partial_base,
                           plan.head_split_stride);
      }
    });
  }
  if (f.cu_seqlens_k != nullptr && f.seqlens_k != nullptr) {
    // Varlen keys beyond seqused_k take no part in attention: their gradients are exact zeros.
    zero_key_gradients(args, lease, true);
  }
}

}  // namespace anyattn::cpu
