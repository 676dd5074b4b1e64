/* Compiles include/anyattn/anyattn.h as C99 and calls the forward pass on a problem whose answer
 * is known in closed form. Exit status 0 means success.
 *
 * q (1, 2, 1, 4) and k (1, 3, 1, 4) are all zero, so every score is 0 and each query row is the
 * plain mean of the three value rows; lse = log(3). Then causal with Sq = 2, Sk = 3: row 0 sees
 * keys 0 and 1 (bottom-right alignment), row 1 sees all three. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "anyattn/anyattn.h"

static int check(int ok, const char* what) {
  if (!ok) fprintf(stderr, "FAILED: %s (last error: \"%s\")\n", what, anyattn_last_error());
  return ok ? 0 : 1;
}

int main(void) {
  float q[8] = {0}, k[12] = {0};
  float v[6] = {1, 10, 2, 20, 6, 60}; /* (1, 3, 1, 2) */
  float out[4], lse[2];
  int64_t q_shape[4] = {1, 2, 1, 4}, k_shape[4] = {1, 3, 1, 4}, v_shape[4] = {1, 3, 1, 2};
  int64_t out_shape[4] = {1, 2, 1, 2}, lse_shape[3] = {1, 1, 2};
  anyattn_tensor tq, tk, tv, tout, tlse;
  anyattn_fwd_params params;
  int failures = 0;

  failures +=
      check(anyattn_tensor_init_contiguous(&tq, q, ANYATTN_DTYPE_F32, 4, q_shape) == ANYATTN_OK,
            "init q");
  failures +=
      check(anyattn_tensor_init_contiguous(&tk, k, ANYATTN_DTYPE_F32, 4, k_shape) == ANYATTN_OK,
            "init k");
  failures +=
      check(anyattn_tensor_init_contiguous(&tv, v, ANYATTN_DTYPE_F32, 4, v_shape) == ANYATTN_OK,
            "init v");
  failures += check(
      anyattn_tensor_init_contiguous(&tout, out, ANYATTN_DTYPE_F32, 4, out_shape) == ANYATTN_OK,
      "init out");
  failures += check(
      anyattn_tensor_init_contiguous(&tlse, lse, ANYATTN_DTYPE_F32, 3, lse_shape) == ANYATTN_OK,
      "init lse");

  anyattn_fwd_params_init(&params);
  failures += check(params.struct_size == sizeof(anyattn_fwd_params), "struct_size");
  failures += check(anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, &params) == ANYATTN_OK, "fwd");
  failures += check(strcmp(anyattn_last_error(), "") == 0, "last_error empty after success");
  failures += check(fabsf(out[0] - 3.0f) < 1e-6f && fabsf(out[1] - 30.0f) < 1e-5f, "row 0 mean");
  failures += check(fabsf(out[2] - 3.0f) < 1e-6f && fabsf(out[3] - 30.0f) < 1e-5f, "row 1 mean");
  failures += check(fabsf(lse[0] - logf(3.0f)) < 1e-6f, "lse row 0");

  params.causal = 1;
  failures += check(anyattn_fwd(&tq, &tk, &tv, &tout, &tlse, &params) == ANYATTN_OK, "causal");
  failures += check(fabsf(out[0] - 1.5f) < 1e-6f && fabsf(out[1] - 15.0f) < 1e-5f, "causal 0");
  failures += check(fabsf(out[2] - 3.0f) < 1e-6f, "causal row 1");
  failures += check(fabsf(lse[0] - logf(2.0f)) < 1e-6f, "causal lse row 0");

  /* NULL params means defaults; a NULL q is rejected with a message. */
  failures += check(anyattn_fwd(&tq, &tk, &tv, &tout, NULL, NULL) == ANYATTN_OK, "NULL params");
  failures += check(anyattn_fwd(NULL, &tk, &tv, &tout, NULL, NULL) == ANYATTN_E_INVALID_ARGUMENT,
                    "NULL q rejected");
  failures += check(strlen(anyattn_last_error()) > 0, "message after failure");
  failures += check(anyattn_version() == ANYATTN_VERSION, "version");

  if (failures == 0) printf("C ABI test passed (anyattn %s)\n", anyattn_version_string());
  return failures == 0 ? 0 : 1;
}
