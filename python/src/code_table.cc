// anyattn._core.widen_codes: 8-bit codes to 16-bit values through a 256-entry table, for the
// float8 inputs of FA3's FP8 call style (python/anyattn/_fa3_fp8.py), whose q runs as bfloat16.
// It replaces torch's element-wise float8 conversion and a torch.take over int64 indices with one
// table load and one store per code (bench/MEASUREMENTS.md, "FA3's FP8 call style").
#include "code_table.h"

#include <cstdint>
#include <cstring>

namespace nb = nanobind;

namespace {

// Writes table[src[i]] to dst[i] for i < count. `src_address` and `dst_address` are the data
// pointers of a contiguous uint8 tensor and a contiguous 16-bit tensor of `count` elements, which
// the caller keeps alive; `table` holds 256 uint16 values in native byte order (512 bytes).
// Releases the GIL.
void widen_codes(uintptr_t src_address, int64_t count, nb::bytes table, uintptr_t dst_address) {
  if (count < 0) throw nb::value_error("widen_codes: count must be >= 0");
  if (table.size() != 256 * sizeof(uint16_t)) {
    throw nb::value_error("widen_codes: table must hold 256 uint16 values (512 bytes)");
  }
  if (count > 0 && (src_address == 0 || dst_address == 0)) {
    throw nb::value_error("widen_codes: null data pointer");
  }
  uint16_t values[256];
  std::memcpy(values, table.c_str(), sizeof(values));
  const auto* src = reinterpret_cast<const uint8_t*>(src_address);
  auto* dst = reinterpret_cast<uint16_t*>(dst_address);
  nb::gil_scoped_release release;
  for (int64_t i = 0; i < count; ++i) dst[i] = values[src[i]];
}

}  // namespace

void register_code_table(nb::module_& m) {
  m.def("widen_codes", &widen_codes, nb::arg("src_address"), nb::arg("count"), nb::arg("table"),
        nb::arg("dst_address"),
        "dst[i] = table[src[i]] for i < count: contiguous uint8 codes to 16-bit values through a "
        "256-entry uint16 table (bytes). Releases the GIL.");
}
