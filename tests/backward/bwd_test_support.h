// Shared machinery of the backward tests: a backward problem built on the forward tests' Problem
// (q, k, v, out, lse, params in any layout), with dout and the gradient buffers; the same-dtype
// naive backward; and the acceptance check (tests/README.md) for dq, dk, dv and dsinks.
#ifndef ANYATTN_TESTS_BWD_TEST_SUPPORT_H_
#define ANYATTN_TESTS_BWD_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/reference_bwd.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {

struct BwdCase {
  Case fwd;
  float dropout_p = 0.f;
  uint64_t dropout_seed = 0x5eed;
  uint64_t dropout_offset = 0;
  bool padded_grads = false;  // dq, dk, dv with padded strides (and bytes around to check)
  bool own_forward = false;   // anyattn_fwd_params::bwd_own_forward

  std::string describe() const;
};

// Gradients as contiguous doubles: dq (B, Sq, Hq, D), dk (B, Sk, Hk, D), dv (B, Sk, Hk, Dv),
// dsinks (Hq, empty without sinks).
struct Gradients {
  std::vector<double> dq, dk, dv, dsinks;
};

class BwdProblem {
 public:
  explicit BwdProblem(const BwdCase& c);
  BwdProblem(const BwdProblem&) = delete;
  BwdProblem& operator=(const BwdProblem&) = delete;

  // Fills out and lse: with anyattn_fwd when there is no dropout, else with the f64 reference's
  // forward (with dropout), rounded to the dtype. Returns anyattn_fwd's status (ANYATTN_OK for the
  // reference).
  anyattn_status prepare_forward();
  // anyattn_bwd on this problem's tensors.
  anyattn_status run() const;

  Gradients gradients() const;
  // The raw bytes of every gradient buffer, for bitwise comparisons.
  std::vector<unsigned char> gradient_bytes() const;
  // "" when no byte of a gradient buffer outside its view changed.
  std::string padding_damage() const;

  reference::DenseGradients reference() const;
  Gradients naive_same_dtype() const;

  const BwdCase& spec() const { return case_; }
  Problem fwd;
  anyattn_tensor dout{}, dq{}, dk{}, dv{}, dsinks{};
  std::vector<unsigned char> dout_buffer, dq_buffer, dk_buffer, dv_buffer;
  std::vector<float> dsinks_buffer;

 private:
  BwdCase case_;
  std::vector<unsigned char> dq_sentinel_, dk_sentinel_, dv_sentinel_;
};

// Scores all equal and cancelling score gradients: a bf16 problem (on `isa`, with `precision`) of
// Sq = Sk = 3, Hq = Hk = 1, D = Dv = 32 with q_i = k_j = e_0, v_j = e_j and dout_i = e_i
// (store_cancelling_score_gradients), so P = 1/3 and dq_i[0] = scale sum_j dS_ij and dk_j[0]
// cancel to scale P (1 - 3 o), o = out_i[i], about 1/300 of their terms.
BwdCase cancelling_score_gradients_case(anyattn_isa isa, anyattn_precision precision);
void store_cancelling_score_gradients(const BwdProblem& p);

// Runs c (forward, backward) and checks every gradient by the 2x rule and the padding.
::testing::AssertionResult run_and_check_bwd(const BwdCase& c);

// Checks the gradients already computed in p against the reference and naive results.
::testing::AssertionResult check_gradients(const BwdProblem& p,
                                           const reference::DenseGradients& ref,
                                           const Gradients& naive);

}  // namespace testing
}  // namespace anyattn

#endif  // ANYATTN_TESTS_BWD_TEST_SUPPORT_H_
