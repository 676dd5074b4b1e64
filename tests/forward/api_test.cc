// The small API around the forward call: versions, status names, tensor descriptors, threads.
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <string>

#include "anyattn/anyattn.h"

namespace {

TEST(Version, NumberAndStringMatchTheHeader) {
  EXPECT_EQ(anyattn_version(), ANYATTN_VERSION);
  const std::string expected = std::to_string(ANYATTN_VERSION_MAJOR) + "." +
                               std::to_string(ANYATTN_VERSION_MINOR) + "." +
                               std::to_string(ANYATTN_VERSION_PATCH);
  EXPECT_EQ(std::string(anyattn_version_string()), expected);
}

TEST(Dtype, Sizes) {
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_F32), 4);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_F16), 2);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_BF16), 2);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_I32), 4);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_FP8_E4M3), 1);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_FP8_E5M2), 1);
  EXPECT_EQ(anyattn_dtype_size(ANYATTN_DTYPE_I8), 1);
  for (int32_t none : {-1, 7, 1000, static_cast<int32_t>(ANYATTN_DTYPE_MAX_ENUM)}) {
    EXPECT_EQ(anyattn_dtype_size(none), 0) << none;
  }
}

TEST(Status, Names) {
  EXPECT_STREQ(anyattn_status_name(ANYATTN_OK), "ANYATTN_OK");
  EXPECT_STREQ(anyattn_status_name(ANYATTN_E_INVALID_ARGUMENT), "ANYATTN_E_INVALID_ARGUMENT");
  EXPECT_STREQ(anyattn_status_name(ANYATTN_E_UNSUPPORTED), "ANYATTN_E_UNSUPPORTED");
  EXPECT_STREQ(anyattn_status_name(ANYATTN_E_OUT_OF_MEMORY), "ANYATTN_E_OUT_OF_MEMORY");
  EXPECT_STREQ(anyattn_status_name(ANYATTN_E_INTERNAL), "ANYATTN_E_INTERNAL");
  ASSERT_NE(anyattn_status_name(static_cast<anyattn_status>(1234)), nullptr);
}

TEST(TensorInit, ContiguousStrides) {
  float data[2 * 3 * 4 * 5];
  const int64_t shape[4] = {2, 3, 4, 5};
  anyattn_tensor t;
  ASSERT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_BF16, 4, shape), ANYATTN_OK);
  EXPECT_EQ(t.data, data);
  EXPECT_EQ(t.dtype, ANYATTN_DTYPE_BF16);
  EXPECT_EQ(t.ndim, 4);
  const int64_t strides[4] = {60, 20, 5, 1};
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(t.shape[d], shape[d]);
    EXPECT_EQ(t.strides[d], strides[d]);
  }
}

TEST(TensorInit, RejectsBadArguments) {
  float data[4];
  const int64_t shape[4] = {1, 2, 2, 1};
  const int64_t negative[2] = {2, -1};
  anyattn_tensor t;
  EXPECT_EQ(anyattn_tensor_init_contiguous(nullptr, data, ANYATTN_DTYPE_F32, 2, shape),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_F32, 2, nullptr),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_F32, 0, shape),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_F32, 5, shape),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_F32, 2, negative),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_STRNE(anyattn_last_error(), "");
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, static_cast<anyattn_dtype>(9), 2, shape),
            ANYATTN_E_INVALID_ARGUMENT);
  EXPECT_EQ(anyattn_tensor_init_contiguous(&t, data, ANYATTN_DTYPE_I32, 4, shape), ANYATTN_OK);
}

TEST(Params, InitSetsDefaults) {
  anyattn_fwd_params p;
  anyattn_fwd_params_init(&p);
  EXPECT_EQ(p.struct_size, sizeof(anyattn_fwd_params));
  EXPECT_EQ(p.softmax_scale, 0.0f);
  EXPECT_EQ(p.softcap, 0.0f);
  EXPECT_EQ(p.causal, 0);
  EXPECT_EQ(p.window_left, -1);
  EXPECT_EQ(p.window_right, -1);
  EXPECT_EQ(p.alibi_slopes, nullptr);
  EXPECT_EQ(p.sinks, nullptr);
  EXPECT_EQ(p.dropout_p, 0.0f);
  EXPECT_EQ(p.num_splits, 0);
  EXPECT_EQ(p.isa, ANYATTN_ISA_AUTO);
}

TEST(Threads, SetAndGet) {
  for (int n : {1, 2, 3, 8, 64}) {
    anyattn_set_num_threads(n);
    EXPECT_EQ(anyattn_get_num_threads(), n);
  }
  anyattn_set_num_threads(0);
  EXPECT_GE(anyattn_get_num_threads(), 1);
  anyattn_set_num_threads(-5);
  EXPECT_GE(anyattn_get_num_threads(), 1);
}

TEST(Threads, DefaultIsTheAffinityMask) {
  if (std::getenv("ANYATTN_NUM_THREADS") != nullptr) {
    GTEST_SKIP() << "ANYATTN_NUM_THREADS is set; the env test covers that case";
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  anyattn_set_num_threads(0);
  EXPECT_EQ(anyattn_get_num_threads(), CPU_COUNT(&set));
}

}  // namespace
