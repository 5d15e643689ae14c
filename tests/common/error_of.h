// What a call throws, as text for a test to search: the titan::Error's message, hint and site.
#pragma once

#include <string>

#include "titan/core/error.h"

namespace titan::test {

// What `f` throws: the Error's text (message, hint and site), or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace titan::test
