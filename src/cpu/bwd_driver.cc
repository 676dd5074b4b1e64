#include "cpu/bwd_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "cpu/bwd_layout.h"
#include "runtime/aligned_buffer.h"
#include "runtime/num_threads.h"
#include "runtime/thread_pool.h"

namespace anyattn::cpu {

#define ANYATTN_BWD_KERNEL(ns, isa, name)                                                     \
  namespace ns {                                                                              \
  void row_dots(const BwdArgs& args, int64_t b, int64_t h, float* delta);                     \
  void dkdv_task(const BwdArgs& args, const BwdLayout& layout, const float* delta, int64_t b, \
                 int64_t head_k, int64_t key_block, float* scratch);                          \
  void dq_task(const BwdArgs& args, const BwdLayout& layout, const float* delta, int64_t b,   \
               int64_t h, int64_t q_block, float* scratch);                                   \
  }
#include "cpu/bwd_kernels.inc"
#undef ANYATTN_BWD_KERNEL

namespace {

struct BwdKernel {
  anyattn_isa isa;
  const char* name;
  decltype(&bwd_portable::row_dots) row_dots;
  decltype(&bwd_portable::dkdv_task) dkdv_task;
  decltype(&bwd_portable::dq_task) dq_task;
};

#define ANYATTN_BWD_KERNEL(ns, isa, name) \
  BwdKernel{isa, name, &ns::row_dots, &ns::dkdv_task, &ns::dq_task},
const BwdKernel kBwdKernels[] = {
#include "cpu/bwd_kernels.inc"
};
#undef ANYATTN_BWD_KERNEL

const BwdKernel* find_bwd_kernel(anyattn_isa isa) {
  for (const BwdKernel& kernel : kBwdKernels) {
    if (kernel.isa == isa) return &kernel;
  }
  return nullptr;
}

// Task indices sorted by decreasing cost (stable), so the longest tasks start first and the
// threads finish close together; causal costs differ by up to S/64x between blocks.
std::vector<int64_t> longest_first(const std::vector<int64_t>& costs) {
  std::vector<int64_t> order(costs.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return costs[a] > costs[b]; });
  return order;
}

// Number of 64-row blocks overlapping [first, last] (0 when empty).
int64_t blocks_between(int64_t first, int64_t last) {
  return first > last ? 0 : last / kBwdBlock - first / kBwdBlock + 1;
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
  const BwdKernel* kernel = find_bwd_kernel(isa);
  const BwdLayout layout = BwdLayout::for_args(args);
  const runtime::PoolLease lease = runtime::acquire_pool(runtime::get_num_threads());
  const int64_t scratch_floats = layout.scratch_floats();
  const int64_t delta_floats = (f.batch * f.heads_q * f.seqlen_q + 15) / 16 * 16;
  runtime::AlignedBuffer<float> workspace(delta_floats + lease.num_threads() * scratch_floats);
  float* delta = workspace.get();
  float* scratch = workspace.get() + delta_floats;

  const int64_t offset = f.seqlen_k - f.seqlen_q;
  std::vector<int64_t> dkdv_costs(static_cast<size_t>(f.batch * f.heads_k * layout.num_key_blocks));
  for (size_t t = 0; t < dkdv_costs.size(); ++t) {
    const int64_t j0 = static_cast<int64_t>(t) % layout.num_key_blocks * kBwdBlock;
    const int64_t j_last = std::min(f.seqlen_k - 1, j0 + kBwdBlock - 1);
    dkdv_costs[t] = blocks_between(std::max<int64_t>(0, j0 - offset - f.window_right),
                                   std::min(f.seqlen_q - 1, j_last - offset + f.window_left));
  }
  std::vector<int64_t> dq_costs(static_cast<size_t>(f.batch * f.heads_q * layout.num_q_blocks));
  for (size_t t = 0; t < dq_costs.size(); ++t) {
    const int64_t i0 = static_cast<int64_t>(t) % layout.num_q_blocks * kBwdBlock;
    const int64_t i_last = std::min(f.seqlen_q - 1, i0 + kBwdBlock - 1);
    dq_costs[t] = blocks_between(std::max<int64_t>(0, i0 + offset - f.window_left),
                                 std::min(f.seqlen_k - 1, i_last + offset + f.window_right));
  }
  const std::vector<int64_t> dkdv_order = longest_first(dkdv_costs);
  const std::vector<int64_t> dq_order = longest_first(dq_costs);

  // Every allocation is done; from here on outputs are written.
  lease.run_each(f.batch * f.heads_q, [&](int64_t t, int) {
    kernel->row_dots(args, t / f.heads_q, t % f.heads_q, delta + t * f.seqlen_q);
  });
  if (args.dsinks != nullptr) {
    // dsink_h = -sum_b sum_i exp(sink_h - lse_bhi) delta_bhi, summed in a fixed order in f64.
    lease.run_each(f.heads_q, [&](int64_t h, int) {
      const double sink = f.sinks[h * f.sinks_stride];
      double sum = 0.0;
      for (int64_t b = 0; b < f.batch; ++b) {
        for (int64_t i = 0; i < f.seqlen_q; ++i) {
          const double lse =
              f.lse[b * f.lse_batch_stride + h * f.lse_head_stride + i * f.lse_row_stride];
          sum += std::exp(sink - lse) * delta[(b * f.heads_q + h) * f.seqlen_q + i];
        }
      }
      args.dsinks[h * args.dsinks_stride] = static_cast<float>(-sum);
    });
  }
  lease.run_each(static_cast<int64_t>(dkdv_order.size()), [&](int64_t t, int worker) {
    const int64_t task = dkdv_order[static_cast<size_t>(t)];
    const int64_t key_block = task % layout.num_key_blocks;
    const int64_t pair = task / layout.num_key_blocks;
    kernel->dkdv_task(args, layout, delta, pair / f.heads_k, pair % f.heads_k, key_block,
                      scratch + worker * scratch_floats);
  });
  lease.run_each(static_cast<int64_t>(dq_order.size()), [&](int64_t t, int worker) {
    const int64_t task = dq_order[static_cast<size_t>(t)];
    const int64_t q_block = task % layout.num_q_blocks;
    const int64_t pair = task / layout.num_q_blocks;
    kernel->dq_task(args, layout, delta, pair / f.heads_q, pair % f.heads_q, q_block,
                    scratch + worker * scratch_floats);
  });
}

}  // namespace anyattn::cpu
