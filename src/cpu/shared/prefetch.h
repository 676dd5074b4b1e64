// Software prefetch hints that the optimiser cannot drop.
//
// GCC may delete a loop whose only statements are __builtin_prefetch calls (a loop without side
// effects may be assumed to terminate, and then nothing observable remains). GCC 12 did so for
// the direct decode kernel's "prefetch this row" loop, called from a hot loop that does have side
// effects: not one of its prefetcht1 reached the library, with no warning. On x86 the hints are
// therefore volatile asm; elsewhere __builtin_prefetch, whose loss costs speed, not results.
#ifndef ANYATTN_CPU_SHARED_PREFETCH_H_
#define ANYATTN_CPU_SHARED_PREFETCH_H_

#include <cstdint>

namespace anyattn::cpu {

// Brings the cache line holding `address` towards L1 (prefetcht0).
inline void prefetch_line_l1(const void* address) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 0, 3);
#endif
}

// Brings the cache line holding `address` towards L2, not L1 (prefetcht1).
inline void prefetch_line_l2(const void* address) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(address)));
#else
  __builtin_prefetch(address, 0, 2);
#endif
}

// prefetch_line_l2 for the loop of a register-tiled kernel whose products keep the loop alive: the
// builtin (prefetcht1 on x86), which GCC cannot drop there and which, unlike the volatile asm,
// lets it keep the tile's accumulator array in registers across the hint (with the asm, GCC 12
// stored all of them to the stack at every hint).
inline void prefetch_line_l2_in_tile(const void* address) {
  __builtin_prefetch(address, 0, 2);
}

// Prefetches every cache line of [address, address + bytes) towards L1.
inline void prefetch_bytes(const void* address, int64_t bytes) {
  const char* p = static_cast<const char*>(address);
  for (int64_t offset = 0; offset < bytes; offset += 64) prefetch_line_l1(p + offset);
}

// Prefetches every cache line of [address, address + bytes) towards L2.
inline void prefetch_bytes_l2(const void* address, int64_t bytes) {
  const char* p = static_cast<const char*>(address);
  for (int64_t offset = 0; offset < bytes; offset += 64) prefetch_line_l2(p + offset);
}

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_SHARED_PREFETCH_H_
