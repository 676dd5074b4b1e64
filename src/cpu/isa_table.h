// Reading isa_table.inc: ANYATTN_IF_ARCH_<arch>(...) expands to its arguments where a row of that
// arch compiles and to nothing elsewhere, so a registry built from the table names only the
// kernels this build contains, while the name table covers every path.
#ifndef ANYATTN_CPU_ISA_TABLE_H_
#define ANYATTN_CPU_ISA_TABLE_H_

#define ANYATTN_IF_ARCH_ANY(...) __VA_ARGS__
#if defined(__x86_64__) || defined(_M_X64)
#define ANYATTN_IF_ARCH_X86(...) __VA_ARGS__
#else
#define ANYATTN_IF_ARCH_X86(...)
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
#define ANYATTN_IF_ARCH_ARM(...) __VA_ARGS__
#else
#define ANYATTN_IF_ARCH_ARM(...)
#endif

#endif  // ANYATTN_CPU_ISA_TABLE_H_
