// anyattn._core.use_host_openmp: runs the library's parallel phases on the OpenMP team of the
// process's already loaded OpenMP runtime (the one torch loaded), through
// anyattn_set_host_parallel.
//
// torch's OpenMP workers spin on their cores for a while after each parallel op. The library's own
// pool would then compete with them for the cores: a decode step right after a matmul ran at half
// speed on two cores (bench/torch_omp_spin.py). Run as an OpenMP parallel region, the call is
// taken up by those very threads. The runtime is found among the loaded objects (libgomp,
// LLVM's libomp or Intel's libiomp5, each of which provides GOMP_parallel), never loaded here:
// without torch there is nothing to share, and the pool stays.
#include "host_openmp.h"

#include <nanobind/nanobind.h>

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#endif

#include <cstring>
#include <string>

#include "anyattn/anyattn.h"

namespace nb = nanobind;

namespace {

// libgomp's entry for `#pragma omp parallel num_threads(n)`: runs fn(data) on a team of up to n
// threads (one when nested), the caller among them, and returns when all have.
using GompParallelFn = void (*)(void (*fn)(void*), void* data, unsigned num_threads,
                                unsigned flags);
using OmpThreadNumFn = int (*)();

GompParallelFn g_gomp_parallel = nullptr;
OmpThreadNumFn g_omp_get_thread_num = nullptr;
std::string g_runtime_path;  // the runtime's file, for use_host_openmp's report

struct Region {
  anyattn_parallel_body body;
  void* context;
};

void run_region(void* data) {
  const Region& region = *static_cast<const Region*>(data);
  region.body(region.context, g_omp_get_thread_num());
}

void host_parallel(int threads, anyattn_parallel_body body, void* context) {
  Region region{body, context};
  g_gomp_parallel(&run_region, &region, static_cast<unsigned>(threads), 0);
}

#if defined(__linux__)
// The path of the first loaded object whose file name names an OpenMP runtime.
int find_runtime(dl_phdr_info* info, size_t, void* found) {
  const char* path = info->dlpi_name;
  if (path == nullptr || *path == '\0') return 0;
  const char* name = std::strrchr(path, '/');
  name = name == nullptr ? path : name + 1;
  for (const char* prefix : {"libgomp", "libomp", "libiomp5"}) {
    if (std::strncmp(name, prefix, std::strlen(prefix)) == 0) {
      *static_cast<std::string*>(found) = path;
      return 1;
    }
  }
  return 0;
}

// Binds g_gomp_parallel and g_omp_get_thread_num to the loaded runtime; false if there is none.
bool bind_loaded_runtime() {
  if (g_gomp_parallel != nullptr) return true;
  std::string path;
  dl_iterate_phdr(&find_runtime, &path);
  if (path.empty()) return false;
  void* handle = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  auto parallel = reinterpret_cast<GompParallelFn>(dlsym(handle, "GOMP_parallel"));
  auto thread_num = reinterpret_cast<OmpThreadNumFn>(dlsym(handle, "omp_get_thread_num"));
  if (parallel == nullptr || thread_num == nullptr) return false;  // handle kept: never unloaded
  g_omp_get_thread_num = thread_num;
  g_gomp_parallel = parallel;
  g_runtime_path = path;
  return true;
}
#else
bool bind_loaded_runtime() { return false; }
#endif

bool g_in_use = false;  // whether the library's parallel phases run on the loaded runtime

nb::object runtime_in_use() {
  return g_in_use ? nb::object(nb::str(g_runtime_path.c_str())) : nb::none();
}

// A forked child goes back to the library's pool, which restarts its workers there: GNU OpenMP's
// team does not survive fork(), and a region started in the child may wait for threads that only
// the parent has.
void use_pool_after_fork() {
  g_in_use = false;
  anyattn_set_host_parallel(nullptr);
}

// enable: route the library's parallel phases through the loaded OpenMP runtime, if the process
// has one; else (or with enable false) through the library's pool. Returns the runtime's path, or
// None when the pool is in use.
nb::object use_host_openmp(bool enable) {
  g_in_use = enable && bind_loaded_runtime();
  anyattn_set_host_parallel(g_in_use ? &host_parallel : nullptr);
#if defined(__linux__)
  static const bool fork_handler = pthread_atfork(nullptr, nullptr, &use_pool_after_fork) == 0;
  (void)fork_handler;
#endif
  return runtime_in_use();
}

}  // namespace

void register_host_openmp(nb::module_& m) {
  m.def("use_host_openmp", &use_host_openmp, nb::arg("enable"),
        "Run the library's parallel phases on the loaded OpenMP runtime's team (enable=True, if "
        "one is loaded) or on its own pool; returns the runtime's path, or None for the pool.");
  m.def("host_openmp", &runtime_in_use,
        "The path of the OpenMP runtime the library's parallel phases run on, or None (its pool).");
}
