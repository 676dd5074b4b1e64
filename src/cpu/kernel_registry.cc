#include "cpu/kernel_registry.h"

#include <cstring>

#include "cpu/isa_table.h"
#include "runtime/cpu_features.h"

namespace anyattn::cpu {

// The forward kernels of every path this build compiles, declared from the ISA table, with the
// path's run-time check.
#define ANYATTN_ISA(id, isa, arch, check, fwd_name, lanes, rows, keys, direct_rows,      \
                    bwd_name)                                                            \
  ANYATTN_IF_ARCH_##arch(namespace id {                                                  \
    void pack_block(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq, \
                    int64_t head_k, int64_t block, float* dst, uint8_t* block_flags,     \
                    float* staging);                                                     \
    void attend(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task, \
                const Scratch& scratch);                                                 \
    void attend_direct(const FwdArgs& args, const PackedLayout& layout,                  \
                       const AttendTask& task, const Scratch& scratch);                  \
    bool cpu_supports() {                                                                \
      const runtime::CpuFeatures& features = runtime::cpu_features();                    \
      (void)features;                                                                    \
      return check;                                                                      \
    }                                                                                    \
  })
#include "cpu/isa_table.inc"
#undef ANYATTN_ISA

namespace {

#define ANYATTN_ISA(id, isa, arch, check, fwd_name, lanes, rows, keys, direct_rows, bwd_name) \
  ANYATTN_IF_ARCH_##arch(FwdKernel{isa, fwd_name, lanes, rows, keys, direct_rows,             \
                                   &id::cpu_supports, &id::pack_block, &id::attend,           \
                                   &id::attend_direct}, )
const FwdKernel kKernels[] = {
#include "cpu/isa_table.inc"
};
#undef ANYATTN_ISA

// A direct task holds all its kv heads' rows in the scratch rows of one task.
#define ANYATTN_ISA(id, isa, arch, check, fwd_name, lanes, rows, keys, direct_rows, bwd_name) \
  static_assert(direct_rows >= 1 && direct_rows <= kMaxQBlockRows,                            \
                #id ": direct tasks must fit the scratch rows");
#include "cpu/isa_table.inc"
#undef ANYATTN_ISA

// Every path's name, compiled in or not, in enum order.
struct IsaName {
  anyattn_isa isa;
  const char* enumerator;  // "ANYATTN_ISA_AVX2"
  const char* name;        // "avx2"
};
#define ANYATTN_ISA(id, isa, ...) IsaName{isa, #isa, #id},
constexpr IsaName kIsaNames[] = {
#include "cpu/isa_table.inc"
};
#undef ANYATTN_ISA

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

const char* isa_name(anyattn_isa isa) {
  if (isa == ANYATTN_ISA_AUTO) return "auto";
  for (const IsaName& entry : kIsaNames) {
    if (entry.isa == isa) return entry.name;
  }
  return "unknown";
}

anyattn_isa isa_from_name(const char* name) {
  for (const IsaName& entry : kIsaNames) {
    if (std::strcmp(name, entry.name) == 0) return entry.isa;
  }
  return ANYATTN_ISA_AUTO;
}

bool is_isa_value(int32_t value) {
  if (value == ANYATTN_ISA_AUTO) return true;
  for (const IsaName& entry : kIsaNames) {
    if (entry.isa == value) return true;
  }
  return false;
}

std::string isa_value_list() {
  std::string list = "ANYATTN_ISA_AUTO (0)";
  for (const IsaName& entry : kIsaNames) {
    list += ", ";
    list += entry.enumerator;
    list += " (" + std::to_string(static_cast<int>(entry.isa)) + ")";
  }
  return list;
}

std::string isa_name_list() {
  std::string list = "auto";
  for (const IsaName& entry : kIsaNames) {
    list += ", ";
    list += entry.name;
  }
  return list;
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
