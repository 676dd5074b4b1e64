#include "common/test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "common/kv8_convert.h"
#include "reference/half_convert.h"

namespace anyattn {
namespace testing {
namespace {

bool is_8bit(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_FP8_E4M3 || dtype == ANYATTN_DTYPE_FP8_E5M2 ||
         dtype == ANYATTN_DTYPE_I8;
}

int64_t element_size(int32_t dtype) {
  return dtype == ANYATTN_DTYPE_F32 ? 4 : is_8bit(dtype) ? 1 : 2;
}

// A small deterministic generator (splitmix64), so that values do not depend on the standard
// library's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1).
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Standard normal (Box-Muller).
  double normal() {
    const double kTwoPi = 6.283185307179586;
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(kTwoPi * uniform());
  }

 private:
  uint64_t state_;
};

// Where a rank-n tensor lives inside its buffer, in elements.
struct Placement {
  int64_t offset = 0;
  int64_t strides[ANYATTN_MAX_NDIM] = {0, 0, 0, 0};
};

Placement contiguous(const int64_t* shape, int ndim) {
  Placement p;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    p.strides[d] = stride;
    stride *= shape[d];
  }
  return p;
}

// Padded strides: each dimension's stride is the next one's extent plus pads[d] elements.
Placement padded(const int64_t* shape, int ndim, const int64_t* pads, int64_t offset) {
  Placement p;
  p.offset = offset;
  p.strides[ndim - 1] = 1;
  for (int d = ndim - 2; d >= 0; --d) p.strides[d] = shape[d + 1] * p.strides[d + 1] + pads[d];
  return p;
}

// One past the last element a tensor of `shape` at `p` touches (its offset when it is empty).
int64_t end_of(const int64_t* shape, int ndim, const Placement& p) {
  int64_t last = p.offset;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return p.offset;
    last += std::max<int64_t>(0, (shape[d] - 1) * p.strides[d]);
  }
  return last + 1;
}

// Walks dimension `dim` backwards: negates its stride and moves the start to its last index.
Placement flipped(Placement p, const int64_t* shape, int dim) {
  if (shape[dim] > 0) p.offset += (shape[dim] - 1) * p.strides[dim];
  p.strides[dim] = -p.strides[dim];
  return p;
}

anyattn_tensor make_tensor(unsigned char* base, int32_t dtype, int ndim, const int64_t* shape,
                           const Placement& p) {
  anyattn_tensor t{};
  t.data = base + p.offset * element_size(dtype);
  t.dtype = dtype;
  t.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    t.shape[d] = shape[d];
    t.strides[d] = p.strides[d];
  }
  return t;
}

// Calls f(index) for every logical index of t, in row-major order.
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

int64_t byte_offset(const anyattn_tensor& t, const int64_t* index) {
  int64_t offset = 0;
  for (int d = 0; d < t.ndim; ++d) offset += index[d] * t.strides[d];
  return offset * element_size(t.dtype);
}

// Fills every element slot of `buffer` with `value` in `dtype`.
void fill_buffer(std::vector<unsigned char>* buffer, int32_t dtype, double value) {
  anyattn_tensor flat{};
  flat.data = buffer->data();
  flat.dtype = dtype;
  flat.ndim = 1;
  flat.shape[0] = static_cast<int64_t>(buffer->size()) / element_size(dtype);
  flat.strides[0] = 1;
  for (int64_t i = 0; i < flat.shape[0]; ++i) store(flat, &i, value);
}

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

std::string format_index(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coords(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    coords[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  std::ostringstream s;
  s << "(";
  for (size_t d = 0; d < coords.size(); ++d) s << (d ? "," : "") << coords[d];
  s << ")";
  return s.str();
}

double max_abs_finite(const std::vector<double>& values) {
  double m = 0.0;
  for (double x : values) {
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  }
  return m;
}

}  // namespace

const char* dtype_name(anyattn_dtype dtype) {
  switch (dtype) {
    case ANYATTN_DTYPE_F32:
      return "f32";
    case ANYATTN_DTYPE_F16:
      return "f16";
    case ANYATTN_DTYPE_BF16:
      return "bf16";
    default:
      return "i32";
  }
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kPacked:
      return "packed";
    case Layout::kTransposedBatch:
      return "transposed_batch";
    case Layout::kPaddedStrides:
      return "padded";
    case Layout::kBroadcast:
      return "broadcast";
    case Layout::kNegativeStrides:
      return "negative";
  }
  return "?";
}

std::string Case::describe() const {
  std::ostringstream s;
  s << "B=" << B << " Sq=" << Sq << " Sk=" << Sk << " Hq=" << Hq << " Hk=" << Hk << " D=" << D
    << " Dv=" << Dv << " " << dtype_name(dtype) << " causal=" << causal << " window=("
    << window_left << "," << window_right << ") softcap=" << softcap << " scale=" << softmax_scale
    << " alibi="
    << (alibi == Alibi::kNone      ? "none"
        : alibi == Alibi::kPerHead ? "(Hq)"
                                   : "(B,Hq)")
    << " sinks=" << sinks << " lse=" << with_lse << " layout=" << layout_name(layout)
    << " splits=" << num_splits << " isa=" << anyattn_isa_name(isa) << " seed=" << seed;
  if (precision != ANYATTN_PRECISION_DEFAULT) s << " precision=" << precision;
  return s.str();
}

void store(const anyattn_tensor& t, const int64_t* index, double value) {
  unsigned char* p = static_cast<unsigned char*>(t.data) + byte_offset(t, index);
  const float f = static_cast<float>(value);
  if (t.dtype == ANYATTN_DTYPE_F32) {
    std::memcpy(p, &f, 4);
  } else if (is_8bit(t.dtype)) {  // an 8-bit cache: the stored value (the shared quantizer's Q)
    *p = convert::f32_to_kv8(static_cast<convert::Kv8>(t.dtype), f);
  } else {
    const uint16_t h =
        t.dtype == ANYATTN_DTYPE_F16 ? reference::f32_to_f16(f) : reference::f32_to_bf16(f);
    std::memcpy(p, &h, 2);
  }
}

// ---- Problem ------------------------------------------------------------------------------------

Problem::Problem(const Case& c) : case_(c) {
  const int64_t q_shape[4] = {c.B, c.Sq, c.Hq, c.D};
  const int64_t k_shape[4] = {c.B, c.Sk, c.Hk, c.D};
  const int64_t v_shape[4] = {c.B, c.Sk, c.Hk, c.Dv};
  const int64_t o_shape[4] = {c.B, c.Sq, c.Hq, c.Dv};
  const int64_t l_shape[3] = {c.B, c.Hq, c.Sq};

  // Placements, and which buffer holds k and v (the q buffer for a packed qkv row).
  Placement qp = contiguous(q_shape, 4), kp = contiguous(k_shape, 4), vp = contiguous(v_shape, 4);
  Placement op = contiguous(o_shape, 4), lp = contiguous(l_shape, 3);
  bool kv_in_q_buffer = false;
  vp.offset = end_of(k_shape, 4, kp);
  switch (c.layout) {
    case Layout::kContiguous:
      break;
    case Layout::kPacked:
      if (c.Sq == c.Sk) {
        const int64_t row = c.Hq * c.D + c.Hk * c.D + c.Hk * c.Dv;  // One token of qkv.
        qp = {0, {c.Sq * row, row, c.D, 1}};
        kp = {c.Hq * c.D, {c.Sk * row, row, c.D, 1}};
        vp = {c.Hq * c.D + c.Hk * c.D, {c.Sk * row, row, c.Dv, 1}};
        kv_in_q_buffer = true;
      } else {
        const int64_t q_row = c.Hq * c.D + 1;  // q rows padded by one element.
        const int64_t kv_row = c.Hk * (c.D + c.Dv);
        qp = {0, {c.Sq * q_row, q_row, c.D, 1}};
        kp = {0, {c.Sk * kv_row, kv_row, c.D, 1}};
        vp = {c.Hk * c.D, {c.Sk * kv_row, kv_row, c.Dv, 1}};
      }
      break;
    case Layout::kTransposedBatch:
      qp = {0, {c.Hq * c.D, c.B * c.Hq * c.D, c.D, 1}};
      kp = {0, {c.Hk * c.D, c.B * c.Hk * c.D, c.D, 1}};
      vp = {c.B * c.Sk * c.Hk * c.D, {c.Hk * c.Dv, c.B * c.Hk * c.Dv, c.Dv, 1}};
      op = {0, {c.Hq * c.Dv, c.B * c.Hq * c.Dv, c.Dv, 1}};
      lp = {0, {c.Sq, c.B * c.Sq, 1}};
      break;
    case Layout::kPaddedStrides: {
      const int64_t pads[3] = {7, 5, 3};
      const int64_t lse_pads[2] = {1, 2};
      qp = padded(q_shape, 4, pads, 1);  // Also start one element in: misaligned data.
      kp = padded(k_shape, 4, pads, 0);
      vp = padded(v_shape, 4, pads, end_of(k_shape, 4, kp) + 3);
      op = padded(o_shape, 4, pads, 2);
      lp = padded(l_shape, 3, lse_pads, 1);
      break;
    }
    case Layout::kNegativeStrides:
      qp = flipped(qp, q_shape, 1);  // Query rows in reverse order.
      kp = flipped(kp, k_shape, 0);  // Batch entries of k in reverse order.
      vp = flipped(vp, v_shape, 2);  // Heads of v in reverse order.
      op = flipped(op, o_shape, 1);
      lp = flipped(lp, l_shape, 1);
      break;
    case Layout::kBroadcast:
      qp = {0, {c.Sq * c.D, c.D, 0, 1}};
      kp = {0, {0, c.Hk * c.D, c.D, 1}};
      vp = {c.Sk * c.Hk * c.D, {0, c.Hk * c.Dv, c.Dv, 1}};
      break;
  }

  // Buffers: inputs filled with NaN first, so that any read outside the views shows.
  const int64_t es = element_size(c.dtype);
  const int64_t q_end = end_of(q_shape, 4, qp);
  const int64_t kv_end = std::max(end_of(k_shape, 4, kp), end_of(v_shape, 4, vp));
  q_buffer.assign(static_cast<size_t>((kv_in_q_buffer ? std::max(q_end, kv_end) : q_end) + 1) * es,
                  0);
  kv_buffer.assign(static_cast<size_t>(kv_in_q_buffer ? 1 : kv_end + 1) * es, 0);
  out_buffer.assign(static_cast<size_t>(end_of(o_shape, 4, op) + 1) * es, 0);
  lse_buffer.assign(static_cast<size_t>(end_of(l_shape, 3, lp) + 1) * 4, 0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  fill_buffer(&q_buffer, c.dtype, nan);
  fill_buffer(&kv_buffer, c.dtype, nan);

  unsigned char* kv_base = kv_in_q_buffer ? q_buffer.data() : kv_buffer.data();
  q = make_tensor(q_buffer.data(), c.dtype, 4, q_shape, qp);
  k = make_tensor(kv_base, c.dtype, 4, k_shape, kp);
  v = make_tensor(kv_base, c.dtype, 4, v_shape, vp);
  out = make_tensor(out_buffer.data(), c.dtype, 4, o_shape, op);
  lse = make_tensor(lse_buffer.data(), ANYATTN_DTYPE_F32, 3, l_shape, lp);

  Rng rng(c.seed * 0x100000001b3ull + 17);
  for (const anyattn_tensor* t : {&q, &k, &v}) {
    for_each_index(*t, [&](const int64_t* index) { store(*t, index, rng.normal()); });
  }

  anyattn_fwd_params_init(&params);
  params.softmax_scale = c.softmax_scale;
  params.softcap = c.softcap;
  params.causal = c.causal ? 1 : 0;
  params.window_left = c.window_left;
  params.window_right = c.window_right;
  params.num_splits = c.num_splits;
  params.isa = c.isa;
  params.precision = c.precision;

  if (c.alibi != Alibi::kNone) {
    // Geometric slopes 2^(-8 (h + 1) / Hq) as in the ALiBi paper; per batch entry, scaled.
    // (B, Hq) slopes use a padded row stride of Hq + 1.
    const bool per_batch = c.alibi == Alibi::kPerBatchHead;
    const int64_t rows = per_batch ? c.B : 1;
    alibi_buffer.assign(static_cast<size_t>(rows * (c.Hq + 1) + 1), -1.0f);
    for (int64_t b = 0; b < rows; ++b) {
      for (int64_t h = 0; h < c.Hq; ++h) {
        alibi_buffer[b * (c.Hq + 1) + h] =
            std::exp2(-8.0f * (h + 1) / c.Hq) * (1.0f + 0.5f * static_cast<float>(b));
      }
    }
    alibi_slopes.data = alibi_buffer.data();
    alibi_slopes.dtype = ANYATTN_DTYPE_F32;
    alibi_slopes.ndim = per_batch ? 2 : 1;
    alibi_slopes.shape[0] = per_batch ? c.B : c.Hq;
    alibi_slopes.shape[1] = c.Hq;
    alibi_slopes.strides[0] = per_batch ? c.Hq + 1 : 1;
    alibi_slopes.strides[1] = 1;
    params.alibi_slopes = &alibi_slopes;
  }
  if (c.sinks) {
    sinks_buffer.resize(static_cast<size_t>(c.Hq) + 1);
    for (float& s : sinks_buffer) s = static_cast<float>(2.0 * rng.normal());
    sinks.data = sinks_buffer.data();
    sinks.dtype = ANYATTN_DTYPE_F32;
    sinks.ndim = 1;
    sinks.shape[0] = c.Hq;
    sinks.strides[0] = 1;
    params.sinks = &sinks;
  }

  // Output sentinel: -768 is exact in every dtype and far from any attention output.
  fill_buffer(&out_buffer, c.dtype, -768.0);
  fill_buffer(&lse_buffer, ANYATTN_DTYPE_F32, -768.0);
  out_sentinel_ = out_buffer;
  lse_sentinel_ = lse_buffer;
}

anyattn_status Problem::run() const {
  return anyattn_fwd(&q, &k, &v, &out, case_.with_lse ? &lse : nullptr, &params);
}

void Problem::reset_outputs() {
  out_buffer = out_sentinel_;
  lse_buffer = lse_sentinel_;
}

std::vector<double> Problem::out_values() const {
  return reference::to_contiguous_f64(out);
}

std::vector<double> Problem::lse_values() const {
  if (!case_.with_lse) return {};
  return reference::to_contiguous_f64(lse);
}

std::vector<unsigned char> Problem::output_bytes() const {
  std::vector<unsigned char> bytes = out_buffer;
  bytes.insert(bytes.end(), lse_buffer.begin(), lse_buffer.end());
  return bytes;
}

std::string Problem::padding_damage() const {
  // Put the sentinel back into every logical element; what remains must be all sentinel.
  std::vector<unsigned char> out_copy = out_buffer, lse_copy = lse_buffer;
  const int64_t out_es = element_size(out.dtype);
  const int64_t out_start = static_cast<const unsigned char*>(out.data) - out_buffer.data();
  const int64_t lse_start = static_cast<const unsigned char*>(lse.data) - lse_buffer.data();
  for_each_index(out, [&](const int64_t* index) {
    const int64_t at = out_start + byte_offset(out, index);
    std::memcpy(&out_copy[at], &out_sentinel_[at], out_es);
  });
  for_each_index(lse, [&](const int64_t* index) {
    const int64_t at = lse_start + byte_offset(lse, index);
    std::memcpy(&lse_copy[at], &lse_sentinel_[at], 4);
  });
  auto first_change = [](const std::vector<unsigned char>& got,
                         const std::vector<unsigned char>& sentinel, const anyattn_tensor& view,
                         const unsigned char* base, const char* name) {
    const int64_t es = element_size(view.dtype);
    int64_t changed = 0, first = -1;
    for (size_t i = 0; i < got.size(); i += es) {
      if (std::memcmp(&got[i], &sentinel[i], es) != 0) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++changed;
      }
    }
    if (first < 0) return std::string();
    const int64_t view_start = static_cast<const unsigned char*>(view.data) - base;
    std::ostringstream s;
    s << changed << " element(s) of the " << name
      << " buffer outside its view were written; first at"
      << " element " << (first - view_start) / es << " relative to " << name << ".data (strides "
      << view.strides[0] << "," << view.strides[1] << "," << view.strides[2] << ")";
    return s.str();
  };
  std::string damage = first_change(out_copy, out_sentinel_, out, out_buffer.data(), "out");
  if (damage.empty()) damage = first_change(lse_copy, lse_sentinel_, lse, lse_buffer.data(), "lse");
  return damage;
}

bool Problem::outputs_untouched() const {
  return out_buffer == out_sentinel_ && lse_buffer == lse_sentinel_;
}

reference::DenseOutputs Problem::reference() const {
  return reference::fwd_dense(q, k, v, &params);
}

// The computation a framework would run in the input dtype (flash-attn's attention_ref with
// upcast=False): scores = q k^T accumulated in f32 and rounded to the dtype; scale and softcap
// each rounded to the dtype; the f32 ALiBi bias added in f32 (torch promotes dtype + f32 to f32);
// softmax in f32 (with the sink in the denominator), its probabilities rounded to the dtype; P V
// accumulated in f32 and rounded to the dtype. For f32 every rounding is the identity. lse stays
// f32.
reference::DenseOutputs Problem::naive_same_dtype() const {
  const Case& c = case_;
  const anyattn_dtype dt = c.dtype;
  const std::vector<double> qv = reference::to_contiguous_f64(q);  // (B, Sq, Hq, D)
  const std::vector<double> kv = reference::to_contiguous_f64(k);  // (B, Sk, Hk, D)
  const std::vector<double> vv = reference::to_contiguous_f64(v);  // (B, Sk, Hk, Dv)
  const reference::ScoreOptions options = reference::resolve_options(&params, c.D);
  const float scale =
      c.softmax_scale != 0.0f ? c.softmax_scale : 1.0f / std::sqrt(static_cast<float>(c.D));
  const float minus_inf = -std::numeric_limits<float>::infinity();

  reference::DenseOutputs result;
  result.out.assign(static_cast<size_t>(c.B * c.Sq * c.Hq * c.Dv), 0.0);
  result.lse.assign(static_cast<size_t>(c.B * c.Hq * c.Sq), 0.0);
  std::vector<float> s(static_cast<size_t>(c.Sk)), p(static_cast<size_t>(c.Sk));
  std::vector<char> visible(static_cast<size_t>(c.Sk));
  std::vector<float> acc(static_cast<size_t>(c.Dv));
  for (int64_t b = 0; b < c.B; ++b) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / (c.Hq / c.Hk);
      const float slope =
          c.alibi == Alibi::kNone
              ? 0.0f
              : alibi_buffer[(c.alibi == Alibi::kPerBatchHead ? b * (c.Hq + 1) : 0) + h];
      const float sink = c.sinks ? sinks_buffer[h] : minus_inf;
      for (int64_t i = 0; i < c.Sq; ++i) {
        const double* qi = &qv[((b * c.Sq + i) * c.Hq + h) * c.D];
        float row_max = sink;
        bool any = false;
        for (int64_t j = 0; j < c.Sk; ++j) {
          visible[j] = reference::key_visible(i, j, c.Sq, c.Sk, options);
          if (!visible[j]) continue;
          any = true;
          const double* kj = &kv[((b * c.Sk + j) * c.Hk + hk) * c.D];
          float dot = 0.0f;
          for (int64_t d = 0; d < c.D; ++d)
            dot += static_cast<float>(qi[d]) * static_cast<float>(kj[d]);
          float x = round_to(dt, round_to(dt, dot) * scale);
          if (c.softcap > 0.0f) x = round_to(dt, c.softcap * std::tanh(x / c.softcap));
          if (c.alibi != Alibi::kNone) {
            x -= slope * std::fabs(static_cast<float>(i + c.Sk - c.Sq - j));  // f32: see above.
          }
          s[j] = x;
          if (x > row_max) row_max = x;
        }
        double* out_i = &result.out[((b * c.Sq + i) * c.Hq + h) * c.Dv];
        double* lse_i = &result.lse[(b * c.Hq + h) * c.Sq + i];
        if (!any) {
          *lse_i = sink;
          continue;  // out stays 0.
        }
        float sum = c.sinks ? std::exp(sink - row_max) : 0.0f;
        for (int64_t j = 0; j < c.Sk; ++j) {
          if (visible[j]) sum += (p[j] = std::exp(s[j] - row_max));
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < c.Sk; ++j) {
          if (!visible[j]) continue;
          const float pj = round_to(dt, p[j] / sum);
          const double* vj = &vv[((b * c.Sk + j) * c.Hk + hk) * c.Dv];
          for (int64_t d = 0; d < c.Dv; ++d) acc[d] += pj * static_cast<float>(vj[d]);
        }
        for (int64_t d = 0; d < c.Dv; ++d) out_i[d] = round_to(dt, acc[d]);
        *lse_i = row_max + std::log(sum);
      }
    }
  }
  return result;
}

// ---- Acceptance ---------------------------------------------------------------------------------

// eps of the 2x rule, in two parts; the larger applies.
//  - One ulp of the output dtype (2^-10 for f16, 2^-7 for bf16) at the largest output: the library
//    rounds out to its dtype once, at a different point than the naive computation.
//  - Eight f32 ulps (8 * 2^-23) at the largest output: every dtype is computed in f32, and two f32
//    computations of equal quality but different order (blocked dot products, online-softmax
//    rescaling, a polynomial exp2 of < 2 ulp) differ by rounding noise whose maximum over a tensor
//    is a few f32 ulps. Measured on the f32 sweep: max|out - ref| / max|naive - ref| has median
//    0.97 and p99 1.94, so without this term the 2x rule fails on noise alone. Any semantic error
//    (a wrong key, scale or mask) is orders of magnitude above 8 ulps.
double out_eps(anyattn_dtype dtype, double max_abs_ref) {
  const double dtype_ulp = dtype == ANYATTN_DTYPE_F32   ? 0x1.0p-23
                           : dtype == ANYATTN_DTYPE_F16 ? 0x1.0p-10
                                                        : 0x1.0p-7;
  return std::max(dtype_ulp, 8.0 * 0x1.0p-23) * max_abs_ref;
}

double lse_eps(double max_abs_ref) {
  return 4.0 * 0x1.0p-23 * std::max(1.0, max_abs_ref);
}

::testing::AssertionResult within_two_x_naive(const char* what, const std::vector<double>& got,
                                              const std::vector<double>& ref,
                                              const std::vector<double>& naive, double eps,
                                              const std::vector<int64_t>& shape) {
  if (got.size() != ref.size() || naive.size() != ref.size()) {
    return ::testing::AssertionFailure() << what << ": size mismatch";
  }
  double max_err = 0.0, max_naive = 0.0;
  int64_t worst = -1, nonfinite_mismatch = -1, worst_naive = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) {
      const bool same = got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));
      if (!same && nonfinite_mismatch < 0) nonfinite_mismatch = static_cast<int64_t>(i);
      continue;
    }
    const double err = std::isfinite(got[i]) ? std::fabs(got[i] - ref[i])
                                             : std::numeric_limits<double>::infinity();
    if (worst < 0 || err > max_err) {
      max_err = err;
      worst = static_cast<int64_t>(i);
    }
    if (std::isfinite(naive[i]) && std::fabs(naive[i] - ref[i]) > max_naive) {
      max_naive = std::fabs(naive[i] - ref[i]);
      worst_naive = static_cast<int64_t>(i);
    }
  }
  const double tolerance = 2.0 * max_naive + eps;
  auto describe_at = [&](int64_t i) {
    std::ostringstream s;
    s << format_index(i, shape) << " got=" << got[i] << " ref=" << ref[i] << " naive=" << naive[i];
    return s.str();
  };
  if (nonfinite_mismatch >= 0) {
    return ::testing::AssertionFailure()
           << what << ": non-finite reference not matched at " << describe_at(nonfinite_mismatch);
  }
  if (worst >= 0 && !(max_err <= tolerance)) {
    ::testing::AssertionResult r = ::testing::AssertionFailure();
    r << what << ": max|got-ref|=" << max_err << " > 2*max|naive-ref|+eps=" << tolerance
      << " (max|naive-ref|=" << max_naive << ", eps=" << eps << "); worst at "
      << describe_at(worst);
    if (worst_naive >= 0) r << "; naive worst at " << describe_at(worst_naive);
    return r;
  }
  return ::testing::AssertionSuccess();
}

double naive_error_ceiling(anyattn_dtype dtype, double max_abs_ref) {
  const double relative = dtype == ANYATTN_DTYPE_F32   ? 1e-4
                          : dtype == ANYATTN_DTYPE_F16 ? 2e-2
                                                       : 1.5e-1;
  return relative * std::max(1.0, max_abs_ref);
}

// The naive result must itself be close to the reference, or the 2x rule would silently loosen:
// a disagreement beyond the dtype's plausible rounding error means the oracle or the naive
// computation is wrong, not the library.
::testing::AssertionResult naive_is_plausible(const char* what, const std::vector<double>& naive,
                                              const std::vector<double>& ref, anyattn_dtype dtype) {
  double max_naive = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isfinite(ref[i])) max_naive = std::max(max_naive, std::fabs(naive[i] - ref[i]));
  }
  const double ceiling = naive_error_ceiling(dtype, max_abs_finite(ref));
  if (!(max_naive <= ceiling)) {
    return ::testing::AssertionFailure()
           << what << ": the naive same-dtype result differs from the f64 reference by "
           << max_naive << " > " << ceiling << "; the oracle or the naive computation is wrong";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult check_outputs(const Problem& p, const reference::DenseOutputs& ref,
                                         const reference::DenseOutputs& naive) {
  const Case& c = p.spec();
  ::testing::AssertionResult plausible = naive_is_plausible("out", naive.out, ref.out, c.dtype);
  if (plausible) plausible = naive_is_plausible("lse", naive.lse, ref.lse, c.dtype);
  if (!plausible) return plausible << "\n  case: " << c.describe();
  const std::vector<double> out = p.out_values();
  ::testing::AssertionResult r =
      within_two_x_naive("out", out, ref.out, naive.out, out_eps(c.dtype, max_abs_finite(ref.out)),
                         {c.B, c.Sq, c.Hq, c.Dv});
  if (r && c.with_lse) {
    r = within_two_x_naive("lse", p.lse_values(), ref.lse, naive.lse,
                           lse_eps(max_abs_finite(ref.lse)), {c.B, c.Hq, c.Sq});
  }
  if (r) {
    const std::string damage = p.padding_damage();
    if (!damage.empty()) r = ::testing::AssertionFailure() << damage;
  }
  if (!r) r << "\n  case: " << c.describe();
  return r;
}

::testing::AssertionResult run_and_check(const Case& c) {
  Problem p(c);
  const anyattn_status status = p.run();
  if (status != ANYATTN_OK) {
    return ::testing::AssertionFailure()
           << "anyattn_fwd returned " << anyattn_status_name(status) << ": " << anyattn_last_error()
           << "\n  case: " << c.describe();
  }
  return check_outputs(p, p.reference(), p.naive_same_dtype());
}

::testing::AssertionResult check_cross(const Problem& p, const std::vector<double>& out_a,
                                       const std::vector<double>& out_b,
                                       const std::vector<double>& lse_a,
                                       const std::vector<double>& lse_b,
                                       const reference::DenseOutputs& ref,
                                       const reference::DenseOutputs& naive) {
  // Treat b as the "reference" and a as "got": the two may differ by one acceptance bound.
  const Case& c = p.spec();
  auto shifted_naive = [](const std::vector<double>& naive, const std::vector<double>& ref,
                          const std::vector<double>& base) {
    std::vector<double> n(naive.size());
    for (size_t i = 0; i < n.size(); ++i) n[i] = base[i] + (naive[i] - ref[i]);
    return n;
  };
  ::testing::AssertionResult r =
      within_two_x_naive("out(cross-ISA)", out_a, out_b, shifted_naive(naive.out, ref.out, out_b),
                         out_eps(c.dtype, max_abs_finite(ref.out)), {c.B, c.Sq, c.Hq, c.Dv});
  if (r && c.with_lse) {
    r = within_two_x_naive("lse(cross-ISA)", lse_a, lse_b, shifted_naive(naive.lse, ref.lse, lse_b),
                           lse_eps(max_abs_finite(ref.lse)), {c.B, c.Hq, c.Sq});
  }
  if (!r) r << "\n  case: " << c.describe();
  return r;
}

void vary_decode_options(int64_t n, Case* c) {
  const Layout layouts[] = {Layout::kContiguous, Layout::kPaddedStrides, Layout::kNegativeStrides,
                            Layout::kBroadcast, Layout::kTransposedBatch};
  c->B = n % 3 == 0 ? 2 : 1;
  c->causal = n % 4 == 1;
  if (n % 5 == 3) {
    c->window_left = 40;
    c->window_right = n % 2 ? 0 : 5;
  }
  c->softcap = n % 6 == 2 ? 8.0f : 0.0f;
  c->alibi = n % 7 == 4 ? Alibi::kPerHead : n % 7 == 6 ? Alibi::kPerBatchHead : Alibi::kNone;
  c->sinks = n % 4 == 2;
  c->layout = layouts[n % 5];
  c->num_splits = n % 8 == 5 ? 3 : 0;
}

bool reduced_sweep() {
  const char* env = std::getenv("ANYATTN_TEST_SWEEP");
  return env != nullptr && std::strcmp(env, "reduced") == 0;
}

std::vector<anyattn_isa> all_isas() {
  std::vector<anyattn_isa> isas;
  for (int value = ANYATTN_ISA_PORTABLE;; ++value) {
    const anyattn_isa isa = static_cast<anyattn_isa>(value);
    if (std::strcmp(anyattn_isa_name(isa), "unknown") == 0) break;
    isas.push_back(isa);
  }
  return isas;
}

std::vector<anyattn_isa> supported_isas() {
  std::vector<anyattn_isa> isas;
  for (anyattn_isa isa : all_isas()) {
    if (anyattn_isa_supported(isa)) isas.push_back(isa);
  }
  return isas;
}

std::vector<Case> precision_sweep_cases(anyattn_precision precision) {
  struct Shape {
    int64_t Sq, Sk, Hq, Hk, D, Dv;
  };
  constexpr Shape kShapes[] = {
      {64, 64, 2, 1, 64, 64},    {130, 131, 4, 2, 128, 128}, {70, 257, 8, 2, 96, 48},
      {33, 77, 2, 2, 40, 16},    {40, 95, 2, 1, 32, 8},      {17, 200, 4, 1, 256, 200},
      {20, 129, 2, 1, 576, 512}, {96, 96, 1, 1, 16, 24},
      // Decode on the direct loop, 8 and 16 query rows per kv head.
      {1, 300, 16, 2, 128, 128}, {1, 200, 16, 1, 64, 64},  {2, 150, 8, 1, 576, 512},
  };
  std::vector<Case> cases;
  int n = 0;
  for (anyattn_isa isa : supported_isas()) {
    for (const Shape& shape : kShapes) {
      for (int options = 0; options < 5; ++options) {
        Case c;
        c.isa = isa;
        c.dtype = ANYATTN_DTYPE_BF16;
        c.precision = precision;
        c.Sq = shape.Sq;
        c.Sk = shape.Sk;
        c.Hq = shape.Hq;
        c.Hk = shape.Hk;
        c.D = shape.D;
        c.Dv = shape.Dv;
        c.B = options == 4 ? 2 : 1;
        c.causal = options == 1;
        if (options == 2) {
          c.window_left = 40;
          c.window_right = 3;
          c.alibi = Alibi::kPerHead;
        }
        if (options == 3) {
          c.softcap = 5.f;
          c.sinks = true;
          c.num_splits = 2;
        }
        c.layout = options == 4 ? Layout::kTransposedBatch : Layout::kContiguous;
        c.seed = static_cast<uint64_t>(++n);
        cases.push_back(c);
      }
    }
  }
  return cases;
}

Case precision_ignored_case(anyattn_isa isa, anyattn_dtype dtype) {
  Case c;
  c.isa = isa;
  c.dtype = dtype;
  c.Sq = 70;
  c.Sk = 150;
  c.Hq = 4;
  c.Hk = 2;
  c.D = c.Dv = 64;
  c.causal = true;
  c.precision = ANYATTN_PRECISION_ACCURATE;
  return c;
}

Case cancelling_probabilities_case(anyattn_isa isa, anyattn_precision precision) {
  Case c;
  c.isa = isa;
  c.precision = precision;
  c.dtype = ANYATTN_DTYPE_BF16;
  c.Sq = 64;
  c.Sk = 2;
  c.D = c.Dv = 32;
  return c;
}

void store_cancelling_probabilities(const Problem& p) {
  const Case& c = p.spec();
  for (int64_t i = 0; i < c.Sq; ++i) {
    for (int64_t d = 0; d < c.D; ++d) {
      const int64_t index[4] = {0, i, 0, d};
      store(p.q, index, d == 0 ? 1.0 : 0.0);
      if (i < c.Sk) {
        store(p.k, index, d == 0 && i == 1 ? 0x1.0p-5 : 0.0);
        store(p.v, index, d == 0 ? (i == 0 ? 1.0 : -1.0) : 0.0);
      }
    }
  }
}

}  // namespace testing
}  // namespace anyattn
