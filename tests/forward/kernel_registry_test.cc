// Every entry of the forward-kernel registry (anyattn_fwd_kernel_info) against the f64 reference:
// head dims on and just off the vector widths and tile sizes (63, 65, 127, 129, ...), row counts
// that leave every remainder of the register tile, and both the packed (prefill) and the
// streaming (decode) paths, through the 2x rule of test_support.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "common/test_support.h"

namespace anyattn::testing {
namespace {

std::vector<anyattn_kernel_info> registry() {
  std::vector<anyattn_kernel_info> kernels;
  for (int i = 0; i < anyattn_fwd_kernel_count(); ++i) {
    anyattn_kernel_info info{};
    EXPECT_EQ(anyattn_fwd_kernel_info(i, &info), ANYATTN_OK) << anyattn_last_error();
    kernels.push_back(info);
  }
  return kernels;
}

TEST(KernelRegistry, ListsThePortablePathAndDescribesEveryEntry) {
  bool has_portable = false;
  for (const anyattn_kernel_info& info : registry()) {
    EXPECT_NE(std::string(info.name).find(anyattn_isa_name(static_cast<anyattn_isa>(info.isa))),
              std::string::npos)
        << info.name;
    EXPECT_EQ(info.supported, anyattn_isa_supported(static_cast<anyattn_isa>(info.isa)));
    EXPECT_GT(info.vector_lanes, 0);
    EXPECT_EQ(info.tile_keys % info.vector_lanes, 0) << info.name;
    has_portable |= info.isa == ANYATTN_ISA_PORTABLE && info.supported;
  }
  EXPECT_TRUE(has_portable);
  anyattn_kernel_info info{};
  EXPECT_EQ(anyattn_fwd_kernel_info(anyattn_fwd_kernel_count(), &info), ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(anyattn_last_error()).find("index"), std::string::npos);
}

TEST(KernelRegistry, EveryEntryMatchesTheReferenceAroundItsTiles) {
  const std::vector<int64_t> head_dims = {1, 7, 63, 64, 65, 80, 96, 127, 128, 129, 192, 255, 256};
  int index = 0;
  for (const anyattn_kernel_info& info : registry()) {
    if (!info.supported) continue;
    for (size_t d = 0; d < head_dims.size(); ++d) {
      if (reduced_sweep() && (index++ % 4) != 0) continue;
      Case c;
      c.isa = static_cast<anyattn_isa>(info.isa);
      c.D = head_dims[d];
      c.Dv = head_dims[(d + 5) % head_dims.size()];
      // Sq cycles through every remainder of the row tile; Sk crosses a 64-key block boundary.
      c.Sq = info.tile_rows * 3 + static_cast<int64_t>(d % info.tile_rows);
      c.Sk = 64 + 1 + static_cast<int64_t>(d);
      c.Hq = 2;
      c.Hk = d % 2 ? 1 : 2;
      c.causal = d % 3 == 0;
      c.seed = 700 + d;
      EXPECT_TRUE(run_and_check(c)) << info.name << ": " << c.describe();
      // Decode: one query row per head, GQA, the streaming path.
      Case decode = c;
      decode.Sq = 1;
      decode.Sk = 300;
      decode.Hq = 8;
      decode.Hk = 2;
      decode.causal = false;
      EXPECT_TRUE(run_and_check(decode)) << info.name << ": " << decode.describe();
    }
  }
}

}  // namespace
}  // namespace anyattn::testing
