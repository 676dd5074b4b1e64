// Vector exp2 and tanh written once against the Vec interface. Include inside an ISA namespace
// after that ISA's vec_*.h. Coefficients are least-squares fits (Chebyshev nodes, relative error)
// computed for this library; scripts/fit_polynomials.py regenerates them.

// 2^x for x <= 128 (or NaN): exp2 without the clamp from above, for arguments known not to exceed
// it, such as the online softmax's exponents once it has checked that none is above 8. Same
// results as exp2 there.
inline Vec exp2_not_above_128(Vec x) {
  Vec n, f;  // x = n + f, n integral (or -inf), f in [-0.5, 0.5]
  split_for_exp2(x, &n, &f);
  Vec p = Vec::broadcast(1.5337577497120947e-4f);
  p = fma(p, f, Vec::broadcast(1.3399859890341759e-3f));
  p = fma(p, f, Vec::broadcast(9.618519805371761e-3f));
  p = fma(p, f, Vec::broadcast(5.550329014658928e-2f));
  p = fma(p, f, Vec::broadcast(2.4022646248340607e-1f));
  p = fma(p, f, Vec::broadcast(6.931471824645996e-1f));
  p = fma(p, f, Vec::broadcast(1.0f));
  return scale_by_pow2(p, n);
}

// 2^x. Relative error below 2 ulp for x in (-125.5, 0]; exactly +0 for x <= -125.5 (x rounds to
// n <= -126), so that no result is subnormal, which would cost a microcode assist per
// instruction; +inf for x >= 128; NaN for NaN.
inline Vec exp2(Vec x) {
  return exp2_not_above_128(min_keep_b_nan(Vec::broadcast(128.f), x));
}

// tanh(y). An odd polynomial for |y| < 0.625 (no cancellation near 0), (1 - e) / (1 + e) with
// e = exp(-2|y|) above. Relative error below 3 ulp (tests/vec_math_test.cc); +-1 for +-inf; NaN
// for NaN.
inline Vec tanh(Vec y) {
  const Vec u = y * y;
  Vec q = Vec::broadcast(-5.7189627550542355e-3f);
  q = fma(q, u, Vec::broadcast(2.0653124898672104e-2f));
  q = fma(q, u, Vec::broadcast(-5.374465882778168e-2f));
  q = fma(q, u, Vec::broadcast(1.3331513106822968e-1f));
  q = fma(q, u, Vec::broadcast(-3.333328664302826e-1f));
  const Vec near_zero = fma(y * u, q, y);
  const Vec e = exp2(abs(y) * Vec::broadcast(-2.8853900817779268f));  // -2 * log2(e)
  const Vec one = Vec::broadcast(1.f);
  const Vec far = copy_sign((one - e) / (one + e), y);
  return select_abs_less(y, 0.625f, near_zero, far);
}
