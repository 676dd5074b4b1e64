// api::CallCheck against small tables of its own: how symbolic dims bind and what a mismatch
// says, how tables checked in turn share their dims and their memory rules, optional tensors, and
// the in-place exception. The entry points' own tables are covered through the C ABI by the
// errors tests.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "api/call_check.h"
#include "api/entry_tables.h"
#include "api/errors.h"

namespace anyattn::api {
namespace {

anyattn_tensor view(std::vector<float>& data, std::vector<int64_t> shape) {
  anyattn_tensor t;
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data.data(), ANYATTN_DTYPE_F32,
                                           static_cast<int32_t>(shape.size()), shape.data()),
            ANYATTN_OK);
  return t;
}

// The message of the ApiError `body` throws, or "" if it returns.
template <class Body>
std::string message_of(Body&& body) {
  try {
    body();
  } catch (const ApiError& error) {
    return error.what();
  }
  return "";
}

constexpr TensorSpec kPairSpecs[] = {
    {"x", {Dim::kB, Dim::kHq, Dim::kD}, DTypes::kShared, Role::kInput, false, 0},
    {"y", {Dim::kB, Dim::kHq, Dim::kDv}, DTypes::kShared, Role::kOutput, false, 0},
    {"z", {Dim::kHq, Dim::kB}, DTypes::kF32, Role::kOutput, true, 0}};
constexpr TensorTable kPair = make_table(kPairSpecs, "x and y must share one dtype");

constexpr TensorSpec kFollowerSpecs[] = {
    {"w", {Dim::kB, Dim::kDv}, DTypes::kShared, Role::kOutput, false, 0}};
constexpr TensorTable kFollower = make_table(kFollowerSpecs, "x, y and w must share one dtype");

TEST(CallCheck, BindsEachDimFromItsFirstTensor) {
  std::vector<float> x(2 * 3 * 4), y(2 * 3 * 5);
  anyattn_tensor tx = view(x, {2, 3, 4}), ty = view(y, {2, 3, 5});
  const anyattn_tensor* tensors[] = {&tx, &ty, nullptr};
  CallCheck check("f");
  check.check(kPair, tensors);
  EXPECT_EQ(check[Dim::kB], 2);
  EXPECT_EQ(check[Dim::kHq], 3);
  EXPECT_EQ(check[Dim::kD], 4);
  EXPECT_EQ(check[Dim::kDv], 5);
}

TEST(CallCheck, AShapeMismatchNamesTheAxisTheValueAndWhereTheDimCameFrom) {
  std::vector<float> x(2 * 3 * 4), y(2 * 7 * 5);
  anyattn_tensor tx = view(x, {2, 3, 4}), ty = view(y, {2, 7, 5});
  const anyattn_tensor* tensors[] = {&tx, &ty, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, tensors); }),
            "f: y.shape is (2, 7, 5); expected (B, Hq, Dv) = (2, 3, 5): y.shape[1] is 7, but Hq "
            "is 3 (x.shape[1])");
}

TEST(CallCheck, RankDtypeAndNullMessagesNameTheTensor) {
  std::vector<float> x(2 * 3 * 4), y(2 * 3 * 5);
  anyattn_tensor tx = view(x, {2, 3, 4}), ty = view(y, {2, 3, 5});
  anyattn_tensor flat = view(y, {30});
  const anyattn_tensor* wrong_rank[] = {&tx, &flat, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, wrong_rank); }),
            "f: y.ndim is 1; expected 3 (B, Hq, Dv)");
  anyattn_tensor half = ty;
  half.dtype = ANYATTN_DTYPE_F16;
  const anyattn_tensor* wrong_dtype[] = {&tx, &half, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, wrong_dtype); }),
            "f: y.dtype is f16 but x.dtype is f32; x and y must share one dtype");
  const anyattn_tensor* missing[] = {nullptr, &ty, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, missing); }),
            "f: x is NULL; a tensor descriptor is required");
}

TEST(CallCheck, OutputsMustNotOverlapAnyOtherTensor) {
  std::vector<float> x(2 * 3 * 4), z(3 * 2);
  anyattn_tensor tx = view(x, {2, 3, 4}), tz = view(z, {3, 2});
  anyattn_tensor ty = view(x, {2, 3, 4});  // y written over x
  const anyattn_tensor* tensors[] = {&tx, &ty, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, tensors); }),
            "f: y overlaps x in memory; outputs must not alias inputs or each other");
  std::vector<float> y(2 * 3 * 4);
  ty = view(y, {2, 3, 4});
  tz.data = y.data();  // z written over y
  const anyattn_tensor* outputs_alias[] = {&tx, &ty, &tz};
  EXPECT_NE(message_of([&] { CallCheck("f").check(kPair, outputs_alias); }).find("z overlaps y"),
            std::string::npos);
}

TEST(CallCheck, ALaterTableUsesTheDimsAndMemoryOfTheEarlierOnes) {
  std::vector<float> x(2 * 3 * 4), y(2 * 3 * 5), w(2 * 5);
  anyattn_tensor tx = view(x, {2, 3, 4}), ty = view(y, {2, 3, 5}), tw = view(w, {2, 5});
  const anyattn_tensor* first[] = {&tx, &ty, nullptr};
  {
    CallCheck check("f");
    check.check(kPair, first);
    const anyattn_tensor* follower[] = {&tw};
    EXPECT_EQ(message_of([&] { check.check(kFollower, follower); }), "");
  }
  {
    CallCheck check("f");
    check.check(kPair, first);
    anyattn_tensor wide = view(w, {2, 4});
    const anyattn_tensor* follower[] = {&wide};
    EXPECT_EQ(message_of([&] { check.check(kFollower, follower); }),
              "f: w.shape is (2, 4); expected (B, Dv) = (2, 5): w.shape[1] is 4, but Dv is 5 "
              "(y.shape[2])");
  }
  {
    CallCheck check("f");
    check.check(kPair, first);
    anyattn_tensor over_x = view(x, {2, 5});
    const anyattn_tensor* follower[] = {&over_x};
    EXPECT_EQ(message_of([&] { check.check(kFollower, follower); }),
              "f: w overlaps x in memory; outputs must not alias inputs or each other");
  }
}

TEST(CallCheck, AnInPlaceOutputMayBeExactlyItsInputButNotPartly) {
  std::vector<float> a(7 * 2 * 4), b(6 * 2 * 4), lse_a(2 * 6), lse_b(2 * 6);
  anyattn_tensor ta = view(a, {6, 2, 4}), tb = view(b, {6, 2, 4});
  anyattn_tensor la = view(lse_a, {2, 6}), lb = view(lse_b, {2, 6});
  const anyattn_tensor* in_place[] = {&ta, &la, &tb, &lb, &ta, &la};
  EXPECT_EQ(message_of([&] { CallCheck("merge").check(tables::kMergeTokens, in_place); }), "");
  anyattn_tensor next_row = ta;  // rows 1..6 of a: overlaps out_a without being it
  next_row.data = a.data() + 2 * 4;
  const anyattn_tensor* partly[] = {&ta, &la, &tb, &lb, &next_row, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("merge").check(tables::kMergeTokens, partly); }),
            "merge: out overlaps out_a in memory; outputs must not alias inputs or each other");
}

TEST(CallCheck, DimRules) {
  std::vector<float> x(577), y(513);
  anyattn_tensor tx = view(x, {1, 1, 577}), ty = view(y, {1, 1, 1});
  const anyattn_tensor* head_dim[] = {&tx, &ty, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, head_dim); }),
            "f: x.shape[2] (head dim D) is 577; supported: 0..576");
  // The largest head dims pass: D = 576 and Dv = 512 (absorbed MLA's).
  anyattn_tensor widest_x = view(x, {1, 1, 576}), widest_y = view(y, {1, 1, 512});
  const anyattn_tensor* widest[] = {&widest_x, &widest_y, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, widest); }), "");
  anyattn_tensor wide_y = view(y, {1, 1, 513});
  const anyattn_tensor* value_head_dim[] = {&widest_x, &wide_y, nullptr};
  EXPECT_EQ(message_of([&] { CallCheck("f").check(kPair, value_head_dim); }),
            "f: y.shape[2] (head dim Dv) is 513; supported: 0..512");
  // B = 2^31 rows, all at one address: fits memory, but not the int32 the kernels count in.
  anyattn_tensor many = view(y, {1, 1, 1}), many_out = view(x, {1, 1, 1});
  many.shape[0] = many_out.shape[0] = int64_t{1} << 31;
  many.strides[0] = many_out.strides[0] = 0;
  const anyattn_tensor* extent[] = {&many, &many_out, nullptr};
  try {
    CallCheck("f").check(kPair, extent);
    ADD_FAILURE() << "B = 2^31 accepted";
  } catch (const ApiError& error) {
    EXPECT_EQ(error.status(), ANYATTN_E_UNSUPPORTED);
    EXPECT_STREQ(error.what(), "f: B is 2147483648 (x.shape[0]); supported: up to 2147483647");
  }
}

}  // namespace
}  // namespace anyattn::api
