// anyattn_merge_attention_states: against the f64 reference merge by the 2x rule (the naive side
// is the same formula in f32, rounded to the dtype), -inf LSEs, the in-place form, both ranks,
// and the property that makes it useful: merging the attentions of two halves of a key range
// equals attention over the whole range (2x rule against the dense f64 reference).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "cache/cache_test_support.h"
#include "reference/reference_cache.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const double kInf = std::numeric_limits<double>::infinity();

// Two partial results of one shape, with some -inf LSEs on either side or both.
struct MergeProblem {
  MergeProblem(anyattn_dtype dtype, std::vector<int64_t> out_shape, uint64_t seed) : dtype(dtype) {
    CacheRng rng(seed);
    const bool four = out_shape.size() == 4;
    std::vector<int64_t> lse_shape =
        four ? std::vector<int64_t>{out_shape[0], out_shape[2], out_shape[1]}
             : std::vector<int64_t>{out_shape[1], out_shape[0]};
    out_a = OwnedTensor(dtype, out_shape, 2);  // Padded strides.
    out_b = OwnedTensor(dtype, out_shape);
    out = OwnedTensor(dtype, out_shape, 1);
    lse_a = OwnedTensor(ANYATTN_DTYPE_F32, lse_shape);
    lse_b = OwnedTensor(ANYATTN_DTYPE_F32, lse_shape, 3);
    lse_out = OwnedTensor(ANYATTN_DTYPE_F32, lse_shape);
    out_a.fill_normal(&rng);
    out_b.fill_normal(&rng);
    const int64_t rows = lse_a.size(), dim = out_shape.back();
    for (int64_t i = 0; i < rows; ++i) {
      // Every 7th row empty on side a, every 11th on side b (both on some), the rest spread over
      // a wide range so that either side may dominate.
      lse_a.set(i, i % 7 == 3 ? -kInf : 6.0 * rng.normal());
      lse_b.set(i, i % 11 == 3 ? -kInf : 6.0 * rng.normal());
    }
    // An empty side's out row is ignored, even when it holds NaN: poison a few.
    for (int64_t i = 0; i < rows; ++i) {
      if (i % 7 != 3) continue;
      const int64_t token_head = lse_row_to_out_row(i, out_shape);
      for (int64_t d = 0; d < dim; ++d) {
        out_a.set(token_head * dim + d, std::numeric_limits<double>::quiet_NaN());
      }
    }
    out.fill(-768.0);
    lse_out.fill(-768.0);
  }

  // The flat (token, head) row of out for flat lse index i.
  static int64_t lse_row_to_out_row(int64_t i, const std::vector<int64_t>& s) {
    if (s.size() == 4) {  // lse (B, H, S) -> out (B, S, H)
      const int64_t b = i / (s[2] * s[1]), h = i / s[1] % s[2], t = i % s[1];
      return (b * s[1] + t) * s[2] + h;
    }
    const int64_t h = i / s[0], t = i % s[0];  // lse (H, T) -> out (T, H)
    return t * s[1] + h;
  }

  anyattn_status run(const anyattn_tensor* o, const anyattn_tensor* l) {
    return anyattn_merge_attention_states(&out_a.t, &lse_a.t, &out_b.t, &lse_b.t, o, l);
  }

  // The naive merge: the reference formula in f32, the result rounded to the dtype.
  reference::MergeOutputs naive() const {
    const std::vector<double> oa = out_a.values(), ob = out_b.values();
    const std::vector<double> la = lse_a.values(), lb = lse_b.values();
    const std::vector<int64_t> shape(out_a.t.shape, out_a.t.shape + out_a.t.ndim);
    const int64_t dim = shape.back();
    reference::MergeOutputs r;
    r.out.assign(oa.size(), 0.0);
    r.lse.assign(la.size(), 0.0);
    for (size_t i = 0; i < la.size(); ++i) {
      const float a = static_cast<float>(la[i]), b = static_cast<float>(lb[i]);
      const float top = std::fmax(a, b);
      if (top == -std::numeric_limits<float>::infinity()) {
        r.lse[i] = -kInf;
        continue;
      }
      const float wa = std::exp(a - top), wb = std::exp(b - top), total = wa + wb;
      const int64_t row = lse_row_to_out_row(static_cast<int64_t>(i), shape);
      for (int64_t d = 0; d < dim; ++d) {
        const float xa = wa != 0.0f ? wa * static_cast<float>(oa[row * dim + d]) : 0.0f;
        const float xb = wb != 0.0f ? wb * static_cast<float>(ob[row * dim + d]) : 0.0f;
        r.out[row * dim + d] = round_to_dtype(dtype, (xa + xb) / total);
      }
      r.lse[i] = top + std::log(total);
    }
    return r;
  }

  anyattn_dtype dtype;
  OwnedTensor out_a, out_b, out, lse_a, lse_b, lse_out;
};

::testing::AssertionResult check_merge(const MergeProblem& p, const std::vector<double>& got_out,
                                       const std::vector<double>& got_lse) {
  const reference::MergeOutputs ref =
      reference::merge_states(p.out_a.t, p.lse_a.t, p.out_b.t, p.lse_b.t);
  const reference::MergeOutputs naive = p.naive();
  const std::vector<int64_t> out_shape(p.out_a.t.shape, p.out_a.t.shape + p.out_a.t.ndim);
  const std::vector<int64_t> lse_shape(p.lse_a.t.shape, p.lse_a.t.shape + p.lse_a.t.ndim);
  return check_two_x(p.dtype, got_out, ref.out, naive.out, out_shape, &got_lse, ref.lse, naive.lse,
                     lse_shape);
}

TEST(Merge, AgainstReferenceBothRanksAllDtypes) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{37, 4, 64}, {5, 3, 1}, {2, 19, 3, 128}, {3, 1, 8, 256},
          {2, 5, 2, 512}}) {
      MergeProblem p(dtype, shape, 7);
      ASSERT_EQ(p.run(&p.out.t, &p.lse_out.t), ANYATTN_OK) << anyattn_last_error();
      EXPECT_TRUE(check_merge(p, p.out.values(), p.lse_out.values()))
          << dtype_name(dtype) << " rank " << shape.size();
    }
  }
}

TEST(Merge, NegativeInfinityLses) {
  MergeProblem p(ANYATTN_DTYPE_F32, {77, 2, 16}, 3);
  ASSERT_EQ(p.run(&p.out.t, &p.lse_out.t), ANYATTN_OK) << anyattn_last_error();
  const std::vector<double> la = p.lse_a.values(), lb = p.lse_b.values();
  const std::vector<double> oa = p.out_a.values(), ob = p.out_b.values();
  const std::vector<double> out = p.out.values(), lse = p.lse_out.values();
  const std::vector<int64_t> shape = {77, 2, 16};
  int both = 0, one = 0;
  for (size_t i = 0; i < la.size(); ++i) {
    const int64_t row = MergeProblem::lse_row_to_out_row(static_cast<int64_t>(i), shape);
    if (la[i] == -kInf && lb[i] == -kInf) {
      ++both;  // Both empty: out = 0, lse = -inf.
      EXPECT_EQ(lse[i], -kInf);
      for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(out[row * 16 + d], 0.0);
    } else if (la[i] == -kInf) {
      ++one;  // Side a empty (and NaN): exactly side b.
      EXPECT_EQ(lse[i], lb[i]);
      for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(out[row * 16 + d], ob[row * 16 + d]);
    } else if (lb[i] == -kInf) {
      ++one;
      EXPECT_EQ(lse[i], la[i]);
      for (int64_t d = 0; d < 16; ++d) EXPECT_EQ(out[row * 16 + d], oa[row * 16 + d]);
    }
  }
  EXPECT_GT(both, 0);
  EXPECT_GT(one, 0);
}

TEST(Merge, InPlaceMatchesOutOfPlace) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{37, 4, 64}, std::vector<int64_t>{2, 19, 3, 40}}) {
    MergeProblem p(ANYATTN_DTYPE_BF16, shape, 11);
    ASSERT_EQ(p.run(&p.out.t, &p.lse_out.t), ANYATTN_OK) << anyattn_last_error();
    const std::vector<double> out = p.out.values(), lse = p.lse_out.values();
    // Into out_a / lse_a.
    MergeProblem in_a(ANYATTN_DTYPE_BF16, shape, 11);
    ASSERT_EQ(in_a.run(&in_a.out_a.t, &in_a.lse_a.t), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(in_a.out_a.values() == out);
    EXPECT_TRUE(in_a.lse_a.values() == lse);
    // Into out_b / lse_b.
    MergeProblem in_b(ANYATTN_DTYPE_BF16, shape, 11);
    ASSERT_EQ(in_b.run(&in_b.out_b.t, &in_b.lse_b.t), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(in_b.out_b.values() == out);
    EXPECT_TRUE(in_b.lse_b.values() == lse);
    // Without lse_out.
    MergeProblem no_lse(ANYATTN_DTYPE_BF16, shape, 11);
    ASSERT_EQ(no_lse.run(&no_lse.out.t, nullptr), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(no_lse.out.values() == out);
  }
}

// A view of keys [first, first + count) of a (B, Sk, Hk, X) tensor.
anyattn_tensor key_range(const anyattn_tensor& t, int64_t first, int64_t count) {
  anyattn_tensor r = t;
  r.shape[1] = count;
  r.data = static_cast<unsigned char*>(t.data) + first * t.strides[1] * dtype_size(t.dtype);
  return r;
}

// Attention over keys [0, m) and [m, Sk) separately, merged, against attention over [0, Sk).
// The mask of the whole call is bottom-right aligned at key i + Sk - Sq: the second half keeps
// that alignment, and the first half gets it back with window_right + (Sk - m) (window_left -
// (Sk - m)). With causal and Sq = Sk, the first rows see no key of the second half (lse -inf).
::testing::AssertionResult merged_halves_match(const Case& c, int64_t m) {
  Problem whole(c);
  const reference::DenseOutputs ref = whole.reference();
  const reference::DenseOutputs naive = whole.naive_same_dtype();
  const int64_t shift = c.Sk - m;
  OwnedTensor out_a(c.dtype, {c.B, c.Sq, c.Hq, c.Dv}), out_b(c.dtype, {c.B, c.Sq, c.Hq, c.Dv});
  OwnedTensor lse_a(ANYATTN_DTYPE_F32, {c.B, c.Hq, c.Sq}),
      lse_b(ANYATTN_DTYPE_F32, {c.B, c.Hq, c.Sq});
  OwnedTensor out(c.dtype, {c.B, c.Sq, c.Hq, c.Dv}), lse(ANYATTN_DTYPE_F32, {c.B, c.Hq, c.Sq});
  anyattn_fwd_params first = whole.params, second = whole.params;
  const int32_t right = c.causal ? 0 : c.window_right;
  first.causal = 0;
  first.window_right = right < 0 ? -1 : right + static_cast<int32_t>(shift);
  first.window_left = c.window_left < 0 ? -1 : c.window_left - static_cast<int32_t>(shift);
  if (c.window_left >= 0 && first.window_left < 0) {
    return ::testing::AssertionFailure() << "test setup: window_left too small for this split";
  }
  const anyattn_tensor ka = key_range(whole.k, 0, m), va = key_range(whole.v, 0, m);
  const anyattn_tensor kb = key_range(whole.k, m, c.Sk - m), vb = key_range(whole.v, m, c.Sk - m);
  anyattn_status s = anyattn_fwd(&whole.q, &ka, &va, &out_a.t, &lse_a.t, &first);
  if (s == ANYATTN_OK) s = anyattn_fwd(&whole.q, &kb, &vb, &out_b.t, &lse_b.t, &second);
  if (s == ANYATTN_OK) {
    s = anyattn_merge_attention_states(&out_a.t, &lse_a.t, &out_b.t, &lse_b.t, &out.t, &lse.t);
  }
  if (s != ANYATTN_OK) {
    return ::testing::AssertionFailure() << anyattn_status_name(s) << ": " << anyattn_last_error();
  }
  const std::vector<double> got_lse = lse.values();
  ::testing::AssertionResult r =
      check_two_x(c.dtype, out.values(), ref.out, naive.out, {c.B, c.Sq, c.Hq, c.Dv}, &got_lse,
                  ref.lse, naive.lse, {c.B, c.Hq, c.Sq});
  if (!r) r << "\n  split at " << m << " of " << c.describe();
  return r;
}

TEST(Merge, TwoHalvesEqualTheWhole) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    Case c;
    c.B = 2;
    c.Sq = 37;
    c.Sk = 100;
    c.Hq = 4;
    c.Hk = 2;
    c.D = c.Dv = 64;
    c.dtype = dtype;
    for (int64_t m : {int64_t{1}, int64_t{50}, int64_t{99}}) {
      EXPECT_TRUE(merged_halves_match(c, m));
    }
    c.softcap = 4.0f;
    EXPECT_TRUE(merged_halves_match(c, 40));
  }
}

TEST(Merge, TwoHalvesWithOneSideFullyMasked) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    Case c;
    c.Sq = c.Sk = 64;
    c.Hq = 2;
    c.D = c.Dv = 32;
    c.causal = true;  // Rows i < m see nothing of the second half; rows see all of the first
    c.dtype = dtype;  // half only when i >= m - 1.
    for (int64_t m : {int64_t{1}, int64_t{32}, int64_t{63}}) EXPECT_TRUE(merged_halves_match(c, m));
    c.window_left = 80;
    c.Sk = 100;  // Sq < Sk; the first half's rows are partly masked.
    EXPECT_TRUE(merged_halves_match(c, 50));
  }
}

// ---- Errors -------------------------------------------------------------------------------------

void expect_merge_error(MergeProblem* p, const anyattn_tensor* lse_out,
                        const std::vector<std::string>& needles) {
  const std::vector<unsigned char> out_before = p->out.bytes, lse_before = p->lse_out.bytes;
  EXPECT_EQ(p->run(&p->out.t, lse_out), ANYATTN_E_INVALID_ARGUMENT);
  const std::string message = anyattn_last_error();
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message \"" << message << "\" lacks \"" << needle << "\"";
  }
  EXPECT_TRUE(p->out.bytes == out_before && p->lse_out.bytes == lse_before) << message;
}

// Past the largest Dv (512): unsupported, with the tensor, the value and the limit; nothing written.
TEST(MergeErrors, HeadDimPastTheLimit) {
  MergeProblem p(ANYATTN_DTYPE_F32, {3, 2, 513}, 1);
  const std::vector<unsigned char> out_before = p.out.bytes, lse_before = p.lse_out.bytes;
  EXPECT_EQ(p.run(&p.out.t, &p.lse_out.t), ANYATTN_E_UNSUPPORTED);
  EXPECT_STREQ(anyattn_last_error(),
               "anyattn_merge_attention_states: the head dim (out_a.shape[2], the last dimension) "
               "is 513; supported: up to 512");
  EXPECT_TRUE(p.out.bytes == out_before && p.lse_out.bytes == lse_before);
}

TEST(MergeErrors, ShapeMismatch) {
  MergeProblem p(ANYATTN_DTYPE_F32, {8, 2, 16}, 1);
  p.out_b.t.shape[0] = 7;
  expect_merge_error(&p, &p.lse_out.t, {"out_b.shape[0]", "7", "8"});
}

TEST(MergeErrors, LseShapeMismatch) {
  MergeProblem p(ANYATTN_DTYPE_F32, {2, 8, 2, 16}, 1);
  p.lse_b.t.shape[2] = 4;
  expect_merge_error(&p, &p.lse_out.t, {"lse_b", "(B, H, S)"});
}

TEST(MergeErrors, DtypeMismatch) {
  MergeProblem p(ANYATTN_DTYPE_F16, {8, 2, 16}, 1);
  p.out.t.dtype = ANYATTN_DTYPE_BF16;
  expect_merge_error(&p, nullptr, {"out.dtype", "bf16"});
}

TEST(MergeErrors, WrongRank) {
  MergeProblem p(ANYATTN_DTYPE_F32, {8, 2, 16}, 1);
  p.out_a.t.ndim = 2;
  expect_merge_error(&p, nullptr, {"out_a.ndim", "2"});
}

TEST(MergeErrors, PartialOverlap) {
  MergeProblem p(ANYATTN_DTYPE_F32, {8, 2, 16}, 1);
  anyattn_tensor shifted = p.out_a.t;  // Overlaps out_a without being it.
  shifted.data = static_cast<float*>(p.out_a.t.data) + 1;
  shifted.shape[0] = 7;
  p.out_b.t.shape[0] = 7;
  p.lse_a.t.shape[1] = 7;
  p.lse_b.t.shape[1] = 7;
  p.out_a.t.shape[0] = 7;
  const std::vector<unsigned char> before = p.out_a.bytes;
  EXPECT_EQ(anyattn_merge_attention_states(&p.out_a.t, &p.lse_a.t, &p.out_b.t, &p.lse_b.t, &shifted,
                                           nullptr),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(anyattn_last_error()).find("out_a"), std::string::npos)
      << anyattn_last_error();
  EXPECT_TRUE(p.out_a.bytes == before);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
