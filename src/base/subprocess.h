// run_process: runs a program with arguments (no shell), waits, and returns its standard output. Standard
// error passes through to ours. Blocking; safe to call from any thread.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace se {

// argv[0] is the program path. kNotFound when it cannot be executed, kInternal with the exit status otherwise.
Result<std::string> run_process(const std::vector<std::string>& argv);

}  // namespace se
