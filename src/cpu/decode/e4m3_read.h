// Which e4m3 read the direct decode loop uses for a call (fwd_decode_kernel-inl.h, E4m3Read):
// the f32-bits read (values times 2^-120, three integer instructions) or the read through f16
// (values times 2^-8). The bits read turns every code below 2^-6 into an f32 subnormal, which
// AMD cores multiply at full speed but Intel cores only through a microcode assist per instruction
// (measured: bench/MEASUREMENTS.md, "e4m3 keys as f32 subnormals on an Intel Xeon"). Both reads
// give the same results.
#ifndef ANYATTN_CPU_DECODE_E4M3_READ_H_
#define ANYATTN_CPU_DECODE_E4M3_READ_H_

namespace anyattn::cpu {

// True when the direct loop reads e4m3 rows as f32 bits: on CPUs that take f32 subnormal
// operands at full speed (runtime::CpuFeatures::fast_subnormal_operands), unless the tests chose
// a read (set_e4m3_read_for_tests). Paths whose bits read is the f16 read ignore it.
bool e4m3_reads_as_f32_bits();

// For the tests: kCpuDefault restores the choice above; the others force a read on any CPU.
enum class E4m3ReadChoice { kCpuDefault, kF32Bits, kViaHalf };
void set_e4m3_read_for_tests(E4m3ReadChoice choice);

}  // namespace anyattn::cpu

#endif  // ANYATTN_CPU_DECODE_E4M3_READ_H_
