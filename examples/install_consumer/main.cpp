// Consumer of the installed anyattn package. With all keys equal every score ties, so each output
// row is the mean of the value rows: a check that needs no reference implementation.
#include <anyattn/anyattn.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int64_t sq = 3, sk = 4, h = 2, d = 5;
  std::vector<float> q(sq * h * d), k(sk * h * d, 0.5f), v(sk * h * d), out(sq * h * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = 0.1f * static_cast<float>(i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7);
  anyattn::fwd(
      anyattn::TensorView(q.data(), {1, sq, h, d}), anyattn::TensorView(k.data(), {1, sk, h, d}),
      anyattn::TensorView(v.data(), {1, sk, h, d}), anyattn::TensorView(out.data(), {1, sq, h, d}));
  double err = 0;
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t c = 0; c < h * d; ++c) {
      double mean = 0;
      for (int64_t j = 0; j < sk; ++j) mean += v[j * h * d + c] / static_cast<double>(sk);
      err = std::fmax(err, std::fabs(mean - out[i * h * d + c]));
    }
  }
  std::printf("install consumer: anyattn %s (header %d), max error %.2e\n",
              anyattn::version_string(), ANYATTN_VERSION, err);
  return err < 1e-5 && anyattn::version() == ANYATTN_VERSION ? 0 : 1;
}
