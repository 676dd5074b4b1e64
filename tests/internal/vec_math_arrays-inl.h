// One path's exp2, tanh, 1 - tanh^2, f16 narrowing and e4m3 read over arrays. Include inside a
// path's namespace (and its target region) after that path's simd/vec_*.h and
// simd/vec_math-inl.h (vec_math_paths.cc).

// y[i] = f(x[i]) for i < n, one vector at a time; a partial last vector is padded with 0.
inline void map_vectors(Vec (*f)(Vec), const float* x, int64_t n, float* y) {
  alignas(64) float lanes[Vec::kLanes];
  for (int64_t i = 0; i < n; i += Vec::kLanes) {
    const int64_t count = n - i < Vec::kLanes ? n - i : Vec::kLanes;
    for (int64_t k = 0; k < Vec::kLanes; ++k) lanes[k] = k < count ? x[i + k] : 0.f;
    f(Vec::load(lanes)).store(lanes);
    for (int64_t k = 0; k < count; ++k) y[i + k] = lanes[k];
  }
}

inline Vec sech2_of(Vec x) {
  Vec t, sech2;
  tanh_and_sech2(x, &t, &sech2);
  return sech2;
}

void exp2_array(const float* x, int64_t n, float* y) { map_vectors(exp2, x, n, y); }
void tanh_array(const float* x, int64_t n, float* y) { map_vectors(tanh, x, n, y); }
void sech2_array(const float* x, int64_t n, float* y) { map_vectors(sech2_of, x, n, y); }

void f16_array(const float* x, int64_t n, uint16_t* y) {
  alignas(64) float lanes[Vec::kLanes];
  uint16_t bits[Vec::kLanes];
  for (int64_t i = 0; i < n; i += Vec::kLanes) {
    const int64_t count = n - i < Vec::kLanes ? n - i : Vec::kLanes;
    for (int64_t k = 0; k < Vec::kLanes; ++k) lanes[k] = k < count ? x[i + k] : 0.f;
    Vec::load(lanes).store_f16(bits);
    for (int64_t k = 0; k < count; ++k) y[i + k] = bits[k];
  }
}

void e4m3_direct_array(const uint8_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += Vec::kLanes) Vec::load_fp8_e4m3_direct(x + i).store(y + i);
}
extern const int kE4m3DirectExponent = Vec::kE4m3DirectExponent;
