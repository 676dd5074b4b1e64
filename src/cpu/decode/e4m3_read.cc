#include "cpu/decode/e4m3_read.h"

#include <atomic>

#include "runtime/cpu_features.h"

namespace anyattn::cpu {
namespace {

std::atomic<E4m3ReadChoice> g_choice{E4m3ReadChoice::kCpuDefault};

}  // namespace

bool e4m3_reads_as_f32_bits() {
  switch (g_choice.load(std::memory_order_relaxed)) {
    case E4m3ReadChoice::kF32Bits:
      return true;
    case E4m3ReadChoice::kViaHalf:
      return false;
    case E4m3ReadChoice::kCpuDefault:
    default:
      return runtime::cpu_features().fast_subnormal_operands;
  }
}

void set_e4m3_read_for_tests(E4m3ReadChoice choice) {
  g_choice.store(choice, std::memory_order_relaxed);
}

}  // namespace anyattn::cpu
