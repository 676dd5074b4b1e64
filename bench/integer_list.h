// Comma-separated integer lists on the probes' command lines ("0,16,64").
#ifndef ANYATTN_BENCH_INTEGER_LIST_H_
#define ANYATTN_BENCH_INTEGER_LIST_H_

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace anyattn_bench {

// *values = the integers of `text`, comma-separated; false when text holds anything else or none.
inline bool ParseIntegerList(const char* text, std::vector<int64_t>* values) {
  values->clear();
  for (const char* p = text; *p != '\0';) {
    char* end = nullptr;
    const long long value = std::strtoll(p, &end, 10);
    if (end == p || (*end != ',' && *end != '\0')) return false;
    values->push_back(value);
    p = *end == ',' ? end + 1 : end;
  }
  return !values->empty();
}

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_INTEGER_LIST_H_
