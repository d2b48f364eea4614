// netreduce-dataplane: the DPDK primary process.
//
// Theory of operation
// -------------------
// Two ports form a bump in the wire: what arrives on one leaves on the other.
// Worker lcores poll the ports; the main lcore runs the control socket and
// DPDK telemetry, never the data path.
//
// Ownership. Every ring is owned by exactly one worker: its Engine holds the
// ring's cells and CLT entries, and no other thread touches them. A ring is
// placed on the worker with the fewest rings, unless it shares a link (an
// adjacent-member address pair) with an installed ring, in which case it
// joins that ring's worker, since a link's packets must all meet in one
// engine. A ring sharing links with rings on two different workers is
// refused; a link's owner never changes while a ring uses it (reference
// counts, rings.cc).
//
// Dispatch. NIC RSS spreads packets by 5-tuple, not by ring, so a packet may
// arrive on any worker's queue. The dispatch stage (dispatch.cc, after classify) looks up the
// packet's link (IPv4 src, dst) in the link table: packets of a link owned
// by another worker go to that worker's inbox (an rte_ring, multi-producer /
// single-consumer); everything else is processed where it arrived. With one
// worker the stage is skipped. Devices with fewer queues than workers are
// handled the same way: a worker without an RX queue is fed only through its
// inbox, and a worker without a TX queue on a port hands its output to the
// queue's owner through a TX handoff ring.
//
// Stages, per burst (one file each): rx -> classify (classify.cc: every
// frame parsed once into engine::Frame[]) -> dispatch (dispatch.cc, on that
// parse) -> aggregate (aggregate.cc: one Engine::process_burst call: CLT
// lookup, cells, reduction, ICRC fix-up) -> transmit (transmit.cc: buffered
// per port).
//
// TX flush rule. Buffered packets are sent when a burst's worth is queued,
// and at the end of every loop iteration in which some RX poll returned
// less than a full burst (the queues are drained: waiting would only add
// latency; DPDK l3fwd sends per burst the same way). Only while every poll
// returns a full burst does the 100 us timer bound how long a partial batch
// waits.
//
// Idle rule (adaptive polling, config idle_sleep_max_us / idle_after_us).
// A worker that has moved no packet for idle_after_us sleeps between polls,
// 1 us first and doubling up to idle_sleep_max_us; any packet ends it. So a
// box without traffic leaves its cores to others, traffic that pauses for
// less than idle_after_us never waits, and a burst after a long idle waits
// at most idle_sleep_max_us plus the wake-up on the worker that receives it
// (twice that with several workers, when it is then handed to a sleeping
// owner's inbox or TX queue). Control commands count as work. The worker's
// timer slack is
// set to 1 us so short sleeps are short. Time slept is counted
// (WorkerStats::idle_sleep_ns / idle_sleeps).
//
// Control (ordering contract). The control thread never touches engine
// state. Commands go to a worker through its command ring (SP/SC) and run
// between bursts on that worker, which moves the command's `state` to done
// (release) when finished; the caller waits for it (acquire) until
// control.command_timeout_ms, then cancels the command (CAS queued ->
// cancelled: it will never run, the worker frees it when it dequeues it) and
// answers "unavailable" naming the worker and its lcore. Until that worker
// has dequeued every cancelled command, requests needing it fail at once, so
// one stuck worker costs the control socket one deadline, not one per
// request; requests that need no worker (ping, status) and the other
// workers' traffic go on. A command a worker has started is waited for
// without limit, and so is every worker at shutdown (rte_eal_mp_wait_lcore):
// the two waits no deadline bounds. The link table is an
// immutable object published through `links` (release store). Workers load
// it once per burst (acquire) and report an RCU quiescent state after every
// burst; the control thread frees a replaced table only after its grace
// period (quiesce(), bounded by control.command_timeout_ms; past that,
// housekeeping frees it once rte_rcu_qsbr_check says the grace has passed). Installing: the owner's
// engine gets the ring first, then the link table points at the owner. Removing: the owner's engine
// retires the ring (frees its held mbufs, keeps its connections as a tombstone whose packets are
// dropped) while the link table keeps pointing the ring's links at the owner; after
// rings.retire_grace_ms the engine forgets the tombstone and the control thread drops the links
// (rings.cc).
//
// Counters are per worker, cache-aligned, written only by their worker and
// read through commands, so they are never torn or shared. The data plane's
// own drops are listed once in dataplane/reasons.h (WorkerStats::reasons).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "dataplane/config.h"
#include "dataplane/ports.h"
#include "dataplane/reasons.h"
#include "engine/engine.h"

struct rte_mempool;
struct rte_ring;
struct rte_mbuf;
struct rte_eth_dev_tx_buffer;
struct rte_rcu_qsbr;

namespace netreduce::dataplane {

inline constexpr unsigned kMaxBurst = 256;
inline constexpr unsigned kMaxWorkers = 64;

// (src, dst) address pair of adjacent ring members -> owning worker index.
struct LinkTable {
  std::unordered_map<uint64_t, uint16_t> owner;
  static uint64_t key(uint32_t src, uint32_t dst) { return uint64_t{src} << 32 | dst; }
};

// A piece of control work run on a worker between bursts. Allocated by the
// caller (Dataplane::on_worker, control thread or telemetry); `state` says
// who frees it:
//   queued -> running -> done   the worker ran it; the waiting caller frees it
//   queued -> cancelled         the caller gave up at its deadline and left;
//                               whoever dequeues it next frees it without
//                               running it (run_command)
// A command that has started is always waited for, so `fn` may refer to the
// caller's stack.
struct Command {
  enum State : uint8_t { queued, running, done, cancelled };
  std::function<void(struct Worker&)> fn;
  std::atomic<uint8_t> state{queued};  // caller: queued->cancelled; worker: queued->running->done
};

struct alignas(64) WorkerStats {
  uint64_t rx[2] = {};  // packets received per port (by this worker's queues)
  uint64_t tx[2] = {};  // packets transmitted per port
  uint64_t rx_bytes[2] = {};
  uint64_t tx_bytes[2] = {};
  // The data plane's own drops and oddities per port slot (dataplane/reasons.h
  // says which port each is counted under): reasons[slot][index(Reason)].
  uint64_t reasons[2][kReasonCount] = {};
  uint64_t dispatched = 0;   // handed to another worker
  uint64_t busy_cycles = 0;  // TSC cycles in bursts that moved packets
  uint64_t total_cycles = 0;
  uint64_t busy_polls = 0;     // loop iterations that moved packets, TX handoff or a command
                               // (rx / busy_polls: about the mean RX burst)
  uint64_t idle_sleeps = 0;    // adaptive polling: sleeps taken (dataplane.h, idle rule)
  uint64_t idle_sleep_ns = 0;  // and the time they took (TSC-measured, in ns)
};

// What a worker publishes for the control thread: its WorkerStats and the
// engine's totals. Written only by the worker (Dataplane::publish), read by
// the control thread (Dataplane::read_published) without a command, under a
// sequence counter: the worker makes `seq` odd, copies, makes it even; a
// reader copies and retries if `seq` was odd or moved. The worker never waits
// for a reader, and a reader never stops the worker.
//
// When: every kPublishMs of TSC, after every control command it runs, when it
// stops, and on request: a reader stores its TSC in `asked` and waits (up to
// control.command_timeout_ms) until `tsc` passes it, so a stats reply counts
// every packet handled before the request. A worker that does not answer in
// time leaves its last publication, whose age the reply shows.
//
// The rings' figures (engine::RingFigures, every installed ring's counters
// and cells) are copied only when a reader asks for them (`rings_asked`,
// list_rings / get_ring / telemetry, i.e. a scrape), not every kPublishMs:
// a fixed array, no allocation, under the same `seq`.
struct Figures {
  uint64_t tsc = 0;  // worker's TSC when it copied the rest
  WorkerStats stats;
  engine::ReasonCounters reasons{};
  uint64_t memory = 0;
  uint32_t rings = 0;
  uint32_t retired = 0;
  uint64_t rings_tsc = 0;     // worker's TSC at its last copy of the ring figures (0: none)
  uint32_t ring_figures = 0;  // entries of Published::ring_figures that copy filled
};
struct alignas(64) Published {
  std::atomic<uint32_t> seq{0};  // worker writes; control reads
  Figures f;                     // worker writes (seq odd); control copies (seq even, unchanged)
  // max_rings entries, allocated by setup (Worker::ring_store); the worker
  // writes (seq odd), readers copy f.ring_figures of them (seq even, unchanged).
  engine::RingFigures* ring_figures = nullptr;
  uint32_t ring_capacity = 0;  // setup
};

struct alignas(64) Worker {
  unsigned index = 0;  // 0..workers-1
  unsigned lcore = 0;
  std::unique_ptr<engine::Engine> engine;
  // RX queues this worker polls: (port slot 0/1, queue id).
  std::vector<std::pair<uint16_t, uint16_t>> rxq;
  // TX: own queue per port, or the handoff ring of the queue's owner.
  int txq[2] = {-1, -1};
  rte_ring* tx_handoff_to[2] = {};
  rte_ring* tx_handoff_in[2] = {};  // rings others hand this worker's TX queue
  rte_eth_dev_tx_buffer* txbuf[2] = {};
  rte_ring* inbox = nullptr;  // dispatched packets
  rte_ring* commands = nullptr;
  // Commands a caller gave up on that are still in `commands` (control: +1
  // before cancelling; whoever dequeues one: -1). Non-zero: the worker is not
  // taking commands, and on_worker fails at once instead of waiting again.
  std::atomic<uint32_t> abandoned{0};
  // Test only (NETREDUCE_TEST_IGNORE_COMMANDS, set before start): the worker
  // does not poll `commands` while running, as if stuck.
  bool ignore_commands = false;
  // Test only (NETREDUCE_TEST_STALL_WORKER, set before start): the worker
  // spins doing nothing until the box stops, as if stuck inside a PMD call:
  // no ports, no commands, no publication, no RCU quiescent state.
  bool stall = false;
  WorkerStats stats;
  engine::Sink sink;  // what the engine releases per burst, reused
  // Publication (Published above): the worker's copy, on lines of its own;
  // `asked` on a line of its own too (control writes it, the worker reads it
  // once per loop iteration).
  Published pub;
  std::unique_ptr<engine::RingFigures[]> ring_store;  // pub.ring_figures' storage (setup)
  alignas(64) std::atomic<uint64_t> asked{0};
  // Same line, same writers: a reader wanting the rings' figures stores its
  // TSC here before `asked`; the worker copies them when this passes the
  // last copy's (Figures::rings_tsc).
  std::atomic<uint64_t> rings_asked{0};
  // A reader's `asked` that the worker did not answer within
  // control.command_timeout_ms (0: none). While the worker has published
  // nothing since, readers take its last figures without waiting again.
  // Written and read by readers (control thread, telemetry); not the worker.
  std::atomic<uint64_t> unanswered{0};
  uint64_t published_at = 0;  // worker only: TSC of its last publication
  uint64_t stall_cycles = 0;  // setup: stall_timeout_ms in TSC (RingFigures::stalled_cells)
  uint64_t last_flush = 0;
  uint64_t last_busy = 0;  // TSC of the last iteration that moved packets (idle rule)
  uint32_t sleep_us = 0;   // the idle rule's current step; 0: not sleeping
  // Set (release) once the worker has left its loop and drained its command
  // ring; from then on control callers run commands themselves.
  std::atomic<bool> stopped{false};
};

// The hot-path layout (no line written by two workers): a Worker is
// allocated alone on line boundaries (rte_zmalloc, RTE_CACHE_LINE_SIZE) and
// is written only by its own worker thread, except `stopped` (set once at
// exit); its WorkerStats start a line of their own.
static_assert(alignof(Worker) == 64 && sizeof(Worker) % 64 == 0);
static_assert(alignof(WorkerStats) == 64 && sizeof(WorkerStats) % 64 == 0);
static_assert(offsetof(Worker, stats) % 64 == 0);
static_assert(offsetof(Worker, pub) % 64 == 0 && offsetof(Worker, asked) % 64 == 0);

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
  // a port could not be opened.
  Status run();
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

  // Control operations (control thread only). JSON in/out, see control.cc.
  Status install_ring(const engine::RingSpec& spec);
  Status remove_ring(uint32_t ring_id);
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
  Figures read_published(unsigned w, double& age_ms, bool* answering = nullptr,
                         std::vector<engine::RingFigures>* rings = nullptr);
  static constexpr unsigned kPublishMs = 1;

  const DataplaneConfig& config() const { return cfg_; }
  uint16_t port_id(unsigned slot) const { return port_ids_[slot]; }
  std::vector<Worker*>& workers() { return workers_; }

  // Worker side.
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
  const LinkTable* links() const { return links_.load(std::memory_order_acquire); }
  rte_rcu_qsbr* qsbr() const { return qsbr_; }
  rte_mempool* pool() const { return pool_; }

 private:
  nlohmann::json answer(const std::string& line);  // handle_request's body; may throw
  nlohmann::json control_json() const;             // the control socket's counters
  // Control-loop work between socket rounds (control thread): drops retired
  // rings whose grace (plus a margin) has passed, and their links.
  void housekeeping();
  // rings.cc: placement and lifecycle.
  void publish_links(std::unique_ptr<LinkTable> t);
  void publish_link_use();  // LinkTable from link_use_
  Status place(const engine::RingSpec& spec, unsigned& owner) const;
  std::string rings_in_use() const;  // "installed: 1, 2; retiring: 3"
  void final_report();

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
  std::mutex on_worker_mu_;      // one control caller at a time (control thread, telemetry)
  long control_gid_ = -1;        // control.group resolved by setup(); -1: none
  class ControlSocket* control_ = nullptr;  // while run() serves it (control thread)

  struct RingEntry {
    engine::RingSpec spec;
    unsigned owner;
    uint64_t memory;
    uint64_t mbufs;  // most mbufs its cells can hold at once
  };
  std::unordered_map<uint32_t, RingEntry> rings_;  // installed
  // Removed rings in their grace: their links stay counted until `until`.
  // The same id may appear twice (removed, installed again, removed again).
  struct Retiring {
    engine::RingSpec spec;
    unsigned owner;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Retiring> retiring_;
  std::string seconds_left(const Retiring& r) const;  // "12.3"
  nlohmann::json retiring_json() const;               // [{"id", "worker", "seconds_left"}]
  struct LinkUse {
    uint16_t owner;  // never changes while rings > 0
    uint32_t rings;  // rings (installed or retiring) using the link
  };
  std::unordered_map<uint64_t, LinkUse> link_use_;
  uint64_t memory_reserved_ = 0;
  uint64_t mbufs_reserved_ = 0;
};

// Stage functions (one file each), called by worker_loop. `now` is the TSC
// read once per loop iteration (rdtsc costs ~34 ns on this project's VMs).
// classify.cc: parses each frame once into `frames` (returns how many);
// multi-segment mbufs are transmitted untouched instead.
unsigned classify(Dataplane& dp, Worker& w, rte_mbuf** pkts, unsigned n, engine::Frame* frames);
// dispatch.cc: keeps this worker's frames (compacted in place, count
// returned), hands the rest to their owners' inboxes.
unsigned dispatch(Dataplane& dp, Worker& w, engine::Frame* frames, unsigned n);
// aggregate.cc: the burst through the engine; queues what leaves.
void aggregate(Dataplane& dp, Worker& w, const engine::Frame* frames, unsigned n, uint64_t now);
// forward.cc: the forward-only mode: every packet to the other port.
void forward(Dataplane& dp, Worker& w, rte_mbuf** pkts, unsigned n);
// transmit.cc: queue one packet for the port opposite to `in_slot`; flush.
void transmit(Dataplane& dp, Worker& w, rte_mbuf* m, unsigned in_slot);
// flush: first takes what other workers handed to this worker's TX queues
// (returns how many: they count as work for the idle rule, or a TX-queue
// owner without RX traffic would sleep while others hand it packets), then
// sends the TX buffers if `force` or 100 us passed.
unsigned flush(Dataplane& dp, Worker& w, bool force, uint64_t now);

}  // namespace netreduce::dataplane
