// netreduce-dataplane: entry point. Loads and validates the YAML
// configuration (refusing to start with a message that says what to fix),
// starts EAL with the configured arguments, sets up ports and workers, and
// runs until SIGINT/SIGTERM or a "shutdown" control request, then releases
// every held mbuf and prints the final counters as one JSON line.
//
//   netreduce-dataplane -c config/dataplane.yaml [--rings rings.json] [--check] [-- EAL args]
#include <rte_eal.h>
#include <rte_errno.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>

#include "common/fatal_signal.h"
#include "dataplane/dataplane.h"

namespace {
netreduce::dataplane::Dataplane* g_dp = nullptr;
void on_signal(int) {
  if (g_dp) g_dp->stop();
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"netreduce-dataplane: in-network gradient aggregation on a DPDK port pair"};
  std::string config_path, rings_path;
  bool check_only = false;
  std::vector<std::string> extra_eal;
  app.add_option("-c,--config", config_path, "YAML configuration (see config/dataplane.yaml)")
      ->required();
  app.add_option("--rings", rings_path,
                 "JSON array of ring specs to install before traffic starts");
  app.add_flag("--check", check_only, "validate the configuration and exit");
  app.allow_extras();  // everything after "--" goes to EAL
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  extra_eal = app.remaining();
  if (!extra_eal.empty() && extra_eal.front() == "--") extra_eal.erase(extra_eal.begin());

  netreduce::dataplane::DataplaneConfig cfg;
  if (netreduce::Status s = netreduce::dataplane::load_config(config_path, cfg); !s) {
    // Whole-file problems already start with "path:line:col:"; field errors name the key.
    if (s.field().empty())
      std::fprintf(stderr, "netreduce-dataplane: %s\n", s.message().c_str());
    else
      std::fprintf(stderr, "netreduce-dataplane: %s: %s\n", config_path.c_str(),
                   s.to_string().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("%s: configuration is valid\n", config_path.c_str());
    return 0;
  }

  std::vector<std::string> eal = {"netreduce-dataplane"};
  eal.insert(eal.end(), cfg.eal_args.begin(), cfg.eal_args.end());
  eal.insert(eal.end(), extra_eal.begin(), extra_eal.end());
  std::vector<char*> eal_argv;
  for (auto& a : eal) eal_argv.push_back(a.data());
  eal_argv.push_back(nullptr);
  netreduce::install_fatal_signal_report("netreduce-dataplane");
  if (rte_eal_init(static_cast<int>(eal.size()), eal_argv.data()) < 0) {
    std::fprintf(stderr,
                 "netreduce-dataplane: EAL initialization failed: %s\n"
                 "  check the eal arguments: lcores (-l), memory (-m, --no-huge or hugepages), "
                 "devices (--vdev, -a)\n",
                 rte_strerror(rte_errno));
    return 1;
  }

  int rc = 0;
  {
    netreduce::dataplane::Dataplane dp(cfg);
    if (netreduce::Status s = dp.setup(); !s) {
      std::fprintf(stderr, "netreduce-dataplane: %s\n", s.to_string().c_str());
      rc = 1;
    } else if (netreduce::Status s2 =
                   rings_path.empty() ? netreduce::Status{} : dp.preload_rings(rings_path);
               !s2) {
      std::fprintf(stderr, "netreduce-dataplane: %s\n", s2.to_string().c_str());
      rc = 1;
    } else {
      g_dp = &dp;
      std::signal(SIGINT, on_signal);
      std::signal(SIGTERM, on_signal);
      if (netreduce::Status s3 = dp.run(); !s3) {
        std::fprintf(stderr, "netreduce-dataplane: %s\n", s3.to_string().c_str());
        rc = 1;
      } else {
        spdlog::info("stopped");
      }
      g_dp = nullptr;
    }
  }
  rte_eal_cleanup();
  return rc;
}
