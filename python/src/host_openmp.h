// anyattn._core's use_host_openmp (host_openmp.cc).
#pragma once

#include <nanobind/nanobind.h>

// Adds use_host_openmp and host_openmp to the module.
void register_host_openmp(nanobind::module_& m);
