// The command line of the kernel benchmarks whose only flag is `--csv FILE`.
#pragma once

#include <cstdio>
#include <cstring>

namespace se::bench {

// Returns run(the --csv path, or null), or 2 after printing the usage for anything else.
inline int run_with_csv_flag(int argc, char** argv, int (*run)(const char* csv_path)) {
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--csv FILE]\n", argv[0]);
      return 2;
    }
  }
  return run(csv);
}

}  // namespace se::bench
