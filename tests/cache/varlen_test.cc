// anyattn_fwd_varlen against the f64 reference (reference_cache.h: every sequence attended on its
// own, as a dense problem) by the 2x rule (tests/README.md), plus its error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "cache/cache_test_support.h"
#include "reference/reference_cache.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

constexpr double kSentinel = -768.0;  // Exact in every dtype, far from any output.

struct VarlenCase {
  std::vector<int32_t> lens_q, lens_k;
  std::vector<int32_t> seqused_k;  // Empty: no seqused_k.
  int64_t Hq = 2, Hk = 1, D = 32, Dv = 32;
  anyattn_dtype dtype = ANYATTN_DTYPE_F32;
  bool causal = false;
  int32_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  Alibi alibi = Alibi::kNone;
  bool sinks = false;
  bool with_lse = true;
  int64_t pad = 0;         // Extra elements in every non-last stride of q, k, v, out.
  int32_t lead_rows = 0;   // cu_seqlens start here: rows before belong to no sequence.
  int32_t trail_rows = 0;  // Rows after the last sequence, likewise.
  int32_t num_splits = 0;
  uint64_t seed = 1;

  std::string describe() const {
    std::string s = "lens_q=[";
    for (int32_t l : lens_q) s += std::to_string(l) + ",";
    s += "] lens_k=[";
    for (int32_t l : lens_k) s += std::to_string(l) + ",";
    s += "] Hq=" + std::to_string(Hq) + " Hk=" + std::to_string(Hk) + " D=" + std::to_string(D) +
         " Dv=" + std::to_string(Dv) + " " + dtype_name(dtype) +
         " causal=" + std::to_string(causal) + " window=(" + std::to_string(window_left) + "," +
         std::to_string(window_right) + ") softcap=" + std::to_string(softcap) +
         " alibi=" + std::to_string(static_cast<int>(alibi)) + " sinks=" + std::to_string(sinks) +
         " seqused=" + std::to_string(!seqused_k.empty()) + " pad=" + std::to_string(pad) +
         " splits=" + std::to_string(num_splits);
    return s;
  }
};

// A varlen problem with owned buffers; outputs pre-filled with kSentinel.
struct VarlenProblem {
  explicit VarlenProblem(const VarlenCase& c) : c(c) {
    const int64_t batch = static_cast<int64_t>(c.lens_q.size());
    std::vector<int32_t> cu_q{c.lead_rows}, cu_k{c.lead_rows};
    for (int64_t b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
    }
    total_q = cu_q.back() + c.trail_rows;
    total_k = cu_k.back() + c.trail_rows;
    max_q = c.lens_q.empty() ? 0 : *std::max_element(c.lens_q.begin(), c.lens_q.end());
    max_k = c.lens_k.empty() ? 0 : *std::max_element(c.lens_k.begin(), c.lens_k.end());
    cu_seqlens_q = int_tensor(cu_q);
    cu_seqlens_k = int_tensor(cu_k);
    if (!c.seqused_k.empty()) seqused_k = int_tensor(c.seqused_k);
    CacheRng rng(c.seed);
    q = OwnedTensor(c.dtype, {total_q, c.Hq, c.D}, c.pad);
    k = OwnedTensor(c.dtype, {total_k, c.Hk, c.D}, c.pad);
    v = OwnedTensor(c.dtype, {total_k, c.Hk, c.Dv}, c.pad);
    q.fill_normal(&rng);
    k.fill_normal(&rng);
    v.fill_normal(&rng);
    out = OwnedTensor(c.dtype, {total_q, c.Hq, c.Dv}, c.pad);
    lse = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq, total_q}, c.pad);
    std::fill(out.bytes.begin(), out.bytes.end(), 0);
    std::fill(lse.bytes.begin(), lse.bytes.end(), 0);
    out.fill(kSentinel);
    lse.fill(kSentinel);
    out_before = out.bytes;
    lse_before = lse.bytes;

    anyattn_fwd_params_init(&params);
    params.causal = c.causal;
    params.window_left = c.window_left;
    params.window_right = c.window_right;
    params.softcap = c.softcap;
    params.num_splits = c.num_splits;
    if (c.alibi != Alibi::kNone) {
      const bool per_batch = c.alibi == Alibi::kPerBatchHead;
      alibi = per_batch ? OwnedTensor(ANYATTN_DTYPE_F32, {batch, c.Hq})
                        : OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq});
      for (int64_t i = 0; i < alibi.size(); ++i) {
        alibi.set(i, std::exp2(-8.0 * (i % c.Hq + 1) / c.Hq) * (1.0 + 0.5 * (i / c.Hq)));
      }
      params.alibi_slopes = &alibi.t;
    }
    if (c.sinks) {
      sinks = OwnedTensor(ANYATTN_DTYPE_F32, {c.Hq});
      sinks.fill_normal(&rng, 2.0);
      params.sinks = &sinks.t;
    }
  }

  anyattn_status run() {
    return anyattn_fwd_varlen(&q.t, &k.t, &v.t, &out.t, c.with_lse ? &lse.t : nullptr,
                              &cu_seqlens_q.t, &cu_seqlens_k.t,
                              c.seqused_k.empty() ? nullptr : &seqused_k.t, max_q, max_k, &params);
  }
  bool outputs_untouched() const { return out.bytes == out_before && lse.bytes == lse_before; }

  VarlenCase c;
  int64_t total_q = 0, total_k = 0, max_q = 0, max_k = 0;
  OwnedTensor q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi, sinks;
  std::vector<unsigned char> out_before, lse_before;
  anyattn_fwd_params params{};
};

::testing::AssertionResult run_and_check_varlen(const VarlenCase& c) {
  VarlenProblem p(c);
  const anyattn_status status = p.run();
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure() << "anyattn_fwd_varlen: " << anyattn_status_name(status)
                                         << ": " << anyattn_last_error() << "\n  " << c.describe();
  }
  const reference::VarlenOutputs ref =
      reference::fwd_varlen(p.q.t, p.k.t, p.v.t, p.cu_seqlens_q.t, p.cu_seqlens_k.t,
                            c.seqused_k.empty() ? nullptr : &p.seqused_k.t, &p.params);
  const std::vector<reference::GatheredSequence> seqs =
      reference::gather_varlen(p.q.t, p.k.t, p.v.t, p.cu_seqlens_q.t, p.cu_seqlens_k.t,
                               c.seqused_k.empty() ? nullptr : &p.seqused_k.t, &p.params);
  const reference::HeadShape shape{c.Hq, c.Hk, c.D, c.Dv};
  const reference::ScoreOptions options = reference::resolve_options(&p.params, c.D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));

  // Naive per sequence, then every output compacted to the rows inside a sequence.
  std::vector<double> naive_out(ref.out.size(), 0.0), naive_lse(ref.lse.size(), 0.0);
  int64_t first = c.lead_rows;
  for (const reference::GatheredSequence& seq : seqs) {
    naive_gathered(seq, shape, options, c.dtype, scale, c.softcap,
                   naive_out.data() + first * c.Hq * c.Dv, naive_lse.data() + first, p.total_q);
    first += seq.seqlen_q;
  }
  const std::vector<double> got_out = p.out.values(), got_lse = p.lse.values();
  std::vector<double> go, ro, no, gl, rl, nl;
  int64_t rows = 0;
  for (int64_t r = 0; r < p.total_q; ++r) {
    if (!ref.row_in_sequence[r]) continue;
    ++rows;
    for (int64_t x = r * c.Hq * c.Dv; x < (r + 1) * c.Hq * c.Dv; ++x) {
      go.push_back(got_out[x]);
      ro.push_back(ref.out[x]);
      no.push_back(naive_out[x]);
    }
  }
  for (int64_t h = 0; h < c.Hq; ++h) {
    for (int64_t r = 0; r < p.total_q; ++r) {
      if (!ref.row_in_sequence[r]) continue;
      gl.push_back(got_lse[h * p.total_q + r]);
      rl.push_back(ref.lse[h * p.total_q + r]);
      nl.push_back(naive_lse[h * p.total_q + r]);
    }
  }
  ::testing::AssertionResult r = check_two_x(c.dtype, go, ro, no, {rows, c.Hq, c.Dv},
                                             c.with_lse ? &gl : nullptr, rl, nl, {c.Hq, rows});
  if (r) {
    const int64_t out_changed =
        changed_outside(p.out.bytes, p.out_before, p.out.t, ref.row_in_sequence, false);
    const int64_t lse_changed =
        c.with_lse ? changed_outside(p.lse.bytes, p.lse_before, p.lse.t, ref.row_in_sequence, true)
                   : static_cast<int64_t>(p.lse.bytes != p.lse_before);
    if (out_changed != 0 || lse_changed != 0) {
      r = ::testing::AssertionFailure() << out_changed << " out bytes and " << lse_changed
                                        << " lse bytes written outside the sequences' rows";
    }
  }
  if (!r) r << "\n  " << c.describe();
  return r;
}

VarlenCase mixed_lengths() {
  VarlenCase c;
  c.lens_q = {5, 17, 64, 1, 33, 9, 70};
  c.lens_k = {9, 17, 40, 65, 33, 3, 70};
  return c;
}

TEST(Varlen, EveryDenseFeaturePerSequence) {
  struct Feature {
    const char* name;
    void (*apply)(VarlenCase*);
  };
  const Feature features[] = {
      {"plain", [](VarlenCase*) {}},
      {"causal", [](VarlenCase* c) { c->causal = true; }},
      {"window", [](VarlenCase* c) { c->window_left = 6, c->window_right = 3; }},
      {"window_left_only", [](VarlenCase* c) { c->window_left = 4; }},
      {"causal_window", [](VarlenCase* c) { c->causal = true, c->window_left = 8; }},
      {"softcap", [](VarlenCase* c) { c->softcap = 1.5f; }},
      {"alibi_head", [](VarlenCase* c) { c->alibi = Alibi::kPerHead; }},
      {"alibi_batch_head", [](VarlenCase* c) { c->alibi = Alibi::kPerBatchHead; }},
      {"sinks", [](VarlenCase* c) { c->sinks = true; }},
      {"all",
       [](VarlenCase* c) {
         c->causal = true, c->window_left = 12, c->softcap = 3.0f;
         c->alibi = Alibi::kPerBatchHead, c->sinks = true;
       }},
  };
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16}) {
    for (const Feature& f : features) {
      VarlenCase c = mixed_lengths();
      c.dtype = dtype;
      c.Hq = 4;
      c.Hk = 2;
      f.apply(&c);
      c.seed = 1 + static_cast<uint64_t>(&f - features);
      EXPECT_TRUE(run_and_check_varlen(c)) << f.name;
    }
  }
}

TEST(Varlen, HeadDimsAndGqa) {
  for (auto [hq, hk, d, dv] : {std::array<int64_t, 4>{8, 1, 59, 40},
                               {8, 8, 8, 128},
                               {6, 3, 128, 64},
                               {4, 1, 256, 256},
                               {4, 1, 576, 512},
                               {2, 2, 1, 3}}) {
    VarlenCase c = mixed_lengths();
    c.Hq = hq, c.Hk = hk, c.D = d, c.Dv = dv;
    c.causal = true;
    EXPECT_TRUE(run_and_check_varlen(c));
  }
}

// A group of 48 query heads on one kv head: the sequences of 2 to 4 positions run the packed
// path in tasks of several heads (plan::packed_heads_per_task, chosen per sequence: 24 or 16 of
// them), the one-position decode steps the streaming path, the one of 70 positions one head per
// task.
TEST(Varlen, LargeGroupSharesPackedTasksAcrossHeads) {
  VarlenCase c;
  c.lens_q = {1, 3, 2, 4, 1, 70, 3};
  c.lens_k = {300, 3, 130, 65, 1, 70, 200};
  c.Hq = 48;
  c.Hk = 1;
  c.causal = true;
  c.alibi = Alibi::kPerHead;
  c.sinks = true;
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    c.dtype = dtype;
    EXPECT_TRUE(run_and_check_varlen(c));
  }
}

TEST(Varlen, SequsedK) {
  for (bool causal : {false, true}) {
    VarlenCase c = mixed_lengths();
    c.seqused_k = {9, 0, 13, 65, 1, 2, 35};
    c.causal = causal;
    c.alibi = Alibi::kPerHead;
    EXPECT_TRUE(run_and_check_varlen(c));
  }
}

TEST(Varlen, EmptySequences) {
  for (bool sinks : {false, true}) {
    VarlenCase c;
    c.lens_q = {0, 3, 4, 0, 7, 2};
    c.lens_k = {5, 0, 6, 0, 7, 0};  // Sequences 1 and 5 have queries but no keys.
    c.sinks = sinks;
    c.causal = true;
    EXPECT_TRUE(run_and_check_varlen(c));
    VarlenProblem p(c);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    // Sequence 1 (rows 0..2) sees no key: out = 0, lse = -inf (or the sink).
    const std::vector<double> out = p.out.values(), lse = p.lse.values();
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        for (int64_t d = 0; d < c.Dv; ++d) EXPECT_EQ(out[(r * c.Hq + h) * c.Dv + d], 0.0);
        const double expected =
            sinks ? static_cast<double>(static_cast<const float*>(p.sinks.t.data)[h])
                  : -std::numeric_limits<double>::infinity();
        EXPECT_EQ(lse[h * p.total_q + r], expected);
      }
    }
  }
  VarlenCase none;  // B = 0.
  VarlenProblem p(none);
  EXPECT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
}

TEST(Varlen, RowsOutsideSequencesAndPaddedStrides) {
  VarlenCase c = mixed_lengths();
  c.lead_rows = 3;
  c.trail_rows = 5;
  c.pad = 3;
  c.causal = true;
  c.dtype = ANYATTN_DTYPE_BF16;
  EXPECT_TRUE(run_and_check_varlen(c));
  c.with_lse = false;
  EXPECT_TRUE(run_and_check_varlen(c));
}

TEST(Varlen, NumSplits) {
  for (int32_t splits : {1, 2, 3, 7}) {
    VarlenCase c = mixed_lengths();
    c.num_splits = splits;
    c.sinks = true;
    c.causal = true;
    EXPECT_TRUE(run_and_check_varlen(c)) << "num_splits=" << splits;
  }
}

TEST(Varlen, OneLongSequenceAmongManyShort) {
  VarlenCase c;
  for (int i = 0; i < 100; ++i) {
    c.lens_q.push_back(16);
    c.lens_k.push_back(16);
  }
  c.lens_q.insert(c.lens_q.begin() + 37, 8192);
  c.lens_k.insert(c.lens_k.begin() + 37, 8192);
  c.Hq = 2;
  c.Hk = 1;
  c.D = c.Dv = 64;
  c.causal = true;
  c.window_left = 511;  // Keeps the f64 reference (which skips masked keys) quick.
  c.dtype = ANYATTN_DTYPE_BF16;
  EXPECT_TRUE(run_and_check_varlen(c));
}

// A serving batch: decode steps (direct path) followed by prefill chunks (packed path). The steps'
// rows must be the same bits as in a call that holds the steps alone (the chunks given no queries,
// max_seqlen_q their own): each path's sequences are planned on their own, so the chunks change
// nothing for the steps. With the key splits fixed, the two plans for the steps are the same.
TEST(Varlen, DecodeStepsUnaffectedByPrefillChunksInTheCall) {
  for (anyattn_dtype dtype : {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_BF16}) {
    VarlenCase c;
    c.lens_q = {1, 1, 2, 1, 70, 33};
    c.lens_k = {40, 90, 65, 17, 70, 150};
    c.Hq = 4;
    c.Hk = 2;
    c.dtype = dtype;
    c.causal = true;
    c.sinks = true;
    c.num_splits = 1;
    EXPECT_TRUE(run_and_check_varlen(c));
    VarlenProblem mixed(c);
    ASSERT_EQ(mixed.run(), ANYATTN_OK) << anyattn_last_error();
    VarlenProblem alone(c);  // The same inputs; the chunks' query ranges emptied.
    const int32_t step_rows = 5;
    alone.cu_seqlens_q.set(5, step_rows);
    alone.cu_seqlens_q.set(6, step_rows);
    alone.max_q = 2;
    ASSERT_EQ(alone.run(), ANYATTN_OK) << anyattn_last_error();
    const std::vector<double> out_mixed = mixed.out.values(), out_alone = alone.out.values();
    const std::vector<double> lse_mixed = mixed.lse.values(), lse_alone = alone.lse.values();
    int64_t differ = 0;
    for (int64_t i = 0; i < step_rows * c.Hq * c.Dv; ++i) differ += out_mixed[i] != out_alone[i];
    for (int64_t h = 0; h < c.Hq; ++h) {
      for (int64_t r = 0; r < step_rows; ++r) {
        differ += lse_mixed[h * mixed.total_q + r] != lse_alone[h * alone.total_q + r];
      }
    }
    EXPECT_EQ(differ, 0) << dtype_name(dtype) << ": values of the decode steps that differ";
  }
}

TEST(Varlen, BitwiseAcrossThreadCounts) {
  VarlenCase c = mixed_lengths();
  c.causal = true;
  c.sinks = true;
  std::vector<unsigned char> first;
  for (int threads : {1, 2, 3, 8}) {
    anyattn_set_num_threads(threads);
    VarlenProblem p(c);
    ASSERT_EQ(p.run(), ANYATTN_OK) << anyattn_last_error();
    std::vector<unsigned char> bytes = p.out.bytes;
    bytes.insert(bytes.end(), p.lse.bytes.begin(), p.lse.bytes.end());
    if (first.empty()) {
      first = bytes;
    } else {
      EXPECT_TRUE(bytes == first) << "threads=" << threads;
    }
  }
  anyattn_set_num_threads(0);
}

// ---- Errors -------------------------------------------------------------------------------------

// Runs p, expecting `status` with every `needle` in the message and the outputs untouched.
void expect_error(VarlenProblem* p, anyattn_status status,
                  const std::vector<std::string>& needles) {
  EXPECT_EQ(p->run(), status);
  const std::string message = anyattn_last_error();
  for (const std::string& needle : needles) {
    EXPECT_NE(message.find(needle), std::string::npos)
        << "message \"" << message << "\" lacks \"" << needle << "\"";
  }
  EXPECT_TRUE(p->outputs_untouched()) << message;
}

VarlenCase small_case() {
  VarlenCase c;
  c.lens_q = {3, 4, 5};
  c.lens_k = {3, 4, 5};
  return c;
}

TEST(VarlenErrors, HeadDimsPastTheLimits) {
  VarlenCase c = small_case();
  c.D = 577;
  VarlenProblem wide_k(c);
  expect_error(&wide_k, ANYATTN_E_INVALID_ARGUMENT,
               {"anyattn_fwd_varlen: q.shape[2] (head dim D) is 577; supported: 0..576"});
  c.D = 32;
  c.Dv = 513;
  VarlenProblem wide_v(c);
  expect_error(&wide_v, ANYATTN_E_INVALID_ARGUMENT,
               {"anyattn_fwd_varlen: v.shape[2] (head dim Dv) is 513; supported: 0..512"});
}

TEST(VarlenErrors, NonMonotonicCuSeqlensQ) {
  VarlenProblem p(small_case());
  p.cu_seqlens_q.set(1, 8);  // {0, 8, 7, 12}
  p.max_q = 100;
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_q", "non-decreasing", "8", "7"});
}

TEST(VarlenErrors, NonMonotonicCuSeqlensK) {
  VarlenProblem p(small_case());
  p.cu_seqlens_k.set(2, 2);  // {0, 3, 2, 12}
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_k", "non-decreasing"});
}

TEST(VarlenErrors, CuSeqlensBeyondTotal) {
  VarlenProblem p(small_case());
  p.cu_seqlens_k.set(3, 13);  // total_k is 12
  p.max_k = 6;
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_k[3]", "13", "total_k", "12"});
  VarlenProblem pq(small_case());
  pq.cu_seqlens_q.set(3, 1 << 30);
  pq.max_q = 1 << 30;
  expect_error(&pq, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_q[3]", "total_q"});
}

TEST(VarlenErrors, NegativeCuSeqlensStart) {
  VarlenProblem p(small_case());
  p.cu_seqlens_q.set(0, -1);
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"cu_seqlens_q[0]", "-1"});
}

TEST(VarlenErrors, LengthAboveMaxSeqlen) {
  VarlenProblem p(small_case());
  p.max_k = 4;  // Sequence 2 has 5 keys.
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"max_seqlen_k", "5"});
}

TEST(VarlenErrors, NegativeMaxSeqlen) {
  VarlenProblem p(small_case());
  p.max_q = -1;
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"max_seqlen_q", "-1"});
}

TEST(VarlenErrors, SequsedKOutOfRange) {
  VarlenCase c = small_case();
  c.seqused_k = {3, -2, 5};
  VarlenProblem p(c);
  expect_error(&p, ANYATTN_E_INVALID_ARGUMENT, {"seqused_k[1]", "-2"});
  c.seqused_k = {3, 5, 5};  // Sequence 1 has only 4 keys.
  VarlenProblem p2(c);
  expect_error(&p2, ANYATTN_E_INVALID_ARGUMENT, {"seqused_k[1]", "5"});
}

TEST(VarlenErrors, MissingCuSeqlens) {
  VarlenProblem p(small_case());
  EXPECT_EQ(anyattn_fwd_varlen(&p.q.t, &p.k.t, &p.v.t, &p.out.t, nullptr, &p.cu_seqlens_q.t,
                               nullptr, nullptr, p.max_q, p.max_k, &p.params),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_NE(std::string(anyattn_last_error()).find("cu_seqlens_k"), std::string::npos);
  EXPECT_TRUE(p.outputs_untouched());
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
