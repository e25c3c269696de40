// Wall time per run of `run`, repeated until at least `seconds_min` has passed (at least
// once). Shared by the CPU micro-benchmarks in bench/.
#pragma once

#include <chrono>
#include <cstddef>

namespace tandem::bench {

template <class F>
double seconds_per_run(double seconds_min, F&& run) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  size_t runs = 0;
  double elapsed = 0;
  do {
    run();
    ++runs;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds_min);
  return elapsed / static_cast<double>(runs);
}

}  // namespace tandem::bench
