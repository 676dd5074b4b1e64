// The forward sweep against the f64 reference by the 2x rule (tests/README.md, "Acceptance rule").
//
// The full cartesian product of the axes is far too large, so the sweep is a set of structured
// groups. Each group walks the full grid of one or two axes and assigns every other axis by a
// Latin-square rule, index (a * i + b * j) mod n with a different (a, b) per axis, so that each
// value of an assigned axis with at most as many values as the grid axis meets every value of
// both grid axes (pairwise coverage), and longer axes are at least covered in full:
//   SeqLens    all 8 x 8 (Sq, Sk) pairs x all 7 masks; dtype, B, heads, head dims,
//              features, layout, scale and lse assigned.
//   HeadDims   all 12 x 12 (D, Dv) pairs; the rest assigned.
//   Features   the full product masks x softcap x ALiBi x sinks, each on Sq < Sk, Sq > Sk and
//              Sq = Sk, the dtype rotating so each combination runs in all three dtypes.
//   Gqa        head ratios 1, 2, 4, 8 and MQA x ALiBi x sinks x dtype.
//   Layouts    the six memory layouts x dtype x mask x shape.
//   Scale      default and explicit softmax_scale x dtype x head dim.
//   SmallDv    value head dims 1-15 (below one vector on some path: V packed transposed) x mask,
//              on every path of the CPU; D, shape, dtype, features and layout assigned.
//   LargeGroups  groups of 24 to 128 query heads per kv head at Sq 1 to 4 (more rows per kv head
//              than one task holds: the packed path's tasks then take several heads, evenly
//              spread) x mask x ALiBi, with and without key splits; dtype, sinks, softcap,
//              layout and the CPU's path assigned.
// Cases whose f64 reference would be slow are shrunk by fit_budget() (B, then heads, then head
// dims), so the longest sequences run with B = 1 and few heads; the groups above keep every axis
// value reachable anyway. Seeds are fixed (group * 100000 + case index). The sweep costs about 30
// CPU-seconds in a Release build.
//
// ANYATTN_TEST_SWEEP=reduced keeps every 7th case of each group (for sanitizer builds).
#include <gtest/gtest.h>

#include <vector>

#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

const int64_t kSeqLens[] = {1, 7, 63, 64, 65, 128, 257, 1000};
const int64_t kHeadDims[] = {8, 32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 256};
const anyattn_dtype kDtypes[] = {ANYATTN_DTYPE_F32, ANYATTN_DTYPE_F16, ANYATTN_DTYPE_BF16};
const Layout kLayouts[] = {Layout::kContiguous,    Layout::kPacked,    Layout::kTransposedBatch,
                           Layout::kPaddedStrides, Layout::kBroadcast, Layout::kNegativeStrides};

struct Heads {
  int64_t hq, hk;
};
// GQA ratios 1, 2, 4, 8 and MQA (Hk = 1).
const Heads kHeads[] = {{3, 3}, {4, 2}, {8, 2}, {16, 2}, {5, 1}};

struct Mask {
  bool causal;
  int32_t window_left, window_right;
};
const Mask kMasks[] = {
    {false, -1, -1},  // none
    {true, -1, -1},   // causal
    {false, 16, 4},   // local window
    {true, 32, -1},   // causal sliding window
    {false, 0, 0},    // the diagonal only
    {false, 48, -1},  // left bound only
    {false, -1, 8},   // right bound only
};

// Softcap / ALiBi / sinks combinations used where features are an assigned axis.
struct Features {
  float softcap;
  Alibi alibi;
  bool sinks;
};
const Features kFeatures[] = {
    {0.0f, Alibi::kNone, false},         {5.0f, Alibi::kNone, false},
    {0.0f, Alibi::kPerHead, false},      {0.0f, Alibi::kPerBatchHead, false},
    {0.0f, Alibi::kNone, true},          {5.0f, Alibi::kPerHead, true},
    {30.0f, Alibi::kPerBatchHead, true},
};

template <typename T, size_t N>
constexpr int64_t count(const T (&)[N]) {
  return static_cast<int64_t>(N);
}

// Element (a * i + b * j) mod N of `values`: the Latin-square assignment.
template <typename T, size_t N>
const T& pick(const T (&values)[N], int64_t a, int64_t i, int64_t b, int64_t j) {
  return values[static_cast<size_t>((a * i + b * j) % static_cast<int64_t>(N))];
}

void apply(const Mask& m, Case* c) {
  c->causal = m.causal;
  c->window_left = m.window_left;
  c->window_right = m.window_right;
}

void apply(const Features& f, Case* c) {
  c->softcap = f.softcap;
  c->alibi = f.alibi;
  c->sinks = f.sinks;
}

// Shrinks a case whose reference costs more than about 6e7 multiply-adds: B to 1, then heads to
// (2, 1) or (2, 2), then head dims to at most 128.
void fit_budget(Case* c) {
  auto cost = [c] { return double(c->B) * c->Hq * c->Sq * c->Sk * (c->D + c->Dv); };
  const double kBudget = 6e7;
  if (cost() > kBudget) c->B = 1;
  if (cost() > kBudget && c->Hq > 2) {
    c->Hk = c->Hk == 1 ? 1 : 2;
    c->Hq = 2;
  }
  if (cost() > kBudget) {
    c->D = c->D > 128 ? 128 : c->D;
    c->Dv = c->Dv > 128 ? 128 : c->Dv;
  }
}

// Runs every case (every 7th with ANYATTN_TEST_SWEEP=reduced); reports the first failures in full
// and the count.
void run_cases(std::vector<Case> cases, uint64_t group) {
  const size_t stride = reduced_sweep() ? 7 : 1;
  int failures = 0, run = 0;
  for (size_t n = 0; n < cases.size(); n += stride) {
    Case& c = cases[n];
    c.seed = group * 100000 + n;
    fit_budget(&c);
    ++run;
    const ::testing::AssertionResult r = run_and_check(c);
    if (!r && ++failures <= 12) ADD_FAILURE() << r.message();
  }
  EXPECT_EQ(failures, 0) << "failing cases out of " << run;
}

// All (Sq, Sk) pairs under masks [first_mask, last_mask). Large problems keep few heads and
// small head dims so that the f64 reference stays fast.
std::vector<Case> seq_len_cases(int first_mask, int last_mask) {
  std::vector<Case> cases;
  const int64_t small_dims[] = {32, 64, 40, 59, 80, 8};
  for (int64_t m = first_mask; m < last_mask; ++m) {
    for (int64_t i = 0; i < count(kSeqLens); ++i) {
      for (int64_t j = 0; j < count(kSeqLens); ++j) {
        Case c;
        c.Sq = kSeqLens[i];
        c.Sk = kSeqLens[j];
        apply(kMasks[m], &c);
        c.dtype = pick(kDtypes, 1, i + m, 1, j);
        const bool large = c.Sq * c.Sk > 40000;
        c.B = (i + 2 * j + m) % 2 ? 3 : 1;
        const Heads heads = large ? Heads{2, (i + j) % 2 ? 1 : 2} : pick(kHeads, 1, i, 3, j + m);
        c.Hq = heads.hq;
        c.Hk = heads.hk;
        c.D = large ? pick(small_dims, 1, i, 2, j + m) : pick(kHeadDims, 5, i + m, 7, j);
        c.Dv = large ? pick(small_dims, 2, i + m, 1, j) : pick(kHeadDims, 7, i, 5, j + m);
        apply(pick(kFeatures, 5, i, 3, j + m), &c);
        c.layout = pick(kLayouts, 1, i + 2 * m, 5, j);
        c.softmax_scale = (i + j + m) % 3 == 2 ? 0.3f : 0.0f;
        c.with_lse = (i + 3 * j) % 5 != 4;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

TEST(FwdSweep, SeqLensNoMaskAndCausal) {
  run_cases(seq_len_cases(0, 2), 1);
}
TEST(FwdSweep, SeqLensWindows) {
  run_cases(seq_len_cases(2, 4), 2);
}
TEST(FwdSweep, SeqLensOneSidedWindows) {
  run_cases(seq_len_cases(4, 7), 8);
}

TEST(FwdSweep, HeadDims) {
  const int64_t seqs[] = {7, 63, 64, 65, 128, 1, 257};
  std::vector<Case> cases;
  for (int64_t i = 0; i < count(kHeadDims); ++i) {
    for (int64_t j = 0; j < count(kHeadDims); ++j) {
      Case c;
      c.D = kHeadDims[i];
      c.Dv = kHeadDims[j];
      c.Sq = pick(seqs, 1, i, 3, j);
      c.Sk = pick(seqs, 3, i, 1, j + 2);
      c.dtype = pick(kDtypes, 1, i, 1, j);
      c.B = (i + 2 * j) % 2 ? 3 : 1;
      const Heads heads = pick(kHeads, 2, i, 1, j);
      c.Hq = heads.hq > 4 ? 4 : heads.hq;  // GQA breadth is the Gqa group's job.
      c.Hk = heads.hq > 4 ? (heads.hk == 1 ? 1 : 2) : heads.hk;
      apply(pick(kMasks, 1, i, 2, j), &c);
      apply(pick(kFeatures, 3, i, 1, j), &c);
      c.layout = pick(kLayouts, 1, i, 5, j);
      c.softmax_scale = (i + j) % 4 == 3 ? 0.05f : 0.0f;
      cases.push_back(c);
    }
  }
  run_cases(cases, 3);
}

TEST(FwdSweep, FeatureCombinations) {
  struct Shape {
    int64_t sq, sk;
  };
  const Shape shapes[] = {{65, 257}, {257, 65}, {128, 128}};
  const int64_t dims[] = {64, 80, 128, 59};
  const float softcaps[] = {0.0f, 5.0f};
  const Alibi alibis[] = {Alibi::kNone, Alibi::kPerHead, Alibi::kPerBatchHead};
  std::vector<Case> cases;
  int64_t n = 0;
  for (const Mask& mask : kMasks) {
    for (float softcap : softcaps) {
      for (Alibi alibi : alibis) {
        for (bool sinks : {false, true}) {
          for (int64_t s = 0; s < count(shapes); ++s, ++n) {
            Case c;
            apply(mask, &c);
            c.softcap = softcap;
            c.alibi = alibi;
            c.sinks = sinks;
            c.Sq = shapes[s].sq;
            c.Sk = shapes[s].sk;
            c.dtype = pick(kDtypes, 1, n / 3, 1, s);  // All three dtypes per combination.
            c.B = n % 2 ? 3 : 1;
            c.Hq = 4;
            c.Hk = n % 5 == 0 ? 1 : 2;
            c.D = c.Dv = dims[n % 4];
            c.softmax_scale = n % 3 == 1 ? 0.2f : 0.0f;
            c.layout = pick(kLayouts, 1, n, 0, 0);
            cases.push_back(c);
          }
        }
      }
    }
  }
  run_cases(cases, 4);
}

TEST(FwdSweep, Gqa) {
  const Alibi alibis[] = {Alibi::kNone, Alibi::kPerHead, Alibi::kPerBatchHead};
  std::vector<Case> cases;
  int64_t n = 0;
  for (const Heads& heads : kHeads) {
    for (Alibi alibi : alibis) {
      for (bool sinks : {false, true}) {
        for (anyattn_dtype dtype : kDtypes) {
          Case c;
          c.Hq = heads.hq;
          c.Hk = heads.hk;
          c.alibi = alibi;
          c.sinks = sinks;
          c.dtype = dtype;
          c.B = 3;
          c.Sq = n % 2 ? 63 : 128;
          c.Sk = n % 2 ? 128 : 63;
          c.D = 64;
          c.Dv = n % 3 ? 64 : 32;
          apply(kMasks[n % 4], &c);
          c.layout = pick(kLayouts, 1, n, 0, 0);
          cases.push_back(c);
          ++n;
        }
      }
    }
  }
  run_cases(cases, 5);
}

TEST(FwdSweep, Layouts) {
  struct Shape {
    int64_t sq, sk;
  };
  const Shape shapes[] = {{64, 64}, {7, 257}, {257, 65}};  // The first packs q, k, v together.
  std::vector<Case> cases;
  int64_t n = 0;
  for (Layout layout : kLayouts) {
    for (anyattn_dtype dtype : kDtypes) {
      for (int64_t m = 0; m < 3; ++m) {
        for (const Shape& shape : shapes) {
          Case c;
          c.layout = layout;
          c.dtype = dtype;
          apply(kMasks[m], &c);
          c.Sq = shape.sq;
          c.Sk = shape.sk;
          c.B = 3;
          const Heads heads = kHeads[n % 5];
          c.Hq = heads.hq > 8 ? 8 : heads.hq;
          c.Hk = heads.hk;
          c.D = n % 2 ? 40 : 64;
          c.Dv = n % 3 ? 64 : 96;
          apply(kFeatures[n % count(kFeatures)], &c);
          c.with_lse = n % 4 != 3;
          cases.push_back(c);
          ++n;
        }
      }
    }
  }
  run_cases(cases, 6);
}

TEST(FwdSweep, SoftmaxScale) {
  // 0 = default 1/sqrt(D); 1.0 makes the softmax peaky; -0.5 flips the order of the scores.
  const float scales[] = {0.0f, 1.0f, 0.01f, -0.5f, 0.125f};
  const int64_t dims[] = {8, 111, 256};
  std::vector<Case> cases;
  int64_t n = 0;
  for (float scale : scales) {
    for (anyattn_dtype dtype : kDtypes) {
      for (int64_t d : dims) {
        Case c;
        c.softmax_scale = scale;
        c.dtype = dtype;
        c.D = d;
        c.Dv = 64;
        c.Sq = 65;
        c.Sk = 128;
        c.Hq = 2;
        c.Hk = 1;
        c.B = 1;
        apply(kMasks[n % 3], &c);
        c.softcap = n % 4 == 1 ? 5.0f : 0.0f;
        cases.push_back(c);
        ++n;
      }
    }
  }
  run_cases(cases, 7);
}

TEST(FwdSweep, SmallValueHeadDims) {
  const int64_t value_dims[] = {1, 2, 3, 5, 7, 15};
  const int64_t head_dims[] = {1, 4, 8, 64};
  const int64_t seq_lens[] = {7, 65, 130};
  std::vector<Case> cases;
  for (int64_t i = 0; i < count(value_dims); ++i) {
    for (int64_t m = 0; m < count(kMasks); ++m) {
      for (anyattn_isa isa : supported_isas()) {
        Case c;
        c.Dv = value_dims[i];
        c.D = pick(head_dims, 1, i, 1, m);
        c.Sq = pick(seq_lens, 1, i, 2, m);
        c.Sk = pick(seq_lens, 2, i, 1, m);
        apply(kMasks[m], &c);
        apply(pick(kFeatures, 3, i, 1, m), &c);
        c.dtype = pick(kDtypes, 1, i, 1, m);
        const Heads heads = pick(kHeads, 2, i, 1, m);
        c.Hq = heads.hq;
        c.Hk = heads.hk;
        c.B = (i + m) % 2 ? 2 : 1;
        c.layout = pick(kLayouts, 1, i, 3, m);
        c.isa = isa;
        cases.push_back(c);
      }
    }
  }
  run_cases(cases, 8);
}

TEST(FwdSweep, LargeGroups) {
  struct GroupShape {
    int64_t hq, hk, sq;  // tasks of the packed path: heads per task x sq rows
  };
  const GroupShape shapes[] = {
      {72, 1, 1},   // 2 tasks of 36 heads
      {65, 1, 1},   // 33 and 32
      {128, 1, 1},  // 2 tasks of 64
      {130, 2, 1},  // 33 and 32 per kv head
      {96, 1, 2},   // 3 tasks of 32 heads x 2 positions
      {40, 1, 2},   // 2 tasks of 20 x 2
      {33, 1, 3},   // 17 and 16, x 3
      {24, 1, 4},   // 2 tasks of 12 x 4
  };
  const Alibi alibis[] = {Alibi::kNone, Alibi::kPerHead, Alibi::kPerBatchHead};
  const int64_t key_counts[] = {63, 300, 1000};  // 1000: 16 blocks, key splits by default
  const std::vector<anyattn_isa> isas = supported_isas();
  std::vector<Case> cases;
  for (int64_t i = 0; i < count(shapes); ++i) {
    for (int64_t m = 0; m < 4; ++m) {
      for (int64_t a = 0; a < count(alibis); ++a) {
        Case c;
        c.Hq = shapes[i].hq;
        c.Hk = shapes[i].hk;
        c.Sq = shapes[i].sq;
        c.Sk = pick(key_counts, 1, i, 1, m + a);
        c.B = (i + m) % 2 ? 2 : 1;
        c.D = (i + a) % 2 ? 64 : 40;
        c.Dv = (m + a) % 3 ? 64 : 24;
        apply(kMasks[m], &c);
        c.alibi = alibis[a];
        c.sinks = (i + m + a) % 2 == 1;
        c.softcap = (i + 2 * m + a) % 4 == 3 ? 5.0f : 0.0f;
        c.dtype = pick(kDtypes, 1, i, 1, m + 2 * a);
        c.layout = pick(kLayouts, 1, i + a, 2, m);
        c.num_splits = (i + m + a) % 5 == 4 ? 3 : 0;
        c.isa = isas[(i + m + 2 * a) % isas.size()];
        cases.push_back(c);
      }
    }
  }
  run_cases(cases, 9);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
