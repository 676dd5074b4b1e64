// Concurrency and determinism (docs/reliability.md): every entry point gives bitwise-identical
// outputs for the same inputs across runs, thread counts 1..8 and concurrent callers, also while
// another thread changes the thread count. Built to run under ThreadSanitizer (the `tsan` preset),
// so the problems are small.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "reference/reference_cache.h"
#include "common/test_support.h"

namespace anyattn {
namespace testing {
namespace {

struct ThreadCountGuard {
  ~ThreadCountGuard() { anyattn_set_num_threads(0); }
};

// Deterministic values in [-1, 1).
std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t state = seed * 2654435761u + 1;
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) * 0x1.0p-23f - 1.0f;
  }
  return v;
}

anyattn_tensor tensor(void* data, anyattn_dtype dtype, std::vector<int64_t> shape) {
  anyattn_tensor t{};
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, dtype, static_cast<int32_t>(shape.size()),
                                           shape.data()),
            ANYATTN_OK);
  return t;
}

template <class T>
void append_bytes(std::vector<unsigned char>* bytes, const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  bytes->insert(bytes->end(), p, p + v.size() * sizeof(T));
}

// One call of an entry point on fixed inputs. run() may be called from several threads at once:
// it allocates its own outputs (and its own copy of anything the call writes, like a KV cache)
// and returns every output byte, or an empty vector when the call fails.
using Workload = std::function<std::vector<unsigned char>()>;

// Dense forward through a Problem (its inputs are shared and only read).
Workload dense_workload(const Case& c) {
  auto problem = std::make_shared<Problem>(c);
  return [problem] {
    Problem& p = *problem;
    std::vector<unsigned char> out(p.out_buffer.size()), lse(p.lse_buffer.size());
    anyattn_tensor t_out = p.out, t_lse = p.lse;
    t_out.data = out.data() + (static_cast<unsigned char*>(p.out.data) - p.out_buffer.data());
    t_lse.data = lse.data() + (static_cast<unsigned char*>(p.lse.data) - p.lse_buffer.data());
    if (anyattn_fwd(&p.q, &p.k, &p.v, &t_out, p.spec().with_lse ? &t_lse : nullptr, &p.params) !=
        ANYATTN_OK) {
      return std::vector<unsigned char>();
    }
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
}

// Varlen forward: three sequences (q lengths 5, 70, 33; k lengths 90, 0, 41), GQA 4:2, window.
Workload varlen_workload() {
  struct Inputs {
    std::vector<float> q = values(108 * 4 * 24, 1), k = values(131 * 2 * 24, 2),
                       v = values(131 * 2 * 16, 3);
    std::vector<int32_t> cu_q = {0, 5, 75, 108}, cu_k = {0, 90, 90, 131};
  };
  auto in = std::make_shared<Inputs>();
  return [in] {
    std::vector<float> out(108 * 4 * 16, -1.0f), lse(4 * 108, -1.0f);
    const anyattn_tensor q = tensor(in->q.data(), ANYATTN_DTYPE_F32, {108, 4, 24});
    const anyattn_tensor k = tensor(in->k.data(), ANYATTN_DTYPE_F32, {131, 2, 24});
    const anyattn_tensor v = tensor(in->v.data(), ANYATTN_DTYPE_F32, {131, 2, 16});
    const anyattn_tensor o = tensor(out.data(), ANYATTN_DTYPE_F32, {108, 4, 16});
    const anyattn_tensor l = tensor(lse.data(), ANYATTN_DTYPE_F32, {4, 108});
    const anyattn_tensor cq = tensor(in->cu_q.data(), ANYATTN_DTYPE_I32, {4});
    const anyattn_tensor ck = tensor(in->cu_k.data(), ANYATTN_DTYPE_I32, {4});
    anyattn_fwd_params params;
    anyattn_fwd_params_init(&params);
    params.window_left = 20;
    params.window_right = 3;
    std::vector<unsigned char> bytes;
    if (anyattn_fwd_varlen(&q, &k, &v, &o, &l, &cq, &ck, nullptr, 70, 90, &params) != ANYATTN_OK) {
      return bytes;
    }
    append_bytes(&bytes, out);
    append_bytes(&bytes, lse);
    return bytes;
  };
}

// Paged KV-cache forward with an in-place append of 3 new keys per sequence; each run appends
// into its own copy of the cache.
Workload kvcache_workload() {
  struct Inputs {
    // 6 pages of 16 rows, Hk = 1, D = Dv = 32; B = 2 with 3 pages each.
    std::vector<float> k_cache = values(6 * 16 * 32, 4), v_cache = values(6 * 16 * 32, 5);
    std::vector<float> q = values(2 * 3 * 2 * 32, 6), k_new = values(2 * 3 * 32, 7),
                       v_new = values(2 * 3 * 32, 8);
    std::vector<int32_t> block_table = {4, 0, 2, 1, 5, 3}, seqlens = {20, 41};
  };
  auto in = std::make_shared<Inputs>();
  return [in] {
    std::vector<float> k_cache = in->k_cache, v_cache = in->v_cache;
    std::vector<float> out(2 * 3 * 2 * 32, -1.0f), lse(2 * 2 * 3, -1.0f);
    const anyattn_tensor q = tensor(in->q.data(), ANYATTN_DTYPE_F32, {2, 3, 2, 32});
    const anyattn_tensor kc = tensor(k_cache.data(), ANYATTN_DTYPE_F32, {6, 16, 1, 32});
    const anyattn_tensor vc = tensor(v_cache.data(), ANYATTN_DTYPE_F32, {6, 16, 1, 32});
    const anyattn_tensor kn = tensor(in->k_new.data(), ANYATTN_DTYPE_F32, {2, 3, 1, 32});
    const anyattn_tensor vn = tensor(in->v_new.data(), ANYATTN_DTYPE_F32, {2, 3, 1, 32});
    const anyattn_tensor o = tensor(out.data(), ANYATTN_DTYPE_F32, {2, 3, 2, 32});
    const anyattn_tensor l = tensor(lse.data(), ANYATTN_DTYPE_F32, {2, 2, 3});
    const anyattn_tensor bt = tensor(in->block_table.data(), ANYATTN_DTYPE_I32, {2, 3});
    const anyattn_tensor sl = tensor(in->seqlens.data(), ANYATTN_DTYPE_I32, {2});
    anyattn_kvcache_params cache;
    anyattn_kvcache_params_init(&cache);
    cache.k_new = &kn;
    cache.v_new = &vn;
    cache.cache_seqlens = &sl;
    cache.block_table = &bt;
    anyattn_fwd_params params;
    anyattn_fwd_params_init(&params);
    params.causal = 1;
    std::vector<unsigned char> bytes;
    if (anyattn_fwd_kvcache(&q, &kc, &vc, &o, &l, &cache, &params) != ANYATTN_OK) return bytes;
    append_bytes(&bytes, out);
    append_bytes(&bytes, lse);
    append_bytes(&bytes, k_cache);
    append_bytes(&bytes, v_cache);
    return bytes;
  };
}

// Merge of two (T=50, H=3, Dv=20) partial results, one LSE entry -inf.
Workload merge_workload() {
  struct Inputs {
    std::vector<float> oa = values(50 * 3 * 20, 9), ob = values(50 * 3 * 20, 10);
    std::vector<float> la = values(3 * 50, 11), lb = values(3 * 50, 12);
  };
  auto in = std::make_shared<Inputs>();
  in->la[7] = -INFINITY;
  return [in] {
    std::vector<float> out(50 * 3 * 20, -1.0f), lse(3 * 50, -1.0f);
    const anyattn_tensor oa = tensor(in->oa.data(), ANYATTN_DTYPE_F32, {50, 3, 20});
    const anyattn_tensor ob = tensor(in->ob.data(), ANYATTN_DTYPE_F32, {50, 3, 20});
    const anyattn_tensor la = tensor(in->la.data(), ANYATTN_DTYPE_F32, {3, 50});
    const anyattn_tensor lb = tensor(in->lb.data(), ANYATTN_DTYPE_F32, {3, 50});
    const anyattn_tensor o = tensor(out.data(), ANYATTN_DTYPE_F32, {50, 3, 20});
    const anyattn_tensor l = tensor(lse.data(), ANYATTN_DTYPE_F32, {3, 50});
    std::vector<unsigned char> bytes;
    if (anyattn_merge_attention_states(&oa, &la, &ob, &lb, &o, &l) != ANYATTN_OK) return bytes;
    append_bytes(&bytes, out);
    append_bytes(&bytes, lse);
    return bytes;
  };
}

// Backward (B=2, Sq=40, Sk=70, Hq=4, Hk=2, D=16, Dv=24, causal, sinks): forward once for out and
// lse, then every run computes dq, dk, dv, dsinks.
Workload bwd_workload() {
  struct Inputs {
    std::vector<float> q = values(2 * 40 * 4 * 16, 13), k = values(2 * 70 * 2 * 16, 14),
                       v = values(2 * 70 * 2 * 24, 15), dout = values(2 * 40 * 4 * 24, 16);
    std::vector<float> out = std::vector<float>(2 * 40 * 4 * 24),
                       lse = std::vector<float>(2 * 4 * 40);
    std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
    anyattn_tensor t_sinks{};
    anyattn_fwd_params params{};
  };
  auto in = std::make_shared<Inputs>();
  in->t_sinks = tensor(in->sinks.data(), ANYATTN_DTYPE_F32, {4});
  anyattn_fwd_params_init(&in->params);
  in->params.causal = 1;
  in->params.sinks = &in->t_sinks;
  {
    const anyattn_tensor q = tensor(in->q.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 16});
    const anyattn_tensor k = tensor(in->k.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 16});
    const anyattn_tensor v = tensor(in->v.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 24});
    const anyattn_tensor o = tensor(in->out.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 24});
    const anyattn_tensor l = tensor(in->lse.data(), ANYATTN_DTYPE_F32, {2, 4, 40});
    EXPECT_EQ(anyattn_fwd(&q, &k, &v, &o, &l, &in->params), ANYATTN_OK) << anyattn_last_error();
  }
  return [in] {
    std::vector<float> dq(in->q.size(), -1.0f), dk(in->k.size(), -1.0f), dv(in->v.size(), -1.0f),
        dsinks(4, -1.0f);
    const anyattn_tensor q = tensor(in->q.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 16});
    const anyattn_tensor k = tensor(in->k.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 16});
    const anyattn_tensor v = tensor(in->v.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 24});
    const anyattn_tensor o = tensor(in->out.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 24});
    const anyattn_tensor l = tensor(in->lse.data(), ANYATTN_DTYPE_F32, {2, 4, 40});
    const anyattn_tensor d_o = tensor(in->dout.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 24});
    const anyattn_tensor tdq = tensor(dq.data(), ANYATTN_DTYPE_F32, {2, 40, 4, 16});
    const anyattn_tensor tdk = tensor(dk.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 16});
    const anyattn_tensor tdv = tensor(dv.data(), ANYATTN_DTYPE_F32, {2, 70, 2, 24});
    const anyattn_tensor tds = tensor(dsinks.data(), ANYATTN_DTYPE_F32, {4});
    std::vector<unsigned char> bytes;
    if (anyattn_bwd(&d_o, &q, &k, &v, &o, &l, &tdq, &tdk, &tdv, &tds, &in->params) != ANYATTN_OK) {
      return bytes;
    }
    append_bytes(&bytes, dq);
    append_bytes(&bytes, dk);
    append_bytes(&bytes, dv);
    append_bytes(&bytes, dsinks);
    return bytes;
  };
}

struct NamedWorkload {
  std::string name;
  Workload run;
};

std::vector<NamedWorkload> workloads() {
  Case prefill;
  prefill.B = 2;
  prefill.Sq = 96;
  prefill.Sk = 130;
  prefill.Hq = 4;
  prefill.Hk = 2;
  prefill.D = prefill.Dv = 32;
  prefill.causal = true;
  prefill.dtype = ANYATTN_DTYPE_F16;
  prefill.layout = Layout::kPaddedStrides;
  Case decode;
  decode.Sq = 1;
  decode.Sk = 1500;  // Long enough for split-KV.
  decode.Hq = 4;
  decode.Hk = 1;
  decode.D = decode.Dv = 64;
  decode.dtype = ANYATTN_DTYPE_BF16;
  decode.sinks = true;
  Case gqa;
  gqa.B = 3;
  gqa.Sq = gqa.Sk = 65;
  gqa.Hq = 8;
  gqa.Hk = 2;
  gqa.D = 40;
  gqa.Dv = 24;
  gqa.softcap = 5.0f;
  gqa.alibi = Alibi::kPerBatchHead;
  gqa.layout = Layout::kNegativeStrides;
  return {{"fwd prefill f16", dense_workload(prefill)},
          {"fwd decode bf16 split-KV", dense_workload(decode)},
          {"fwd gqa softcap alibi", dense_workload(gqa)},
          {"varlen", varlen_workload()},
          {"kvcache paged append", kvcache_workload()},
          {"merge", merge_workload()},
          {"bwd", bwd_workload()}};
}

// Same bits for thread counts 1..8 and for repeated runs, for every entry point.
TEST(ReliabilityConcurrency, BitwiseIdenticalForThreadCountsOneToEight) {
  ThreadCountGuard guard;
  for (const NamedWorkload& w : workloads()) {
    SCOPED_TRACE(w.name);
    anyattn_set_num_threads(1);
    const std::vector<unsigned char> expected = w.run();
    ASSERT_FALSE(expected.empty()) << anyattn_last_error();
    for (int threads = 1; threads <= 8; ++threads) {
      anyattn_set_num_threads(threads);
      ASSERT_EQ(anyattn_get_num_threads(), threads);
      for (int repeat = 0; repeat < 2; ++repeat) {
        EXPECT_TRUE(w.run() == expected) << "threads=" << threads << " repeat=" << repeat;
      }
    }
  }
}

// Host parallel regions (anyattn_set_host_parallel) for the test below: one that runs the bodies
// on threads of its own (the caller as worker 0), and one that runs a single body on the caller,
// as a nested OpenMP region does. Each counts its regions.
std::atomic<int> g_host_regions{0};

void threaded_host(int threads, anyattn_parallel_body body, void* context) {
  g_host_regions.fetch_add(1);
  std::vector<std::thread> team;
  for (int worker = 1; worker < threads; ++worker) team.emplace_back(body, context, worker);
  body(context, 0);
  for (std::thread& t : team) t.join();
}

void single_body_host(int, anyattn_parallel_body body, void* context) {
  g_host_regions.fetch_add(1);
  body(context, 0);
}

struct HostParallelGuard {
  ~HostParallelGuard() { anyattn_set_host_parallel(nullptr); }
};

// Every entry point gives the pool's bits on a host's threads, and on a host that runs one body.
TEST(ReliabilityConcurrency, HostParallelRegionsGiveThePoolsBits) {
  ThreadCountGuard threads_guard;
  HostParallelGuard host_guard;
  anyattn_set_num_threads(3);
  for (const NamedWorkload& w : workloads()) {
    SCOPED_TRACE(w.name);
    anyattn_set_host_parallel(nullptr);
    const std::vector<unsigned char> expected = w.run();
    ASSERT_FALSE(expected.empty()) << anyattn_last_error();
    for (anyattn_host_parallel_fn host : {&threaded_host, &single_body_host}) {
      anyattn_set_host_parallel(host);
      const int regions = g_host_regions.load();
      EXPECT_TRUE(w.run() == expected) << (host == &threaded_host ? "threaded" : "one body");
      EXPECT_GT(g_host_regions.load(), regions) << "the host ran no region";
    }
  }
  // NULL restores the pool.
  anyattn_set_host_parallel(nullptr);
  const int regions = g_host_regions.load();
  EXPECT_FALSE(workloads().front().run().empty());
  EXPECT_EQ(g_host_regions.load(), regions);
}

// The dense workloads are also right, so the bitwise checks above compare meaningful results.
TEST(ReliabilityConcurrency, DenseWorkloadsMatchTheReference) {
  Case c;
  c.B = 2;
  c.Sq = 96;
  c.Sk = 130;
  c.Hq = 4;
  c.Hk = 2;
  c.D = c.Dv = 32;
  c.causal = true;
  c.dtype = ANYATTN_DTYPE_F16;
  c.layout = Layout::kPaddedStrides;
  EXPECT_TRUE(run_and_check(c));
}

// Six caller threads run every entry point in turn while a seventh keeps changing the thread
// count (1..8, then the default); every result is bitwise the sequential one.
TEST(ReliabilityConcurrency, ConcurrentCallersWhileThreadCountChanges) {
  ThreadCountGuard guard;
  const std::vector<NamedWorkload> all = workloads();
  std::vector<std::vector<unsigned char>> expected;
  anyattn_set_num_threads(1);
  for (const NamedWorkload& w : all) {
    expected.push_back(w.run());
    ASSERT_FALSE(expected.back().empty()) << w.name << ": " << anyattn_last_error();
  }
  constexpr int kCallers = 6, kRounds = 3;
  std::atomic<int> running{kCallers}, mismatches{0}, calls{0};
  std::atomic<int> first_bad{-1};
  std::thread changer([&] {
    for (int n = 1; running.load() > 0; n = n % 9 + 1) {
      anyattn_set_num_threads(n == 9 ? 0 : n);
      const int got = anyattn_get_num_threads();
      if (got < 1) mismatches += 1000;
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < kCallers; ++t) {
    callers.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        for (size_t i = 0; i < all.size(); ++i) {
          const size_t w = (i + static_cast<size_t>(t)) % all.size();  // Different orders.
          if (all[w].run() != expected[w]) {
            ++mismatches;
            first_bad.store(static_cast<int>(w));
          }
          ++calls;
        }
      }
      --running;
    });
  }
  for (std::thread& caller : callers) caller.join();
  changer.join();
  EXPECT_EQ(calls.load(), kCallers * kRounds * static_cast<int>(all.size()));
  EXPECT_EQ(mismatches.load(), 0) << "e.g. workload "
                                  << (first_bad.load() >= 0 ? all[first_bad.load()].name : "");
}

// Many short-lived threads mix successful calls and failing ones: every thread sees its own error
// message (thread-local, naming the value it passed), and nothing leaks when the threads exit
// (LeakSanitizer checks this at exit under the asan preset).
TEST(ReliabilityConcurrency, ManyThreadsKeepTheirOwnErrorMessages) {
  ThreadCountGuard guard;
  anyattn_set_num_threads(2);
  const Workload small = merge_workload();
  anyattn_set_num_threads(1);
  const std::vector<unsigned char> expected = small();
  anyattn_set_num_threads(2);
  constexpr int kThreads = 16;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t bad_dim = ANYATTN_MAX_HEAD_DIM + 1 + t;
      std::vector<float> q(4 * bad_dim), out(4 * bad_dim);
      for (int call = 0; call < 5; ++call) {
        // D = 577 + t is out of range: the message must name this thread's value.
        const anyattn_tensor bad_q = tensor(q.data(), ANYATTN_DTYPE_F32, {1, 2, 2, bad_dim});
        const anyattn_tensor bad_out = tensor(out.data(), ANYATTN_DTYPE_F32, {1, 2, 2, bad_dim});
        if (anyattn_fwd(&bad_q, &bad_q, &bad_q, &bad_out, nullptr, nullptr) !=
            ANYATTN_E_INVALID_ARGUMENT) {
          ++failures;
        }
        std::this_thread::yield();
        if (std::string(anyattn_last_error()).find(std::to_string(bad_dim)) == std::string::npos) {
          ++failures;
        }
        if (small() != expected) ++failures;
        if (std::strlen(anyattn_last_error()) != 0) ++failures;  // Success clears the message.
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace testing
}  // namespace anyattn
