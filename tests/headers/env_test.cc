// Checks that the library honours its environment variables. Run by ctest with the variable set
// (see tests/CMakeLists.txt):
//   anyattn_env_test threads N        ANYATTN_NUM_THREADS=N gives N threads, also after
//                                     anyattn_set_num_threads(0) restores the default.
//   anyattn_env_test threads default  an invalid ANYATTN_NUM_THREADS is ignored: the default is
//                                     the number of CPUs in the process's affinity mask.
//   anyattn_env_test isa NAME         ANYATTN_ISA=NAME makes ANYATTN_ISA_AUTO resolve to NAME:
//                                     anyattn_isa_default() says so, and a forward call with
//                                     ANYATTN_ISA_AUTO gives the bits of one forced to NAME.
// Exits 0 on success; prints the mismatch and exits 1 otherwise.
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "anyattn/anyattn.h"

namespace {

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return CPU_COUNT(&set);
}

int expect_threads(int expected) {
  const int initial = anyattn_get_num_threads();
  anyattn_set_num_threads(expected == 1 ? 2 : 1);  // Something else...
  anyattn_set_num_threads(0);                      // ...then back to the default.
  const int restored = anyattn_get_num_threads();
  if (initial != expected || restored != expected) {
    std::fprintf(stderr, "expected %d threads; got %d at start, %d after set_num_threads(0)\n",
                 expected, initial, restored);
    return 1;
  }
  return 0;
}

// Runs a small f32 forward problem (B=1, Sq=37, Sk=129, Hq=Hk=2, D=Dv=64) on `isa` and returns
// out followed by lse.
std::vector<float> run_forward(anyattn_isa isa) {
  const int64_t q_shape[4] = {1, 37, 2, 64}, kv_shape[4] = {1, 129, 2, 64};
  const int64_t lse_shape[3] = {1, 2, 37};
  std::vector<float> q(37 * 2 * 64), k(129 * 2 * 64), v(129 * 2 * 64), out(q.size()), lse(74);
  uint32_t state = 7;
  for (std::vector<float>* t : {&q, &k, &v}) {
    for (float& x : *t) {
      state = state * 1664525u + 1013904223u;
      x = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
    }
  }
  anyattn_tensor tq, tk, tv, tout, tlse;
  anyattn_tensor_init_contiguous(&tq, q.data(), ANYATTN_DTYPE_F32, 4, q_shape);
  anyattn_tensor_init_contiguous(&tk, k.data(), ANYATTN_DTYPE_F32, 4, kv_shape);
  anyattn_tensor_init_contiguous(&tv, v.data(), ANYATTN_DTYPE_F32, 4, kv_shape);
  anyattn_tensor_init_contiguous(&tout, out.data(), ANYATTN_DTYPE_F32, 4, q_shape);
  anyattn_tensor_init_contiguous(&tlse, lse.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.isa = isa;
  if (anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, &params) != ANYATTN_OK) {
    std::fprintf(stderr, "anyattn_fwd on %s failed: %s\n", anyattn_isa_name(isa),
                 anyattn_last_error());
    return {};
  }
  out.insert(out.end(), lse.begin(), lse.end());
  return out;
}

int expect_isa(const char* name) {
  int failures = 0;
  const char* got = anyattn_isa_name(anyattn_isa_default());
  if (std::strcmp(got, name) != 0) {
    std::fprintf(stderr, "expected anyattn_isa_default() = %s; got %s\n", name, got);
    ++failures;
  }
  anyattn_isa forced = ANYATTN_ISA_AUTO;
  for (anyattn_isa isa :
       {ANYATTN_ISA_PORTABLE, ANYATTN_ISA_AVX2, ANYATTN_ISA_AVX512, ANYATTN_ISA_AVX512_AMX,
        ANYATTN_ISA_NEON}) {
    if (std::strcmp(anyattn_isa_name(isa), name) == 0) forced = isa;
  }
  const std::vector<float> automatic = run_forward(ANYATTN_ISA_AUTO);
  const std::vector<float> named = run_forward(forced);
  if (automatic.empty() || automatic != named) {
    std::fprintf(stderr, "a forward call with ANYATTN_ISA_AUTO did not run the %s path\n", name);
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s threads N|default | isa NAME\n", argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "threads") == 0) {
    const bool use_default = std::strcmp(argv[2], "default") == 0;
    return expect_threads(use_default ? affinity_cpus() : std::atoi(argv[2]));
  }
  if (std::strcmp(argv[1], "isa") == 0) return expect_isa(argv[2]);
  std::fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
