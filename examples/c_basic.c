/* anyattn from C: causal attention over a tiny problem, checked against a direct computation. */
#include <anyattn/anyattn.h>
#include <math.h>
#include <stdio.h>

enum { SQ = 2, SK = 3, D = 4 }; /* B = 1, one head. Sq < Sk: the causal mask is bottom-right. */

int main(void) {
  float q[SQ * D], k[SK * D], v[SK * D], out[SQ * D];
  for (int i = 0; i < SQ * D; ++i) q[i] = 0.1f * i - 0.4f;
  for (int i = 0; i < SK * D; ++i) k[i] = sinf(0.3f * i);
  for (int i = 0; i < SK * D; ++i) v[i] = cosf(0.7f * i);
  anyattn_tensor tq, tk, tv, to;
  int64_t qs[4] = {1, SQ, 1, D}, ks[4] = {1, SK, 1, D};
  anyattn_tensor_init_contiguous(&tq, q, ANYATTN_DTYPE_F32, 4, qs);
  anyattn_tensor_init_contiguous(&tk, k, ANYATTN_DTYPE_F32, 4, ks);
  anyattn_tensor_init_contiguous(&tv, v, ANYATTN_DTYPE_F32, 4, ks);
  anyattn_tensor_init_contiguous(&to, out, ANYATTN_DTYPE_F32, 4, qs);
  anyattn_fwd_params p;
  anyattn_fwd_params_init(&p);
  p.causal = 1; /* query i sees keys j <= i + SK - SQ */
  if (anyattn_fwd(&tq, &tk, &tv, &to, NULL, &p) != ANYATTN_OK) {
    fprintf(stderr, "anyattn_fwd failed: %s\n", anyattn_last_error());
    return 1;
  }
  double err = 0;
  for (int i = 0; i < SQ; ++i) {
    double w[SK], sum = 0; /* Scores are small here: no max subtraction needed. */
    for (int j = 0; j <= i + SK - SQ; ++j) {
      double s = 0;
      for (int d = 0; d < D; ++d) s += q[i * D + d] * k[j * D + d] / sqrt((double)D);
      w[j] = exp(s);
      sum += w[j];
    }
    for (int d = 0; d < D; ++d) {
      double o = 0;
      for (int j = 0; j <= i + SK - SQ; ++j) o += w[j] / sum * v[j * D + d];
      err = fmax(err, fabs(o - out[i * D + d]));
    }
  }
  printf("c_basic: anyattn %s, max |out - direct| = %.2e\n", anyattn_version_string(), err);
  return err < 1e-5 ? 0 : 1;
}
