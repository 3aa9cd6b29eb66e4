// The errors cnccl raises: DistBackendError (what torch's own backends raise for a collective that
// failed), with messages that carry no backtrace in their middle.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace cnccl::errors {

// An error's message; for c10 errors, without the backtrace their what() appends.
inline std::string message_of(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return c10_error ? c10_error->what_without_backtrace() : e.what();
}

inline std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return message_of(e);
  } catch (...) {
    return "unknown error";
  }
}

inline c10::DistBackendError backend_error(const std::string& msg) {
  return c10::DistBackendError({__func__, __FILE__, uint32_t(__LINE__)}, msg);
}

// `error` as a DistBackendError whose message starts with `context`.
inline std::exception_ptr as_backend_error(std::exception_ptr error, const std::string& context) {
  return std::make_exception_ptr(backend_error(context + ": " + message_of(error)));
}

}  // namespace cnccl::errors
