// Error reporting inside the library. Validation code throws ApiError; the C entry points
// (c_api.cc) catch it, store the message for anyattn_last_error() and return its status. This is
// the only place messages are built, so they read alike: "<function>: <parameter> <what was
// given>; <what is supported>".
#ifndef ANYATTN_API_ERRORS_H_
#define ANYATTN_API_ERRORS_H_

#include <stdexcept>
#include <string>
#include <utility>

#include "anyattn/anyattn.h"
#include "runtime/str_cat.h"

namespace anyattn::api {

class ApiError : public std::runtime_error {
 public:
  ApiError(anyattn_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  anyattn_status status() const { return status_; }

 private:
  anyattn_status status_;
};

// Throws ANYATTN_E_INVALID_ARGUMENT with the concatenated message.
template <class... Parts>
[[noreturn]] void fail_invalid(const Parts&... parts) {
  throw ApiError(ANYATTN_E_INVALID_ARGUMENT, runtime::str_cat(parts...));
}

// Throws ANYATTN_E_UNSUPPORTED with the concatenated message.
template <class... Parts>
[[noreturn]] void fail_unsupported(const Parts&... parts) {
  throw ApiError(ANYATTN_E_UNSUPPORTED, runtime::str_cat(parts...));
}

// The calling thread's last error message ("" after a success).
void set_last_error(std::string message);
void clear_last_error();
const char* last_error();

// Runs `body` and converts every exception into a status code and a stored message. Never throws.
template <class Body>
anyattn_status guarded_call(const char* function, Body&& body) noexcept {
  try {
    body();
    clear_last_error();
    return ANYATTN_OK;
  } catch (const ApiError& error) {
    set_last_error(error.what());
    return error.status();
  } catch (const std::bad_alloc&) {
    set_last_error(runtime::str_cat(function, ": out of memory allocating workspace"));
    return ANYATTN_E_OUT_OF_MEMORY;
  } catch (const std::exception& error) {
    set_last_error(runtime::str_cat(function, ": internal error: ", error.what()));
    return ANYATTN_E_INTERNAL;
  } catch (...) {
    set_last_error(runtime::str_cat(function, ": internal error: unknown exception"));
    return ANYATTN_E_INTERNAL;
  }
}

}  // namespace anyattn::api

#endif  // ANYATTN_API_ERRORS_H_
