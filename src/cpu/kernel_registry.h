// The registry of CPU forward kernels: one entry per instruction-set path compiled into this build,
// from isa_table.inc, and the names of every path. The dispatcher (plan/), the tests and the
// benchmark all enumerate this one list.
#ifndef ANYATTN_CPU_KERNEL_REGISTRY_H_
#define ANYATTN_CPU_KERNEL_REGISTRY_H_

#include <cstdint>
#include <string>

#include "anyattn/anyattn.h"
#include "common/fwd_args.h"
#include "plan/fwd_layout.h"

namespace anyattn::cpu {

// Packs key block `block` of sequence `seq`, kv head `head_k`, into `dst`
// (PackedLayout::block_floats floats, 64-byte aligned, in the path's own packed format) and sets
// *block_flags to what it found (kBlockVNonfinite, kBlockSubnormal, kBlockValuePairs; 0 for
// none). `staging`: the calling thread's Scratch::staging (Scratch::staging_floats(layout, 1)
// floats).
using PackBlockFn = void (*)(const FwdArgs& args, const PackedLayout& layout, const SeqInfo& seq,
                             int64_t head_k, int64_t block, float* dst, uint8_t* block_flags,
                             float* staging);

// Runs one AttendTask with the given scratch. Writes only the task's own rows of out/lse (or of
// its partial output).
using AttendFn = void (*)(const FwdArgs& args, const PackedLayout& layout, const AttendTask& task,
                          const Scratch& scratch);

struct FwdKernel {
  anyattn_isa isa;
  const char* name;  // e.g. "fwd_f32acc_avx512_6x64": ISA, then the score tile rows x keys
  int vector_lanes;  // floats per vector register
  int tile_rows;     // query rows per micro-kernel tile
  int tile_keys;     // keys per micro-kernel tile
  int direct_rows;   // most query rows per kv head that attend_direct takes (isa_table.inc)
  bool (*cpu_supports)();
  PackBlockFn pack_block;
  AttendFn attend;         // packed K/V, or streaming tasks that pack their own blocks
  AttendFn attend_direct;  // streaming tasks of at most direct_rows rows per kv head
};

// Every kernel compiled into this build, whether or not the CPU can run it.
const FwdKernel* fwd_kernels_begin();
const FwdKernel* fwd_kernels_end();

// The kernel for `isa` if compiled in and runnable on this CPU, else nullptr.
const FwdKernel* find_fwd_kernel(anyattn_isa isa);
// The fastest runnable path (ANYATTN_ISA_PORTABLE at worst).
anyattn_isa best_supported_isa();
// ANYATTN_ISA_PORTABLE -> "portable" etc. (ANYATTN_ISA_AUTO -> "auto"); "unknown" for a value that
// names no path. Static storage.
const char* isa_name(anyattn_isa isa);
// "portable" -> ANYATTN_ISA_PORTABLE etc.; ANYATTN_ISA_AUTO for an unknown name.
anyattn_isa isa_from_name(const char* name);
// True if `value` is ANYATTN_ISA_AUTO or a path's anyattn_isa value (compiled in or not).
bool is_isa_value(int32_t value);
// "ANYATTN_ISA_AUTO (0), ANYATTN_ISA_PORTABLE (1), ...": every value, for error messages.
std::string isa_value_list();
// "auto, portable, avx2, ...": every name ANYATTN_ISA accepts, for error messages.
std::string isa_name_list();
// Comma-separated names of the runnable paths, e.g. "portable, avx2, avx512".
std::string supported_isa_list();

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_KERNEL_REGISTRY_H_
