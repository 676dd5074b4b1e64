// anyattn._core's widen_codes (code_table.cc).
#pragma once

#include <nanobind/nanobind.h>

// Adds widen_codes to the module.
void register_code_table(nanobind::module_& m);
