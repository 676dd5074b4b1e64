// plan::pairs_balance_on_threads, which decides whether a packing group of the forward runs each
// (sequence, kv head) pair whole on one thread (pair-local, fwd_driver.cc): the greedy schedule's
// makespan against an even share of the work, within 1/32.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "plan/fwd_plan.h"

namespace anyattn::plan {
namespace {

TEST(PairsBalanceOnThreads, EqualPairsBalanceWhereTheThreadsDivideThem) {
  const std::vector<int64_t> eight(8, 100);
  for (int threads : {1, 2, 4, 8}) EXPECT_TRUE(pairs_balance_on_threads(eight, threads)) << threads;
  // 3 of 8 pairs on a thread against 2.67: 12.5% over.
  EXPECT_FALSE(pairs_balance_on_threads(eight, 3));
  // More threads than pairs: half of them idle.
  EXPECT_FALSE(pairs_balance_on_threads(eight, 16));
  // 11 of 32 pairs on a thread against 10.67: 3.1%, just within 1/32; 10 of 29 against 9.67 is
  // 3.4%.
  EXPECT_TRUE(pairs_balance_on_threads(std::vector<int64_t>(32, 7), 3));
  EXPECT_FALSE(pairs_balance_on_threads(std::vector<int64_t>(29, 7), 3));
}

TEST(PairsBalanceOnThreads, UnequalPairsAreScheduledMostExpensiveFirst) {
  // Handed out in the given order, the 9 would come last, onto a thread that holds 4 already: 13
  // against 5. Sorted, it goes first and the small pairs fill the other thread: 9 against 9.
  EXPECT_TRUE(pairs_balance_on_threads({1, 1, 1, 1, 1, 1, 1, 1, 1, 9}, 2));
  // One pair larger than every other together: the makespan is that pair.
  EXPECT_FALSE(pairs_balance_on_threads({100, 10, 10}, 2));
  EXPECT_TRUE(pairs_balance_on_threads({100, 50, 50}, 2));
}

TEST(PairsBalanceOnThreads, NoPairsOrOneThreadAlwaysBalance) {
  EXPECT_TRUE(pairs_balance_on_threads({}, 4));
  EXPECT_TRUE(pairs_balance_on_threads({5, 1000, 3}, 1));
}

}  // namespace
}  // namespace anyattn::plan
