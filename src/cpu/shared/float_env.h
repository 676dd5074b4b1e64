// The floating-point environment a kernel needs, set for a scope and then given back.
#ifndef ANYATTN_CPU_SHARED_FLOAT_ENV_H_
#define ANYATTN_CPU_SHARED_FLOAT_ENV_H_

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace anyattn::cpu {

// Subnormal f32 operands read as themselves for the scope's lifetime, for loops whose operands
// are subnormal by construction rather than by the caller's data (the direct decode loop's e4m3
// values times 2^-120). Where the calling thread has MXCSR.DAZ set (denormals are zero: set by
// -ffast-math start-up code and by torch.set_flush_denormal(True)), the constructor clears it and
// the destructor sets it again; the exception flags raised meanwhile stay raised. It reads MXCSR
// once, and writes it only where DAZ was set. Elsewhere it does nothing: the paths that build such
// operands are x86 ones.
class SubnormalOperandsScope {
 public:
#if defined(__x86_64__) || defined(__i386__)
  SubnormalOperandsScope() : caller_csr_(_mm_getcsr()) {
    if (caller_csr_ & kDenormalsAreZero) _mm_setcsr(caller_csr_ & ~kDenormalsAreZero);
  }
  ~SubnormalOperandsScope() {
    if (caller_csr_ & kDenormalsAreZero) _mm_setcsr(_mm_getcsr() | kDenormalsAreZero);
  }
#else
  SubnormalOperandsScope() = default;
#endif
  SubnormalOperandsScope(const SubnormalOperandsScope&) = delete;
  SubnormalOperandsScope& operator=(const SubnormalOperandsScope&) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kDenormalsAreZero = 1u << 6;
  unsigned caller_csr_;
#endif
};

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_SHARED_FLOAT_ENV_H_
