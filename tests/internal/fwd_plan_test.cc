// plan::pairs_balance_on_threads and plan::pair_local_count, which decide how many (sequence, kv
// head) pairs of a packing group of the forward run whole on one thread each (pair-local,
// fwd_driver.cc): the greedy schedule's makespan against an even share of the work, within 1/32,
// over the most expensive pairs in whole rounds of the threads.
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

TEST(PairLocalCount, AllPairsWhereTheyBalance) {
  EXPECT_EQ(pair_local_count(std::vector<int64_t>(8, 100), 2), 8);
  EXPECT_EQ(pair_local_count({9, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 2), 10);
  EXPECT_EQ(pair_local_count({5, 3}, 1), 2);
  EXPECT_EQ(pair_local_count({}, 4), 0);
}

TEST(PairLocalCount, WholeRoundsOfTheMostExpensivePairsOtherwise) {
  // 8 equal pairs on 3 threads: two rounds, the last 2 pairs shared.
  EXPECT_EQ(pair_local_count(std::vector<int64_t>(8, 100), 3), 6);
  // 3 on 2: one round.
  EXPECT_EQ(pair_local_count({7, 7, 7}, 2), 2);
  // 29 on 3 (unbalanced as a whole, above): 27.
  EXPECT_EQ(pair_local_count(std::vector<int64_t>(29, 7), 3), 27);
  // Fewer pairs than threads: none.
  EXPECT_EQ(pair_local_count({7, 7, 7}, 4), 0);
  EXPECT_EQ(pair_local_count({7}, 2), 0);
}

TEST(PairLocalCount, NoneWhereTheFrontDoesNotBalance) {
  // The first round holds 100 against 10: it does not balance, and no shorter front exists.
  EXPECT_EQ(pair_local_count({100, 10, 10}, 2), 0);
  // All 5: 100 + 10 + 10 against 60 + 50, 120 against an even 115 (4.3% over); the first two
  // rounds: 110 and 110.
  EXPECT_EQ(pair_local_count({100, 60, 50, 10, 10}, 2), 4);
}

}  // namespace
}  // namespace anyattn::plan
