// One test per error path of anyattn_bwd: the status, a message that names the parameter, and no
// byte of any gradient written.
#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "backward/bwd_test_support.h"

namespace anyattn {
namespace testing {
namespace {

bool names(const std::string& text, const std::string& word) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    const size_t end = at + word.size();
    if ((at == 0 || !ident(text[at - 1])) && (end == text.size() || !ident(text[end]))) return true;
  }
  return false;
}

BwdCase valid_case() {
  BwdCase c;
  c.fwd.B = 2;
  c.fwd.Sq = 5;
  c.fwd.Sk = 7;
  c.fwd.Hq = 4;
  c.fwd.Hk = 2;
  c.fwd.D = 16;
  c.fwd.Dv = 8;
  c.fwd.sinks = true;
  return c;
}

class BwdErrors : public ::testing::Test {
 protected:
  BwdErrors() : p_(valid_case()) {
    EXPECT_EQ(p_.prepare_forward(), ANYATTN_OK);
    dout_ = p_.dout;
    q_ = p_.fwd.q;
    k_ = p_.fwd.k;
    v_ = p_.fwd.v;
    out_ = p_.fwd.out;
    lse_ = p_.fwd.lse;
    dq_ = p_.dq;
    dk_ = p_.dk;
    dv_ = p_.dv;
    dsinks_ = p_.dsinks;
    params_ = p_.fwd.params;
  }

  void expect_rejected(anyattn_status expected, std::vector<std::string> words) {
    const std::vector<unsigned char> before = p_.gradient_bytes();
    const anyattn_status status =
        anyattn_bwd(doutp_, &q_, &k_, &v_, &out_, lsep_, &dq_, &dk_, &dv_, dsinksp_, &params_);
    const std::string message = anyattn_last_error();
    EXPECT_EQ(status, expected) << anyattn_status_name(status) << ": " << message;
    EXPECT_TRUE(names(message, "anyattn_bwd")) << message;
    for (const std::string& word : words) {
      EXPECT_TRUE(names(message, word)) << "message does not name " << word << ": " << message;
    }
    EXPECT_TRUE(p_.gradient_bytes() == before) << "a failing call wrote a gradient";
  }

  BwdProblem p_;
  anyattn_tensor dout_{}, q_{}, k_{}, v_{}, out_{}, lse_{}, dq_{}, dk_{}, dv_{}, dsinks_{};
  anyattn_fwd_params params_{};
  const anyattn_tensor* doutp_ = &dout_;
  const anyattn_tensor* lsep_ = &lse_;
  const anyattn_tensor* dsinksp_ = &dsinks_;
};

TEST_F(BwdErrors, ValidCallSucceeds) {
  EXPECT_EQ(anyattn_bwd(&dout_, &q_, &k_, &v_, &out_, &lse_, &dq_, &dk_, &dv_, &dsinks_, &params_),
            ANYATTN_OK)
      << anyattn_last_error();
  EXPECT_STREQ(anyattn_last_error(), "");
}

TEST_F(BwdErrors, NullDout) {
  doutp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dout", "NULL"});
}

TEST_F(BwdErrors, NullLse) {
  lsep_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse", "NULL"});
}

TEST_F(BwdErrors, DoutWrongRank) {
  dout_.ndim = 3;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dout", "ndim"});
}

TEST_F(BwdErrors, DoutDtypeDiffersFromQ) {
  dout_.dtype = ANYATTN_DTYPE_BF16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dout", "dtype", "bf16"});
}

TEST_F(BwdErrors, DoutWrongShape) {
  dout_.shape[3] = 7;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dout", "shape"});
}

TEST_F(BwdErrors, OutWrongShape) {
  out_.shape[1] = 4;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"out", "shape"});
}

TEST_F(BwdErrors, LseWrongShape) {
  lse_.shape[2] = 4;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse", "shape"});
}

TEST_F(BwdErrors, LseNotF32) {
  lse_.dtype = ANYATTN_DTYPE_F16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"lse", "dtype", "f32"});
}

TEST_F(BwdErrors, DqWrongShape) {
  dq_.shape[3] = 8;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dq", "shape"});
}

TEST_F(BwdErrors, DkWrongShape) {
  dk_.shape[1] = 6;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dk", "shape"});
}

TEST_F(BwdErrors, DvWrongShape) {
  dv_.shape[2] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dv", "shape"});
}

TEST_F(BwdErrors, GradientDtypeDiffersFromQ) {
  dk_.dtype = ANYATTN_DTYPE_F16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dk", "dtype"});
}

TEST_F(BwdErrors, GradientNonUnitLastStride) {
  dv_.strides[3] = 2;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dv", "strides"});
}

TEST_F(BwdErrors, KBatchDiffers) {
  k_.shape[0] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"k", "shape"});
}

TEST_F(BwdErrors, HqNotMultipleOfHk) {
  k_.shape[2] = 3;
  v_.shape[2] = 3;
  dk_.shape[2] = 3;
  dv_.shape[2] = 3;
  k_.strides[1] = 3 * 16;
  v_.strides[1] = 3 * 8;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"Hq", "Hk"});
}

TEST_F(BwdErrors, HeadDimTooLarge) {
  for (anyattn_tensor* t : {&q_, &k_, &dq_, &dk_}) t->shape[3] = 577;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"(head dim D) is 577", "supported: 0..576"});
}

TEST_F(BwdErrors, ValueHeadDimTooLarge) {
  for (anyattn_tensor* t : {&v_, &out_, &dout_, &dv_}) t->shape[3] = 513;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"(head dim Dv) is 513", "supported: 0..512"});
}

TEST_F(BwdErrors, GradientAliasesAnInput) {
  dq_.data = q_.data;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dq", "q", "overlaps"});
}

TEST_F(BwdErrors, GradientsAliasEachOther) {
  dv_.data = dk_.data;
  dv_.strides[0] = dk_.strides[0];
  dv_.strides[1] = dk_.strides[1];
  dv_.strides[2] = dk_.strides[2];
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dv", "dk", "overlaps"});
}

TEST_F(BwdErrors, GradientOverlapsItself) {
  dq_.strides[1] = 1;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dq", "overlapping"});
}

TEST_F(BwdErrors, DsinksMissingWithSinks) {
  dsinksp_ = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dsinks", "sinks"});
}

TEST_F(BwdErrors, DsinksWithoutSinks) {
  params_.sinks = nullptr;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dsinks", "sinks"});
}

TEST_F(BwdErrors, DsinksWrongShape) {
  dsinks_.shape[0] = 3;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dsinks", "Hq"});
}

TEST_F(BwdErrors, DsinksNotF32) {
  dsinks_.dtype = ANYATTN_DTYPE_BF16;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dsinks", "dtype"});
}

TEST_F(BwdErrors, DsinksAliasesSinks) {
  dsinks_.data = p_.fwd.sinks.data;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dsinks", "overlaps"});
}

TEST_F(BwdErrors, DropoutOutOfRange) {
  params_.dropout_p = 1.f;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"dropout_p"});
}

TEST_F(BwdErrors, NegativeSoftcap) {
  params_.softcap = -1.f;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softcap"});
}

TEST_F(BwdErrors, WindowBelowMinusOne) {
  params_.window_left = -2;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"window_left"});
}

TEST_F(BwdErrors, NonFiniteScale) {
  params_.softmax_scale = std::numeric_limits<float>::infinity();
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"softmax_scale"});
}

TEST_F(BwdErrors, AlibiWrongShape) {
  p_.fwd.alibi_buffer.assign(8, 0.5f);
  anyattn_tensor slopes{};
  slopes.data = p_.fwd.alibi_buffer.data();
  slopes.dtype = ANYATTN_DTYPE_F32;
  slopes.ndim = 1;
  slopes.shape[0] = 3;
  slopes.strides[0] = 1;
  params_.alibi_slopes = &slopes;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"alibi_slopes", "Hq"});
}

TEST_F(BwdErrors, UnknownIsa) {
  params_.isa = 9;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"isa"});
}

TEST_F(BwdErrors, ParamsStructSizeTooSmall) {
  params_.struct_size = 0;
  expect_rejected(ANYATTN_E_INVALID_ARGUMENT, {"struct_size"});
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
