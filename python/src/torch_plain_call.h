// anyattn._core's fast path for plain CPU torch calls (torch_plain_call.cc).
#pragma once

#include <nanobind/nanobind.h>

// Adds bind_torch, fwd_torch_plain, fwd_varlen_torch_plain, fwd_kvcache_torch_plain and
// fwd_kvcache_varlen_torch_plain to the module.
void register_torch_plain_call(nanobind::module_& m);
