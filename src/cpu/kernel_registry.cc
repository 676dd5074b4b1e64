#include "cpu/kernel_registry.h"

#include <cstring>

#include "runtime/cpu_features.h"

namespace anyattn::cpu {

#define ANYATTN_FWD_KERNEL(ns, isa, name, lanes, rows, keys, check)                           \
  namespace ns {                                                                              \
  void pack_block(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,        \
                  int64_t head_k, int64_t block, float* dst, uint8_t* block_flags);           \
  void attend(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,        \
              const Scratch& scratch);                                                        \
  void attend_direct(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task, \
                     const Scratch& scratch);                                                 \
  bool cpu_supports() {                                                                       \
    const runtime::CpuFeatures& features = runtime::cpu_features();                           \
    (void)features;                                                                           \
    return check;                                                                             \
  }                                                                                           \
  }
#include "cpu/kernels.inc"
#undef ANYATTN_FWD_KERNEL

namespace {

#define ANYATTN_FWD_KERNEL(ns, isa, name, lanes, rows, keys, check) \
  FwdKernel{isa,                                                    \
            name,                                                   \
            lanes,                                                  \
            rows,                                                   \
            keys,                                                   \
            &ns::cpu_supports,                                      \
            &ns::pack_block,                                        \
            &ns::attend,                                            \
            &ns::attend_direct},
const FwdKernel kKernels[] = {
#include "cpu/kernels.inc"
};
#undef ANYATTN_FWD_KERNEL

}  // namespace

const FwdKernel* fwd_kernels_begin() { return kKernels; }
const FwdKernel* fwd_kernels_end() { return kKernels + sizeof(kKernels) / sizeof(kKernels[0]); }

const FwdKernel* find_fwd_kernel(anyattn_isa isa) {
  for (const FwdKernel* kernel = fwd_kernels_begin(); kernel != fwd_kernels_end(); ++kernel) {
    if (kernel->isa == isa) return kernel->cpu_supports() ? kernel : nullptr;
  }
  return nullptr;
}

anyattn_isa best_supported_isa() {
  anyattn_isa best = ANYATTN_ISA_PORTABLE;
  for (const FwdKernel* kernel = fwd_kernels_begin(); kernel != fwd_kernels_end(); ++kernel) {
    if (kernel->cpu_supports()) best = kernel->isa;
  }
  return best;
}

anyattn_isa isa_from_name(const char* name) {
  for (anyattn_isa isa :
       {ANYATTN_ISA_PORTABLE, ANYATTN_ISA_AVX2, ANYATTN_ISA_AVX512, ANYATTN_ISA_AVX512_AMX}) {
    if (std::strcmp(name, anyattn_isa_name(isa)) == 0) return isa;
  }
  return ANYATTN_ISA_AUTO;
}

std::string supported_isa_list() {
  std::string list;
  for (const FwdKernel* kernel = fwd_kernels_begin(); kernel != fwd_kernels_end(); ++kernel) {
    if (!kernel->cpu_supports()) continue;
    if (!list.empty()) list += ", ";
    list += anyattn_isa_name(kernel->isa);
  }
  return list;
}

}  // namespace anyattn::cpu
