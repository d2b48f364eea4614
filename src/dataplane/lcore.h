// The lcore side of the data plane: what one worker lcore owns (Worker:
// its queues, engine, counters and publication), what it reads from the
// control thread (LinkTable, Command), and the stages of its burst loop.
//
// The lcore context (Lcore) is everything a stage reads besides its burst,
// handed to it explicitly: stages never see the Dataplane. worker_loop
// (worker.cc) builds one per worker when the worker starts; only that
// worker reads it. Who writes and who reads each shared field is said beside
// it; the ordering contract between the control thread and the workers is
// in dataplane.h.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dataplane/link_table.h"
#include "dataplane/reasons.h"
#include "engine/engine.h"

struct rte_mempool;
struct rte_ring;
struct rte_mbuf;
struct rte_eth_dev_tx_buffer;

namespace netreduce::dataplane {

struct FaultTable;  // faults.h

inline constexpr unsigned kMaxBurst = 256;
inline constexpr unsigned kMaxWorkers = 64;

// A piece of control work run on a worker between bursts. Allocated by the
// caller (Dataplane::on_worker, control thread); `state` says
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
  uint64_t idle_sleeps = 0;    // adaptive polling: sleeps taken (dataplane.h top, step 3)
  uint64_t idle_sleep_ns = 0;  // and the time they took (TSC-measured, in ns)
  // Stalls: busy polls that took longer than kStallUs. A burst of a few dozen
  // packets takes microseconds, so such a poll was preempted or interrupted:
  // the lcore is not isolated. Their cycles and the packets they received
  // are counted apart, so busy_cycles minus stall_cycles over rx minus
  // stall_rx is the cost per packet of an unshared core.
  uint64_t stalls = 0;
  uint64_t stall_cycles = 0;
  uint64_t stall_rx = 0;
};

// What a worker publishes for the control thread: its WorkerStats and the
// engine's totals. Written only by the worker (Dataplane::publish) while it
// runs (before start and after stop by a reader, under on_worker_mu_), read
// by the control thread and DPDK telemetry's thread (Dataplane::read_published)
// without a command, under a
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
struct WorkerFigures {
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
  WorkerFigures f;               // worker writes (seq odd); control copies (seq even, unchanged)
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
  // Publication (Published above): the worker's copy, on lines of its own.
  // The readers' line (asked, rings_asked, unanswered) is next, alone:
  // readers write it, the worker reads `asked` once per loop iteration.
  Published pub;
  std::unique_ptr<engine::RingFigures[]> ring_store;  // pub.ring_figures' storage (setup)
  alignas(64) std::atomic<uint64_t> asked{0};
  // Same line, same writers: a reader wanting the rings' figures stores its
  // TSC here (and in `asked`); the worker copies them when this passes the
  // last copy's (WorkerFigures::rings_tsc).
  std::atomic<uint64_t> rings_asked{0};
  // A reader's `asked` that the worker did not answer within
  // control.command_timeout_ms (0: none). While the worker has published
  // nothing since, readers take its last figures without waiting again.
  // Written and read by readers (control thread, telemetry); not the worker.
  std::atomic<uint64_t> unanswered{0};
  // From here on the worker's own line(s) again.
  alignas(64) uint64_t published_at = 0;  // worker only: TSC of its last publication
  uint64_t stall_cycles = 0;  // setup: stall_timeout_ms in TSC (RingFigures::stalled_cells)
  uint64_t last_flush = 0;
  uint64_t last_busy = 0;  // TSC of the last iteration that moved packets (idle rule)
  uint32_t sleep_us = 0;   // the idle rule's current step; 0: not sleeping
  // Fault injection (faults.h): the PRNG state and the generation of the
  // table it was seeded for.
  uint64_t fault_rng = 0;
  uint64_t fault_generation = 0;
  // Set (release) once the worker has left its loop and drained its command
  // ring; from then on control callers run commands themselves.
  std::atomic<bool> stopped{false};
};

// The hot-path layout (no line written by two workers): a Worker is
// allocated alone on line boundaries (rte_zmalloc, RTE_CACHE_LINE_SIZE) and
// is written only by its own worker thread, except the readers' line
// (asked, rings_asked, unanswered: readers write, the worker reads) and
// `stopped` (set once at exit); its WorkerStats start a line of their own.
static_assert(alignof(Worker) == 64 && sizeof(Worker) % 64 == 0);
static_assert(alignof(WorkerStats) == 64 && sizeof(WorkerStats) % 64 == 0);
static_assert(offsetof(Worker, stats) % 64 == 0);
static_assert(offsetof(Worker, pub) % 64 == 0 && offsetof(Worker, asked) % 64 == 0);
static_assert(offsetof(Worker, published_at) >= offsetof(Worker, asked) + 64 &&
              offsetof(Worker, unanswered) < offsetof(Worker, asked) + 64);

// The lcore context (see the top of this file). Built by worker_loop when
// the worker starts; the worker only reads it.
struct Lcore {
  Worker& w;                         // this lcore's worker
  uint16_t port_id[2] = {};          // port slot (0: A, 1: B) -> DPDK port id
  Worker* const* workers = nullptr;  // every worker (dispatch: their inboxes)
  unsigned nworkers = 0;
  const std::atomic<const LinkTable*>* links;  // control publishes (release), stages load
  // Active faults (faults.h; nullptr: none): control publishes (release).
  const std::atomic<const FaultTable*>* faults = nullptr;
  rte_mempool* pool = nullptr;  // the packet pool (a duplicate's copy)

  unsigned slot_of(uint16_t port) const noexcept { return port == port_id[0] ? 0 : 1; }
  // The link table, loaded once per burst (acquire); RCU: valid until this
  // worker's next quiescent state.
  const LinkTable* link_table() const noexcept { return links->load(std::memory_order_acquire); }
  // The fault table, loaded once per burst (acquire); RCU as link_table().
  const FaultTable* fault_table() const noexcept { return faults->load(std::memory_order_acquire); }
};

// Stage functions (one file each), called by worker_loop. `now` is the TSC
// read once per loop iteration (rdtsc costs ~34 ns on this project's VMs).
// classify.cc: parses each frame once into `frames` (returns how many);
// multi-segment mbufs are transmitted untouched instead.
unsigned classify(Lcore& lc, rte_mbuf** pkts, unsigned n, engine::Frame* frames);
// dispatch.cc: keeps this worker's frames (compacted in place, count
// returned), hands the rest to their owners' inboxes.
unsigned dispatch(Lcore& lc, engine::Frame* frames, unsigned n);
// aggregate.cc: the burst through the engine; queues what leaves.
void aggregate(Lcore& lc, const engine::Frame* frames, unsigned n, uint64_t now);
// faults.cc: inject_faults (faults.h), between classify and dispatch while
// a fault is active.
// forward.cc: the forward-only mode: every packet to the other port.
void forward(Lcore& lc, rte_mbuf** pkts, unsigned n);
// transmit.cc: queue one packet for the port opposite to `in_slot`; flush.
void transmit(Lcore& lc, rte_mbuf* m, unsigned in_slot);
// flush: first takes what other workers handed to this worker's TX queues
// (returns how many: they count as work for the idle rule, or a TX-queue
// owner without RX traffic would sleep while others hand it packets), then
// sends the TX buffers if `force` or 100 us passed.
unsigned flush(Lcore& lc, bool force, uint64_t now);

}  // namespace netreduce::dataplane
