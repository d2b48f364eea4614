// netreduce-dataplane: the DPDK primary process. Two ports form a bump in
// the wire: what arrives on one leaves on the other. Worker lcores poll the
// ports and run one Engine each; the main lcore runs the control socket and
// DPDK telemetry, never the data path. Design:
// docs/design.md#the-data-plane; running it: docs/dataplane.md#workers-and-placement.
//
// Example: workers W0 and W1, ring 7 of P = 3 ranks A, B, C.
//  1. Install (rings.cc, placement.h): ring 7 goes to the worker with the fewest rings,
//     W0. W0's engine gets the ring by command first; then a new link table
//     maps the links A->B, B->C, C->A to W0.
//  2. RSS hands W1 a packet A->B: rx -> classify (parsed once) -> dispatch
//     finds link (A, B) owned by W0 and enqueues the packet on W0's inbox.
//  3. W0 takes it from the inbox; aggregate (Engine::process_burst) holds
//     it. The packet that completes a cell releases three, which transmit
//     buffers per port and sends once a burst is queued or some RX poll
//     came back short. With nothing to move for idle_after_us, a worker
//     sleeps between polls (1 us, doubling up to idle_sleep_max_us).
//
// Threads:
// - Worker: the only thread that touches its Engine and writes its
//   counters. Per burst: load `links` (acquire), run the stages, report an
//   RCU quiescent state. Between bursts: run the commands of its command
//   ring (SP/SC) and store each one's `state` = done (release).
// - Control thread (main lcore): never touches engine state. Sends a
//   command and waits for done (acquire) up to control.command_timeout_ms,
//   else CASes queued -> cancelled and answers "unavailable". Publishes a
//   new link table (release store), frees the old one after the RCU grace
//   period, and reads counters through each worker's Published (lcore.h).
// - Worker to worker: the owner's inbox (rte_ring, MP/SC) for dispatched
//   packets, and TX handoff rings to a port queue's owner.
// Files: worker.cc (a worker's loop), lcore.h (a worker and its stages,
// one .cc each), placement.h (which worker owns a ring), rings.cc
// (lifecycle), commands.cc, publication.cc, control_socket.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dataplane/config.h"
#include "dataplane/faults.h"
#include "dataplane/lcore.h"
#include "dataplane/placement.h"
#include "dataplane/ports.h"
#include "dataplane/reasons.h"
#include "engine/engine.h"

struct rte_rcu_qsbr;

namespace netreduce::dataplane {

class Dataplane {
 public:
  explicit Dataplane(DataplaneConfig cfg);
  ~Dataplane();

  // After rte_eal_init: checks ports/lcores/memory, sets up pools, queues,
  // rings and workers. The Status says what to fix.
  Status setup();
  // Installs rings from a JSON file (an array of ring specs) before traffic.
  Status preload_rings(const std::string& path);
  // Opens the control socket, starts the ports and workers, and runs the
  // control loop on the main lcore until stop() or a signal. Returns when all
  // workers have stopped; an error (nothing started) if the control socket or
  // a port could not be opened. The final counters go to `final_report` as
  // one JSON line (nullptr: nowhere; an embedding program reports its own).
  Status run(std::FILE* final_report = stdout);
  void stop() { quit_.store(true, std::memory_order_relaxed); }
  // The packet path's mode. Starts as config().mode; `set_mode` on the
  // control channel switches it at run time (benchmarks measure the forward-
  // only baseline on the same ports in the same run). Forward mode sends
  // every packet out untouched, so it is refused while any ring is installed
  // or retiring (a running job would receive unreduced data), and rings are
  // refused in forward mode. Workers load the mode once per burst (acquire);
  // set_mode stores it (release) and waits for every worker to finish its
  // current burst (RCU synchronize), so when it returns no worker still
  // processes in the old mode.
  Mode mode() const { return mode_.load(std::memory_order_acquire); }
  Status set_mode(Mode m);
  bool quitting() const { return quit_.load(std::memory_order_relaxed); }
  // Port polling (`set_polling`). While paused, workers make no RX or TX
  // call on any port and leave their inboxes alone; they still run control
  // commands. set_polling(false) stores the flag and waits for every worker
  // to finish the iteration it is in (RCU synchronize), so when it returns no
  // worker is inside a PMD burst call. That is what makes it safe to detach
  // a port's peer: DPDK's memif PMD unmaps the peer's rings from its
  // interrupt thread on disconnect, with no synchronisation with a worker
  // inside rx_burst. Writer: the control thread; readers: workers, once per
  // loop iteration (acquire).
  bool polling() const { return polling_.load(std::memory_order_acquire); }
  // Unavailable, naming the worker, if a worker did not finish its iteration
  // within control.command_timeout_ms (quiesce): the flag stays as asked, but
  // that worker may still be inside a PMD call.
  Status set_polling(bool on);
  // Waits until every running worker has finished the loop iteration it was
  // in when this was called (RCU: each reports a quiescent state once per
  // iteration), up to control.command_timeout_ms. Unavailable, naming the
  // workers that published nothing meanwhile (stuck), if one did not: the
  // control thread never waits on a stuck worker for good. `token` (if not
  // null) receives the grace period's RCU token, for a later
  // rte_rcu_qsbr_check. Control thread.
  Status quiesce(uint64_t* token = nullptr);

  // Control operations (control thread only). JSON in/out, see control_api.cc.
  // With `tree`: this box's node of the ring's multi-rack tree (engine/tree.h).
  Status install_ring(const engine::RingSpec& spec,
                      const std::optional<engine::TreeSpec>& tree = std::nullopt);
  Status remove_ring(uint32_t ring_id);
  // Fault injection (faults.h; faults.cc). set_fault: `ring` nullopt means
  // every installed ring; refused unless faults.enabled. clear_faults: the
  // ring's fault, or every one; returns how many were active.
  Status set_fault(std::optional<uint32_t> ring, FaultKind kind, double fraction,
                   uint32_t duration_ms);
  size_t clear_faults(std::optional<uint32_t> ring);
  Status faults_allowed() const;  // conflict, field faults.enabled, when off
  nlohmann::json faults_json();   // [{"ring", "kind", "fraction", "remaining_ms", "packets"}]
  // One JSON request line -> one JSON reply line. Never throws.
  std::string handle_request(const std::string& line) noexcept;

  // Runs fn on worker w between bursts. Unavailable, naming the worker and
  // its lcore, if the worker does not take the command within
  // control.command_timeout_ms (the command is then cancelled: it never
  // runs), or has not taken an earlier cancelled one yet (no waiting then).
  Status on_worker(unsigned w, std::function<void(Worker&)> fn);
  // Port slot s (0: A, 1: B) as ports.h configures and starts it.
  PortSetup port_setup(unsigned s) const;
  // Worker w's latest publication (Published), asking for a fresh one first
  // and waiting for it up to control.command_timeout_ms; `age_ms` is how old
  // the copy is (0 when fresh). No command: a worker stuck in a PMD call or
  // not taking commands still has its last figures read, and once it has
  // missed one deadline (Worker::unanswered) readers stop waiting for it
  // until it publishes again; `answering` says which. Control thread and
  // DPDK telemetry's thread (Worker::unanswered: a lost update between them
  // only costs one more wait).
  // With `rings`: the rings' figures too (asked for, and waited for, the
  // same way; `age_ms` is then theirs); no allocation once `rings` has
  // max_rings capacity.
  WorkerFigures read_published(unsigned w, double& age_ms, bool* answering = nullptr,
                               std::vector<engine::RingFigures>* rings = nullptr);
  static constexpr unsigned kPublishMs = 1;
  // A busy poll longer than this was preempted or interrupted (WorkerStats::
  // stalls): the data path's own bursts take microseconds. A poll that ran a
  // control command (a ring install allocates) is never counted.
  static constexpr unsigned kStallUs = 100;
  // engine::EngineConfig::forward_unmatched_after (dataplane.cc says why).
  static constexpr unsigned kForwardUnmatchedMs = 1;

  const DataplaneConfig& config() const { return cfg_; }
  uint16_t port_id(unsigned slot) const { return port_ids_[slot]; }
  std::vector<Worker*>& workers() { return workers_; }

 private:
  // Worker side (worker.cc; commands.cc, publication.cc): worker lcores
  // only, but publish() also for a stopped worker (setup, final_report).
  static int worker_main(void* arg);
  // Runs a dequeued command, or frees it if its caller cancelled it.
  static void run_command(Worker& w, Command* c);
  void worker_loop(Worker& w);
  // The idle rule (dataplane.h top): sleeps if the worker has been idle long
  // enough; `now` is this iteration's TSC.
  void idle(Worker& w, bool moved, uint64_t now);
  // The worker's side of Published: the rings' figures too if `rings` or a
  // reader asked for them since the last copy.
  static void publish(Worker& w, uint64_t now, bool rings = false);

  // setup()'s steps, in its order (dataplane.cc).
  Status resolve_control_group();
  Status find_ports();
  Status worker_lcores(std::vector<unsigned>& lcores) const;
  Status create_pool();
  Status configure_ports(unsigned nw, uint16_t nrxq[2], uint16_t ntxq[2]);
  engine::EngineConfig engine_config();
  Status add_worker(unsigned i, unsigned lcore, unsigned nw, const uint16_t nrxq[2],
                    const uint16_t ntxq[2]);
  Status apply_test_faults();
  nlohmann::json answer(const std::string& line);  // handle_request's body; may throw
  // One control command each (control_api.cc, whose top lists them): the
  // reply to a request, an error reply for a bad field.
  nlohmann::json cmd_ping(const nlohmann::json& req);
  nlohmann::json cmd_shutdown(const nlohmann::json& req);
  nlohmann::json cmd_install_ring(const nlohmann::json& req);
  nlohmann::json cmd_remove_ring(const nlohmann::json& req);
  nlohmann::json cmd_list_rings(const nlohmann::json& req);
  nlohmann::json cmd_get_ring(const nlohmann::json& req);
  nlohmann::json cmd_stats(const nlohmann::json& req);
  nlohmann::json cmd_status(const nlohmann::json& req);
  nlohmann::json cmd_set_mode(const nlohmann::json& req);
  nlohmann::json cmd_set_polling(const nlohmann::json& req);
  nlohmann::json cmd_set_fault(const nlohmann::json& req);
  nlohmann::json cmd_clear_faults(const nlohmann::json& req);
  nlohmann::json cmd_list_faults(const nlohmann::json& req);
  nlohmann::json rings_json(std::optional<uint32_t> only);  // [ring info], by id
  nlohmann::json control_json() const;                      // the control socket's counters
  // Control-loop work between socket rounds (control thread): drops retired
  // rings whose grace (plus a margin) has passed, and their links.
  void housekeeping();
  // Control-loop work (faults.cc): faults whose time is up or whose ring is
  // gone end, and the table is republished without them.
  void expire_faults();
  void publish_faults();  // builds the FaultTable from faults_ and the installed rings
  // rings.cc: the rings' lifecycle.
  void publish_links(std::unique_ptr<LinkTable> t);
  void final_report(std::FILE* out);

  DataplaneConfig cfg_;
  uint16_t port_ids_[2] = {};
  rte_mempool* pool_ = nullptr;
  std::vector<Worker*> workers_;
  std::atomic<const LinkTable*> links_{nullptr};
  std::unique_ptr<LinkTable> links_owned_;
  // Replaced link tables a stuck worker may still read (quiesce timed out):
  // freed by housekeeping once their grace period has passed. Control only.
  std::vector<std::pair<uint64_t, std::unique_ptr<LinkTable>>> links_deferred_;
  // The grace period quiesce() last gave up on (0: none) and whom it named:
  // until it passes, quiesce fails at once. Control only.
  uint64_t stuck_token_ = 0;
  std::string stuck_who_;
  rte_rcu_qsbr* qsbr_ = nullptr;
  std::atomic<bool> quit_{false};
  std::atomic<Mode> mode_{Mode::aggregate};
  std::atomic<bool> polling_{true};  // see polling()
  bool started_ = false;
  uint64_t publish_cycles_ = 0;  // kPublishMs in TSC cycles (setup)
  // kStallUs in TSC cycles (setup): a busy poll longer is a stall.
  uint64_t stall_threshold_cycles_ = 0;
  std::mutex
      on_worker_mu_;  // one on_worker caller at a time; serializes publishing for stopped workers
  long control_gid_ = -1;                   // control.group resolved by setup(); -1: none
  class ControlSocket* control_ = nullptr;  // while run() serves it (control thread)

  // Which worker owns each ring (installed or retiring) and its links.
  Placement placement_{0};
  // What each installed ring reserved at admission, freed at its removal.
  struct Reservation {
    uint64_t memory;
    uint64_t mbufs;  // most mbufs its cells can hold at once
  };
  std::unordered_map<uint32_t, Reservation> reserved_;
  std::string seconds_left(const Placement::Retiring& r) const;  // "12.3"
  nlohmann::json retiring_json() const;  // [{"id", "worker", "seconds_left"}]
  uint64_t memory_reserved_ = 0;
  uint64_t mbufs_reserved_ = 0;

  // Fault injection (faults.h). Active faults, one per ring, in ring id
  // order; `packets` carries the hits of the tables already replaced.
  // Control only; workers read the published table.
  struct ActiveFault {
    uint32_t ring_id;
    FaultKind kind;
    double fraction;
    std::chrono::steady_clock::time_point until;
    uint64_t until_tsc;
    uint64_t packets = 0;
  };
  std::vector<ActiveFault> faults_;
  std::atomic<const FaultTable*> fault_table_{nullptr};
  std::unique_ptr<FaultTable> fault_owned_;
  // Replaced tables a stuck worker may still read, as links_deferred_.
  std::vector<std::pair<uint64_t, std::unique_ptr<FaultTable>>> faults_deferred_;
  uint64_t fault_generation_ = 0;
};

}  // namespace netreduce::dataplane
