// Shared machinery of the forward tests: a case description, a problem that owns its buffers and
// lays them out in memory (contiguous, packed, transposed, padded, broadcast), the same-dtype naive
// computation and the acceptance check (tests/README.md) against the f64 reference.
#ifndef ANYATTN_TESTS_TEST_SUPPORT_H_
#define ANYATTN_TESTS_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/reference.h"

namespace anyattn {
namespace testing {

// How q, k, v, out and lse are placed in memory.
enum class Layout {
  kContiguous,       // Each tensor C-contiguous in its own buffer.
  kPacked,           // q, k, v are column slices of one packed row (B, S, Hq*D + Hk*D + Hk*Dv);
                     // when Sq != Sk, q gets its own padded rows and k, v share a packed kv row.
  kTransposedBatch,  // Memory is (S, B, H, X) for q, k, v, out and (H, B, S) for lse.
  kPaddedStrides,    // Every non-last stride padded by a few elements, outputs included.
  kBroadcast,        // k and v have batch stride 0; q has head stride 0 (all heads equal).
  kNegativeStrides,  // Negative strides: q, out rows reversed, k batch reversed, v heads
                     // reversed, lse heads reversed.
};

enum class Alibi { kNone, kPerHead, kPerBatchHead };

// One forward problem. Defaults: no mask, no softcap, default scale, f32, contiguous.
struct Case {
  int64_t B = 1, Sq = 1, Sk = 1, Hq = 1, Hk = 1, D = 64, Dv = 64;
  anyattn_dtype dtype = ANYATTN_DTYPE_F32;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  float softmax_scale = 0.0f;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;
  bool with_lse = true;
  Layout layout = Layout::kContiguous;
  int32_t num_splits = 0;
  anyattn_isa isa = ANYATTN_ISA_AUTO;
  anyattn_precision precision = ANYATTN_PRECISION_DEFAULT;
  uint64_t seed = 1;

  // A one-line description for failure messages, e.g. "B=1 Sq=7 Sk=65 Hq=4 Hk=2 D=64 ...".
  std::string describe() const;
};

const char* dtype_name(anyattn_dtype dtype);
const char* layout_name(Layout layout);

// Writes `value`, rounded to t's dtype, at `index` (for an 8-bit dtype: the stored value, rounded
// and saturated by the shared quantizer, common/kv8_convert.h).
void store(const anyattn_tensor& t, const int64_t* index, double value);

// A problem with its buffers: inputs filled from c.seed (normal(0, 1) values, rounded to the
// dtype), every input byte outside the logical tensors set to NaN (so a stride bug shows), and
// outputs pre-filled with a sentinel. Not copyable: params points into it.
class Problem {
 public:
  explicit Problem(const Case& c);
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  // anyattn_fwd on this problem's tensors and params.
  anyattn_status run() const;
  // Restores the sentinel in every byte of the output buffers.
  void reset_outputs();

  // The logical outputs, gathered through their strides: out (B, Sq, Hq, Dv), lse (B, Hq, Sq).
  std::vector<double> out_values() const;
  std::vector<double> lse_values() const;  // Empty when the case has no lse.
  // The raw bytes of both output buffers, for bitwise comparisons.
  std::vector<unsigned char> output_bytes() const;
  // "" when every output byte outside the logical out/lse elements still holds the sentinel, else
  // a description of the first element written there.
  std::string padding_damage() const;
  bool padding_untouched() const { return padding_damage().empty(); }
  // True when no output byte was changed since reset_outputs().
  bool outputs_untouched() const;

  // The reference result and the naive same-dtype result of this problem.
  reference::DenseOutputs reference() const;
  reference::DenseOutputs naive_same_dtype() const;

  const Case& spec() const { return case_; }
  anyattn_tensor q{}, k{}, v{}, out{}, lse{}, alibi_slopes{}, sinks{};
  anyattn_fwd_params params{};
  // Raw storage; tests may poke values (NaN injection) through q/k/v and store().
  std::vector<unsigned char> q_buffer, kv_buffer, out_buffer, lse_buffer;
  std::vector<float> alibi_buffer, sinks_buffer;

 private:
  std::vector<unsigned char> out_sentinel_, lse_sentinel_;
  Case case_;
};

// The acceptance rule (tests/README.md) for one output:
//   max|got - ref| <= 2 * max|naive - ref| + eps.
// Entries where ref is not finite (-inf lse of an empty row) must be matched exactly. On failure
// the message names the worst index (as coordinates of `shape`) and got / ref / naive there.
::testing::AssertionResult within_two_x_naive(const char* what, const std::vector<double>& got,
                                              const std::vector<double>& ref,
                                              const std::vector<double>& naive, double eps,
                                              const std::vector<int64_t>& shape);

// The eps of the rule for `out` in `dtype` whose largest reference magnitude is `max_abs_ref`.
double out_eps(anyattn_dtype dtype, double max_abs_ref);
// The eps for the f32 lse whose largest finite reference magnitude is `max_abs_ref`.
double lse_eps(double max_abs_ref);

// Runs c through the library and checks out, lse, untouched padding and the status.
::testing::AssertionResult run_and_check(const Case& c);

// Checks the outputs already in `p` against precomputed reference and naive results.
::testing::AssertionResult check_outputs(const Problem& p, const reference::DenseOutputs& ref,
                                         const reference::DenseOutputs& naive);

// The cross-ISA rule: two library results may differ by at most 2 * max|naive - ref| + eps.
::testing::AssertionResult check_cross(const Problem& p, const std::vector<double>& out_a,
                                       const std::vector<double>& out_b,
                                       const std::vector<double>& lse_a,
                                       const std::vector<double>& lse_b,
                                       const reference::DenseOutputs& ref,
                                       const reference::DenseOutputs& naive);

// The options of decode case number n, in the fixed cycle the decode tests share: B (2 every third
// case), causal, sliding windows, softcap, ALiBi (per head, per batch and head), sinks, the five
// strided layouts and an explicit split count. Leaves shapes, dtype, isa and seed to the caller.
void vary_decode_options(int64_t n, Case* c);

// "reduced" when ANYATTN_TEST_SWEEP=reduced (sanitizer builds); the full sweep otherwise.
bool reduced_sweep();

// Every path anyattn_isa names, compiled into this build or not: the values from
// ANYATTN_ISA_PORTABLE up to the first that anyattn_isa_name calls "unknown".
std::vector<anyattn_isa> all_isas();

// The ISA paths the host supports (always includes ANYATTN_ISA_PORTABLE).
std::vector<anyattn_isa> supported_isas();

// The bf16 cases the precision tests sweep (forward and backward) on every supported path, with
// `precision`: query and key counts that end blocks on odd rows and keys and on partial vectors,
// GQA and MQA, Dv of one vector, of several, not a multiple of 16 and below one vector, and the
// largest head dims; each shape plain, causal, with a window and ALiBi, with softcap, sinks and
// two splits, and as two transposed batches.
std::vector<Case> precision_sweep_cases(anyattn_precision precision);

// An f32 or f16 problem (on `isa`, with ANYATTN_PRECISION_ACCURATE) that the precision tests run
// again with ANYATTN_PRECISION_FAST, which such calls ignore: causal, GQA, Sq 70, Sk 150, D 64.
Case precision_ignored_case(anyattn_isa isa, anyattn_dtype dtype);

// Two keys whose probabilities nearly cancel: a bf16 problem (on `isa`, with `precision`) of 64
// query rows q_i = e_0 against k_0 = 0 and k_1 = 2^-5 e_0, D = Dv = 32, so the scores are 0 and
// s_1 = 2^-5 / sqrt(32); with v_0 = e_0 and v_1 = -e_0 (store_cancelling_probabilities),
// out[i][0] = (P_0 - P_1) / (P_0 + P_1) = -tanh(s_1 / 2), about -0.00276.
Case cancelling_probabilities_case(anyattn_isa isa, anyattn_precision precision);
void store_cancelling_probabilities(const Problem& p);

}  // namespace testing
}  // namespace anyattn

#endif  // ANYATTN_TESTS_TEST_SUPPORT_H_
