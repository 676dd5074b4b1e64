// anyattn from C++: grouped-query attention with a sliding window and the log-sum-exp output.
#include <anyattn/anyattn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int64_t sq = 3, sk = 5, hq = 2, hk = 1, d = 8;  // B = 1; both query heads read kv head 0.
  std::vector<float> q(sq * hq * d), k(sk * hk * d), v(sk * hk * d), out(q.size()), lse(hq * sq);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * i);
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.21f * i);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * i;
  anyattn::FwdOptions opt;
  opt.window_size = {1, 0};  // Query i sees keys i + sk - sq - 1 and i + sk - sq.
  try {
    anyattn::fwd({q.data(), {1, sq, hq, d}}, {k.data(), {1, sk, hk, d}}, {v.data(), {1, sk, hk, d}},
                 {out.data(), {1, sq, hq, d}}, anyattn::TensorView(lse.data(), {1, hq, sq}), opt);
  } catch (const anyattn::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  double err = 0;
  for (int64_t h = 0; h < hq; ++h) {
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t j0 = i + sk - sq - 1;  // The first of the two visible keys.
      double w[2], z = 0;
      for (int t = 0; t < 2; ++t) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += q[(i * hq + h) * d + c] * k[(j0 + t) * d + c];
        w[t] = std::exp(s / std::sqrt(double(d)));
        z += w[t];
      }
      err = std::max(err, std::abs(std::log(z) - lse[h * sq + i]));
      for (int64_t c = 0; c < d; ++c) {
        const double o = (w[0] * v[j0 * d + c] + w[1] * v[(j0 + 1) * d + c]) / z;
        err = std::max(err, std::abs(o - out[(i * hq + h) * d + c]));
      }
    }
  }
  std::printf("cpp_basic: anyattn %s, max |out, lse - direct| = %.2e\n", anyattn::version_string(),
              err);
  return err < 1e-5 ? 0 : 1;
}
