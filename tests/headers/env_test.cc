// Checks that the library honours its environment variables. Run by ctest with the variable set
// (see tests/CMakeLists.txt):
//   anyattn_env_test threads N        ANYATTN_NUM_THREADS=N gives N threads, also after
//                                     anyattn_set_num_threads(0) restores the default.
//   anyattn_env_test threads default  an invalid ANYATTN_NUM_THREADS is ignored: the default is
//                                     the number of CPUs in the process's affinity mask.
//   anyattn_env_test isa NAME         ANYATTN_ISA=NAME makes ANYATTN_ISA_AUTO resolve to NAME:
//                                     anyattn_isa_default() says so, and a forward call with
//                                     ANYATTN_ISA_AUTO gives the bits of one forced to NAME.
//   anyattn_env_test precision fast   ANYATTN_PRECISION=fast: a bf16 forward call with
//                                     ANYATTN_PRECISION_DEFAULT gives the bits of one with
//                                     ANYATTN_PRECISION_FAST.
//   anyattn_env_test precision invalid  ANYATTN_PRECISION is no precision's name: a call with
//                                     ANYATTN_PRECISION_DEFAULT fails with an error naming the
//                                     variable and its value; one with ANYATTN_PRECISION_ACCURATE
//                                     runs.
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

// Runs a small forward problem (B=1, Sq=37, Sk=129, Hq=Hk=2, D=Dv=64) in f32 or bf16 (the f32
// values' high halves) on `isa` with `precision` and returns the bytes of out followed by lse,
// or nothing (with *status set) when the call fails.
std::vector<unsigned char> run_forward(anyattn_isa isa, anyattn_dtype dtype,
                                       anyattn_precision precision, anyattn_status* status) {
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
  if (dtype == ANYATTN_DTYPE_BF16) {
    // In place: element i's bf16 bits go to the i-th 16-bit slot (before the float they replace).
    for (std::vector<float>* t : {&q, &k, &v}) {
      uint16_t* halves = reinterpret_cast<uint16_t*>(t->data());
      for (size_t i = 0; i < t->size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, t->data() + i, sizeof(bits));
        halves[i] = static_cast<uint16_t>(bits >> 16);
      }
    }
  }
  anyattn_tensor tq, tk, tv, tout, tlse;
  anyattn_tensor_init_contiguous(&tq, q.data(), dtype, 4, q_shape);
  anyattn_tensor_init_contiguous(&tk, k.data(), dtype, 4, kv_shape);
  anyattn_tensor_init_contiguous(&tv, v.data(), dtype, 4, kv_shape);
  anyattn_tensor_init_contiguous(&tout, out.data(), dtype, 4, q_shape);
  anyattn_tensor_init_contiguous(&tlse, lse.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.isa = isa;
  params.precision = precision;
  *status = anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, &params);
  if (*status != ANYATTN_OK) return {};
  const unsigned char* out_bytes = reinterpret_cast<const unsigned char*>(out.data());
  const unsigned char* lse_bytes = reinterpret_cast<const unsigned char*>(lse.data());
  std::vector<unsigned char> bytes(out_bytes, out_bytes + out.size() * 4);
  bytes.insert(bytes.end(), lse_bytes, lse_bytes + lse.size() * 4);
  return bytes;
}

std::vector<unsigned char> run_forward(anyattn_isa isa) {
  anyattn_status status = ANYATTN_OK;
  std::vector<unsigned char> bytes =
      run_forward(isa, ANYATTN_DTYPE_F32, ANYATTN_PRECISION_DEFAULT, &status);
  if (status != ANYATTN_OK) {
    std::fprintf(stderr, "anyattn_fwd on %s failed: %s\n", anyattn_isa_name(isa),
                 anyattn_last_error());
  }
  return bytes;
}

int expect_isa(const char* name) {
  int failures = 0;
  const char* got = anyattn_isa_name(anyattn_isa_default());
  if (std::strcmp(got, name) != 0) {
    std::fprintf(stderr, "expected anyattn_isa_default() = %s; got %s\n", name, got);
    ++failures;
  }
  anyattn_isa forced = ANYATTN_ISA_AUTO;
  // Every path has a name; past the last, anyattn_isa_name says "unknown".
  for (int value = ANYATTN_ISA_PORTABLE;; ++value) {
    const anyattn_isa isa = static_cast<anyattn_isa>(value);
    const char* path = anyattn_isa_name(isa);
    if (std::strcmp(path, "unknown") == 0) break;
    if (std::strcmp(path, name) == 0) forced = isa;
  }
  const std::vector<unsigned char> automatic = run_forward(ANYATTN_ISA_AUTO);
  const std::vector<unsigned char> named = run_forward(forced);
  if (automatic.empty() || automatic != named) {
    std::fprintf(stderr, "a forward call with ANYATTN_ISA_AUTO did not run the %s path\n", name);
    ++failures;
  }
  return failures == 0 ? 0 : 1;
}

int expect_precision(const char* mode) {
  anyattn_status status = ANYATTN_OK;
  if (std::strcmp(mode, "fast") == 0) {
    const std::vector<unsigned char> by_default =
        run_forward(ANYATTN_ISA_AUTO, ANYATTN_DTYPE_BF16, ANYATTN_PRECISION_DEFAULT, &status);
    const std::vector<unsigned char> fast =
        run_forward(ANYATTN_ISA_AUTO, ANYATTN_DTYPE_BF16, ANYATTN_PRECISION_FAST, &status);
    if (by_default.empty() || by_default != fast) {
      std::fprintf(stderr, "ANYATTN_PRECISION_DEFAULT did not give the fast results: %s\n",
                   anyattn_last_error());
      return 1;
    }
    return 0;
  }
  run_forward(ANYATTN_ISA_AUTO, ANYATTN_DTYPE_BF16, ANYATTN_PRECISION_DEFAULT, &status);
  const char* error = anyattn_last_error();
  if (status != ANYATTN_E_INVALID_ARGUMENT || std::strstr(error, "ANYATTN_PRECISION") == nullptr ||
      std::strstr(error, std::getenv("ANYATTN_PRECISION")) == nullptr) {
    std::fprintf(stderr, "expected an error naming ANYATTN_PRECISION; got status %d: %s\n",
                 static_cast<int>(status), error);
    return 1;
  }
  run_forward(ANYATTN_ISA_AUTO, ANYATTN_DTYPE_BF16, ANYATTN_PRECISION_ACCURATE, &status);
  if (status != ANYATTN_OK) {
    std::fprintf(stderr, "an explicit ANYATTN_PRECISION_ACCURATE failed: %s\n",
                 anyattn_last_error());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s threads N|default | isa NAME | precision fast|invalid\n",
                 argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "threads") == 0) {
    const bool use_default = std::strcmp(argv[2], "default") == 0;
    return expect_threads(use_default ? affinity_cpus() : std::atoi(argv[2]));
  }
  if (std::strcmp(argv[1], "isa") == 0) return expect_isa(argv[2]);
  if (std::strcmp(argv[1], "precision") == 0) return expect_precision(argv[2]);
  std::fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
