#include "backward/bwd_test_support.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/philox.h"
#include "reference/half_convert.h"

namespace anyattn {
namespace testing {
namespace {

int64_t element_size(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_F32 ? 4 : 2;
}

// splitmix64 normals, independent of the standard library's distributions.
class Normals {
 public:
  explicit Normals(uint64_t seed) : state_(seed) {}
  double next() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  double uniform() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (static_cast<double>(z >> 11) + 0.5) * 0x1.0p-53;
  }
  uint64_t state_;
};

float round_to(anyattn_dtype dtype, float x) {
  switch (dtype) {
    case ANYATTN_DTYPE_F16:
      return reference::round_to_f16(x);
    case ANYATTN_DTYPE_BF16:
      return reference::round_to_bf16(x);
    default:
      return x;
  }
}

// A rank-4 tensor of `shape` in `buffer`: contiguous, or with strides padded by (5, 3, 2)
// elements and a start offset of 1.
anyattn_tensor make_grad(std::vector<unsigned char>* buffer, anyattn_dtype dtype,
                         const int64_t* shape, bool padded) {
  const int64_t pads[3] = {5, 3, 2};
  anyattn_tensor t{};
  t.dtype = dtype;
  t.ndim = 4;
  int64_t stride = 1;
  for (int d = 3; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride = stride * shape[d] + (padded && d > 0 ? pads[d - 1] : 0);
  }
  const int64_t start = padded ? 1 : 0;
  const int64_t total = start + stride + (padded ? 4 : 0);
  buffer->assign(static_cast<size_t>(std::max<int64_t>(total, 1) * element_size(dtype)), 0xA5);
  t.data = buffer->data() + start * element_size(dtype);
  return t;
}

template <typename F>
void for_each_index(const anyattn_tensor& t, F f) {
  const int64_t n = reference::num_elements(t);
  int64_t index[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
  for (int64_t flat = 0; flat < n; ++flat) {
    int64_t rest = flat;
    for (int d = t.ndim - 1; d >= 0; --d) {
      index[d] = rest % t.shape[d];
      rest /= t.shape[d];
    }
    f(index);
  }
}

// "" when every byte of `now` outside the elements of `view` equals `before`.
std::string outside_view_damage(const char* name, const anyattn_tensor& view,
                                const std::vector<unsigned char>& before,
                                std::vector<unsigned char> now, const unsigned char* base) {
  const int64_t es = element_size(view.dtype);
  for_each_index(view, [&](const int64_t* index) {
    int64_t offset = 0;
    for (int d = 0; d < view.ndim; ++d) offset += index[d] * view.strides[d];
    const int64_t at = (static_cast<const unsigned char*>(view.data) - base) + offset * es;
    std::memcpy(&now[at], &before[at], es);
  });
  for (size_t i = 0; i < now.size(); ++i) {
    if (now[i] != before[i]) {
      std::ostringstream s;
      s << name << " buffer byte " << i << " outside the view was written";
      return s.str();
    }
  }
  return "";
}

double max_abs(const std::vector<double>& values) {
  double m = 0.0;
  for (double x : values) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

}  // namespace

std::string BwdCase::describe() const {
  std::ostringstream s;
  s << fwd.describe() << " dropout=" << dropout_p << " padded_grads=" << padded_grads
    << " own_forward=" << own_forward;
  return s.str();
}

BwdProblem::BwdProblem(const BwdCase& c) : fwd(c.fwd), case_(c) {
  const Case& f = c.fwd;
  const int64_t o_shape[4] = {f.B, f.Sq, f.Hq, f.Dv};
  const int64_t q_shape[4] = {f.B, f.Sq, f.Hq, f.D};
  const int64_t k_shape[4] = {f.B, f.Sk, f.Hk, f.D};
  const int64_t v_shape[4] = {f.B, f.Sk, f.Hk, f.Dv};
  dout = make_grad(&dout_buffer, f.dtype, o_shape, false);
  Normals normals(f.seed * 7919 + 3);
  for_each_index(dout, [&](const int64_t* index) { store(dout, index, normals.next()); });
  dq = make_grad(&dq_buffer, f.dtype, q_shape, c.padded_grads);
  dk = make_grad(&dk_buffer, f.dtype, k_shape, c.padded_grads);
  dv = make_grad(&dv_buffer, f.dtype, v_shape, c.padded_grads);
  dq_sentinel_ = dq_buffer;
  dk_sentinel_ = dk_buffer;
  dv_sentinel_ = dv_buffer;
  if (f.sinks) {
    dsinks_buffer.assign(static_cast<size_t>(f.Hq), -768.f);
    dsinks.data = dsinks_buffer.data();
    dsinks.dtype = ANYATTN_DTYPE_F32;
    dsinks.ndim = 1;
    dsinks.shape[0] = f.Hq;
    dsinks.strides[0] = 1;
  }
  fwd.params.dropout_p = c.dropout_p;
  fwd.params.dropout_seed = c.dropout_seed;
  fwd.params.dropout_offset = c.dropout_offset;
  fwd.params.bwd_own_forward = c.own_forward ? 1 : 0;
}

anyattn_status BwdProblem::prepare_forward() {
  if (case_.dropout_p == 0.f) return fwd.run();
  const reference::DenseGradients r = reference();
  const Case& f = case_.fwd;
  int64_t index[4];
  for (index[0] = 0; index[0] < f.B; ++index[0]) {
    for (index[1] = 0; index[1] < f.Sq; ++index[1]) {
      for (index[2] = 0; index[2] < f.Hq; ++index[2]) {
        for (index[3] = 0; index[3] < f.Dv; ++index[3]) {
          store(fwd.out, index,
                r.out[((index[0] * f.Sq + index[1]) * f.Hq + index[2]) * f.Dv + index[3]]);
        }
      }
    }
    for (index[1] = 0; index[1] < f.Hq; ++index[1]) {
      for (index[2] = 0; index[2] < f.Sq; ++index[2]) {
        store(fwd.lse, index, r.lse[(index[0] * f.Hq + index[1]) * f.Sq + index[2]]);
      }
    }
  }
  return ANYATTN_OK;
}

anyattn_status BwdProblem::run() const {
  return anyattn_bwd(&dout, &fwd.q, &fwd.k, &fwd.v, &fwd.out, &fwd.lse, &dq, &dk, &dv,
                     case_.fwd.sinks ? &dsinks : nullptr, &fwd.params);
}

Gradients BwdProblem::gradients() const {
  Gradients g;
  g.dq = reference::to_contiguous_f64(dq);
  g.dk = reference::to_contiguous_f64(dk);
  g.dv = reference::to_contiguous_f64(dv);
  g.dsinks.assign(dsinks_buffer.begin(), dsinks_buffer.end());
  return g;
}

std::vector<unsigned char> BwdProblem::gradient_bytes() const {
  std::vector<unsigned char> bytes = dq_buffer;
  bytes.insert(bytes.end(), dk_buffer.begin(), dk_buffer.end());
  bytes.insert(bytes.end(), dv_buffer.begin(), dv_buffer.end());
  const unsigned char* sinks = reinterpret_cast<const unsigned char*>(dsinks_buffer.data());
  bytes.insert(bytes.end(), sinks, sinks + dsinks_buffer.size() * sizeof(float));
  return bytes;
}

std::string BwdProblem::padding_damage() const {
  std::string damage = outside_view_damage("dq", dq, dq_sentinel_, dq_buffer, dq_buffer.data());
  if (damage.empty()) {
    damage = outside_view_damage("dk", dk, dk_sentinel_, dk_buffer, dk_buffer.data());
  }
  if (damage.empty()) {
    damage = outside_view_damage("dv", dv, dv_sentinel_, dv_buffer, dv_buffer.data());
  }
  return damage;
}

reference::DenseGradients BwdProblem::reference() const {
  return reference::bwd_dense(fwd.q, fwd.k, fwd.v, dout, &fwd.params);
}

// The backward a framework would run in the input dtype (autograd through the naive forward of
// test_support.cc): every matrix product accumulated in f32 and rounded to the dtype, P rounded
// to the dtype, the softmax backward dS = P (dP - rowsum(P dP)) in f32 then rounded, the softcap
// and scale factors each rounded, GQA gradients rounded per head and then summed.
Gradients BwdProblem::naive_same_dtype() const {
  const Case& c = case_.fwd;
  const anyattn_dtype dt = c.dtype;
  const std::vector<double> qv = reference::to_contiguous_f64(fwd.q);
  const std::vector<double> kv = reference::to_contiguous_f64(fwd.k);
  const std::vector<double> vv = reference::to_contiguous_f64(fwd.v);
  const std::vector<double> dov = reference::to_contiguous_f64(dout);
  const reference::ScoreOptions options = reference::resolve_options(&fwd.params, c.D);
  const float scale =
      c.softmax_scale != 0.0f ? c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.D));
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const cpu::PhiloxKey key = cpu::dropout_key(case_.dropout_seed, case_.dropout_offset);
  const uint32_t threshold = cpu::dropout_threshold(case_.dropout_p);
  const float keep_scale = 1.0f / (1.0f - case_.dropout_p);
  const int64_t group = c.Hq / c.Hk;

  Gradients g;
  g.dq.assign(static_cast<size_t>(c.B * c.Sq * c.Hq * c.D), 0.0);
  std::vector<float> dk_acc(static_cast<size_t>(c.B * c.Sk * c.Hk * c.D), 0.f);
  std::vector<float> dv_acc(static_cast<size_t>(c.B * c.Sk * c.Hk * c.Dv), 0.f);
  std::vector<double> dsinks(static_cast<size_t>(c.Hq), 0.0);
  const size_t tile = static_cast<size_t>(c.Sq * c.Sk);
  std::vector<float> t(tile), p(tile), z(tile), ds(tile);
  std::vector<char> visible(tile);
  std::vector<float> out_i(static_cast<size_t>(c.Dv)), lse(static_cast<size_t>(c.Sq));
  std::vector<float> head_dk(static_cast<size_t>(c.Sk * c.D)),
      head_dv(static_cast<size_t>(c.Sk * c.Dv));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / group;
      const float slope =
          c.alibi == Alibi::kNone
              ? 0.0f
              : fwd.alibi_buffer[(c.alibi == Alibi::kPerBatchHead ? b * (c.Hq + 1) : 0) + h];
      const float sink = c.sinks ? fwd.sinks_buffer[h] : minus_inf;
      auto q_at = [&](int64_t i, int64_t d) {
        return static_cast<float>(qv[((b * c.Sq + i) * c.Hq + h) * c.D + d]);
      };
      auto k_at = [&](int64_t j, int64_t d) {
        return static_cast<float>(kv[((b * c.Sk + j) * c.Hk + hk) * c.D + d]);
      };
      auto v_at = [&](int64_t j, int64_t d) {
        return static_cast<float>(vv[((b * c.Sk + j) * c.Hk + hk) * c.Dv + d]);
      };
      auto do_at = [&](int64_t i, int64_t d) {
        return static_cast<float>(dov[((b * c.Sq + i) * c.Hq + h) * c.Dv + d]);
      };
      std::fill(head_dk.begin(), head_dk.end(), 0.f);
      std::fill(head_dv.begin(), head_dv.end(), 0.f);
      for (int64_t i = 0; i < c.Sq; ++i) {
        // Forward of row i, as in the naive forward.
        float row_max = sink;
        bool any = false;
        std::vector<float> s(static_cast<size_t>(c.Sk));
        for (int64_t j = 0; j < c.Sk; ++j) {
          const size_t ij = static_cast<size_t>(i * c.Sk + j);
          visible[ij] = reference::key_visible(i, j, c.Sq, c.Sk, options);
          p[ij] = 0.f;
          ds[ij] = 0.f;
          if (!visible[ij]) continue;
          any = true;
          float dot = 0.f;
          for (int64_t d = 0; d < c.D; ++d) dot += q_at(i, d) * k_at(j, d);
          float x = round_to(dt, round_to(dt, dot) * scale);
          if (c.softcap > 0.f) {
            t[ij] = std::tanh(x / c.softcap);
            x = round_to(dt, c.softcap * t[ij]);
          }
          if (c.alibi != Alibi::kNone) {
            x = round_to(dt, x - slope * std::fabs(static_cast<float>(i + c.Sk - c.Sq - j)));
          }
          s[j] = x;
          row_max = std::max(row_max, x);
        }
        if (!any) {
          lse[i] = sink;
          continue;
        }
        float sum = c.sinks ? std::exp(sink - row_max) : 0.f;
        for (int64_t j = 0; j < c.Sk; ++j) {
          if (visible[i * c.Sk + j]) sum += std::exp(s[j] - row_max);
        }
        lse[i] = row_max + std::log(sum);
        std::fill(out_i.begin(), out_i.end(), 0.f);
        for (int64_t j = 0; j < c.Sk; ++j) {
          const size_t ij = static_cast<size_t>(i * c.Sk + j);
          if (!visible[ij]) continue;
          p[ij] = round_to(dt, std::exp(s[j] - row_max) / sum);
          z[ij] = case_.dropout_p > 0.f
                      ? (cpu::dropout_keep(key, b, h, i, j, threshold) ? keep_scale : 0.f)
                      : 1.f;
          const float kept = round_to(dt, p[ij] * z[ij]);
          for (int64_t d = 0; d < c.Dv; ++d) out_i[d] += kept * v_at(j, d);
        }
        for (float& o : out_i) o = round_to(dt, o);
        // Backward of row i.
        std::vector<float> dp(static_cast<size_t>(c.Sk), 0.f);
        float delta = 0.f;
        for (int64_t j = 0; j < c.Sk; ++j) {
          const size_t ij = static_cast<size_t>(i * c.Sk + j);
          if (!visible[ij]) continue;
          float dot = 0.f;
          for (int64_t d = 0; d < c.Dv; ++d) dot += do_at(i, d) * v_at(j, d);
          dp[j] = round_to(dt, round_to(dt, dot) * z[ij]);
          delta += p[ij] * dp[j];
        }
        for (int64_t j = 0; j < c.Sk; ++j) {
          const size_t ij = static_cast<size_t>(i * c.Sk + j);
          if (!visible[ij]) continue;
          float d_score = round_to(dt, p[ij] * (dp[j] - delta));
          if (c.softcap > 0.f) d_score = round_to(dt, d_score * (1.f - t[ij] * t[ij]));
          ds[ij] = round_to(dt, d_score * scale);
        }
        if (c.sinks) dsinks[h] -= std::exp(static_cast<double>(sink) - lse[i]) * delta;
      }
      // dq = dS K, dk = dS^T Q, dv = (P Z)^T dout, each accumulated in f32 and rounded.
      for (int64_t i = 0; i < c.Sq; ++i) {
        for (int64_t d = 0; d < c.D; ++d) {
          float acc = 0.f;
          for (int64_t j = 0; j < c.Sk; ++j) acc += ds[i * c.Sk + j] * k_at(j, d);
          g.dq[((b * c.Sq + i) * c.Hq + h) * c.D + d] = round_to(dt, acc);
        }
      }
      for (int64_t j = 0; j < c.Sk; ++j) {
        for (int64_t d = 0; d < c.D; ++d) {
          float acc = 0.f;
          for (int64_t i = 0; i < c.Sq; ++i) acc += ds[i * c.Sk + j] * q_at(i, d);
          dk_acc[((b * c.Sk + j) * c.Hk + hk) * c.D + d] += round_to(dt, acc);
        }
        for (int64_t d = 0; d < c.Dv; ++d) {
          float acc = 0.f;
          for (int64_t i = 0; i < c.Sq; ++i) {
            const size_t ij = static_cast<size_t>(i * c.Sk + j);
            if (visible[ij]) acc += round_to(dt, p[ij] * z[ij]) * do_at(i, d);
          }
          dv_acc[((b * c.Sk + j) * c.Hk + hk) * c.Dv + d] += round_to(dt, acc);
        }
      }
    }
  }
  g.dk.assign(dk_acc.begin(), dk_acc.end());
  g.dv.assign(dv_acc.begin(), dv_acc.end());
  for (double& x : g.dk) x = round_to(dt, static_cast<float>(x));
  for (double& x : g.dv) x = round_to(dt, static_cast<float>(x));
  if (c.sinks) g.dsinks = dsinks;
  return g;
}

::testing::AssertionResult check_gradients(const BwdProblem& p,
                                           const reference::DenseGradients& ref,
                                           const Gradients& naive) {
  const Case& c = p.spec().fwd;
  const Gradients got = p.gradients();
  ::testing::AssertionResult r = within_two_x_naive(
      "dq", got.dq, ref.dq, naive.dq, out_eps(c.dtype, max_abs(ref.dq)), {c.B, c.Sq, c.Hq, c.D});
  if (r) {
    r = within_two_x_naive("dk", got.dk, ref.dk, naive.dk, out_eps(c.dtype, max_abs(ref.dk)),
                           {c.B, c.Sk, c.Hk, c.D});
  }
  if (r) {
    r = within_two_x_naive("dv", got.dv, ref.dv, naive.dv, out_eps(c.dtype, max_abs(ref.dv)),
                           {c.B, c.Sk, c.Hk, c.Dv});
  }
  if (r && c.sinks) {
    // dsinks is f32 whatever the dtype: a sum of B * Sq terms of f32 quantities.
    r = within_two_x_naive("dsinks", got.dsinks, ref.dsinks, naive.dsinks,
                           out_eps(ANYATTN_DTYPE_F32, std::max(1.0, max_abs(ref.dsinks))), {c.Hq});
  }
  if (r) {
    const std::string damage = p.padding_damage();
    if (!damage.empty()) r = ::testing::AssertionFailure() << damage;
  }
  if (!r) r << "\n  case: " << p.spec().describe();
  return r;
}

BwdCase cancelling_score_gradients_case(anyattn_isa isa, anyattn_precision precision) {
  BwdCase c;
  c.fwd.isa = isa;
  c.fwd.precision = precision;
  c.fwd.dtype = ANYATTN_DTYPE_BF16;
  c.fwd.Sq = c.fwd.Sk = 3;
  c.fwd.D = c.fwd.Dv = 32;
  return c;
}

void store_cancelling_score_gradients(const BwdProblem& p) {
  const Case& c = p.spec().fwd;
  for (int64_t r = 0; r < c.Sq; ++r) {
    for (int64_t d = 0; d < c.D; ++d) {
      const int64_t index[4] = {0, r, 0, d};
      store(p.fwd.q, index, d == 0 ? 1.0 : 0.0);
      store(p.fwd.k, index, d == 0 ? 1.0 : 0.0);
      store(p.fwd.v, index, d == r ? 1.0 : 0.0);
      store(p.dout, index, d == r ? 1.0 : 0.0);
    }
  }
}

::testing::AssertionResult run_and_check_bwd(const BwdCase& c) {
  BwdProblem p(c);
  anyattn_status status = p.prepare_forward();
  if (status == ANYATTN_OK) status = p.run();
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure() << anyattn_status_name(status) << ": "
                                         << anyattn_last_error() << "\n  case: " << c.describe();
  }
  return check_gradients(p, p.reference(), p.naive_same_dtype());
}

}  // namespace testing
}  // namespace anyattn
