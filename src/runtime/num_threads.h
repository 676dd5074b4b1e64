// The process-wide thread count: set by anyattn_set_num_threads, else ANYATTN_NUM_THREADS, else
// the number of CPUs in the process's affinity mask.
#ifndef ANYATTN_RUNTIME_NUM_THREADS_H_
#define ANYATTN_RUNTIME_NUM_THREADS_H_

namespace anyattn::runtime {

// Upper bound on any thread count the library uses.
constexpr int kMaxThreads = 1024;

// n <= 0 restores the default. Values above kMaxThreads are clamped.
void set_num_threads(int n);
// Always >= 1.
int get_num_threads();
// The default without any override: ANYATTN_NUM_THREADS or the affinity mask, >= 1.
int default_num_threads();

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_NUM_THREADS_H_
