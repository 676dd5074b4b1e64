// One test per error path of anyattn_fwd: the status, a message that names the parameter, and no
// byte of any output (or input) written.
#include <gtest/gtest.h>

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

// True when `word` occurs in `text` not preceded or followed by an identifier character, so that
// "q" matches "q.shape[3]" and "q is NULL" but not "requires".
bool contains_word(const std::string& text, const std::string& word) {
  auto is_ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const bool left_ok = at == 0 || !is_ident(text[at - 1]);
    const size_t end = at + word.size();
    const bool right_ok = end == text.size() || !is_ident(text[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

class FwdErrors : public ::testing::Test {
 protected:
  // A valid problem: B=2, Sq=5, Sk=7, Hq=4, Hk=2, D=16, Dv=8, f32, contiguous.
  static Case valid_case() {
    Case c;
    c.B = 2;
    c.Sq = 5;
    c.Sk = 7;
    c.Hq = 4;
    c.Hk = 2;
    c.D = 16;
    c.Dv = 8;
    return c;
  }

  FwdErrors() : p_(valid_case()) {
    q_ = p_.q;
    k_ = p_.k;
    v_ = p_.v;
    out_ = p_.out;
    lse_ = p_.lse;
    params_ = p_.params;
  }

  anyattn_status call() { return anyattn_fwd(qp_, kp_, vp_, outp_, lsep_, paramsp_); }

  // Calls anyattn_fwd with the current descriptors and checks the status, that the message names
  // every word of `names`, and that no buffer changed.
  void expect_rejected(anyattn_status expected, std::vector<std::string> names) {
    const std::vector<unsigned char> q_before = p_.q_buffer, kv_before = p_.kv_buffer;
    const anyattn_status status = call();
    const std::string message = anyattn_last_error();
    EXPECT_EQ(status, expected) << anyattn_status_name(status) << ": " << message;
    for (const std::string& name : names) {
      EXPECT_TRUE(contains_word(message, name))
          << "message does not name " << name << ": \"" << message << "\"";
    }
    EXPECT_TRUE(p_.outputs_untouched()) << "a failing call wrote to out or lse";
    EXPECT_TRUE(p_.q_buffer == q_before && p_.kv_buffer == kv_before)
        << "a failing call wrote to an input";
  }

  Problem p_;
  anyattn_tensor q_{}, k_{}, v_{}, out_{}, lse_{};
  anyattn_fwd_params params_{};
  const anyattn_tensor *qp_ = &q_, *kp_ = &k_, *vp_ = &v_, *outp_ = &out_, *lsep_ = &lse_;
  const anyattn_fwd_params* paramsp_ = &params_;
};

TEST_F(FwdErrors, ValidProblemSucceedsAndClearsTheLastError) {
  qp_ = nullptr;
  ASSERT_EQ(call(), ANYATTN_E_INVALID_ARGUMENT);
  ASSERT_STRNE(anyattn_last_error(), "");
  qp_ = &q_;
  ASSERT_EQ(call(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_STREQ(anyattn_last_error(), "");
  EXPECT_TRUE(check_outputs(p_, p_.reference(), p_.naive_same_dtype()));
}

TEST_F(FwdErrors, LastErrorIsPerThread) {
  qp_ = nullptr;
  ASSERT_EQ(call(), ANYATTN_E_INVALID_ARGUMENT);
  const std::string mine = anyattn_last_error();
  std::string other_before, other_after;
  std::thread other([&] {
    other_before = anyattn_last_error();  // A fresh thread has no error.
    anyattn_fwd_params params;
    anyattn_fwd_params_init(&params);
    params.softcap = -1.0f;
    anyattn_fwd(&q_, &k_, &v_, &out_, &lse_, &params);
    other_after = anyattn_last_error();
  });
  other.join();
  EXPECT_EQ(other_before, "");
  EXPECT_TRUE(contains_word(other_after, "softcap")) << other_after;
  EXPECT_EQ(std::string(anyattn_last_error()), mine);
}

// ---- Null pointers ------------------------------------------------------------------------------

TEST_F(FwdErrors, NullQ) {
  qp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, NullK) {
  kp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, NullV) {
  vp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, NullOut) {
  outp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, NullDataQ) {
  q_.data = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, NullDataK) {
  k_.data = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, NullDataV) {
  v_.data = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, NullDataOut) {
  out_.data = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, NullDataLse) {
  lse_.data = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse"});
}

// ---- Rank and shape -----------------------------------------------------------------------------

TEST_F(FwdErrors, RankOfQ) {
  q_.ndim = 3;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, RankOfKTooLarge) {
  k_.ndim = 5;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, RankOfLse) {
  lse_.ndim = 4;
  lse_.shape[3] = 1;
  lse_.strides[3] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse"});
}
TEST_F(FwdErrors, NegativeDimension) {
  q_.shape[1] = -1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, BatchOfKDiffers) {
  k_.shape[0] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, SeqLenOfVDiffersFromK) {
  v_.shape[1] = 6;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, HeadsOfVDifferFromK) {
  v_.shape[2] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, HeadDimOfKDiffersFromQ) {
  k_.shape[3] = 8;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, OutHeadDimDiffersFromV) {
  out_.shape[3] = 4;  // Dv is 8.
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, OutSeqLenDiffers) {
  out_.shape[1] = 4;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, OutHeadsDiffer) {
  out_.shape[2] = 2;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, LseShapeDiffers) {
  lse_.shape[2] = 4;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse"});
}
TEST_F(FwdErrors, LseHeadsDiffer) {
  lse_.shape[1] = 2;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse"});
}
TEST_F(FwdErrors, HqNotMultipleOfHk) {
  // Hk = 3 over 4 query heads; k and v agree with each other and stay inside their buffers.
  k_.shape[2] = v_.shape[2] = 3;
  k_.shape[1] = v_.shape[1] = 4;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"Hq", "Hk"});
}
TEST_F(FwdErrors, NoKeyHeadsForQueryHeads) {
  // Hk = 0 under Hq = 4: nothing to attend with (Hq = Hk = 0 is an empty call, degenerate_test.cc).
  k_.shape[2] = v_.shape[2] = 0;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"Hq", "Hk", "k.shape[2]"});
}

// ---- Dtypes and strides -------------------------------------------------------------------------

TEST_F(FwdErrors, DtypeOfKDiffers) {
  k_.dtype = ANYATTN_DTYPE_F16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, DtypeOfVDiffers) {
  v_.dtype = ANYATTN_DTYPE_BF16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, DtypeOfOutDiffers) {
  out_.dtype = ANYATTN_DTYPE_F16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}
TEST_F(FwdErrors, I32Inputs) {
  q_.dtype = k_.dtype = v_.dtype = out_.dtype = ANYATTN_DTYPE_I32;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q", "i32"});
}
TEST_F(FwdErrors, UnknownDtype) {
  q_.dtype = 17;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, LseNotF32) {
  lse_.dtype = ANYATTN_DTYPE_F16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse"});
}
TEST_F(FwdErrors, NonUnitLastStrideOfQ) {
  q_.strides[3] = 2;
  q_.shape[0] = 1;  // Stays inside the buffer.
  out_.shape[0] = lse_.shape[0] = k_.shape[0] = v_.shape[0] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, ZeroLastStrideOfV) {
  v_.strides[3] = 0;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, NonUnitLastStrideOfOut) {
  out_.strides[3] = -1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}

// ---- Head dims ----------------------------------------------------------------------------------

TEST_F(FwdErrors, HeadDimAbove576) {
  Case c = valid_case();
  c.D = 577;
  Problem big(c);  // Real buffers, so the rejection is not about memory.
  ASSERT_EQ(anyattn_fwd(&big.q, &big.k, &big.v, &big.out, &big.lse, &big.params),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_STREQ(anyattn_last_error(),
               "anyattn_fwd: q.shape[3] (head dim D) is 577; supported: 0..576");
  EXPECT_TRUE(big.outputs_untouched());
}
TEST_F(FwdErrors, ValueHeadDimAbove512) {
  Case c = valid_case();
  c.Dv = 513;
  Problem big(c);
  ASSERT_EQ(anyattn_fwd(&big.q, &big.k, &big.v, &big.out, &big.lse, &big.params),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_STREQ(anyattn_last_error(),
               "anyattn_fwd: v.shape[3] (head dim Dv) is 513; supported: 0..512");
  EXPECT_TRUE(big.outputs_untouched());
}

// ---- Scalar parameters --------------------------------------------------------------------------

TEST_F(FwdErrors, WindowLeftBelowMinusOne) {
  params_.window_left = -2;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"window_left"});
}
TEST_F(FwdErrors, WindowRightBelowMinusOne) {
  params_.window_right = -7;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"window_right"});
}
TEST_F(FwdErrors, NegativeSoftcap) {
  params_.softcap = -1.0f;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softcap"});
}
TEST_F(FwdErrors, NanSoftcap) {
  params_.softcap = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softcap"});
}
TEST_F(FwdErrors, NanSoftmaxScale) {
  params_.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softmax_scale"});
}
TEST_F(FwdErrors, InfiniteSoftmaxScale) {
  params_.softmax_scale = -std::numeric_limits<float>::infinity();
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softmax_scale"});
}
TEST_F(FwdErrors, DropoutOfOneOrMoreIsRejected) {
  params_.dropout_p = 1.0f;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dropout_p", "[0, 1)"});
}
TEST_F(FwdErrors, NegativeNumSplits) {
  params_.num_splits = -1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"num_splits"});
}
TEST_F(FwdErrors, UnknownIsa) {
  params_.isa = 42;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"isa"});
}
TEST_F(FwdErrors, StructSizeTooSmall) {
  params_.struct_size = 0;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"struct_size"});
}
TEST_F(FwdErrors, OlderStructSizeIgnoresLaterFields) {
  // A caller compiled before `isa` existed: the garbage beyond struct_size must be ignored.
  params_.struct_size = offsetof(anyattn_fwd_params, isa);
  params_.isa = 42;
  EXPECT_EQ(call(), ANYATTN_OK) << anyattn_last_error();
  EXPECT_TRUE(check_outputs(p_, p_.reference(), p_.naive_same_dtype()));
}

// ---- ALiBi and sinks ----------------------------------------------------------------------------

class FwdErrorsOptional : public FwdErrors {
 protected:
  FwdErrorsOptional() {
    slopes_.assign(16, 0.5f);
    alibi_ = {};
    alibi_.data = slopes_.data();
    alibi_.dtype = ANYATTN_DTYPE_F32;
    alibi_.ndim = 1;
    alibi_.shape[0] = 4;  // Hq
    alibi_.strides[0] = 1;
    sinks_ = alibi_;
  }
  std::vector<float> slopes_;
  anyattn_tensor alibi_{}, sinks_{};
};

TEST_F(FwdErrorsOptional, ValidAlibiAndSinksAreAccepted) {
  params_.alibi_slopes = &alibi_;
  params_.sinks = &sinks_;
  EXPECT_EQ(call(), ANYATTN_OK) << anyattn_last_error();
}
TEST_F(FwdErrorsOptional, AlibiWrongLength) {
  alibi_.shape[0] = 5;
  params_.alibi_slopes = &alibi_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes"});
}
TEST_F(FwdErrorsOptional, AlibiWrongBatch) {
  alibi_.ndim = 2;
  alibi_.shape[0] = 3;  // B is 2.
  alibi_.shape[1] = 4;
  alibi_.strides[0] = 4;
  alibi_.strides[1] = 1;
  params_.alibi_slopes = &alibi_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes"});
}
TEST_F(FwdErrorsOptional, AlibiWrongRank) {
  alibi_.ndim = 3;
  alibi_.shape[0] = 1;
  alibi_.shape[1] = 2;
  alibi_.shape[2] = 4;
  alibi_.strides[0] = 8;
  alibi_.strides[1] = 4;
  alibi_.strides[2] = 1;
  params_.alibi_slopes = &alibi_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes"});
}
TEST_F(FwdErrorsOptional, AlibiWrongDtype) {
  alibi_.dtype = ANYATTN_DTYPE_F16;
  params_.alibi_slopes = &alibi_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes"});
}
TEST_F(FwdErrorsOptional, AlibiNullData) {
  alibi_.data = nullptr;
  params_.alibi_slopes = &alibi_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes"});
}
TEST_F(FwdErrorsOptional, SinksWrongLength) {
  sinks_.shape[0] = 3;
  params_.sinks = &sinks_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"sinks"});
}
TEST_F(FwdErrorsOptional, SinksPerBatchIsRejected) {
  sinks_.ndim = 2;
  sinks_.shape[0] = 2;
  sinks_.shape[1] = 4;
  sinks_.strides[0] = 4;
  sinks_.strides[1] = 1;
  params_.sinks = &sinks_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"sinks"});
}
TEST_F(FwdErrorsOptional, SinksWrongDtype) {
  sinks_.dtype = ANYATTN_DTYPE_BF16;
  params_.sinks = &sinks_;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"sinks"});
}

// ---- Sizes that overflow int64, checked before any access ---------------------------------------

TEST_F(FwdErrors, ElementCountOverflowsInt64) {
  // 2^21 * 2^21 * 2^21 * 16 elements over a buffer of a few hundred bytes.
  q_.shape[0] = q_.shape[1] = q_.shape[2] = int64_t{1} << 21;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"q"});
}
TEST_F(FwdErrors, StrideSpanOverflowsInt64) {
  k_.strides[0] = std::numeric_limits<int64_t>::max() / 2 + 1;
  k_.strides[1] = std::numeric_limits<int64_t>::max() / 8;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k"});
}
TEST_F(FwdErrors, ByteSpanOverflowsInt64) {
  // The element span fits int64 but the span in bytes (x4) does not.
  v_.strides[0] = std::numeric_limits<int64_t>::max() / 3;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"v"});
}
TEST_F(FwdErrors, NegativeStrideSpanBeforeAddressZero) {
  out_.strides[0] = std::numeric_limits<int64_t>::min() / 8;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out"});
}

// ---- Aliasing -----------------------------------------------------------------------------------

// q, k, v, out share one f32 buffer in these tests; D = Dv so out can sit exactly on q.
class FwdAliasing : public ::testing::Test {
 protected:
  static constexpr int64_t kB = 1, kS = 6, kH = 2, kD = 8, kN = kB * kS * kH * kD;
  FwdAliasing() : buffer_(6 * kN, 0.25f), lse_buffer_(64, 0.0f) {
    const int64_t shape[4] = {kB, kS, kH, kD};
    for (int i = 0; i < 4; ++i) {
      anyattn_tensor* t = i == 0 ? &q_ : i == 1 ? &k_ : i == 2 ? &v_ : &out_;
      EXPECT_EQ(
          anyattn_tensor_init_contiguous(t, buffer_.data() + i * kN, ANYATTN_DTYPE_F32, 4, shape),
          ANYATTN_OK);
    }
    const int64_t lse_shape[3] = {kB, kH, kS};
    anyattn_tensor_init_contiguous(&lse_, lse_buffer_.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
  }

  void expect_alias_rejected(std::vector<std::string> names) {
    const std::vector<float> before = buffer_, lse_before = lse_buffer_;
    EXPECT_EQ(anyattn_fwd(&q_, &k_, &v_, &out_, &lse_, nullptr), ANYATTN_E_INVALID_ARGUMENT);
    const std::string message = anyattn_last_error();
    for (const std::string& name : names) {
      EXPECT_TRUE(contains_word(message, name)) << "no " << name << " in \"" << message << "\"";
    }
    EXPECT_TRUE(buffer_ == before && lse_buffer_ == lse_before) << "a rejected call wrote memory";
  }

  std::vector<float> buffer_, lse_buffer_;
  anyattn_tensor q_{}, k_{}, v_{}, out_{}, lse_{};
};

TEST_F(FwdAliasing, DisjointViewsOfOneBufferAreAccepted) {
  EXPECT_EQ(anyattn_fwd(&q_, &k_, &v_, &out_, &lse_, nullptr), ANYATTN_OK) << anyattn_last_error();
}
TEST_F(FwdAliasing, OutIsQ) {
  out_.data = q_.data;
  expect_alias_rejected({"out", "q"});
}
TEST_F(FwdAliasing, OutOverlapsK) {
  out_.data = static_cast<float*>(k_.data) + kN / 2;
  expect_alias_rejected({"out", "k"});
}
TEST_F(FwdAliasing, OutOverlapsVByOneElement) {
  out_.data = static_cast<float*>(v_.data) + kN - 1;
  expect_alias_rejected({"out", "v"});
}
TEST_F(FwdAliasing, LseOverlapsOut) {
  lse_.data = static_cast<float*>(out_.data) + 3;
  expect_alias_rejected({"lse", "out"});
}
TEST_F(FwdAliasing, LseOverlapsQ) {
  lse_.data = q_.data;
  expect_alias_rejected({"lse", "q"});
}
TEST_F(FwdAliasing, OutOverlapsItself) {
  out_.strides[1] = 0;  // Every query row writes the same memory.
  expect_alias_rejected({"out"});
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
