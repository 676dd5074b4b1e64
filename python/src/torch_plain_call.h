// anyattn._core's fast path for plain CPU torch calls (torch_plain_call.cc).
#pragma once

#include <nanobind/nanobind.h>

// Adds bind_torch and fwd_torch_plain to the module.
void register_torch_plain_call(nanobind::module_& m);
