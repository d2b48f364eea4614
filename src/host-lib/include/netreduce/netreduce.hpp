// libnetreduce, C++ API: all-reduce (and broadcast, all-gather,
// reduce-scatter, reduce, barrier) for data-parallel training over RoCEv2,
// through the netreduce box when there is one, as a plain ring otherwise.
//
// Example: P = 3 ranks, each with float g[4]; rank 0 listens at 10.0.0.1.
//   std::unique_ptr<netreduce::Communicator> comm;
//   netreduce::Error e = netreduce::Communicator::create(
//       r, 3, "", -1, "10.0.0.1:29500", netreduce::Options{}, comm);
//   e = comm->allreduce(g, g, 4, netreduce::DataType::fp32, netreduce::Op::sum);
// create() connects an RC QP to rank r + 1 mod 3 and accepts one from
// r - 1, exchanging QP numbers through a TCP rendezvous at the bootstrap
// address. Rank 0 registers the job's ring with the daemon
// (NETREDUCE_DAEMON), which gives it a credential and a lease that it renews
// while comm lives, and tells every rank the path: Path::ina (the box sums:
// each rank writes each message once and receives the sum from its
// predecessor's QP) or Path::ring (no box, the daemon unreachable or
// refusing: reduce-scatter + all-gather over the same QPs; path_reason()
// says why). Then every rank's g holds g0 + g1 + g2, summed in rank order
// per element on the INA path.
// Options::rings = R stripes each tensor over R rings, Options::local_size
// = n shares one all-reduce among the n ranks of a host:
// docs/host-library.md#several-rings-striping,
// docs/host-library.md#local-ranks-parallel-netreduce,
// docs/design.md#parallel-rings.
//
// The other collectives are each one all-reduce, so they take its path,
// deadlines and failover (on the ring path without local ranks, all-gather
// and reduce-scatter are the classic ring algorithms); broadcast and
// all-gather are bit-exact for every dtype: docs/host-library.md#collectives.
//
// Errors are values, never exceptions. Every wait has a deadline; on expiry
// the error names the peer rank, the message id and what was missing.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace netreduce {

// Wire values of the INA header (src/wire/ina.h), but avg: a sum on the
// wire, then every element divided by world() on the rank, in the element's
// type (floats rounded to nearest even, integers truncated toward zero as C
// divides): docs/host-library.md#averages-and-pre-multiplied-sums.
enum class DataType : uint8_t { fp32 = 1, fp16 = 2, bf16 = 3, int32 = 4, int64 = 5, fp64 = 6 };
enum class Op : uint8_t { sum = 1, min = 2, max = 3, avg = 4 };
enum class Path : uint8_t { ina, ring };

size_t element_size(DataType t) noexcept;  // 0 for an invalid value
const char* to_string(DataType t) noexcept;
const char* to_string(Op o) noexcept;
const char* to_string(Path p) noexcept;

// Which collective a call is (statistics, the path choice).
enum class CallKind : uint8_t {
  all_reduce,
  broadcast,
  all_gather,
  reduce_scatter,
  reduce,
  barrier
};
inline constexpr int kCallKinds = 6;
const char* to_string(CallKind k) noexcept;

// How a call picks its path while the box is up (Options::path_choice).
enum class PathChoice : uint8_t { model, ina, ring };
const char* to_string(PathChoice c) noexcept;

// What a finished call did (AllreduceHandle::record()).
struct CallRecord {
  Path path = Path::ring;  // the path it ran on
  uint32_t steps = 0;  // dependent network steps: 1 through the box, P - 1 or 2(P - 1) on the ring
  uint64_t bytes_sent = 0;  // data bytes this rank wrote onto the wire
};

// The cost model's figures of the job's links (Communicator::links()).
struct LinkFigures {
  double alpha_us = 0;  // one network step's latency (a ring hop)
  double gbps = 0;      // one rank's link bandwidth
  double box_us = 0;    // the box's own latency per pass, beyond a hop
  bool measured = false;
};

enum class ErrorCode : int {
  ok = 0,
  invalid_argument = 1,  // bad argument (the message names it)
  no_device = 2,         // no RDMA device, or the named one does not exist
  timeout = 3,           // a deadline expired (names the peer, message id, what was missing)
  transport = 4,         // QP/CQ error, a work completion with an error status
  bootstrap = 5,         // TCP rendezvous failed
  internal = 6,
};
const char* to_string(ErrorCode c) noexcept;

struct Error {
  ErrorCode code = ErrorCode::ok;
  std::string message;
  bool ok() const noexcept { return code == ErrorCode::ok; }
  explicit operator bool() const noexcept { return !ok(); }  // true when there is an error
  static Error make(ErrorCode c, std::string m) { return {c, std::move(m)}; }
};

struct Options {
  // Messages of the INA path: msg_len packets of payload_bytes (the RoCE path
  // MTU: 256..4096); the first packet carries the 24-byte INA header.
  uint16_t msg_len = 4;
  uint16_t payload_bytes = 1024;
  // Window N of rule W (docs/design.md#cells-and-the-window-rule). 0:
  // estimated from the bandwidth-delay product link_gbps x rtt_us over the
  // message size, clamped to [2, 64].
  uint16_t window = 0;
  double link_gbps = 25.0;
  double rtt_us = 10.0;
  // Ring id registered with the daemon. 0 (default): derived from the
  // bootstrap address, the members and a random per-run nonce, so two
  // communicators of one job, or a relaunch, never share an id; an id
  // another job holds (409) is replaced by a fresh one, up to 3 tries. An
  // explicit id that another job holds means the ring path, with the
  // daemon's reason in path_reason().
  uint32_t ring_id = 0;
  // Lease of the ring at the daemon, ms: rank 0 renews it every lease_ms / 3
  // while the communicator lives; if the job dies, the daemon removes the
  // ring lease_ms after the last renewal. 0: no lease (the ring stays until
  // the communicator is destroyed or an operator deletes it).
  uint32_t lease_ms = 30000;
  // true (default): rank 0 deletes its ring when the communicator is
  // destroyed. false: it only stops renewing, and the ring stays until its
  // lease runs out (to read the ring's counters after the job, as the
  // system tests do).
  bool delete_ring_at_close = true;
  // Daemon URL and token; empty = from NETREDUCE_DAEMON, NETREDUCE_TOKEN,
  // NETREDUCE_TOKEN_FILE. No daemon URL at all = no box: ring path.
  std::string daemon;
  std::string token;
  bool force_ring = false;  // never use the box
  // Deadlines, milliseconds: bootstrap and connection set-up; the daemon's
  // answer; one collective (the default when a call passes none).
  int connect_timeout_ms = 30000;
  int daemon_timeout_ms = 3000;
  int op_timeout_ms = 30000;
  // Receive buffer of the ring path (and at least the INA window): the ring
  // path moves tensors in segments that fit in it.
  size_t ring_buffer_bytes = 4u << 20;
  // Verbs: port number, and the local IPv4 to put in the ring when the GID
  // is not IPv4-mapped (empty = from the GID).
  uint8_t port = 1;
  // RC retransmission timeout exponent: 4.096 us x 2^qp_timeout (14 = 67 ms,
  // as NCCL_IB_TIMEOUT). Raise it where ACKs are slow (emulated endpoints)
  // to avoid spurious go-back-N retransmissions. The retry count is 6: a QP
  // whose peer vanished errors out after 7 timeouts without progress.
  uint8_t qp_timeout = 14;
  std::string ipv4;
  // Rings side by side (striping; see the top of this file), 1..8. 0
  // (default): the box's worker count (capped at 8; the box spreads a job's
  // rings over its workers by their QPs), 1 without a box or with
  // force_ring. Rank 0 decides and every rank must
  // give the same value. With an explicit ring_id, ring
  // i registers id ring_id + i; derived ids are derived per ring.
  unsigned rings = 0;
  // Parallel NetReduce: this rank's place among the ranks of its host. -1
  // (default): discovered through the bootstrap (ranks with the same host
  // identity are one host; local ranks numbered in global rank order). Every
  // host must run the same number of ranks; explicit local ranks must be
  // 0..local_size-1 once each per host (all of a host's ranks give one, or
  // none). local_size 1 is the plain communicator, byte for byte. Over
  // verbs each local rank is a process with its own QPs (one RC pair per
  // stripe of its ring); several ranks started on one machine with the
  // default -1 are one host's local ranks (give host_id to make them hosts).
  int local_rank = -1;
  int local_size = -1;
  // The host identity; empty: NETREDUCE_HOST_ID, else
  // /proc/sys/kernel/random/boot_id + "/" + hostname. Tests set it to run
  // several "hosts" on one machine.
  std::string host_id;
  // After a failover (an INA call finished on the ring path: failovers()),
  // the ranks try the box again after this many calls: a probe all-reduce
  // through it, and the INA path again if every rank's is sealed and right.
  // Each failed try doubles the wait, up to 64 x this. 0: stay on the ring
  // path.
  uint32_t failback_calls = 64;
  // The job's identity at the bootstrap; empty: NETREDUCE_JOB_KEY, else
  // none. Every rank of a job gives the same key (any string; e.g. a random
  // one rank 0 hands out through the launcher, as netreduce.torch does), so
  // rank 0 refuses another job's ranks that reach its address (a leftover of
  // an earlier run, a job given the same port) instead of mixing the two.
  std::string job_key;
  // How each call picks its path while the box is up: ina (default) sends
  // every call through the box; model asks the cost model for the faster
  // of the box's single pass and the ring algorithms
  // (docs/host-library.md#the-path-of-each-call); ring runs every call on
  // the ring (the box forwards it; with local ranks, the stage across the
  // hosts). Without a box, after a failover, and with local ranks for
  // model, calls take the communicator's path(). Every rank must give the
  // same value.
  PathChoice path_choice = PathChoice::ina;
  // The model's figures: with path_choice model, measured at create on the
  // job's own links (rank 0's measurement, shared) when true; else (and for
  // the other choices) alpha = rtt_us / 2, link_gbps and box_us.
  bool measure_links = true;
  double box_us = 1.0;
  // The ring's order. rack: this rank's rack (any label; empty:
  // NETREDUCE_RACK, else the box's fabric's rack of this rank's address,
  // else none): the ring visits each rack's ranks one after the other,
  // racks in the order of their lowest rank, so it crosses each rack
  // boundary once. ring_order: rank 0's pins it instead (empty:
  // NETREDUCE_RING_ORDER, else by rack), every rank 0..world-1 once,
  // comma-separated (with local ranks, hosts by their lowest rank's place).
  // rank() stays the rank given to create; the box reduces in ring order
  // (docs/host-library.md#the-order-of-the-ring).
  std::string rack;
  std::string ring_order;
  // Rina mode (also NETREDUCE_RINA=1; every rank alike): for a job whose
  // racks do not all have a box. Each rack whose label is a leaf of the
  // box's fabric reduces through its box, a ring runs across the racks and
  // the ranks without one, and the rack spreads the result
  // (docs/multi-rack.md#rina-mode-in-a-job). Every collective made of
  // all-reduces takes that way, each stage with op_timeout_ms; path() is
  // ring, last_call() the rack stage's path, failovers() the rack
  // stage's. ring_id is not used. Not with local ranks.
  bool rina = false;
};

class AllreduceHandle;

// A rendezvous the caller already has, in place of create()'s TCP bootstrap
// (libnetreduce-mpi runs it over the MPI communicator). allgather gives every
// rank's blob to every rank, in rank order (all.size() == world), or fails.
// Every rank calls it in the same order: a few times in create(), and later
// wherever the TCP bootstrap would be used: a failover's exchange (on the
// communicator's progress thread, while one of its calls is waited for) and
// the closing exchange (in the destructor, on the destroying thread). It must
// stay callable until the communicator is destroyed, and return by the
// deadline it is given (a rank that never joins is a timeout error, as over
// TCP). Local ranks and Rina mode still open their own TCP rendezvous, at
// the address of the rank's GID.
struct Rendezvous {
  std::function<Error(const std::string& mine, std::vector<std::string>& all,
                      std::chrono::steady_clock::time_point deadline)>
      allgather;
  std::string name;  // the job's name (seeds the ring id as a bootstrap address does)
};

class Communicator {
 public:
  struct Impl;

  // Creates the communicator over rdma-core verbs. device empty = the first
  // RDMA device. Fails with ErrorCode::no_device when there is none.
  static Error create(int rank, int world, const std::string& device, int gid_index,
                      const std::string& bootstrap, const Options& options,
                      std::unique_ptr<Communicator>& out);
  // The same over a rendezvous the caller has (Rendezvous above).
  static Error create(int rank, int world, const std::string& device, int gid_index,
                      const Rendezvous& rendezvous, const Options& options,
                      std::unique_ptr<Communicator>& out);

  explicit Communicator(std::unique_ptr<Impl> impl);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // recv may equal send (in place). count elements of type t. timeout_ms < 0:
  // Options::op_timeout_ms. Every rank must make the same calls in the same
  // order with the same count, type and op.
  Error allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                  int timeout_ms = -1);
  // Starts the all-reduce on the communicator's progress thread; the buffers
  // must stay valid until the handle reports completion. Calls run in order.
  Error allreduce_async(const void* send, void* recv, size_t count, DataType t, Op op,
                        AllreduceHandle& handle, int timeout_ms = -1);

  // The other collectives, in the same queue as all-reduce (every rank makes
  // the same calls in the same order with the same counts, type, op, root).
  // Each is one all-reduce, or on the ring path without local ranks the
  // classic ring all-gather or reduce-scatter
  // (docs/host-library.md#collectives); root is a rank of world(), count is
  // per rank.
  // broadcast: the root's count elements of buf into every rank's buf,
  // bit-exact.
  Error broadcast(void* buf, size_t count, DataType t, int root, int timeout_ms = -1);
  Error broadcast_async(void* buf, size_t count, DataType t, int root, AllreduceHandle& handle,
                        int timeout_ms = -1);
  // all_gather: recv (world() x count elements) gets rank r's count
  // elements of send at r x count, bit-exact. send may be recv + rank() x
  // count elements (in place).
  Error all_gather(const void* send, void* recv, size_t count, DataType t, int timeout_ms = -1);
  Error all_gather_async(const void* send, void* recv, size_t count, DataType t,
                         AllreduceHandle& handle, int timeout_ms = -1);
  // reduce_scatter: send holds world() x recv_count elements; recv gets
  // elements [rank() x recv_count, + recv_count) of their reduction (as
  // all-reduce computes it; on the ring path without local ranks, folded
  // from rank() + 1 round to rank()). recv may lie inside send.
  Error reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                       int timeout_ms = -1);
  Error reduce_scatter_async(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                             AllreduceHandle& handle, int timeout_ms = -1);
  // reduce: the reduction of send into the root's recv (recv unused, may be
  // null, on the other ranks).
  Error reduce(const void* send, void* recv, size_t count, DataType t, Op op, int root,
               int timeout_ms = -1);
  Error reduce_async(const void* send, void* recv, size_t count, DataType t, Op op, int root,
                     AllreduceHandle& handle, int timeout_ms = -1);
  // Pre-multiplied sums (NCCL's ncclRedOpCreatePreMulSum): every rank's
  // send multiplied by `factor` in the element's type, then the sum, as
  // allreduce / reduce_scatter with Op::sum compute it. A factor the type
  // cannot use as given (NaN, infinity, past float's range for fp32, fp16
  // and bf16, not an integer of the type for int32 and int64) is refused
  // with invalid_argument: docs/host-library.md#averages-and-pre-multiplied-sums.
  Error allreduce_premul(const void* send, void* recv, size_t count, DataType t, double factor,
                         int timeout_ms = -1);
  Error allreduce_premul_async(const void* send, void* recv, size_t count, DataType t,
                               double factor, AllreduceHandle& handle, int timeout_ms = -1);
  Error reduce_scatter_premul(const void* send, void* recv, size_t recv_count, DataType t,
                              double factor, int timeout_ms = -1);
  Error reduce_scatter_premul_async(const void* send, void* recv, size_t recv_count, DataType t,
                                    double factor, AllreduceHandle& handle, int timeout_ms = -1);
  // barrier: returns once every rank called it (checked: their count must be
  // world()).
  Error barrier(int timeout_ms = -1);
  Error barrier_async(AllreduceHandle& handle, int timeout_ms = -1);
  // The same with this call's own path choice in place of
  // Options::path_choice (every rank must pass the same). PathChoice::ring
  // waits for ranks any distance apart, up to the deadline, where a barrier
  // through the box fails once the first and the last rank enter it further
  // apart than the RC retransmission budget
  // (docs/host-library.md#deadlines-and-errors).
  Error barrier(PathChoice path, int timeout_ms = -1);
  Error barrier_async(PathChoice path, AllreduceHandle& handle, int timeout_ms = -1);

  int rank() const noexcept;
  int world() const noexcept;
  // The path calls take now, and why: the path chosen at create until an
  // INA call fails and is finished on the ring path (a failover), then the
  // ring path with that failover's reason (valid while the communicator
  // lives).
  Path path() const noexcept;
  const std::string& path_reason() const noexcept;
  int failovers() const noexcept;     // INA calls finished on the ring path so far
  uint32_t ring_id() const noexcept;  // ring 0's
  uint16_t window() const noexcept;
  int rings() const noexcept;                 // rings (stripes) per call
  uint32_t ring_id(int ring) const noexcept;  // ring i's id at the box; 0 on the ring path
  int local_rank() const noexcept;            // 0 without local ranks
  int local_size() const noexcept;            // local ranks per host (1: none)
  int host() const noexcept;                  // host index (rank on the ring across hosts)
  // Calls of one kind that finished on one path so far, and what the last
  // call that finished without an error did.
  uint64_t calls(CallKind k, Path p) const noexcept;
  CallRecord last_call() const noexcept;
  // The cost model's figures (Options::measure_links).
  const LinkFigures& links() const noexcept;

  Impl& impl() noexcept { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The handle of any asynchronous collective (not only all-reduce).
class AllreduceHandle {
 public:
  struct State;
  AllreduceHandle() = default;
  explicit AllreduceHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // Waits up to timeout_ms (< 0: forever; the operation has its own deadline,
  // so this returns). A wait that times out returns ErrorCode::timeout and
  // the operation keeps running: wait again before reusing the buffers.
  Error wait(int timeout_ms = -1);
  // True once the operation finished; error (if finished) in *result.
  bool test(Error* result = nullptr);
  bool valid() const noexcept { return state_ != nullptr; }
  Path path() const noexcept;
  // What the call did, once it finished without an error (else a default
  // record).
  CallRecord record() const noexcept;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace netreduce
