// Runs the RC ring simulator over many seeds (tests/engine/sim.h).
//   engine-sim-test [SEEDS] [FIRST_SEED]     random parameters per seed
//   NETREDUCE_SIM_SEED=S engine-sim-test     replay one seed, verbosely
//   NETREDUCE_SIM_TRACE=1 ...                 also trace every accepted packet
// A failing seed prints its parameters and the replay command.
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/sim.h"
#include "engine/sim_net.h"

using namespace netreduce;

int main(int argc, char** argv) {
  const sim::SeedRange range = sim::seed_range(argc, argv);
  const uint64_t seeds = range.count, first = range.first;
  const bool replay = range.replay;
  const auto t0 = std::chrono::steady_clock::now();
  engine::ReasonCounters total{};
  uint64_t frames = 0, served = 0, completed = 0, failures = 0;
  uint64_t removed = 0, stuck = 0, reinstalled_done = 0, faulted = 0, fault_stuck = 0;
  uint64_t rejected = 0;
  std::array<uint64_t, 18> combos{};
  for (uint64_t s = first; s < first + seeds; ++s) {
    const sim::SimParams p = sim::random_params(s);
    const sim::SimResult r = sim::run_sim(p);
    if (replay || !r.ok) std::printf("%s\n", sim::describe(p).c_str());
    if (!r.ok) {
      ++failures;
      std::printf("FAIL: %s\n  replay: NETREDUCE_SIM_SEED=%" PRIu64 " %s\n", r.error.c_str(), s,
                  argv[0]);
      if (failures >= 5) break;
      continue;
    }
    ++combos[s % 18];
    rejected += r.rejected;
    if (r.faulted && !r.removed) {
      ++faulted;
      if (r.stuck_after_fault) ++fault_stuck;
    }
    if (r.removed) {
      ++removed;
      if (r.stuck_after_fault)
        ++stuck;
      else if (p.reinstall_at)
        ++reinstalled_done;
    }
    frames += r.frames;
    served += r.ring.retransmissions_served;
    completed += r.ring.messages_completed;
    for (size_t i = 0; i < total.size(); ++i) total[i] += r.counters[i];
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("engine sim: %" PRIu64 " seeds from %" PRIu64 " in %.1f s, %" PRIu64
              " failed; %" PRIu64 " frames through the engine, %" PRIu64
              " messages completed, %" PRIu64 " retransmissions served from cells\n",
              seeds, first, secs, failures, frames, completed, served);
  std::printf("  ring removed mid-run in %" PRIu64 " seeds: %" PRIu64
              " ended stuck (expected), %" PRIu64
              " completed after re-installation; every completed message checked\n",
              removed, stuck, reinstalled_done);
  std::printf("  box bypassed or restarted mid-run in %" PRIu64 " seeds: %" PRIu64
              " ended stuck (expected); %" PRIu64
              " messages rejected by their seal, none accepted wrong\n",
              faulted, fault_stuck, rejected);
  std::printf("  dtype x op combinations run:");
  for (uint64_t c : combos) std::printf(" %" PRIu64, c);
  std::printf("\n  engine reasons:");
  for (size_t i = 0; i < total.size(); ++i)
    if (total[i])
      std::printf(" %s=%" PRIu64,
                  std::string(engine::to_string(static_cast<engine::Reason>(i))).c_str(), total[i]);
  std::printf("\n");
  return failures == 0 ? 0 : 1;
}
