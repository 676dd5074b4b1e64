// Forward dropout: anyattn_fwd with dropout_p > 0 against the f64 reference forward with the same
// Philox mask (reference_bwd.h computes out with dropout), and the properties that make forward
// and backward agree: the mask is a pure function of (seed, offset, b, h, i, j), so the output is
// the same for any thread count and ISA, and changes with the seed or offset.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "anyattn/anyattn.h"
#include "reference/reference_bwd.h"

namespace {

struct DropoutProblem {
  int64_t batch = 2, seqlen_q = 37, seqlen_k = 70, heads_q = 4, heads_k = 2, head_dim = 32;
  std::vector<float> q, k, v, dout, out, lse;
  anyattn_tensor tq{}, tk{}, tv{}, tdout{}, tout{}, tlse{};

  DropoutProblem() {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    const int64_t q_shape[4] = {batch, seqlen_q, heads_q, head_dim};
    const int64_t kv_shape[4] = {batch, seqlen_k, heads_k, head_dim};
    const int64_t lse_shape[3] = {batch, heads_q, seqlen_q};
    q.resize(batch * seqlen_q * heads_q * head_dim);
    k.resize(batch * seqlen_k * heads_k * head_dim);
    v.resize(k.size());
    dout.resize(q.size());
    out.resize(q.size());
    lse.resize(batch * heads_q * seqlen_q);
    for (std::vector<float>* t : {&q, &k, &v, &dout}) {
      for (float& x : *t) x = normal(rng);
    }
    anyattn_tensor_init_contiguous(&tq, q.data(), ANYATTN_DTYPE_F32, 4, q_shape);
    anyattn_tensor_init_contiguous(&tk, k.data(), ANYATTN_DTYPE_F32, 4, kv_shape);
    anyattn_tensor_init_contiguous(&tv, v.data(), ANYATTN_DTYPE_F32, 4, kv_shape);
    anyattn_tensor_init_contiguous(&tdout, dout.data(), ANYATTN_DTYPE_F32, 4, q_shape);
    anyattn_tensor_init_contiguous(&tout, out.data(), ANYATTN_DTYPE_F32, 4, q_shape);
    anyattn_tensor_init_contiguous(&tlse, lse.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
  }

  void run(const anyattn_fwd_params& params) {
    ASSERT_EQ(anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, &params), ANYATTN_OK)
        << anyattn_last_error();
  }
};

anyattn_fwd_params dropout_params(float p, uint64_t seed, uint64_t offset) {
  anyattn_fwd_params params;
  anyattn_fwd_params_init(&params);
  params.dropout_p = p;
  params.dropout_seed = seed;
  params.dropout_offset = offset;
  return params;
}

TEST(FwdDropout, MatchesReferenceOnEveryIsaWithMasks) {
  for (int isa :
       {ANYATTN_ISA_PORTABLE, ANYATTN_ISA_AVX2, ANYATTN_ISA_AVX512, ANYATTN_ISA_AVX512_AMX,
        ANYATTN_ISA_NEON}) {
    if (!anyattn_isa_supported(static_cast<anyattn_isa>(isa))) continue;
    for (int causal : {0, 1}) {
      DropoutProblem problem;
      anyattn_fwd_params params = dropout_params(0.3f, 1234, 56);
      params.causal = causal;
      params.softcap = causal ? 20.f : 0.f;
      params.isa = isa;
      problem.run(params);
      const anyattn::reference::DenseGradients ref =
          anyattn::reference::bwd_dense(problem.tq, problem.tk, problem.tv, problem.tdout, &params);
      // f32 with ~70 keys: errors of a few f32 ulps of the output scale. The dropout scale
      // 1/(1-p) amplifies the values, so the bound is relative to max |ref|.
      double max_ref = 0, max_err = 0, max_lse_err = 0;
      for (size_t i = 0; i < ref.out.size(); ++i) {
        max_ref = std::max(max_ref, std::fabs(ref.out[i]));
        max_err = std::max(max_err, std::fabs(problem.out[i] - ref.out[i]));
      }
      for (size_t i = 0; i < ref.lse.size(); ++i) {
        max_lse_err = std::max(max_lse_err, std::fabs(problem.lse[i] - ref.lse[i]));
      }
      EXPECT_LT(max_err, 4e-6 * std::max(1.0, max_ref)) << "isa " << isa << " causal " << causal;
      EXPECT_LT(max_lse_err, 4e-6) << "isa " << isa << " causal " << causal;
    }
  }
}

TEST(FwdDropout, SameBitsForAnyThreadCountAndDifferentForAnotherSeed) {
  DropoutProblem problem;
  const anyattn_fwd_params params = dropout_params(0.5f, 7, 0);
  std::vector<float> first;
  for (int threads : {1, 2, 3, 8}) {
    anyattn_set_num_threads(threads);
    problem.run(params);
    if (first.empty()) {
      first = problem.out;
    } else {
      EXPECT_EQ(first, problem.out) << threads << " threads";
    }
  }
  anyattn_set_num_threads(0);
  problem.run(dropout_params(0.5f, 8, 0));
  EXPECT_NE(first, problem.out) << "another seed drew the same mask";
  problem.run(dropout_params(0.5f, 7, 1));
  EXPECT_NE(first, problem.out) << "another offset drew the same mask";
}

TEST(FwdDropout, LseIgnoresDropout) {
  DropoutProblem with, without;
  with.run(dropout_params(0.4f, 3, 3));
  without.run(dropout_params(0.f, 0, 0));
  EXPECT_EQ(with.lse, without.lse);
  EXPECT_NE(with.out, without.out);
}

}  // namespace
