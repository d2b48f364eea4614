/* libnetreduce, C API (for bindings): the same communicator as netreduce.hpp.
 *
 * Every function returns an nr_status (0 = NR_OK). On failure the message is
 * available from nr_last_error() (thread-local, valid until the next call
 * on the same thread). No function throws or aborts on bad input.
 */
#ifndef NETREDUCE_NETREDUCE_H
#define NETREDUCE_NETREDUCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  NR_OK = 0,
  NR_ERR_INVALID_ARGUMENT = 1,
  NR_ERR_NO_DEVICE = 2,
  NR_ERR_TIMEOUT = 3,
  NR_ERR_TRANSPORT = 4,
  NR_ERR_BOOTSTRAP = 5,
  NR_ERR_INTERNAL = 6,
  NR_IN_PROGRESS = 7 /* nr_test: not finished yet */
} nr_status;

typedef enum {
  NR_FP32 = 1,
  NR_FP16 = 2,
  NR_BF16 = 3,
  NR_INT32 = 4,
  NR_INT64 = 5,
  NR_FP64 = 6
} nr_dtype;
/* NR_AVG: the sum, then every element divided by the world in its type
   (floats rounded to nearest even, integers truncated toward zero); for
   all-reduce, reduce-scatter and reduce (netreduce.hpp Op). */
typedef enum { NR_SUM = 1, NR_MIN = 2, NR_MAX = 3, NR_AVG = 4 } nr_op;
typedef enum { NR_PATH_INA = 0, NR_PATH_RING = 1 } nr_path;
/* How a call picks its path while the box is up (netreduce.hpp Options). */
typedef enum { NR_CHOICE_MODEL = 0, NR_CHOICE_INA = 1, NR_CHOICE_RING = 2 } nr_path_choice;
/* Which collective a call is (statistics: nr_comm_calls). */
typedef enum {
  NR_CALL_ALL_REDUCE = 0,
  NR_CALL_BROADCAST = 1,
  NR_CALL_ALL_GATHER = 2,
  NR_CALL_REDUCE_SCATTER = 3,
  NR_CALL_REDUCE = 4,
  NR_CALL_BARRIER = 5
} nr_call;

typedef struct nr_comm nr_comm;
typedef struct nr_request nr_request;

/* Options; nr_options_init fills the defaults (see netreduce.hpp Options). */
typedef struct {
  uint16_t msg_len;
  uint16_t payload_bytes;
  uint16_t window; /* 0: bandwidth-delay estimate */
  double link_gbps;
  double rtt_us;
  uint32_t ring_id;   /* 0: derived */
  const char* daemon; /* NULL: NETREDUCE_DAEMON */
  const char* token;  /* NULL: NETREDUCE_TOKEN / NETREDUCE_TOKEN_FILE */
  int force_ring;
  int connect_timeout_ms;
  int daemon_timeout_ms;
  int op_timeout_ms;
  size_t ring_buffer_bytes;
  uint8_t port;
  const char* ipv4;  /* NULL: from the GID */
  uint32_t lease_ms; /* ring lease at the daemon, renewed by rank 0; 0: none */
  /* The layout above and below is the first release's (0.1.0); rings
     took its tail padding (sizeof stayed 104 on LP64). */
  uint8_t qp_timeout;       /* RC retransmission timeout exponent (4.096 us x 2^n) */
  int delete_ring_at_close; /* 0: rank 0 leaves its ring to its lease at close */
  uint32_t rings;           /* rings side by side (striping), 1..8; 0: 1 (netreduce.hpp) */
  /* Past the 104-byte prefix (the size rule below). Parallel NetReduce (netreduce.hpp Options):
     this rank's place among the ranks of its host. */
  int local_rank;      /* -1: discovered; 0..local_size-1 */
  int local_size;      /* -1: discovered; 1: no local ranks */
  const char* host_id; /* NULL: NETREDUCE_HOST_ID, else boot id + hostname */
  /* After a failover: calls before the first try back on the box (doubling
     after each failed try, up to 64 x); 0: stay on the ring path. */
  uint32_t failback_calls;
  const char* job_key; /* NULL: NETREDUCE_JOB_KEY, else none (netreduce.hpp Options) */
  /* The path choice and the cost model's figures (netreduce.hpp Options). */
  int path_choice;   /* nr_path_choice */
  int measure_links; /* 0: alpha = rtt_us / 2, link_gbps and box_us */
  double box_us;
  /* The ring's order (netreduce.hpp Options). */
  const char* rack;       /* NULL or "": NETREDUCE_RACK, else the box's fabric's */
  const char* ring_order; /* NULL or "": NETREDUCE_RING_ORDER, else by rack; rank 0's counts */
} nr_options;

/* ABI rule for nr_options. The struct only grows, at its end, and the
   library must know how much of it a caller has: nr_options_init and
   nr_comm_create below are macros that pass sizeof(nr_options) as the
   caller's header knows it to nr_options_init_sized / nr_comm_create_sized,
   which write or read only that many bytes and take the defaults for the
   fields a shorter struct lacks; a size larger than this library knows
   (a newer header) is refused with NR_ERR_INVALID_ARGUMENT. (A size member
   in the struct cannot do this: a caller whose struct lacks it has none
   for the library to find.) The plain symbols nr_options_init and
   nr_comm_create are exported for binaries that call them directly and
   take the 104-byte struct (the fields up to rings). Bindings call the
   _sized functions with their mirror's size. */
void nr_options_init_sized(nr_options* o, size_t size);
nr_status nr_comm_create_sized(int rank, int world, const char* device, int gid_index,
                               const char* bootstrap, const nr_options* opts, size_t opts_size,
                               nr_comm** out);
void nr_options_init(nr_options* o);
#define nr_options_init(o) nr_options_init_sized((o), sizeof(nr_options))

/* device NULL or "": the first RDMA device. opts NULL: defaults. */
nr_status nr_comm_create(int rank, int world, const char* device, int gid_index,
                         const char* bootstrap, const nr_options* opts, nr_comm** out);
#define nr_comm_create(rank, world, device, gid_index, bootstrap, opts, out)        \
  nr_comm_create_sized((rank), (world), (device), (gid_index), (bootstrap), (opts), \
                       sizeof(nr_options), (out))
void nr_comm_destroy(nr_comm* comm);

/* timeout_ms < 0: the communicator's op_timeout_ms. */
nr_status nr_allreduce(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                       nr_op op, int timeout_ms);
nr_status nr_allreduce_async(nr_comm* comm, const void* send, void* recv, size_t count,
                             nr_dtype dtype, nr_op op, int timeout_ms, nr_request** out);
/* The other collectives (netreduce.hpp: each is one all-reduce, or the
   classic ring all_gather or reduce_scatter on the ring path; root is a
   rank, count per rank). broadcast and all_gather are bit-exact for every
   dtype. all_gather: recv holds world x count elements (send may be recv +
   rank x count elements); reduce_scatter: send holds world x recv_count;
   reduce: recv is used at the root only (may be NULL elsewhere). Their
   requests are waited for, tested and freed as nr_allreduce_async's. */
nr_status nr_broadcast(nr_comm* comm, void* buf, size_t count, nr_dtype dtype, int root,
                       int timeout_ms);
nr_status nr_broadcast_async(nr_comm* comm, void* buf, size_t count, nr_dtype dtype, int root,
                             int timeout_ms, nr_request** out);
nr_status nr_all_gather(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                        int timeout_ms);
nr_status nr_all_gather_async(nr_comm* comm, const void* send, void* recv, size_t count,
                              nr_dtype dtype, int timeout_ms, nr_request** out);
nr_status nr_reduce_scatter(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                            nr_dtype dtype, nr_op op, int timeout_ms);
nr_status nr_reduce_scatter_async(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                                  nr_dtype dtype, nr_op op, int timeout_ms, nr_request** out);
nr_status nr_reduce(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                    nr_op op, int root, int timeout_ms);
nr_status nr_reduce_async(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                          nr_op op, int root, int timeout_ms, nr_request** out);
/* Pre-multiplied sums (netreduce.hpp allreduce_premul): every rank's send
   multiplied by factor in the element's type, then summed. A factor the
   type cannot use as given (NaN, infinity, past float's range for fp32,
   fp16 and bf16, not an integer of the type for int32 and int64) is
   NR_ERR_INVALID_ARGUMENT. */
nr_status nr_allreduce_premul(nr_comm* comm, const void* send, void* recv, size_t count,
                              nr_dtype dtype, double factor, int timeout_ms);
nr_status nr_allreduce_premul_async(nr_comm* comm, const void* send, void* recv, size_t count,
                                    nr_dtype dtype, double factor, int timeout_ms,
                                    nr_request** out);
nr_status nr_reduce_scatter_premul(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                                   nr_dtype dtype, double factor, int timeout_ms);
nr_status nr_reduce_scatter_premul_async(nr_comm* comm, const void* send, void* recv,
                                         size_t recv_count, nr_dtype dtype, double factor,
                                         int timeout_ms, nr_request** out);
nr_status nr_barrier(nr_comm* comm, int timeout_ms);
nr_status nr_barrier_async(nr_comm* comm, int timeout_ms, nr_request** out);
/* A barrier with its own path choice in place of the options' (every rank
   must pass the same): NR_CHOICE_RING waits for ranks any distance apart up
   to the deadline, where one through the box fails once they enter it
   further apart than the RC retransmission budget. */
nr_status nr_barrier_path(nr_comm* comm, nr_path_choice path, int timeout_ms);
nr_status nr_barrier_path_async(nr_comm* comm, nr_path_choice path, int timeout_ms,
                                nr_request** out);

/* Waits up to timeout_ms (< 0: until done). NR_ERR_TIMEOUT: still running. */
nr_status nr_wait(nr_request* req, int timeout_ms);
/* NR_IN_PROGRESS, or the operation's result. */
nr_status nr_test(nr_request* req);
/* Frees a request; it must have finished (nr_wait/nr_test returned its result). */
void nr_request_free(nr_request* req);

/* The path calls take now and why (the reason stays valid while comm
   lives): the one chosen at create, until an INA call fails and is finished
   on the ring path (a failover); then the ring path. */
nr_status nr_comm_path(const nr_comm* comm, nr_path* path, const char** reason);
/* Failovers so far (INA calls finished on the ring path); -1 for a null comm. */
int nr_comm_failovers(const nr_comm* comm);
/* Rings (stripes) the communicator runs; -1 for a null comm. */
int nr_comm_rings(const nr_comm* comm);
int nr_comm_rank(const nr_comm* comm);
/* Parallel NetReduce: local rank and local ranks per host (0 and 1 without;
   -1 for a null comm). */
int nr_comm_local_rank(const nr_comm* comm);
int nr_comm_local_size(const nr_comm* comm);
int nr_comm_world(const nr_comm* comm);
/* The ring id registered with the daemon (0 for a null comm). */
uint32_t nr_comm_ring_id(const nr_comm* comm);
/* Calls of one kind that finished on one path so far (0 for a null comm or
   an invalid kind or path). */
uint64_t nr_comm_calls(const nr_comm* comm, nr_call kind, nr_path path);
/* The cost model's figures (alpha and box in us, bandwidth in Gb/s; any
   pointer may be NULL; measured: 1 if measured at create). */
nr_status nr_comm_links(const nr_comm* comm, double* alpha_us, double* gbps, double* box_us,
                        int* measured);
/* What a finished request did: its path, dependent network steps and data
   bytes this rank sent (any pointer may be NULL). NR_IN_PROGRESS while it
   runs; a failed request's record is empty (steps 0). */
nr_status nr_request_record(nr_request* req, nr_path* path, uint32_t* steps, uint64_t* bytes_sent);

const char* nr_last_error(void);
const char* nr_status_string(nr_status s);

#ifdef __cplusplus
}
#endif

#endif /* NETREDUCE_NETREDUCE_H */
