// anyattn_amx_tile_probe: what one core's AMX tile unit delivers right now.
//
//   anyattn_amx_tile_probe [--iterations N]
//
// Times TDPBF16PS (one 16 x 16 x 32 bf16 product into a 16 x 16 f32 tile) two ways, best of five
// runs each: on tiles held in registers (four independent accumulators, no memory traffic: the
// unit's rate), and in the S = Q K^T passes of the avx512_amx forward and backward (score_tiles of
// src/cpu/amx/amx_tiles-inl.h, compiled here: 2 x 2 tile blocking, four tile loads per four products,
// the accumulators zeroed before and stored after each pass) for 1, 2, 4 and 8 chunks of 32 dims
// per pass, that is D = 32 .. 256.
//
// Why: on the shared development VM the unit's rate moved between about 7 and 16 ns per product
// within an hour (a neighbour on the core, presumably), which moves every bf16 timing of the
// avx512_amx path with it. Run this before and after an A/B comparison of tile-path builds.
//
// Where the CPU or the OS does not offer the tiles (anyattn_isa_supported, which also requests
// the tile state from Linux), it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "anyattn/anyattn.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#include "cpu/simd/isa_target.h"

// The library's own tile code (configuration, S pass), compiled here for the tiles as in
// fwd_avx512_amx.cc, so the S passes below are the kernel's.
ANYATTN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
namespace anyattn_probe {

#include "cpu/amx/amx_tiles-inl.h"

// Operands: K tiles (1 KiB each; key group 1 at 8 KiB), q rows (64 bytes per chunk, 512-byte rows
// as for D = 256), S rows of 64 floats. bf16 0x3f3f is about 0.75: no subnormals, no overflow.
alignas(64) char k_tiles[16 * 1024];
alignas(64) char q_rows[32 * 512];
alignas(64) float s_rows[32 * 64];

void configure() {
  configure_tiles();
  _tile_loadd(4, q_rows, 512);
  _tile_loadd(5, q_rows + 16 * 512, 512);
  _tile_loadd(6, k_tiles, 64);
  _tile_loadd(7, k_tiles + 1024, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

// Four products per iteration on register tiles.
void products_in_registers(int64_t iterations) {
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// One S pass per iteration (score_tiles: two 16-row groups x two 16-key groups, `chunks` chunks).
void score_passes(int64_t iterations, int64_t chunks) {
  const KeyTiles keys{k_tiles, 8 * 1024, kTileBytes, 64};
  for (int64_t i = 0; i < iterations; ++i) {
    score_tiles<2>(q_rows, 512, keys, 0, chunks, s_rows, 64 * 4);
  }
}

void release() {
  _tile_release();
}

}  // namespace anyattn_probe
ANYATTN_TARGET_END()

namespace {

// Best of five timed runs (after one untimed run), in ns per product.
template <class Run>
double best_ns_per_product(int64_t products, Run run) {
  run();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const std::chrono::duration<double, std::nano> elapsed =
        std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count() / static_cast<double>(products));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t iterations = 200000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iterations") == 0 && i + 1 < argc) {
      iterations = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--iterations N]\n", argv[0]);
      return 2;
    }
  }
  if (iterations < 1) {
    std::fprintf(stderr, "anyattn_amx_tile_probe: --iterations must be >= 1\n");
    return 2;
  }
  if (!anyattn_isa_supported(ANYATTN_ISA_AVX512_AMX)) {
    std::printf(
        "anyattn_amx_tile_probe: avx512_amx is not supported here (CPU or OS); nothing "
        "to measure\n");
    return 0;
  }
  std::memset(anyattn_probe::k_tiles, 0x3f, sizeof anyattn_probe::k_tiles);
  std::memset(anyattn_probe::q_rows, 0x3f, sizeof anyattn_probe::q_rows);
  anyattn_probe::configure();
  const double in_registers = best_ns_per_product(
      4 * iterations, [&] { anyattn_probe::products_in_registers(iterations); });
  std::printf("TDPBF16PS (16 x 16 x 32 bf16 into f32), one core, best of 5 runs\n");
  std::printf("  tiles in registers, 4 accumulators:       %6.2f ns per product (%.2f TFLOP/s)\n",
              in_registers, 2.0 * 16 * 16 * 32 / in_registers / 1e3);
  for (int64_t chunks : {1, 2, 4, 8}) {
    const int64_t passes = std::max<int64_t>(1, iterations / chunks);
    const double per_product = best_ns_per_product(
        4 * chunks * passes, [&] { anyattn_probe::score_passes(passes, chunks); });
    std::printf("  S passes, D = %3lld (%lld chunk(s) per pass): %6.2f ns per product\n",
                static_cast<long long>(32 * chunks), static_cast<long long>(chunks), per_product);
  }
  anyattn_probe::release();
  return 0;
}

#else

int main() {
  std::printf("anyattn_amx_tile_probe: AMX tiles exist on x86-64 only; nothing to measure\n");
  return 0;
}

#endif
