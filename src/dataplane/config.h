// netreduce-dataplane configuration: the YAML file (config/dataplane.yaml is
// the commented example), parsed and validated before EAL starts, so a bad
// file is refused with a message that says what to fix. No DPDK here: what
// can only be checked against the running system (do the ports exist, is
// there memory for the pools) is checked at start-up by the data plane.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"

namespace netreduce::dataplane {

enum class Mode : uint8_t {
  aggregate,  // INA processing (the product)
  forward,    // same ports, same burst loop, no INA processing (benchmark baseline)
};

struct PortConfig {
  // DPDK device name: a PCI address ("0000:3b:00.0") or a vdev name ("net_ring0").
  std::string name;
};

// The least rings.retire_grace_ms the box accepts.
inline constexpr uint32_t kMinRetireGraceMs = 1000;

struct DataplaneConfig {
  // EAL arguments (e.g. ["-l", "0-1", "--no-huge", "-m", "512", "--vdev", "net_ring0"]);
  // arguments after "--" on the command line are appended.
  std::vector<std::string> eal_args;

  // Exactly two ports: bump in the wire, A -> B and B -> A.
  std::vector<PortConfig> ports;
  uint16_t mtu = 4200;      // L3 MTU set on the ports: RoCE MTU 4096 + headers
  uint16_t rx_desc = 1024;  // descriptors per RX queue
  uint16_t tx_desc = 1024;  // descriptors per TX queue
  uint16_t burst = 32;      // packets per rx burst (1..256)
  // Adaptive idle polling: a worker that moved no packet for idle_after_us
  // sleeps in doubling steps from 1 us up to idle_sleep_max_us, until a poll
  // finds work. 0 = pure polling (100% of the lcore, lowest latency after idle).
  // A burst after idle waits at most idle_sleep_max_us (plus the wake-up;
  // twice that when dispatched to another sleeping worker);
  // idle CPU is about (one wake-up, ~20 us on a VM) / idle_sleep_max_us.
  uint32_t idle_sleep_max_us = 300;
  uint32_t idle_after_us = 1000;

  Mode mode = Mode::aggregate;

  // Worker lcores (EAL lcore ids). Empty: every EAL worker lcore. The main
  // lcore runs the control socket and housekeeping, never the data path.
  std::vector<unsigned> workers;

  // Memory.
  uint32_t mbufs = 32768;                 // mbufs in the packet pool (held packets come from it)
  uint32_t mbuf_cache = 256;              // per-lcore mempool cache
  uint64_t engine_memory = 256ull << 20;  // bytes all rings may reserve, over all workers

  // Aggregation engine.
  engine::ReduceMode reduce_mode = engine::ReduceMode::deterministic;
  engine::IcrcFixup icrc_fixup = engine::IcrcFixup::linear;
  bool verify_icrc = true;
  unsigned max_rings = 64;           // per worker
  unsigned clt_capacity = 4096;      // connections per worker
  uint32_t stall_timeout_ms = 1000;  // cells collecting longer are reported stalled

  // Rings. A removed ring is retired, not forgotten: for this long its
  // connections and links stay known and their packets are dropped
  // (ring_retired), so a job still sending fails loudly instead of receiving
  // unreduced data, and a resend of the old job never enters a new ring on
  // the same QP numbers. Must exceed the hosts' RC retransmission budget (7
  // transmissions x the ACK timeout, e.g. 7 x 4.3 s at timeout 20): at least
  // kMinRetireGraceMs, twice the host library's default budget (7 x 67 ms);
  // hosts with a longer one check it against the box's value at create.
  uint32_t retire_grace_ms = 60000;
  // How long a message may wait in the box, from its first packet, before
  // resends the box cannot answer are forwarded untouched (fwd_stalled:
  // engine::EngineConfig::forward_stalled_after): the other ranks' packets
  // passed while the box was bypassed or down, or a rank is that late. The
  // hosts then reject the message by its seal and fail over to the ring
  // path instead of resending until their queue pairs fail. Below the
  // hosts' RC retransmission budget (0.47 s at the default qp_timeout 14),
  // above how far apart their ranks enter a call.
  uint32_t stalled_forward_ms = 250;

  // Control socket (control_socket.h). Created with mode 0660; root, the
  // box's own uid and members of `control_group` (a group name or a numeric
  // gid; empty: none) may connect; at most `control_max_clients` at once.
  std::string control_socket = "/run/netreduce/dataplane.sock";
  unsigned control_max_clients = 64;
  std::string control_group;
  // How long a control request waits for a worker to take a command from its
  // command ring (control.command_timeout_ms; dataplane.h, Threads).
  uint32_t command_timeout_ms = 1000;

  // Fault injection (dataplane/faults.h): refused unless enabled. A fault
  // lasts the duration_ms its request gives, at most max_duration_ms; the
  // workers' PRNGs are seeded from `seed` (reproducible tests).
  bool faults_enabled = false;
  uint32_t faults_max_duration_ms = 600000;
  uint64_t faults_seed = 1;
};

// Parses and validates YAML text. `origin` names the source in messages (a
// file path). Unknown keys are errors (a typo must not be silently ignored);
// every message names the key, e.g. "engine.reduce_mode: must be
// deterministic or accumulate, got 'fast'".
//
// Messages. A bad value: field() is the dotted key ("mtu",
// "engine.reduce_mode", "ports[1].name", "workers[2]") and message() says
// what is wrong, without the origin. Something wrong with the text as a
// whole (YAML syntax, empty document, top level not a mapping, a second
// document): field() is empty and message() starts with the origin, as
// "origin:line:column: ..." when yaml-cpp gives a position. So print
//   st.field().empty() ? st.message() : origin + ": " + st.to_string()
// Integers are decimal only; booleans are true/false (also True/TRUE/
// False/FALSE); a section or list left empty (`memory:`, `workers:`) means
// its defaults.
//
// `out` is assigned only on success, and then entirely: keys absent from the
// text take the defaults above, not out's previous values. Never throws.
Status parse_config(const std::string& yaml_text, const std::string& origin, DataplaneConfig& out);
// Reads the file and parses it; a missing or unreadable file is an error that
// names the path (field() empty, message() starting with the path; code
// not_found when it does not exist). Files over 1 MiB are refused. Never
// throws.
Status load_config(const std::string& path, DataplaneConfig& out);

}  // namespace netreduce::dataplane
