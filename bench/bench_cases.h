// The four kinds of measurement: a forward-table row, a backward-table row, a decode-table row and
// the peak-RSS case.
#ifndef ANYATTN_BENCH_BENCH_CASES_H_
#define ANYATTN_BENCH_BENCH_CASES_H_

#include <string>

#include "anyattn/anyattn.h"
#include "results.h"
#include "tensors.h"
#include "timing.h"

namespace anyattn_bench {

// Settings shared by every case of one run.
struct CaseSettings {
  TimingPolicy policy;
  anyattn_isa isa = ANYATTN_ISA_AUTO;
  bool run_baseline = true;
  // The baseline is skipped where its score matrix exceeds this many bytes.
  double baseline_cap_bytes = 0.0;
  // Pages of the decode rows' K/V buffers.
  Pages kv_pages = Pages::kHuge;
};

// Times anyattn and (unless skipped) the unfused OpenBLAS baseline on `shape` with random inputs,
// and compares their outputs. The caller has already set `threads` with anyattn_set_num_threads;
// `limits` gives the FMA peak for the percentage. Failures are recorded in the row, never thrown.
FwdRow RunFwdCase(const FwdShape& shape, const MachineLimits& limits, const CaseSettings& settings);

// Times anyattn_bwd on `shape` with random q, k, v and dout, after one anyattn_fwd (untimed)
// has written out and lse, and checks that dq, dk and dv are finite. The caller has already set
// the thread count; `limits` gives the FMA peak for the percentage. settings.run_baseline and
// baseline_cap_bytes do not apply (there is no backward baseline). Failures are recorded in the
// row, never thrown.
BwdRow RunBwdCase(const FwdShape& shape, const MachineLimits& limits, const CaseSettings& settings);

// Times anyattn on the decode `shape`. When K/V fit in twice the last-level cache, the timed runs
// cycle through enough copies of them that every run reads K/V from memory. The caller has already
// set the thread count; `limits` gives the read bandwidth for the percentage.
DecodeRow RunDecodeCase(const DecodeShape& shape, const MachineLimits& limits,
                        const CaseSettings& settings);

// Times the two anyattn forward calls of a pair (PairKind) in alternation: the subject on `shape`
// with `threads` threads, and the reference (`shape` in f32 with as many threads, or `shape` with
// one thread). Sets the thread count before every call and restores the caller's at the end.
// Failures are recorded in the row, never thrown.
PairRow RunPairCase(PairKind kind, const FwdShape& shape, int threads,
                    const CaseSettings& settings);

// A pair's row key, which --filter matches: "pair/bf16-f32/thr2/full/B1/Hq16/Hk4/D128/S2048" or
// "pair/thr2-thr1/f32/causal/B1/Hq16/Hk16/D64/S4096".
std::string PairKey(PairKind kind, const FwdShape& shape, int threads);

// Runs one forward call on B=1, Sq=Sk=32768, Hq=Hk=8, D=128, f32, no mask, with `threads` threads,
// and reports the process's peak RSS against the bytes of q, k, v and out. Meaningful only as the
// first large allocation of a fresh process (anyattn_bench --rss-case).
RssCaseResult RunRssCase(int threads, anyattn_isa isa);

// The RSS case's row key, "rss/f32/full/B1/Hq8/Hk8/D128/S32768", which --filter matches.
const char* RssCaseKey();

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_BENCH_CASES_H_
