// str_cat: joins strings and numbers into one std::string without iostreams.
//
// Error messages and the ANYATTN_VERBOSE plan line are built here rather than with an
// ostringstream for two reasons. Streams format numbers through the global C++ locale, so a host
// program's std::locale::global(...) could put digit grouping into "Sk=32,768". And where a build
// links libstdc++ statically into a module that runs beside another libstdc++ in the process (as
// one Python build environment did with anyattn._core next to torch), the stream's locale facets
// can be unusable: the first error message then crashed in ostream::_M_insert<long>.
// std::to_chars is locale-independent and touches no facets.
#ifndef ANYATTN_RUNTIME_STR_CAT_H_
#define ANYATTN_RUNTIME_STR_CAT_H_

#include <charconv>
#include <string>
#include <string_view>
#include <type_traits>

namespace anyattn::runtime {

// Appends one part: text as is, a char as a character, a bool as 1 or 0 (as a stream would),
// integers in decimal, floating point as the shortest text that reads back to the same value
// ("0.1", "1e-07", "inf", "nan"), and enums as their underlying integer.
template <class T>
void append_part(std::string& out, const T& part) {
  if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out.append(std::string_view(part));
  } else if constexpr (std::is_same_v<T, char>) {
    out.push_back(part);
  } else if constexpr (std::is_same_v<T, bool>) {
    out.push_back(part ? '1' : '0');
  } else if constexpr (std::is_enum_v<T>) {
    append_part(out, static_cast<std::underlying_type_t<T>>(part));
  } else {
    static_assert(std::is_arithmetic_v<T>, "str_cat: unsupported part type");
    char digits[64];
    const std::to_chars_result result = std::to_chars(digits, digits + sizeof(digits), part);
    out.append(digits, result.ptr);
  }
}

// The concatenation of every part, each formatted by append_part.
template <class... Parts>
std::string str_cat(const Parts&... parts) {
  std::string out;
  (append_part(out, parts), ...);
  return out;
}

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_STR_CAT_H_
