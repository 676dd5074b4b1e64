// Vector exp2 and tanh written once against the Vec interface. Include inside an ISA namespace
// after that ISA's vec_*.h. Coefficients are least-squares fits (Chebyshev nodes, relative error)
// computed for this library; tests/internal/vec_math_test.cc checks the error bounds stated here
// on every path.

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

// tanh(y) for |y| < 0.625: an odd polynomial, y + y^3 q(y^2).
inline Vec tanh_near_zero(Vec y) {
  const Vec u = y * y;
  Vec q = Vec::broadcast(-5.7189627550542355e-3f);
  q = fma(q, u, Vec::broadcast(2.0653124898672104e-2f));
  q = fma(q, u, Vec::broadcast(-5.374465882778168e-2f));
  q = fma(q, u, Vec::broadcast(1.3331513106822968e-1f));
  q = fma(q, u, Vec::broadcast(-3.333328664302826e-1f));
  return fma(y * u, q, y);
}

// exp(-2|y|), the quantity tanh is built from away from 0.
inline Vec exp_minus_two_abs(Vec y) {
  return exp2(abs(y) * Vec::broadcast(-2.8853900817779268f));  // -2 * log2(e)
}

// tanh(y) from its two branches: near_zero = tanh_near_zero(y) for |y| < 0.625, else
// (1 - e) * a with e = exp(-2|y|) and a = 1 / (1 + e), signed as y.
inline Vec tanh_of_parts(Vec y, Vec near_zero, Vec e, Vec a) {
  return select_abs_less(y, 0.625f, near_zero, copy_sign((Vec::broadcast(1.f) - e) * a, y));
}

// tanh(y). An odd polynomial for |y| < 0.625 (no cancellation near 0), (1 - e) / (1 + e) with
// e = exp(-2|y|) above, formed as tanh_and_sech2 forms it, so that both give the same bits (the
// forward's softcap and the backward's must agree). Relative error below 3 ulp
// (tests/internal/vec_math_test.cc); +-1 for +-inf; NaN for NaN.
inline Vec tanh(Vec y) {
  const Vec e = exp_minus_two_abs(y);
  return tanh_of_parts(y, tanh_near_zero(y), e, Vec::broadcast(1.f) / (Vec::broadcast(1.f) + e));
}

// *t = tanh(y) (within 3 ulp, as tanh) and *sech2 = 1 - tanh(y)^2, the softcap's derivative,
// within 4 + 3|y| ulp (the f32 exponent -2|y| log2(e) is rounded, and exp2 turns its absolute
// error into a relative one; sech^2's own condition number is 2|y|), also where tanh(y) is close
// to +-1 and 1 - t * t cancels (that loses about log2(1 / sech^2(y)) bits: 4 at |y| = 2, 12 at
// |y| = 5, all of them from about |y| = 9 on, where t rounds to 1). Above |y| = 0.625 both come
// from e = exp(-2|y|) and a = 1 / (1 + e):
//   t = (1 - e) a,   sech^2 = (1 - |t|)(1 + |t|) = (2 e a)(2 a);
// below, t^2 < 0.31 and 1 - t * t loses nothing. One division, as tanh. sech2 is 0 for +-inf
// and NaN for NaN.
inline void tanh_and_sech2(Vec y, Vec* t, Vec* sech2) {
  const Vec near_zero = tanh_near_zero(y);
  const Vec e = exp_minus_two_abs(y);
  const Vec one = Vec::broadcast(1.f);
  const Vec a = one / (one + e);
  *t = tanh_of_parts(y, near_zero, e, a);
  *sech2 =
      select_abs_less(y, 0.625f, one - near_zero * near_zero, Vec::broadcast(4.f) * e * (a * a));
}
