// runtime::str_cat, which builds every error message and the ANYATTN_VERBOSE plan line: each part
// type's formatting, and independence from the global C++ locale (a host program's
// std::locale::global must not put digit grouping into anyattn's messages).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <locale>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "runtime/str_cat.h"

namespace anyattn::runtime {
namespace {

enum class Color : int16_t { kRed = -3 };

TEST(StrCat, FormatsEveryPartType) {
  const std::string text = "text";
  EXPECT_EQ(str_cat("a", text, std::string_view("b"), 'c'), "atextbc");
  EXPECT_EQ(str_cat(true, false), "10");
  EXPECT_EQ(str_cat(0, -7, 32768, std::numeric_limits<int64_t>::min()),
            "0-732768-9223372036854775808");
  EXPECT_EQ(str_cat(std::numeric_limits<uint64_t>::max()), "18446744073709551615");
  EXPECT_EQ(str_cat(static_cast<int8_t>(-5), static_cast<uint8_t>(200)), "-5200");
  EXPECT_EQ(str_cat(Color::kRed), "-3");
  EXPECT_EQ(str_cat(), "");
}

TEST(StrCat, FloatsAreShortestRoundTrip) {
  EXPECT_EQ(str_cat(0.1f), "0.1");
  EXPECT_EQ(str_cat(0.1), "0.1");
  EXPECT_EQ(str_cat(-1.0f), "-1");
  EXPECT_EQ(str_cat(1e-7), "1e-07");
  EXPECT_EQ(str_cat(-0.0f), "-0");
  EXPECT_EQ(str_cat(std::numeric_limits<float>::infinity()), "inf");
  EXPECT_EQ(str_cat(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(str_cat(std::numeric_limits<float>::quiet_NaN()), "nan");
}

// Groups digits in threes with ',' and uses ',' as the decimal point, as many real locales do.
class GroupingPunct : public std::numpunct<char> {
 protected:
  char do_thousands_sep() const override { return '.'; }
  char do_decimal_point() const override { return ','; }
  std::string do_grouping() const override { return "\3"; }
};

class StrCatUnderGroupingLocale : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = std::locale::global(std::locale(std::locale::classic(), new GroupingPunct));
  }
  void TearDown() override { std::locale::global(previous_); }

 private:
  std::locale previous_;
};

TEST_F(StrCatUnderGroupingLocale, NumbersIgnoreTheGlobalLocale) {
  EXPECT_EQ(str_cat(1234567, " ", 2.5), "1234567 2.5");
}

TEST_F(StrCatUnderGroupingLocale, LibraryErrorMessagesIgnoreTheGlobalLocale) {
  const int64_t d = 1000;
  const int64_t shape[4] = {1, 1, 1, d};
  std::vector<float> data(d);
  anyattn_tensor q, out;
  ASSERT_EQ(anyattn_tensor_init_contiguous(&q, data.data(), ANYATTN_DTYPE_F32, 4, shape),
            ANYATTN_OK);
  ASSERT_EQ(anyattn_tensor_init_contiguous(&out, data.data(), ANYATTN_DTYPE_F32, 4, shape),
            ANYATTN_OK);
  ASSERT_EQ(anyattn_fwd(&q, &q, &q, &out, nullptr, nullptr), ANYATTN_E_INVALID_ARGUMENT);
  const std::string message = anyattn_last_error();
  EXPECT_NE(message.find("1000"), std::string::npos) << message;
  EXPECT_EQ(message.find("1.000"), std::string::npos) << message;
}

}  // namespace
}  // namespace anyattn::runtime
