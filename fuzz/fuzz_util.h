// Helpers shared by the libFuzzer targets in fuzz/ (docs/testing.md, "Fuzzing").
// A target's invariant that does not hold is a finding: FUZZ_CHECK aborts, so libFuzzer saves the
// input as a crash.
#pragma once
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)
