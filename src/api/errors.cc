#include "api/errors.h"

namespace anyattn::api {
namespace {

std::string& thread_message() {
  thread_local std::string message;
  return message;
}

}  // namespace

void set_last_error(std::string message) {
  try {
    thread_message() = std::move(message);
  } catch (...) {
    thread_message().clear();
  }
}

void clear_last_error() {
  thread_message().clear();
}

const char* last_error() {
  return thread_message().c_str();
}

}  // namespace anyattn::api
