#include "runtime/num_threads.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

namespace anyattn::runtime {
namespace {

std::atomic<int> g_override{0};

int cpus_in_affinity_mask() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return count;
  }
#endif
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

// A positive integer from ANYATTN_NUM_THREADS, or 0 when unset or malformed.
int threads_from_environment() {
  const char* text = std::getenv("ANYATTN_NUM_THREADS");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value <= 0) return 0;
  return static_cast<int>(std::min<long>(value, kMaxThreads));
}

}  // namespace

int default_num_threads() {
  static const int computed = [] {
    const int from_env = threads_from_environment();
    return from_env > 0 ? from_env : std::min(cpus_in_affinity_mask(), kMaxThreads);
  }();
  return computed;
}

void set_num_threads(int n) { g_override.store(n <= 0 ? 0 : std::min(n, kMaxThreads)); }

int get_num_threads() {
  const int n = g_override.load();
  return n > 0 ? n : default_num_threads();
}

}  // namespace anyattn::runtime
