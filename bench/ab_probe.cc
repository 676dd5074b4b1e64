// anyattn_ab_probe: compares one to four builds of libanyattn.so, each on one or more page sizes
// of the cache, on one forward (or backward) shape, inside one process, calls interleaved.
//
//   anyattn_ab_probe --lib OLD.so --lib NEW.so [--batch B] [--seqlen S] [--seqlen-q SQ]
//                    [--heads-q H] [--heads-k HK] [--head-dim D] [--dtype f32|bf16|f16]
//                    [--causal] [--backward] [--huge-pages] [--kv-copies N]
//                    [--kv8 e4m3|e5m2|i8] [--latent DV] [--page-size P[,P2,...]]
//                    [--threads T] [--runs N]
//
// --seqlen is the key length, and the query length too unless --seqlen-q gives it: --seqlen-q 1
// --batch 8 --heads-q 32 --heads-k 8 --seqlen 32768 --dtype bf16 times decode, for which the
// report adds the K/V bytes read per second at the minimum. The calls use --kv-copies N copies
// of K and V in turn (default 1, reused: a shape smaller than the last-level cache then runs
// from cache); N copies whose bytes together exceed twice the last-level cache time a small
// shape from memory, as anyattn_bench's decode table does. --huge-pages asks for 2 MiB pages for
// K and V (bench/tensors.h, Pages::kHuge). --kv8 stores K and V as an 8-bit cache and calls
// anyattn_fwd_kvcache on it (the whole cache): e4m3 or e5m2 with one descale of 1/256, or i8
// with token scales of 1/127 per (key, kv head), the bytes spread over the finite codes as
// anyattn_bench's decode rows have them. --page-size P (a divisor of S) calls anyattn_fwd_kvcache
// on the same bytes seen as (B S / P) pages of P keys behind a scattered block table, as
// anyattn_bench's paged decode rows do (bench/tensors.h, ScatteredBlockTable); a list P1,P2,...
// (0: the contiguous cache) times every library on each, so that one library may be given alone
// (configurations: each library with each page size, two to eight in all). --latent DV makes V
// the first DV columns of K (absorbed MLA's shared latent cache: one buffer, D up to 576 and DV
// up to 512) and calls anyattn_fwd_kvcache; an 8-bit latent cache gives V K's scales.
// With --backward each call is anyattn_bwd, on out and lse from one untimed forward of the
// first library (every build differentiates the same out), GFLOP/s counting 2.5 times the
// forward's FLOPs as anyattn_bench does.
// Defaults: S = 2048, Hq = Hk = 16, D = 128, f32, no mask, 1 thread, 10 rounds. Each library is
// opened with dlopen (RTLD_LOCAL), so the paths must differ: copy one build's libanyattn.so.0
// elsewhere before rebuilding. Every round calls each configuration once on the same inputs,
// starting with a different one each round; the report gives each configuration's minimum and
// median time and the median over rounds of its time divided by the first one's in the same
// round.
//
// Why: the development VM's speed drifts by 10-30% over seconds to minutes (other tenants), so
// two builds timed one after the other in separate processes differ by more than most changes
// do. Taken round by round, the ratio cancels the drift that is slower than a round; it still
// moves by a few percent between runs of the probe, so repeat it before trusting a difference
// of that size.
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "anyattn/anyattn.h"
#include "integer_list.h"
#include "tensors.h"
#include "timing.h"

namespace anyattn_bench {
namespace {

// The C entry points the probe calls, resolved from one opened library.
struct LibraryBuild {
  std::string path;
  void* handle = nullptr;
  decltype(&anyattn_fwd) fwd = nullptr;
  decltype(&anyattn_fwd_kvcache) fwd_kvcache = nullptr;
  decltype(&anyattn_kvcache_params_init) kvcache_params_init = nullptr;
  decltype(&anyattn_bwd) bwd = nullptr;
  decltype(&anyattn_fwd_params_init) params_init = nullptr;
  decltype(&anyattn_tensor_init_contiguous) tensor_init = nullptr;
  decltype(&anyattn_set_num_threads) set_num_threads = nullptr;
  decltype(&anyattn_last_error) last_error = nullptr;
};

template <typename Function>
bool Resolve(void* handle, const char* name, Function* function) {
  *function = reinterpret_cast<Function>(dlsym(handle, name));
  return *function != nullptr;
}

bool OpenBuild(const std::string& path, LibraryBuild* build) {
  build->path = path;
  build->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (build->handle == nullptr) {
    std::fprintf(stderr, "anyattn_ab_probe: cannot open %s: %s\n", path.c_str(), dlerror());
    return false;
  }
  void* h = build->handle;
  if (!Resolve(h, "anyattn_fwd", &build->fwd) || !Resolve(h, "anyattn_bwd", &build->bwd) ||
      !Resolve(h, "anyattn_fwd_params_init", &build->params_init) ||
      !Resolve(h, "anyattn_tensor_init_contiguous", &build->tensor_init) ||
      !Resolve(h, "anyattn_set_num_threads", &build->set_num_threads) ||
      !Resolve(h, "anyattn_last_error", &build->last_error) ||
      !Resolve(h, "anyattn_fwd_kvcache", &build->fwd_kvcache) ||
      !Resolve(h, "anyattn_kvcache_params_init", &build->kvcache_params_init)) {
    std::fprintf(stderr, "anyattn_ab_probe: %s lacks an anyattn entry point\n", path.c_str());
    return false;
  }
  return true;
}

struct AbOptions {
  std::vector<std::string> libraries;
  int64_t batch = 1;
  int64_t seqlen = 2048;  // keys
  int64_t seqlen_q = 0;   // queries; 0: seqlen
  int64_t heads_q = 16;
  int64_t heads_k = 16;
  int64_t head_dim = 128;
  DType dtype = DType::kF32;
  bool causal = false;
  bool backward = false;
  bool huge_pages = false;
  anyattn_dtype kv8 = ANYATTN_DTYPE_F32;  // F32: K and V in the dtype of q; else the 8-bit cache's
  int64_t latent_dv = 0;  // > 0: V is the first latent_dv columns of K
  std::vector<int64_t> page_sizes = {0};  // > 0: a paged cache of pages of that many keys
  int kv_copies = 1;
  int threads = 1;
  int rounds = 10;
};

bool ParseAbOptions(int argc, char** argv, AbOptions* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (name == "--causal") {
      options->causal = true;
      continue;
    }
    if (name == "--backward") {
      options->backward = true;
      continue;
    }
    if (name == "--huge-pages") {
      options->huge_pages = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "anyattn_ab_probe: %s needs a value\n", name.c_str());
      return false;
    }
    const char* value = argv[++i];
    if (name == "--lib") {
      options->libraries.push_back(value);
    } else if (name == "--batch") {
      options->batch = std::atoll(value);
    } else if (name == "--seqlen") {
      options->seqlen = std::atoll(value);
    } else if (name == "--seqlen-q") {
      options->seqlen_q = std::atoll(value);
    } else if (name == "--heads-q") {
      options->heads_q = std::atoll(value);
    } else if (name == "--heads-k") {
      options->heads_k = std::atoll(value);
    } else if (name == "--head-dim") {
      options->head_dim = std::atoll(value);
    } else if (name == "--dtype" &&
               (std::strcmp(value, "f32") == 0 || std::strcmp(value, "bf16") == 0 ||
                std::strcmp(value, "f16") == 0)) {
      options->dtype = std::strcmp(value, "f32") == 0    ? DType::kF32
                       : std::strcmp(value, "bf16") == 0 ? DType::kBf16
                                                         : DType::kF16;
    } else if (name == "--kv8" && (std::strcmp(value, "e4m3") == 0 ||
                                   std::strcmp(value, "e5m2") == 0 ||
                                   std::strcmp(value, "i8") == 0)) {
      options->kv8 = std::strcmp(value, "e4m3") == 0   ? ANYATTN_DTYPE_FP8_E4M3
                     : std::strcmp(value, "e5m2") == 0 ? ANYATTN_DTYPE_FP8_E5M2
                                                       : ANYATTN_DTYPE_I8;
    } else if (name == "--latent") {
      options->latent_dv = std::atoll(value);
    } else if (name == "--page-size") {
      if (!ParseIntegerList(value, &options->page_sizes)) {
        std::fprintf(stderr, "anyattn_ab_probe: --page-size wants integers like 0,16; got %s\n",
                     value);
        return false;
      }
    } else if (name == "--kv-copies") {
      options->kv_copies = std::atoi(value);
    } else if (name == "--threads") {
      options->threads = std::atoi(value);
    } else if (name == "--runs") {
      options->rounds = std::atoi(value);
    } else {
      std::fprintf(stderr, "anyattn_ab_probe: unknown option or value: %s %s\n", name.c_str(),
                   value);
      return false;
    }
  }
  const size_t count = options->libraries.size();
  const size_t configurations = count * options->page_sizes.size();
  if (count < 1 || count > 4 || configurations < 2 || configurations > 8) {
    std::fprintf(stderr,
                 "anyattn_ab_probe: give --lib one to four times, and two to eight libraries "
                 "times page sizes (got %zu and %zu)\n",
                 count, configurations);
    return false;
  }
  bool paged = false;
  for (int64_t page_size : options->page_sizes) {
    paged |= page_size != 0;
    if (page_size < 0 || (page_size > 0 && options->seqlen % page_size != 0)) {
      std::fprintf(stderr, "anyattn_ab_probe: --page-size %lld does not divide --seqlen %lld\n",
                   static_cast<long long>(page_size), static_cast<long long>(options->seqlen));
      return false;
    }
  }
  if (options->seqlen_q == 0) options->seqlen_q = options->seqlen;
  const int64_t max_head_dim =
      options->latent_dv > 0 ? ANYATTN_MAX_HEAD_DIM : ANYATTN_MAX_HEAD_DIM_V;
  const int64_t max_latent_dv = std::min<int64_t>(options->head_dim, ANYATTN_MAX_HEAD_DIM_V);
  if (options->batch < 1 || options->seqlen < 1 || options->seqlen_q < 1 || options->heads_q < 1 ||
      options->heads_k < 1 || options->heads_q % options->heads_k != 0 || options->head_dim < 1 ||
      options->head_dim > max_head_dim || options->latent_dv < 0 ||
      options->latent_dv > max_latent_dv ||
      options->kv_copies < 1 || options->threads < 1 || options->rounds < 1 ||
      ((options->kv8 != ANYATTN_DTYPE_F32 || options->latent_dv > 0 || paged) &&
       options->backward)) {
    std::fprintf(stderr,
                 "anyattn_ab_probe: need batch, seqlens, heads, kv-copies, threads, runs >= 1, "
                 "heads-q a multiple of heads-k, head-dim (D = Dv) in [1, 512] (with --latent DV: "
                 "D in [1, 576], DV in [1, min(D, 512)]) and no --kv8, --latent or --page-size "
                 "with --backward\n");
    return false;
  }
  return true;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int RunAb(const AbOptions& options) {
  std::vector<LibraryBuild> builds(options.libraries.size());
  for (size_t i = 0; i < builds.size(); ++i) {
    if (!OpenBuild(options.libraries[i], &builds[i])) return 1;
    for (size_t j = 0; j < i; ++j) {
      if (builds[j].handle == builds[i].handle) {
        std::fprintf(stderr, "anyattn_ab_probe: %s and %s are the same loaded library\n",
                     builds[j].path.c_str(), builds[i].path.c_str());
        return 2;
      }
    }
  }

  const anyattn_dtype dtype = AbiDType(options.dtype);
  const size_t element_bytes = DTypeBytes(options.dtype);
  const bool kv8 = options.kv8 != ANYATTN_DTYPE_F32;
  const bool latent = options.latent_dv > 0;
  const int64_t head_dim_v = latent ? options.latent_dv : options.head_dim;
  const size_t kv_element_bytes = kv8 ? 1 : element_bytes;
  const int64_t batch = options.batch;
  const int64_t seqlen_q = options.seqlen_q;
  const size_t q_elements = batch * seqlen_q * options.heads_q * options.head_dim;
  const size_t out_elements = batch * seqlen_q * options.heads_q * head_dim_v;
  const size_t kv_elements = batch * options.seqlen * options.heads_k * options.head_dim;
  AlignedBuffer q(q_elements * element_bytes);
  AlignedBuffer out(out_elements * element_bytes);
  const Pages kv_pages = options.huge_pages ? Pages::kHuge : Pages::kDefault;
  std::vector<AlignedBuffer> k_copies, v_copies;
  for (int c = 0; c < options.kv_copies; ++c) {
    k_copies.emplace_back(kv_elements * kv_element_bytes, kv_pages);
    v_copies.emplace_back((latent ? 0 : kv_elements) * kv_element_bytes, kv_pages);
  }
  const auto all_allocated = [](const std::vector<AlignedBuffer>& buffers) {
    return std::all_of(buffers.begin(), buffers.end(),
                       [](const AlignedBuffer& b) { return b.data() != nullptr; });
  };
  // Backward only: dout, lse (f32, B x Hq x S) and the gradients.
  const size_t lse_elements = batch * seqlen_q * options.heads_q;
  const size_t grad_q_elements = options.backward ? q_elements : 0;
  const size_t grad_kv_elements = options.backward ? kv_elements : 0;
  AlignedBuffer dout(grad_q_elements * element_bytes);
  AlignedBuffer lse((options.backward ? lse_elements : 0) * sizeof(float));
  AlignedBuffer dq(grad_q_elements * element_bytes);
  AlignedBuffer dk(grad_kv_elements * element_bytes);
  AlignedBuffer dv(grad_kv_elements * element_bytes);
  if (!q.data() || !out.data() || !all_allocated(k_copies) ||
      (!latent && !all_allocated(v_copies)) ||
      (options.backward &&
       (!dout.data() || !lse.data() || !dq.data() || !dk.data() || !dv.data()))) {
    std::fprintf(stderr, "anyattn_ab_probe: could not allocate the buffers\n");
    return 1;
  }
  FillUniform(q.data(), options.dtype, q_elements, 21);
  for (int c = 0; c < options.kv_copies; ++c) {
    if (kv8) {
      // Finite codes only: bit 3 clear excludes e4m3's NaN code S.1111.111 and e5m2's
      // infinities and NaNs S.11111.xx.
      auto* k_bytes = static_cast<uint8_t*>(k_copies[c].data());
      auto* v_bytes = static_cast<uint8_t*>(v_copies[c].data());
      for (size_t i = 0; i < kv_elements; ++i) {
        const uint8_t code = static_cast<uint8_t>((i * 37 + 11) % 251);
        k_bytes[i] = code & 0xF7;
        if (!latent) v_bytes[i] = (code ^ 0x5A) & 0xF7;
      }
    } else {
      FillUniform(k_copies[c].data(), options.dtype, kv_elements, 22);
      if (!latent) FillUniform(v_copies[c].data(), options.dtype, kv_elements, 23);
    }
  }
  // --kv8: a descale of 1/256 (e4m3, e5m2) or token scales of 1/127 (i8) for K and V.
  const float descale_value = 1.f / 256;
  const int64_t one[1] = {1};
  // K's token scales, then V's (two tensors that must not overlap).
  const size_t token_scale_count =
      options.kv8 == ANYATTN_DTYPE_I8 ? batch * options.seqlen * options.heads_k : 0;
  std::vector<float> token_scales(2 * token_scale_count, 1.f / 127);
  const int64_t q_shape[4] = {batch, seqlen_q, options.heads_q, options.head_dim};
  const int64_t out_shape[4] = {batch, seqlen_q, options.heads_q, head_dim_v};
  const int64_t kv_shape[4] = {batch, options.seqlen, options.heads_k, options.head_dim};
  // The cache as each page size sees it: (B, S, Hk, D), or (B S / P, P, Hk, D) pages behind a
  // scattered block table (B, S / P).
  struct CacheView {
    int64_t page_size = 0;
    std::vector<int32_t> block_table;
    int64_t shape[4] = {};
    int64_t block_table_shape[2] = {};
    int64_t token_scale_shape[3] = {};
  };
  std::vector<CacheView> views(options.page_sizes.size());
  for (size_t i = 0; i < views.size(); ++i) {
    CacheView& view = views[i];
    view.page_size = options.page_sizes[i];
    const bool paged = view.page_size > 0;
    const int64_t pages_per_sequence = paged ? options.seqlen / view.page_size : 0;
    const int64_t shape[4] = {paged ? batch * pages_per_sequence : batch,
                              paged ? view.page_size : options.seqlen, options.heads_k,
                              options.head_dim};
    std::copy(shape, shape + 4, view.shape);
    view.block_table = ScatteredBlockTable(batch * pages_per_sequence);
    view.block_table_shape[0] = batch;
    view.block_table_shape[1] = pages_per_sequence;
    view.token_scale_shape[0] = shape[0];
    view.token_scale_shape[1] = shape[1];
    view.token_scale_shape[2] = options.heads_k;
  }
  const int64_t lse_shape[3] = {batch, options.heads_q, seqlen_q};
  // The call's tensors and parameters as one build describes them, on K/V copy `copy` seen as
  // `view` (the gradient tensors only with --backward). Filled in place: `cache` points at the
  // scale and block table tensors beside it.
  struct Call {
    anyattn_tensor q, k, v, out, lse, dout, dq, dk, dv;
    anyattn_tensor descale, k_token_scale, v_token_scale, block_table;
    anyattn_fwd_params params;
    anyattn_kvcache_params cache;
  };
  auto describe = [&](const LibraryBuild& build, const CacheView& view, size_t copy,
                      Call* out_call) {
    Call& call = *out_call;
    build.tensor_init(&call.q, q.data(), dtype, 4, q_shape);
    const anyattn_dtype kv_dtype = kv8 ? options.kv8 : dtype;
    build.tensor_init(&call.k, k_copies[copy].data(), kv_dtype, 4, view.shape);
    if (latent) {  // K's buffer and strides, its first Dv columns
      call.v = call.k;
      call.v.shape[3] = head_dim_v;
    } else {
      build.tensor_init(&call.v, v_copies[copy].data(), kv_dtype, 4, view.shape);
    }
    build.kvcache_params_init(&call.cache);
    if (view.page_size > 0) {
      build.tensor_init(&call.block_table, const_cast<int32_t*>(view.block_table.data()),
                        ANYATTN_DTYPE_I32, 2, view.block_table_shape);
      call.cache.block_table = &call.block_table;
      call.cache.cache_seqlen = options.seqlen;
    }
    if (options.kv8 == ANYATTN_DTYPE_I8) {
      build.tensor_init(&call.k_token_scale, token_scales.data(), ANYATTN_DTYPE_F32, 3,
                        view.token_scale_shape);
      build.tensor_init(&call.v_token_scale, token_scales.data() + token_scale_count,
                        ANYATTN_DTYPE_F32, 3, view.token_scale_shape);
      call.cache.k_token_scale = &call.k_token_scale;
      call.cache.v_token_scale = latent ? &call.k_token_scale : &call.v_token_scale;
    } else if (kv8) {
      build.tensor_init(&call.descale, const_cast<float*>(&descale_value), ANYATTN_DTYPE_F32, 1,
                        one);
      call.cache.k_descale = &call.descale;
      call.cache.v_descale = &call.descale;
    }
    build.tensor_init(&call.out, out.data(), dtype, 4, out_shape);
    if (options.backward) {
      build.tensor_init(&call.lse, lse.data(), ANYATTN_DTYPE_F32, 3, lse_shape);
      build.tensor_init(&call.dout, dout.data(), dtype, 4, q_shape);
      build.tensor_init(&call.dq, dq.data(), dtype, 4, q_shape);
      build.tensor_init(&call.dk, dk.data(), dtype, 4, kv_shape);
      build.tensor_init(&call.dv, dv.data(), dtype, 4, kv_shape);
    }
    build.params_init(&call.params);
    call.params.causal = options.causal ? 1 : 0;
  };
  if (options.backward) {
    FillUniform(dout.data(), options.dtype, q_elements, 24);
    const LibraryBuild& first = builds[0];
    Call call;
    describe(first, views[0], 0, &call);
    if (first.fwd(&call.q, &call.k, &call.v, &call.out, &call.lse, &call.params) != ANYATTN_OK) {
      std::fprintf(stderr, "anyattn_ab_probe: %s: forward: %s\n", first.path.c_str(),
                   first.last_error());
      return 1;
    }
  }

  // Configuration i: library i / views.size() on view i % views.size().
  const size_t count = builds.size() * views.size();
  std::vector<std::vector<double>> seconds(count);
  size_t calls = 0;
  for (int round = -1; round < options.rounds; ++round) {  // round -1: warm-up
    for (size_t turn = 0; turn < count; ++turn) {
      const size_t index = (turn + static_cast<size_t>(round + 1)) % count;
      const LibraryBuild& build = builds[index / views.size()];
      const CacheView& view = views[index % views.size()];
      Call call;
      describe(build, view, calls++ % k_copies.size(), &call);
      build.set_num_threads(options.threads);
      const double start = NowSeconds();
      const anyattn_status status =
          options.backward ? build.bwd(&call.dout, &call.q, &call.k, &call.v, &call.out, &call.lse,
                                       &call.dq, &call.dk, &call.dv, nullptr, &call.params)
          : kv8 || latent || view.page_size > 0
              ? build.fwd_kvcache(&call.q, &call.k, &call.v, &call.out, nullptr, &call.cache,
                                  &call.params)
                   : build.fwd(&call.q, &call.k, &call.v, &call.out, nullptr, &call.params);
      const double elapsed = NowSeconds() - start;
      if (status != ANYATTN_OK) {
        std::fprintf(stderr, "anyattn_ab_probe: %s: %s\n", build.path.c_str(), build.last_error());
        return 1;
      }
      if (round >= 0) seconds[index].push_back(elapsed);
    }
  }

  // Visible query-key pairs per (batch, head): causal is bottom-right aligned, so query i sees
  // keys up to Sk - Sq + i.
  double pairs = 0.0;
  for (int64_t i = 0; i < seqlen_q; ++i) {
    pairs += options.causal
                 ? std::clamp<int64_t>(options.seqlen - seqlen_q + i + 1, 0, options.seqlen)
                 : options.seqlen;
  }
  const double flops = (options.backward ? 2.5 : 1.0) * 2.0 * batch * options.heads_q *
                       (options.head_dim + head_dim_v) * pairs;
  // A latent cache's V is read from K's rows: its bytes once, and its token scales once.
  const double kv_bytes = (latent ? 1.0 : 2.0) * kv_elements * kv_element_bytes +
                          (latent ? 0.5 : 1.0) * token_scales.size() * sizeof(float);
  std::printf(
      "%sB%lld Sq%lld Sk%lld Hq%lld/Hk%lld D%lld%s%s %s%s%s %s, %d thread(s), %d rounds, %d K/V "
      "cop%s\n",
      options.backward ? "backward " : "", static_cast<long long>(batch),
      static_cast<long long>(seqlen_q), static_cast<long long>(options.seqlen),
      static_cast<long long>(options.heads_q), static_cast<long long>(options.heads_k),
      static_cast<long long>(options.head_dim),
      latent ? "/" : "", latent ? std::to_string(head_dim_v).c_str() : "",
      latent ? "latent " : "", DTypeName(options.dtype),
      options.kv8 == ANYATTN_DTYPE_I8          ? " (i8 cache)"
      : options.kv8 == ANYATTN_DTYPE_FP8_E5M2 ? " (e5m2 cache)"
      : kv8                                   ? " (e4m3 cache)"
                                              : "",
      options.causal ? "causal" : "no mask", options.threads, options.rounds, options.kv_copies,
      options.kv_copies == 1 ? "y" : "ies");
  for (size_t i = 0; i < count; ++i) {
    std::vector<double> ratios;
    for (size_t r = 0; r < seconds[i].size(); ++r) ratios.push_back(seconds[i][r] / seconds[0][r]);
    const double minimum = *std::min_element(seconds[i].begin(), seconds[i].end());
    const int64_t page_size = views[i % views.size()].page_size;
    std::string label = builds[i / views.size()].path;
    if (views.size() > 1 || page_size > 0) {
      label += page_size > 0 ? ", pages of " + std::to_string(page_size) : ", contiguous";
    }
    std::printf(
        "  %c %-40s min %9.3f ms (%6.1f GFLOP/s, K/V %5.1f GB/s)  median %9.3f ms  "
        "time / A %.3f\n",
        static_cast<char>('A' + i), label.c_str(), minimum * 1e3, flops / minimum * 1e-9,
        kv_bytes / minimum * 1e-9, Median(seconds[i]) * 1e3, Median(ratios));
  }
  return 0;
}

}  // namespace
}  // namespace anyattn_bench

int main(int argc, char** argv) {
  anyattn_bench::AbOptions options;
  if (!anyattn_bench::ParseAbOptions(argc, argv, &options)) return 2;
  return anyattn_bench::RunAb(options);
}
