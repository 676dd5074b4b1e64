#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "anyattn_runner.h"
#include "bench_cases.h"
#include "machine_limits.h"
#include "process_info.h"
#include "tensors.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

// Bytes the rotated K/V copies may take in all.
constexpr double kMaxRotationBytes = 2.0 * 1024 * 1024 * 1024;
constexpr int kMaxCopies = 32;
// The read passes of a round last about this share of its chunk of calls.
constexpr double kReadShare = 0.5;
// Seconds of rest after each chunk of calls, before the read passes: the library's pool workers
// spin for a few tens of microseconds after a call, and would share a core with a reading thread.
constexpr double kRestAfterCalls = 0.002;

// How many K/V copies to cycle through so that the set exceeds twice the last-level cache, taken
// as the larger of sysfs's and the C library's figure: the library's may count every L3 of the
// socket (384 MiB on a Zen 5 VM whose cores each see 32 MiB), and the threads may sit on
// different L3s, so the larger rotation errs on the side of timing from memory.
int KvCopies(double kv_bytes) {
  const double llc_bytes =
      static_cast<double>(std::max(LastLevelCacheBytes(), LibcLastLevelCacheBytes()));
  if (kv_bytes >= 2.0 * llc_bytes) return 1;
  const int wanted = static_cast<int>(std::ceil(2.0 * llc_bytes / kv_bytes));
  const int affordable = static_cast<int>(kMaxRotationBytes / kv_bytes);
  return std::max(1, std::min({wanted, affordable, kMaxCopies}));
}

}  // namespace

DecodeRow RunDecodeCase(const DecodeShape& shape, const MachineLimits& limits,
                        const CaseSettings& settings) {
  DecodeRow row;
  row.shape = shape;
  row.threads = limits.threads;
  row.kv_bytes = DecodeKvBytes(shape);
  row.read_bandwidth_gbps = limits.read_bandwidth_gbps;
  row.kv_copies = KvCopies(row.kv_bytes);
  row.kv_huge_pages = settings.kv_pages == Pages::kHuge;

  const bool kv8 = shape.cache != CacheFormat::kAsQ;
  const size_t q_bytes = DTypeBytes(shape.dtype);
  const size_t element_bytes = kv8 ? 1 : q_bytes;  // of K and V
  const size_t q_elements = shape.batch * shape.seqlen_q * shape.heads_q * shape.head_dim;
  const size_t k_elements = shape.batch * shape.seqlen_k * shape.heads_k * shape.head_dim;
  // A shared latent cache has no V buffer: V is the first Dv columns of each K row.
  const size_t v_elements =
      shape.shared_latent ? 0 : shape.batch * shape.seqlen_k * shape.heads_k * shape.value_head_dim();
  AlignedBuffer q(q_elements * q_bytes);
  AlignedBuffer out(q_elements * q_bytes);
  std::vector<AlignedBuffer> k_copies;
  std::vector<AlignedBuffer> v_copies;
  for (int c = 0; c < row.kv_copies; ++c) {
    k_copies.emplace_back(k_elements * element_bytes, settings.kv_pages);
    v_copies.emplace_back(v_elements * element_bytes, settings.kv_pages);
    if (!k_copies.back().data() || (v_elements > 0 && !v_copies.back().data())) {
      row.anyattn_error = "benchmark could not allocate the KV copies";
      return row;
    }
  }
  if (!q.data() || !out.data()) {
    row.anyattn_error = "benchmark could not allocate q and out";
    return row;
  }
  FillUniform(q.data(), shape.dtype, q_elements, 11);
  FillUniform(out.data(), shape.dtype, q_elements, 12);
  if (kv8) {
    // Stored bytes spread over the formats' finite codes (no e4m3 NaN pattern S.1111.111).
    for (size_t i = 0; i < k_elements; ++i) {
      const uint8_t code = static_cast<uint8_t>((i * 37 + 11) % 251);
      static_cast<uint8_t*>(k_copies[0].data())[i] = code & 0xF7;
    }
    for (size_t i = 0; i < v_elements; ++i) {
      const uint8_t code = static_cast<uint8_t>((i * 37 + 11) % 251);
      static_cast<uint8_t*>(v_copies[0].data())[i] = (code ^ 0x5A) & 0xF7;
    }
  } else {
    FillUniform(k_copies[0].data(), shape.dtype, k_elements, 13);
    if (v_elements > 0) FillUniform(v_copies[0].data(), shape.dtype, v_elements, 14);
  }
  for (int c = 1; c < row.kv_copies; ++c) {
    std::memcpy(k_copies[c].data(), k_copies[0].data(), k_elements * element_bytes);
    if (v_elements > 0) {
      std::memcpy(v_copies[c].data(), v_copies[0].data(), v_elements * element_bytes);
    }
  }

  // A paged cache is the same bytes seen as (B * Sk / page_size) pages behind a block table.
  const bool paged = shape.page_size > 0;
  const std::vector<int32_t> block_table =
      paged ? ScatteredBlockTable(shape.batch * shape.seqlen_k / shape.page_size)
            : std::vector<int32_t>();
  AnyattnFwdCall call(shape.batch, shape.seqlen_q, shape.seqlen_k, shape.heads_q, shape.heads_k,
                      shape.head_dim, shape.dtype, shape.seqlen_q > 1, settings.isa, q.data(),
                      k_copies[0].data(),
                      shape.shared_latent ? k_copies[0].data() : v_copies[0].data(), out.data());
  if (paged) call.UsePagedCache(shape.page_size, block_table.data());
  if (IsMlaDecode(shape)) call.SetValueHeadDim(shape.value_head_dim(), shape.shared_latent);
  // The int8 rows' token scales, one set for every copy (1/32 of the cache bytes they scale); a
  // shared latent cache's V takes K's.
  std::vector<float> token_scales;
  if (shape.cache == CacheFormat::kI8PerToken) {
    const size_t rows = shape.batch * shape.seqlen_k * shape.heads_k;
    token_scales.assign((shape.shared_latent ? 1 : 2) * rows, 1.f / 127);
    call.UseKv8Cache(ANYATTN_DTYPE_I8, 1.f, token_scales.data(),
                     token_scales.data() + (shape.shared_latent ? 0 : rows));
  } else if (shape.cache == CacheFormat::kFp8E4M3) {
    call.UseKv8Cache(ANYATTN_DTYPE_FP8_E4M3, 1.f / 256, nullptr, nullptr);
  }
  // The calls alternate with a plain streaming read of the same bytes from the K and V copies
  // themselves (summed as floats; their values do not matter), as the forward rows alternate with
  // FMA bursts: chunks of calls, then read passes for half as long, round after round, so that
  // `read now` sees the host as the calls did. Both take the least recently read copy from one
  // rotation, so neither finds the other's bytes in cache. A read pass is timed from its
  // threads' release to their end (thread start-up excluded); the rest after each chunk of calls
  // lets the pool's workers stop spinning before the reading threads start.
  const size_t k_read_floats = k_elements * element_bytes / sizeof(float) / 64 * 64;
  const size_t v_read_floats = v_elements * element_bytes / sizeof(float) / 64 * 64;
  size_t next_copy = 0;
  std::vector<double> read_seconds;
  std::vector<InterleavedRun> runs(2);
  runs[0].run = [&] {
    const size_t c = next_copy++ % k_copies.size();
    call.SetKv(k_copies[c].data(), v_copies[c].data());
    return call.Run(&row.anyattn_error);
  };
  runs[0].rest_seconds = kRestAfterCalls;
  runs[1].run = [&] {
    const size_t c = next_copy++ % k_copies.size();
    read_seconds.push_back(TimeReadPass(k_copies[c].f32(), k_read_floats, limits.threads) +
                           (v_elements > 0 ? TimeReadPass(v_copies[c].f32(), v_read_floats,
                                                          limits.threads)
                                           : 0.0));
    return true;
  };
  runs[1].chunk_share = kReadShare;
  const std::vector<std::optional<TimingResult>> timings = TimeInterleaved(runs, settings.policy);
  row.anyattn = timings[0];
  if (!row.anyattn) return row;
  // The warm-up passes came first; the timed ones are the last `runs`.
  const int read_runs = timings[1]->runs;
  row.read_alongside = SummarizeRuns(std::vector<double>(
      read_seconds.end() - std::min<size_t>(read_seconds.size(), read_runs), read_seconds.end()));
  return row;
}

}  // namespace anyattn_bench
