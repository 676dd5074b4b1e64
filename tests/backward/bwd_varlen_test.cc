// anyattn_bwd_varlen: every sequence's gradients against the f64 reference of that sequence alone
// (2x rule), with empty sequences, seqused_k, rows outside every sequence left untouched and
// unused keys given zero gradients; bitwise equality with anyattn_bwd when every sequence has the
// same length (sinks and dropout included); determinism across thread counts; validation errors;
// the C++ wrappers of anyattn.hpp; and the varlen backward reference (reference::bwd_varlen, which
// fuzz_bwd_varlen checks against) as each sequence's dense reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "anyattn/anyattn.hpp"
#include "backward/bwd_test_support.h"

namespace anyattn {
namespace testing {
namespace {

int64_t element_bytes(anyattn_dtype dtype) {
  return dtype == ANYATTN_DTYPE_F32 ? 4 : 2;
}

// A packed (rows, heads, dim) tensor whose bytes all start as `fill`.
struct Packed {
  std::vector<unsigned char> bytes;
  anyattn_tensor t{};
  Packed(anyattn_dtype dtype, int64_t rows, int64_t heads, int64_t dim, unsigned char fill) {
    bytes.assign(
        static_cast<size_t>(std::max<int64_t>(rows * heads * dim, 1) * element_bytes(dtype)), fill);
    const int64_t shape[3] = {rows, heads, dim};
    EXPECT_EQ(anyattn_tensor_init_contiguous(&t, bytes.data(), dtype, 3, shape), ANYATTN_OK);
  }
};

struct Int32s {
  std::vector<int32_t> values;
  anyattn_tensor t{};
  explicit Int32s(std::vector<int32_t> v) : values(std::move(v)) {
    const int64_t shape[1] = {static_cast<int64_t>(values.size())};
    EXPECT_EQ(anyattn_tensor_init_contiguous(&t, values.data(), ANYATTN_DTYPE_I32, 1, shape),
              ANYATTN_OK);
  }
};

// One sequence: query rows, keys used (seqused_k) and keys present in the packed k/v.
struct SeqLens {
  int64_t sq, sk_used, sk_present;
};

// The packed varlen problem built from one dense BwdProblem (B = 1) per sequence. Rows 0 of q and
// of k lie outside every sequence; NaN bytes (0xFF) fill every input row no sequence uses, and
// the gradients start as 0xA5 bytes.
class VarlenProblem {
 public:
  VarlenProblem(const Case& base, const std::vector<SeqLens>& lens, bool use_seqused)
      : base_(base), lens_(lens), use_seqused_(use_seqused) {
    cu_q_.push_back(1);
    cu_k_.push_back(1);
    for (size_t b = 0; b < lens.size(); ++b) {
      Case c = base;
      c.B = 1;
      c.Sq = lens[b].sq;
      c.Sk = lens[b].sk_used;
      c.seed = base.seed + 101 * b;
      BwdCase bc;
      bc.fwd = c;
      seqs_.push_back(std::make_unique<BwdProblem>(bc));
      EXPECT_EQ(seqs_.back()->prepare_forward(), ANYATTN_OK) << anyattn_last_error();
      cu_q_.push_back(cu_q_.back() + static_cast<int32_t>(lens[b].sq));
      cu_k_.push_back(cu_k_.back() + static_cast<int32_t>(lens[b].sk_present));
      used_.push_back(static_cast<int32_t>(lens[b].sk_used));
      max_q_ = std::max(max_q_, lens[b].sq);
      max_k_ = std::max(max_k_, lens[b].sk_present);
    }
    total_q_ = cu_q_.back() + 1;
    total_k_ = cu_k_.back() + 1;
    const anyattn_dtype dt = base.dtype;
    q_ = std::make_unique<Packed>(dt, total_q_, base.Hq, base.D, 0xFF);
    out_ = std::make_unique<Packed>(dt, total_q_, base.Hq, base.Dv, 0xFF);
    dout_ = std::make_unique<Packed>(dt, total_q_, base.Hq, base.Dv, 0xFF);
    k_ = std::make_unique<Packed>(dt, total_k_, base.Hk, base.D, 0xFF);
    v_ = std::make_unique<Packed>(dt, total_k_, base.Hk, base.Dv, 0xFF);
    dq_ = std::make_unique<Packed>(dt, total_q_, base.Hq, base.D, 0xA5);
    dk_ = std::make_unique<Packed>(dt, total_k_, base.Hk, base.D, 0xA5);
    dv_ = std::make_unique<Packed>(dt, total_k_, base.Hk, base.Dv, 0xA5);
    lse_values_.assign(static_cast<size_t>(base.Hq * total_q_),
                       std::numeric_limits<float>::quiet_NaN());
    const int64_t lse_shape[2] = {base.Hq, total_q_};
    EXPECT_EQ(
        anyattn_tensor_init_contiguous(&lse_, lse_values_.data(), ANYATTN_DTYPE_F32, 2, lse_shape),
        ANYATTN_OK);
    for (size_t b = 0; b < lens.size(); ++b) {
      const BwdProblem& p = *seqs_[b];
      copy_rows(p.fwd.q, q_->t, cu_q_[b]);
      copy_rows(p.fwd.out, out_->t, cu_q_[b]);
      copy_rows(p.dout, dout_->t, cu_q_[b]);
      copy_rows(p.fwd.k, k_->t, cu_k_[b]);
      copy_rows(p.fwd.v, v_->t, cu_k_[b]);
      const std::vector<double> lse = reference::to_contiguous_f64(p.fwd.lse);
      for (int64_t h = 0; h < base.Hq; ++h) {
        for (int64_t i = 0; i < lens[b].sq; ++i) {
          lse_values_[h * total_q_ + cu_q_[b] + i] = static_cast<float>(lse[h * lens[b].sq + i]);
        }
      }
    }
    cu_q_t_ = std::make_unique<Int32s>(cu_q_);
    cu_k_t_ = std::make_unique<Int32s>(cu_k_);
    used_t_ = std::make_unique<Int32s>(used_);
    dq_before_ = dq_->bytes;
    dk_before_ = dk_->bytes;
    dv_before_ = dv_->bytes;
  }

  anyattn_status run() const {
    return anyattn_bwd_varlen(&dout_->t, &q_->t, &k_->t, &v_->t, &out_->t, &lse_, &dq_->t, &dk_->t,
                              &dv_->t, nullptr, &cu_q_t_->t, &cu_k_t_->t,
                              use_seqused_ ? &used_t_->t : nullptr, max_q_, max_k_,
                              &seqs_.front()->fwd.params);
  }

  // Every sequence's gradients by the 2x rule, zero gradients for unused keys, and untouched
  // bytes in rows outside every sequence.
  ::testing::AssertionResult check() {
    const int64_t es = element_bytes(base_.dtype);
    for (size_t b = 0; b < lens_.size(); ++b) {
      BwdProblem& p = *seqs_[b];
      copy_rows_back(dq_->t, cu_q_[b], p.dq);
      copy_rows_back(dk_->t, cu_k_[b], p.dk);
      copy_rows_back(dv_->t, cu_k_[b], p.dv);
      ::testing::AssertionResult r = check_gradients(p, p.reference(), p.naive_same_dtype());
      if (!r) return r << "\n  sequence " << b;
      for (int64_t j = lens_[b].sk_used; j < lens_[b].sk_present; ++j) {
        for (const Packed* g : {dk_.get(), dv_.get()}) {
          const int64_t row_bytes = g->t.shape[1] * g->t.shape[2] * es;
          for (int64_t at = 0; at < row_bytes; ++at) {
            if (g->bytes[(cu_k_[b] + j) * row_bytes + at] != 0) {
              return ::testing::AssertionFailure()
                     << "sequence " << b << " unused key " << j << " has a nonzero gradient";
            }
          }
        }
      }
    }
    // Row 0 and the last row of q and k belong to no sequence.
    for (const auto& [g, before, last] : {std::tuple{dq_.get(), &dq_before_, total_q_ - 1},
                                          std::tuple{dk_.get(), &dk_before_, total_k_ - 1},
                                          std::tuple{dv_.get(), &dv_before_, total_k_ - 1}}) {
      const int64_t row_bytes = g->t.shape[1] * g->t.shape[2] * es;
      for (int64_t row : {int64_t{0}, last}) {
        if (std::memcmp(g->bytes.data() + row * row_bytes, before->data() + row * row_bytes,
                        static_cast<size_t>(row_bytes)) != 0) {
          return ::testing::AssertionFailure() << "row " << row << " outside every sequence "
                                               << "was written";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  // reference::bwd_varlen on the packed tensors (seqused_k given) against each sequence's
  // reference::bwd_dense: every value equal (the same f64 arithmetic on the same values), the
  // keys past seqused_k with zero gradients, and only the rows of the sequences flagged as inside.
  ::testing::AssertionResult reference_matches_dense() const {
    const reference::VarlenGradients r =
        reference::bwd_varlen(q_->t, k_->t, v_->t, dout_->t, cu_q_t_->t, cu_k_t_->t, &used_t_->t,
                              &seqs_.front()->fwd.params);
    const int64_t Hq = base_.Hq, Hk = base_.Hk, D = base_.D, Dv = base_.Dv;
    // packed rows [first, first + rows) of `row` values each equal `dense` (zeros when empty).
    auto rows_equal = [](const std::vector<double>& packed, int64_t first, int64_t rows,
                         int64_t row, const std::vector<double>* dense) {
      for (int64_t e = 0; e < rows * row; ++e) {
        if (packed[first * row + e] != (dense != nullptr ? (*dense)[e] : 0.0)) return false;
      }
      return true;
    };
    std::vector<char> q_in(static_cast<size_t>(total_q_), 0),
        k_in(static_cast<size_t>(total_k_), 0);
    for (size_t b = 0; b < lens_.size(); ++b) {
      const reference::DenseGradients d = seqs_[b]->reference();
      const SeqLens& n = lens_[b];
      const int64_t unused = n.sk_present - n.sk_used;
      if (!rows_equal(r.out, cu_q_[b], n.sq, Hq * Dv, &d.out) ||
          !rows_equal(r.dq, cu_q_[b], n.sq, Hq * D, &d.dq) ||
          !rows_equal(r.dq_terms, cu_q_[b], n.sq, Hq * D, &d.dq_terms) ||
          !rows_equal(r.dk, cu_k_[b], n.sk_used, Hk * D, &d.dk) ||
          !rows_equal(r.dv, cu_k_[b], n.sk_used, Hk * Dv, &d.dv) ||
          !rows_equal(r.dk_terms, cu_k_[b], n.sk_used, Hk * D, &d.dk_terms) ||
          !rows_equal(r.dk, cu_k_[b] + n.sk_used, unused, Hk * D, nullptr) ||
          !rows_equal(r.dv, cu_k_[b] + n.sk_used, unused, Hk * Dv, nullptr)) {
        return ::testing::AssertionFailure()
               << "sequence " << b << " differs from its dense reference";
      }
      for (int64_t h = 0; h < Hq; ++h) {
        for (int64_t i = 0; i < n.sq; ++i) {
          if (r.lse[h * total_q_ + cu_q_[b] + i] != d.lse[h * n.sq + i]) {
            return ::testing::AssertionFailure()
                   << "sequence " << b << " lse (" << h << ", " << i << ")";
          }
        }
      }
      for (int64_t i = 0; i < n.sq; ++i) q_in[cu_q_[b] + i] = 1;
      for (int64_t j = 0; j < n.sk_present; ++j) k_in[cu_k_[b] + j] = 1;
    }
    if (r.q_row_in_sequence != q_in || r.k_row_in_sequence != k_in) {
      return ::testing::AssertionFailure() << "rows flagged inside a sequence";
    }
    return ::testing::AssertionSuccess();
  }

  std::vector<unsigned char> gradient_bytes() const {
    std::vector<unsigned char> all = dq_->bytes;
    all.insert(all.end(), dk_->bytes.begin(), dk_->bytes.end());
    all.insert(all.end(), dv_->bytes.begin(), dv_->bytes.end());
    return all;
  }

 private:
  // dst[first + i][h][d] = src[0][i][h][d] for every element of the rank-4 src (B = 1).
  static void copy_rows(const anyattn_tensor& src, const anyattn_tensor& dst, int64_t first) {
    const std::vector<double> values = reference::to_contiguous_f64(src);
    int64_t index[3];
    size_t n = 0;
    for (index[0] = first; index[0] < first + src.shape[1]; ++index[0]) {
      for (index[1] = 0; index[1] < src.shape[2]; ++index[1]) {
        for (index[2] = 0; index[2] < src.shape[3]; ++index[2]) store(dst, index, values[n++]);
      }
    }
  }
  // The inverse: dst[0][i][h][d] = src[first + i][h][d].
  static void copy_rows_back(const anyattn_tensor& src, int64_t first, const anyattn_tensor& dst) {
    const std::vector<double> values = reference::to_contiguous_f64(src);
    const int64_t row = src.shape[1] * src.shape[2];
    int64_t index[4] = {0, 0, 0, 0};
    for (index[1] = 0; index[1] < dst.shape[1]; ++index[1]) {
      for (index[2] = 0; index[2] < dst.shape[2]; ++index[2]) {
        for (index[3] = 0; index[3] < dst.shape[3]; ++index[3]) {
          store(dst, index, values[(first + index[1]) * row + index[2] * src.shape[2] + index[3]]);
        }
      }
    }
  }

  Case base_;
  std::vector<SeqLens> lens_;
  bool use_seqused_;
  std::vector<std::unique_ptr<BwdProblem>> seqs_;
  std::vector<int32_t> cu_q_, cu_k_, used_;
  int64_t max_q_ = 0, max_k_ = 0, total_q_ = 0, total_k_ = 0;
  std::unique_ptr<Packed> q_, out_, dout_, k_, v_, dq_, dk_, dv_;
  std::vector<float> lse_values_;
  anyattn_tensor lse_{};
  std::unique_ptr<Int32s> cu_q_t_, cu_k_t_, used_t_;
  std::vector<unsigned char> dq_before_, dk_before_, dv_before_;
};

Case varlen_base() {
  Case c;
  c.Hq = 4;
  c.Hk = 2;
  c.D = 40;
  c.Dv = 24;
  return c;
}

const std::vector<SeqLens> kMixedLens = {{70, 90, 90},  {0, 5, 5}, {33, 0, 0},  {1, 130, 130},
                                         {129, 64, 64}, {5, 0, 3}, {64, 65, 80}};

void expect_varlen(const Case& base, const std::vector<SeqLens>& lens, bool use_seqused) {
  VarlenProblem p(base, lens, use_seqused);
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_TRUE(p.check()) << base.describe();
}

// The varlen reference the backward fuzzer uses is each sequence's dense reference, placed.
TEST(BwdVarlen, ReferenceIsEachSequenceAlone) {
  Case base = varlen_base();
  base.causal = true;
  base.softcap = 20.f;
  VarlenProblem p(base, kMixedLens, true);
  EXPECT_TRUE(p.reference_matches_dense());
}

TEST(BwdVarlen, MatchesReferencePerSequenceF32) {
  expect_varlen(varlen_base(), kMixedLens, true);
}

TEST(BwdVarlen, FeaturesPerSequence) {
  Case c = varlen_base();
  c.causal = true;
  expect_varlen(c, kMixedLens, true);
  c = varlen_base();
  c.window_left = 20;
  c.window_right = 7;
  c.softcap = 4.f;
  c.alibi = Alibi::kPerHead;
  expect_varlen(c, kMixedLens, true);
  c = varlen_base();
  c.Hk = 1;
  c.D = 64;
  c.Dv = 64;
  c.dtype = ANYATTN_DTYPE_BF16;
  c.causal = true;
  expect_varlen(c, kMixedLens, true);
}

// D = 576 and Dv = 512, the limits.
TEST(BwdVarlen, LargestHeadDims) {
  Case c = varlen_base();
  c.Hq = 2;
  c.Hk = 1;
  c.D = 576;
  c.Dv = 512;
  c.causal = true;
  expect_varlen(c, {{3, 70, 70}, {0, 5, 5}, {33, 18, 20}}, true);
}

TEST(BwdVarlen, WithoutSequsedK) {
  std::vector<SeqLens> lens = kMixedLens;
  for (SeqLens& l : lens) l.sk_present = l.sk_used;
  expect_varlen(varlen_base(), lens, false);
}

// Many (sequence, kv head) pairs: one key chunk per task, dq written directly.
TEST(BwdVarlen, ManySequences) {
  std::vector<SeqLens> lens;
  for (int64_t b = 0; b < 9; ++b) lens.push_back({5 + 17 * b, 3 + 23 * b, 3 + 23 * b + b % 3});
  Case c = varlen_base();
  c.causal = true;
  expect_varlen(c, lens, true);
}

TEST(BwdVarlen, BitwiseAcrossThreadCounts) {
  Case c = varlen_base();
  c.causal = true;
  VarlenProblem p(c, kMixedLens, true);
  std::vector<unsigned char> first;
  for (int threads : {1, 2, 3, 1}) {
    anyattn_set_num_threads(threads);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    if (first.empty()) {
      first = p.gradient_bytes();
    } else {
      EXPECT_TRUE(p.gradient_bytes() == first) << threads << " threads";
    }
  }
  anyattn_set_num_threads(0);
}

// With B sequences of equal lengths, anyattn_bwd_varlen computes exactly what anyattn_bwd does on
// the dense (B, S, H, D) tensors viewed as packed (B * S, H, D): same bits, sinks and dropout
// included (the dropout mask of sequence b is batch b's).
void expect_varlen_equals_dense(const BwdCase& c) {
  BwdProblem p(c);
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK) << anyattn_last_error();
  ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
  const std::vector<unsigned char> dense = p.gradient_bytes();
  const Case& f = c.fwd;
  const auto packed = [](const anyattn_tensor& t) {
    anyattn_tensor r = t;
    r.ndim = 3;
    r.shape[0] = t.shape[0] * t.shape[1];
    r.shape[1] = t.shape[2];
    r.shape[2] = t.shape[3];
    r.strides[0] = t.strides[1];
    r.strides[1] = t.strides[2];
    r.strides[2] = t.strides[3];
    return r;
  };
  for (const anyattn_tensor* t : {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.out, &p.dout}) {
    ASSERT_EQ(t->strides[0], t->shape[1] * t->strides[1]) << "needs batch-contiguous layouts";
  }
  std::vector<float> lse(static_cast<size_t>(f.Hq * f.B * f.Sq));
  const std::vector<double> dense_lse = reference::to_contiguous_f64(p.fwd.lse);
  for (int64_t b = 0; b < f.B; ++b) {
    for (int64_t h = 0; h < f.Hq; ++h) {
      for (int64_t i = 0; i < f.Sq; ++i) {
        lse[(h * f.B + b) * f.Sq + i] = static_cast<float>(dense_lse[(b * f.Hq + h) * f.Sq + i]);
      }
    }
  }
  anyattn_tensor lse_t{};
  const int64_t lse_shape[2] = {f.Hq, f.B * f.Sq};
  ASSERT_EQ(anyattn_tensor_init_contiguous(&lse_t, lse.data(), ANYATTN_DTYPE_F32, 2, lse_shape),
            ANYATTN_OK);
  std::vector<int32_t> cu_q, cu_k;
  for (int64_t b = 0; b <= f.B; ++b) {
    cu_q.push_back(static_cast<int32_t>(b * f.Sq));
    cu_k.push_back(static_cast<int32_t>(b * f.Sk));
  }
  Int32s cu_q_t(cu_q), cu_k_t(cu_k);
  std::fill(p.dq_buffer.begin(), p.dq_buffer.end(), 0x5A);
  std::fill(p.dk_buffer.begin(), p.dk_buffer.end(), 0x5A);
  std::fill(p.dv_buffer.begin(), p.dv_buffer.end(), 0x5A);
  std::fill(p.dsinks_buffer.begin(), p.dsinks_buffer.end(), 123.f);
  const anyattn_tensor q = packed(p.fwd.q), k = packed(p.fwd.k), v = packed(p.fwd.v),
                       out = packed(p.fwd.out), dout = packed(p.dout), dq = packed(p.dq),
                       dk = packed(p.dk), dv = packed(p.dv);
  ASSERT_EQ(anyattn_bwd_varlen(&dout, &q, &k, &v, &out, &lse_t, &dq, &dk, &dv,
                               f.sinks ? &p.dsinks : nullptr, &cu_q_t.t, &cu_k_t.t, nullptr, f.Sq,
                               f.Sk, &p.fwd.params),
            ANYATTN_OK)
      << anyattn_last_error();
  EXPECT_TRUE(p.gradient_bytes() == dense) << c.describe();
}

TEST(BwdVarlen, EqualLengthsMatchDenseBitwise) {
  BwdCase c;
  c.fwd = varlen_base();
  c.fwd.B = 3;
  c.fwd.Sq = 70;
  c.fwd.Sk = 100;
  c.fwd.causal = true;
  c.fwd.sinks = true;
  c.fwd.alibi = Alibi::kPerBatchHead;
  expect_varlen_equals_dense(c);
  c.dropout_p = 0.3f;
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  expect_varlen_equals_dense(c);
}

// ---- Validation ---------------------------------------------------------------------------------

class BwdVarlenErrors : public ::testing::Test {
 protected:
  BwdVarlenErrors()
      : q_(ANYATTN_DTYPE_F32, 10, 2, 8, 0),
        k_(ANYATTN_DTYPE_F32, 12, 1, 8, 0),
        v_(ANYATTN_DTYPE_F32, 12, 1, 4, 0),
        out_(ANYATTN_DTYPE_F32, 10, 2, 4, 0),
        dout_(ANYATTN_DTYPE_F32, 10, 2, 4, 0),
        dq_(ANYATTN_DTYPE_F32, 10, 2, 8, 0),
        dk_(ANYATTN_DTYPE_F32, 12, 1, 8, 0),
        dv_(ANYATTN_DTYPE_F32, 12, 1, 4, 0),
        cu_q_({0, 4, 10}),
        cu_k_({0, 5, 12}),
        lse_values_(20, 0.f) {
    const int64_t shape[2] = {2, 10};
    anyattn_tensor_init_contiguous(&lse_, lse_values_.data(), ANYATTN_DTYPE_F32, 2, shape);
  }

  anyattn_status call(const anyattn_tensor* dq, const anyattn_tensor* lse = nullptr,
                      const anyattn_tensor* cu_q = nullptr) {
    return anyattn_bwd_varlen(&dout_.t, &q_.t, &k_.t, &v_.t, &out_.t, lse, dq, &dk_.t, &dv_.t,
                              nullptr, cu_q != nullptr ? cu_q : &cu_q_.t, &cu_k_.t, nullptr, 6, 7,
                              nullptr);
  }
  void expect_error(anyattn_status status, const std::string& part) {
    EXPECT_EQ(status, ANYATTN_E_INVALID_ARGUMENT);
    const std::string message = anyattn_last_error();
    EXPECT_EQ(message.rfind("anyattn_bwd_varlen: ", 0), 0u) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }

  Packed q_, k_, v_, out_, dout_, dq_, dk_, dv_;
  Int32s cu_q_, cu_k_;
  std::vector<float> lse_values_;
  anyattn_tensor lse_{};
};

TEST_F(BwdVarlenErrors, ValidCallSucceeds) {
  EXPECT_EQ(call(&dq_.t, &lse_), ANYATTN_OK) << anyattn_last_error();
}

TEST_F(BwdVarlenErrors, LseIsRequired) {
  expect_error(call(&dq_.t), "lse is NULL");
}

TEST_F(BwdVarlenErrors, ForwardChecksNameTheBackward) {
  Int32s bad({0, 5, 4});
  expect_error(call(&dq_.t, &lse_, &bad.t), "cu_seqlens_q is not non-decreasing");
}

TEST_F(BwdVarlenErrors, HeadDimsPastTheLimits) {
  Packed wide_q(ANYATTN_DTYPE_F32, 10, 2, 577, 0);
  q_ = wide_q;
  expect_error(call(&dq_.t, &lse_), "q.shape[2] (head dim D) is 577; supported: 0..576");
}

TEST_F(BwdVarlenErrors, GradientShape) {
  Packed dq(ANYATTN_DTYPE_F32, 10, 2, 7, 0);
  expect_error(call(&dq.t, &lse_), "dq.shape is (10, 2, 7); expected (total_q, Hq, D)");
}

TEST_F(BwdVarlenErrors, GradientDtype) {
  Packed dq(ANYATTN_DTYPE_BF16, 10, 2, 8, 0);
  expect_error(call(&dq.t, &lse_), "dq.dtype is bf16 but q.dtype is f32");
}

TEST_F(BwdVarlenErrors, GradientOverlapsInput) {
  anyattn_tensor dq = q_.t;
  const std::vector<unsigned char> before = q_.bytes;
  EXPECT_NE(call(&dq, &lse_), ANYATTN_OK);
  EXPECT_NE(std::string(anyattn_last_error()).find("dq"), std::string::npos)
      << anyattn_last_error();
  EXPECT_TRUE(q_.bytes == before);
}

TEST_F(BwdVarlenErrors, DsinksWithoutSinks) {
  std::vector<float> dsinks(2);
  anyattn_tensor t{};
  const int64_t shape[1] = {2};
  anyattn_tensor_init_contiguous(&t, dsinks.data(), ANYATTN_DTYPE_F32, 1, shape);
  expect_error(anyattn_bwd_varlen(&dout_.t, &q_.t, &k_.t, &v_.t, &out_.t, &lse_, &dq_.t, &dk_.t,
                                  &dv_.t, &t, &cu_q_.t, &cu_k_.t, nullptr, 6, 7, nullptr),
               "dsinks is given but params->sinks is NULL");
}

// ---- C++ wrappers -------------------------------------------------------------------------------

TEST(BwdCpp, WrappersMatchTheCAbi) {
  BwdCase c;
  c.fwd = varlen_base();
  c.fwd.B = 2;
  c.fwd.Sq = 20;
  c.fwd.Sk = 30;
  c.fwd.causal = true;
  BwdProblem p(c);
  ASSERT_EQ(p.prepare_forward(), ANYATTN_OK);
  ASSERT_EQ(p.run(), ANYATTN_OK);
  const std::vector<unsigned char> expected = p.gradient_bytes();
  std::fill(p.dq_buffer.begin(), p.dq_buffer.end(), 0);
  std::fill(p.dk_buffer.begin(), p.dk_buffer.end(), 0);
  std::fill(p.dv_buffer.begin(), p.dv_buffer.end(), 0);
  FwdOptions options;
  options.causal = true;
  const auto view = [](const anyattn_tensor& t) {
    return TensorView(t.data, DType::kF32, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]},
                      {t.strides[0], t.strides[1], t.strides[2], t.strides[3]});
  };
  const TensorView lse(p.fwd.lse.data, DType::kF32,
                       {p.fwd.lse.shape[0], p.fwd.lse.shape[1], p.fwd.lse.shape[2]},
                       {p.fwd.lse.strides[0], p.fwd.lse.strides[1], p.fwd.lse.strides[2]});
  bwd(view(p.dout), view(p.fwd.q), view(p.fwd.k), view(p.fwd.v), view(p.fwd.out), lse, view(p.dq),
      view(p.dk), view(p.dv), options);
  EXPECT_TRUE(p.gradient_bytes() == expected);
  try {
    bwd(view(p.dout), view(p.fwd.q), view(p.fwd.k), view(p.fwd.v), view(p.fwd.out), lse,
        view(p.fwd.q), view(p.dk), view(p.dv), options);
    ADD_FAILURE() << "dq overlapping q did not throw";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_NE(error.message().find("anyattn_bwd: dq"), std::string::npos) << error.message();
  }
}

TEST(BwdCpp, VarlenWrapperThrowsWithTheMessage) {
  std::vector<float> q(10 * 2 * 8), k(12 * 8), v(12 * 4), out(10 * 2 * 4), dout(10 * 2 * 4),
      lse(2 * 10), dq(10 * 2 * 8), dk(12 * 8), dv(12 * 4);
  std::vector<int32_t> cu_q = {0, 4, 10}, cu_k = {0, 5, 12};
  const TensorView cu_q_view(cu_q.data(), {3}), cu_k_view(cu_k.data(), {3});
  bwd_varlen(TensorView(dout.data(), {10, 2, 4}), TensorView(q.data(), {10, 2, 8}),
             TensorView(k.data(), {12, 1, 8}), TensorView(v.data(), {12, 1, 4}),
             TensorView(out.data(), {10, 2, 4}), TensorView(lse.data(), {2, 10}),
             TensorView(dq.data(), {10, 2, 8}), TensorView(dk.data(), {12, 1, 8}),
             TensorView(dv.data(), {12, 1, 4}), cu_q_view, cu_k_view, 6, 7);
  // q = 0 everywhere with lse = 0 and dout = 0: every gradient is exactly 0.
  for (float x : dq) EXPECT_EQ(x, 0.f);
  try {
    bwd_varlen(TensorView(dout.data(), {10, 2, 4}), TensorView(q.data(), {10, 2, 8}),
               TensorView(k.data(), {12, 1, 8}), TensorView(v.data(), {12, 1, 4}),
               TensorView(out.data(), {10, 2, 4}), TensorView(lse.data(), {2, 10}),
               TensorView(dq.data(), {10, 2, 8}), TensorView(dk.data(), {12, 1, 8}),
               TensorView(dv.data(), {12, 1, 4}), cu_q_view, cu_k_view, 5, 7);
    ADD_FAILURE() << "max_seqlen_q below a length did not throw";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), ANYATTN_E_INVALID_ARGUMENT);
    EXPECT_NE(error.message().find("anyattn_bwd_varlen: sequence 1 has 6 rows"), std::string::npos)
        << error.message();
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
