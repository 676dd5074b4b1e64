// Every ISA path against the reference and against each other; bitwise determinism across
// repeated runs, thread counts and split-KV settings; concurrent calls from several threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};

// Restores the default thread count when a test ends, whatever happens.
struct ThreadCountGuard {
  ~ThreadCountGuard() { anyattn_set_num_threads(0); }
};

// ---- ISA paths ----------------------------------------------------------------------------------

TEST(Isa, PortableIsAlwaysSupportedAndDefaultIsSupported) {
  EXPECT_EQ(anyattn_isa_supported(ANYATTN_ISA_PORTABLE), 1);
  const anyattn_isa def = anyattn_isa_default();
  EXPECT_NE(def, ANYATTN_ISA_AUTO);
  EXPECT_EQ(anyattn_isa_supported(def), 1);
  EXPECT_STREQ(anyattn_isa_name(ANYATTN_ISA_PORTABLE), "portable");
  EXPECT_STREQ(anyattn_isa_name(ANYATTN_ISA_AVX2), "avx2");
  EXPECT_STREQ(anyattn_isa_name(ANYATTN_ISA_AVX512), "avx512");
  EXPECT_STREQ(anyattn_isa_name(ANYATTN_ISA_AVX512_AMX), "avx512_amx");
  EXPECT_STREQ(anyattn_isa_name(ANYATTN_ISA_AUTO), "auto");
  EXPECT_STREQ(anyattn_isa_name(static_cast<anyattn_isa>(99)), "unknown");
}

// Cases for the ISA comparison: every head dim, every dtype, each feature, odd shapes.
std::vector<Case> isa_cases() {
  const int64_t dims[] = {8, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 256};
  const int64_t seqs[] = {1, 7, 63, 64, 65, 128, 257};
  std::vector<Case> cases;
  for (int64_t n = 0; n < 36; ++n) {
    Case c;
    c.D = dims[n % 12];
    c.Dv = dims[(n * 5 + 3) % 12];
    c.dtype = kDtypes[n % 3];
    c.Sq = seqs[(n * 3) % 7];
    c.Sk = seqs[(n * 2 + 1) % 7];
    c.B = n % 2 ? 2 : 1;
    c.Hq = 4;
    c.Hk = n % 4 == 0 ? 1 : 2;
    c.causal = n % 3 == 1;
    if (n % 5 == 2) {
      c.window_left = 20;
      c.window_right = 3;
    }
    c.softcap = n % 4 == 3 ? 5.0f : 0.0f;
    c.alibi = n % 6 == 4 ? Alibi::kPerHead : n % 6 == 5 ? Alibi::kPerBatchHead : Alibi::kNone;
    c.sinks = n % 7 >= 4;
    const Layout layouts[] = {Layout::kContiguous,      Layout::kPaddedStrides,
                              Layout::kContiguous,      Layout::kNegativeStrides,
                              Layout::kTransposedBatch, Layout::kBroadcast};
    c.layout = layouts[n % 6];
    c.seed = 900 + n;
    cases.push_back(c);
  }
  // Long sequences: several key blocks, a long causal diagonal, a decode row over many keys.
  for (int64_t n = 0; n < 6; ++n) {
    Case c;
    c.Sq = n < 3 ? 1000 : 1;
    c.Sk = n < 3 ? 1000 : 4000;
    c.Hq = 2;
    c.Hk = n % 2 ? 1 : 2;
    c.D = c.Dv = n % 2 ? 64 : 128;
    c.dtype = kDtypes[n % 3];
    c.causal = n < 3;
    c.sinks = n % 3 == 1;
    c.softcap = n == 2 ? 30.0f : 0.0f;
    c.seed = 990 + n;
    cases.push_back(c);
  }
  return cases;
}

TEST(Isa, EveryPathMatchesReferenceAndEachOther) {
  const std::vector<anyattn_isa> isas = supported_isas();
  std::vector<Case> cases = isa_cases();
  const size_t stride = reduced_sweep() ? 5 : 1;
  for (size_t n = 0; n < cases.size(); n += stride) {
    Case c = cases[n];
    Problem p(c);
    const reference::DenseOutputs ref = p.reference(), naive = p.naive_same_dtype();
    std::vector<double> first_out, first_lse;
    for (anyattn_isa isa : isas) {
      p.params.isa = isa;
      p.reset_outputs();
      const anyattn_status status = p.run();
      ASSERT_EQ(status, ANYATTN_OK) << anyattn_isa_name(isa) << ": " << anyattn_last_error();
      EXPECT_TRUE(check_outputs(p, ref, naive)) << "isa " << anyattn_isa_name(isa);
      if (first_out.empty()) {
        first_out = p.out_values();
        first_lse = p.lse_values();
      } else {
        EXPECT_TRUE(
            check_cross(p, p.out_values(), first_out, p.lse_values(), first_lse, ref, naive))
            << anyattn_isa_name(isa) << " vs " << anyattn_isa_name(isas[0]);
      }
    }
  }
}

TEST(Isa, ForcingAnUnsupportedPathIsRejected) {
  bool tested = false;
  for (anyattn_isa isa : all_isas()) {
    if (anyattn_isa_supported(isa)) continue;
    Case c;
    c.isa = isa;
    Problem p(c);
    EXPECT_EQ(p.run(), ANYATTN_E_UNSUPPORTED) << anyattn_isa_name(isa);
    EXPECT_NE(std::string(anyattn_last_error()).find(anyattn_isa_name(isa)), std::string::npos)
        << anyattn_last_error();
    EXPECT_TRUE(p.outputs_untouched());
    tested = true;
  }
  if (!tested) GTEST_SKIP() << "this CPU supports every ISA path of the build";
}

// ---- Determinism --------------------------------------------------------------------------------

// Shapes where the plan may split the key dimension (decode, few heads) and ordinary ones.
std::vector<Case> determinism_cases() {
  std::vector<Case> cases;
  Case decode;
  decode.B = 1;
  decode.Sq = 1;
  decode.Sk = 4096;
  decode.Hq = 2;
  decode.Hk = 1;
  decode.D = decode.Dv = 128;
  cases.push_back(decode);
  Case decode_sinks = decode;
  decode_sinks.Sq = 3;
  decode_sinks.Sk = 2000;
  decode_sinks.dtype = ANYATTN_DTYPE_BF16;
  decode_sinks.sinks = true;
  decode_sinks.window_left = 1500;
  decode_sinks.alibi = Alibi::kPerHead;
  cases.push_back(decode_sinks);
  // A short cache with many kv heads: one key split, so the plan gives each task fewer kv heads
  // as the thread count grows (8 heads per task on one thread, 1 on eight).
  Case short_cache = decode;
  short_cache.Sk = 200;
  short_cache.Hq = 32;
  short_cache.Hk = 8;
  cases.push_back(short_cache);
  Case short_cache_packed = short_cache;  // 24 rows per kv head: the streaming path that packs
  short_cache_packed.Sq = 6;
  cases.push_back(short_cache_packed);
  // 80 rows per kv head on the packed path, in tasks of 20 query heads x 2 positions, with key
  // splits.
  Case large_group = decode;
  large_group.Sq = 2;
  large_group.Sk = 1000;
  large_group.Hq = 40;
  large_group.Hk = 1;
  large_group.sinks = true;
  cases.push_back(large_group);
  // Eight pairs of a short sequence: all pair-local (each pair packed and attended by the thread
  // that takes it) on 1, 2 and 8 threads; on 3 the first 6, and the last 2 packed by every
  // thread, then attended by every thread (plan::pair_local_count).
  Case short_mha = decode;
  short_mha.Sq = short_mha.Sk = 130;
  short_mha.Hq = short_mha.Hk = 8;
  short_mha.D = short_mha.Dv = 64;
  short_mha.causal = true;
  cases.push_back(short_mha);
  // Three pairs: 2 pair-local and 1 shared on 2 threads, all 3 on 1 and 3 threads, none on 8.
  Case short_three_pairs = short_mha;
  short_three_pairs.Hq = 6;
  short_three_pairs.Hk = 3;
  cases.push_back(short_three_pairs);
  Case prefill;
  prefill.B = 2;
  prefill.Sq = 257;
  prefill.Sk = 1000;
  prefill.Hq = 4;
  prefill.Hk = 2;
  prefill.D = 64;
  prefill.Dv = 80;
  prefill.causal = true;
  prefill.dtype = ANYATTN_DTYPE_F16;
  prefill.softcap = 5.0f;
  cases.push_back(prefill);
  return cases;
}

TEST(Determinism, BitwiseAcrossRunsThreadCountsAndIsas) {
  ThreadCountGuard guard;
  const int thread_counts[] = {1, 2, 3, 8};
  // Every ISA path; only the default one with ANYATTN_TEST_SWEEP=reduced.
  const std::vector<anyattn_isa> isas =
      reduced_sweep() ? std::vector<anyattn_isa>{ANYATTN_ISA_AUTO} : supported_isas();
  for (const Case& base : determinism_cases()) {
    for (anyattn_isa isa : isas) {
      Case c = base;
      c.isa = isa;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      anyattn_set_num_threads(1);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const std::vector<unsigned char> expected = p.output_bytes();
      EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
      for (int threads : thread_counts) {
        anyattn_set_num_threads(threads);
        ASSERT_EQ(anyattn_get_num_threads(), threads);
        for (int repeat = 0; repeat < 2; ++repeat) {
          p.reset_outputs();
          ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
          EXPECT_TRUE(p.output_bytes() == expected)
              << "threads=" << threads << " repeat=" << repeat << " differs from threads=1";
        }
      }
    }
  }
}

TEST(Determinism, ExplicitNumSplitsCorrectAndThreadIndependent) {
  ThreadCountGuard guard;
  for (int32_t splits : {1, 2, 3, 8, 64}) {
    for (anyattn_dtype dtype : kDtypes) {
      Case c = determinism_cases()[0];
      c.num_splits = splits;
      c.dtype = dtype;
      c.sinks = splits % 2 == 0;
      SCOPED_TRACE(c.describe());
      Problem p(c);
      anyattn_set_num_threads(1);
      ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
      const std::vector<unsigned char> expected = p.output_bytes();
      EXPECT_TRUE(check_outputs(p, p.reference(), p.naive_same_dtype()));
      for (int threads : {2, 3, 8}) {
        anyattn_set_num_threads(threads);
        p.reset_outputs();
        ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
        EXPECT_TRUE(p.output_bytes() == expected) << "threads=" << threads;
      }
    }
  }
}

// The workspace is kept between calls (runtime/kept_workspace.h): a call must not depend on what
// an earlier one left there. A larger call whose inputs are all NaN fills it with NaN; each case
// after it must give the bits it gave before it.
TEST(Determinism, BitwiseAfterAnotherCallLeftNanInTheWorkspace) {
  ThreadCountGuard guard;
  anyattn_set_num_threads(2);
  std::vector<Case> cases = determinism_cases();
  Case ragged;  // head dims and a last key block that end inside a vector
  ragged.B = 2;
  ragged.Sq = 37;
  ragged.Sk = 203;
  ragged.Hq = 4;
  ragged.Hk = 2;
  ragged.D = 70;
  ragged.Dv = 42;
  ragged.causal = true;
  cases.push_back(ragged);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.describe());
    Problem p(c);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    const std::vector<unsigned char> expected = p.output_bytes();

    Case larger = c;
    larger.dtype = ANYATTN_DTYPE_F32;
    larger.B = c.B + 1;
    larger.Sq = 2 * c.Sq;
    larger.Sk = 2 * c.Sk;
    larger.D = 128;
    larger.Dv = 128;
    Problem filler(larger);
    std::fill(filler.q_buffer.begin(), filler.q_buffer.end(), 0xFF);  // f32 NaN
    std::fill(filler.kv_buffer.begin(), filler.kv_buffer.end(), 0xFF);
    ASSERT_EQ(filler.run(), ANYATTN_OK) << anyattn_last_error();

    p.reset_outputs();
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(p.output_bytes() == expected);
  }
}

// ---- Concurrency --------------------------------------------------------------------------------

TEST(Concurrency, FourCallerThreadsGetCorrectResults) {
  ThreadCountGuard guard;
  anyattn_set_num_threads(2);
  // Four different problems: dtypes, GQA, split-KV decode, packed and padded layouts.
  std::vector<Case> cases(4);
  Case& prefill = cases[0];
  prefill.B = 2;
  prefill.Sq = 200;
  prefill.Sk = 300;
  prefill.Hq = 4;
  prefill.Hk = 2;
  prefill.causal = true;
  Case& decode = cases[1];
  decode.Sq = 1;
  decode.Sk = 3000;
  decode.Hq = 2;
  decode.D = decode.Dv = 128;
  decode.dtype = ANYATTN_DTYPE_BF16;
  decode.sinks = true;
  Case& mqa = cases[2];
  mqa.B = 3;
  mqa.Sq = mqa.Sk = 65;
  mqa.Hq = 8;
  mqa.D = 40;
  mqa.Dv = 96;
  mqa.dtype = ANYATTN_DTYPE_F16;
  mqa.alibi = Alibi::kPerBatchHead;
  mqa.layout = Layout::kPacked;
  Case& windowed = cases[3];
  windowed.Sq = 128;
  windowed.Sk = 257;
  windowed.Hq = windowed.Hk = 3;
  windowed.D = windowed.Dv = 59;
  windowed.window_left = 30;
  windowed.window_right = 7;
  windowed.softcap = 5.0f;
  windowed.layout = Layout::kPaddedStrides;

  // Sequential results first: the concurrent ones must be bitwise equal to them.
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::vector<unsigned char>> expected;
  for (size_t t = 0; t < cases.size(); ++t) {
    cases[t].seed = 700 + t;
    problems.push_back(std::make_unique<Problem>(cases[t]));
    ASSERT_EQ(problems[t]->run(), ANYATTN_OK) << anyattn_last_error();
    EXPECT_TRUE(
        check_outputs(*problems[t], problems[t]->reference(), problems[t]->naive_same_dtype()));
    expected.push_back(problems[t]->output_bytes());
  }

  const int kIterations = 5;
  std::vector<int> mismatches(cases.size(), 0), errors(cases.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < cases.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int it = 0; it < kIterations; ++it) {
        problems[t]->reset_outputs();
        if (problems[t]->run() != ANYATTN_OK) ++errors[t];
        if (problems[t]->output_bytes() != expected[t]) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < cases.size(); ++t) {
    EXPECT_EQ(errors[t], 0) << cases[t].describe();
    EXPECT_EQ(mismatches[t], 0) << cases[t].describe();
  }
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
