// The C API: thin wrappers over the C++ Communicator; no exception crosses it.
#include <cstddef>
#include <cstring>
#include <new>
#include <string>

#include "netreduce/netreduce.h"
#include "netreduce/netreduce.hpp"

using netreduce::Error;
using netreduce::ErrorCode;

struct nr_comm {
  std::unique_ptr<netreduce::Communicator> c;
};
struct nr_request {
  netreduce::AllreduceHandle h;
  bool finished = false;
};

namespace {

thread_local std::string g_last_error;

nr_status set(const Error& e) {
  g_last_error = e.message;
  return static_cast<nr_status>(static_cast<int>(e.code));
}
nr_status invalid(std::string msg) {
  g_last_error = std::move(msg);
  return NR_ERR_INVALID_ARGUMENT;
}

// nr_options as binaries built before the size rule (netreduce.h) know it:
// up to `rings`, which took the 0.1.0 layout's tail padding.
constexpr size_t kPreRuleOptionsSize = offsetof(nr_options, local_rank);
static_assert(sizeof(void*) != 8 || kPreRuleOptionsSize == 104);

template <typename F>
nr_status guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    g_last_error = "out of memory";
    return NR_ERR_INTERNAL;
  } catch (const std::exception& e) {
    g_last_error = e.what();
    return NR_ERR_INTERNAL;
  } catch (...) {
    g_last_error = "unknown exception";
    return NR_ERR_INTERNAL;
  }
}

netreduce::DataType dt(nr_dtype t) { return static_cast<netreduce::DataType>(t); }
netreduce::Op op_of(nr_op o) { return static_cast<netreduce::Op>(o); }

// A blocking collective: f(communicator) -> Error.
template <typename F>
nr_status call(nr_comm* comm, F&& f) noexcept {
  return guarded([&]() -> nr_status {
    if (!comm || !comm->c) return invalid("comm: null");
    return set(f(*comm->c));
  });
}

// An asynchronous one: f(communicator, handle) -> Error; *out the request.
template <typename F>
nr_status call_async(nr_comm* comm, nr_request** out, F&& f) noexcept {
  return guarded([&]() -> nr_status {
    if (!out) return invalid("out: null pointer");
    *out = nullptr;
    if (!comm || !comm->c) return invalid("comm: null");
    auto r = std::make_unique<nr_request>();
    if (Error e = f(*comm->c, r->h)) return set(e);
    *out = r.release();
    return NR_OK;
  });
}

}  // namespace

extern "C" {

void nr_options_init_sized(nr_options* o, size_t size) {
  if (!o || size > sizeof(nr_options)) return;
  const netreduce::Options d;
  nr_options v{};
  v.msg_len = d.msg_len;
  v.payload_bytes = d.payload_bytes;
  v.window = d.window;
  v.link_gbps = d.link_gbps;
  v.rtt_us = d.rtt_us;
  v.ring_id = d.ring_id;
  v.daemon = nullptr;
  v.token = nullptr;
  v.force_ring = d.force_ring ? 1 : 0;
  v.connect_timeout_ms = d.connect_timeout_ms;
  v.daemon_timeout_ms = d.daemon_timeout_ms;
  v.op_timeout_ms = d.op_timeout_ms;
  v.ring_buffer_bytes = d.ring_buffer_bytes;
  v.port = d.port;
  v.ipv4 = nullptr;
  v.lease_ms = d.lease_ms;
  v.qp_timeout = d.qp_timeout;
  v.delete_ring_at_close = d.delete_ring_at_close ? 1 : 0;
  v.rings = d.rings;
  v.local_rank = d.local_rank;
  v.local_size = d.local_size;
  v.host_id = nullptr;
  v.failback_calls = d.failback_calls;
  v.job_key = nullptr;
  v.path_choice = static_cast<int>(d.path_choice);
  v.measure_links = d.measure_links ? 1 : 0;
  v.box_us = d.box_us;
  v.rack = nullptr;
  v.ring_order = nullptr;
  std::memcpy(o, &v, size);  // the caller's struct: only the bytes it has
}

void(nr_options_init)(nr_options* o) { nr_options_init_sized(o, kPreRuleOptionsSize); }

nr_status nr_comm_create_sized(int rank, int world, const char* device, int gid_index,
                               const char* bootstrap, const nr_options* opts, size_t opts_size,
                               nr_comm** out) {
  return guarded([&]() -> nr_status {
    if (!out) return invalid("out: null pointer");
    *out = nullptr;
    if (!bootstrap) return invalid("bootstrap: null (expected \"host:port\")");
    if (opts && (opts_size < kPreRuleOptionsSize || opts_size > sizeof(nr_options)))
      return invalid("opts_size: " + std::to_string(opts_size) + " bytes, this library knows " +
                     std::to_string(kPreRuleOptionsSize) + ".." +
                     std::to_string(sizeof(nr_options)) + " (a newer header?)");
    netreduce::Options o;
    if (opts) {
      // The caller's bytes over the defaults: fields it lacks keep theirs.
      nr_options v;
      nr_options_init_sized(&v, sizeof v);
      std::memcpy(&v, opts, opts_size);
      o.msg_len = v.msg_len;
      o.payload_bytes = v.payload_bytes;
      o.window = v.window;
      o.link_gbps = v.link_gbps;
      o.rtt_us = v.rtt_us;
      o.ring_id = v.ring_id;
      o.daemon = v.daemon ? v.daemon : "";
      o.token = v.token ? v.token : "";
      o.force_ring = v.force_ring != 0;
      o.connect_timeout_ms = v.connect_timeout_ms;
      o.daemon_timeout_ms = v.daemon_timeout_ms;
      o.op_timeout_ms = v.op_timeout_ms;
      o.ring_buffer_bytes = v.ring_buffer_bytes;
      o.port = v.port;
      o.ipv4 = v.ipv4 ? v.ipv4 : "";
      o.lease_ms = v.lease_ms;
      o.qp_timeout = v.qp_timeout;
      o.delete_ring_at_close = v.delete_ring_at_close != 0;
      o.rings = v.rings;
      o.local_rank = v.local_rank;
      o.local_size = v.local_size;
      o.host_id = v.host_id ? v.host_id : "";
      o.failback_calls = v.failback_calls;
      o.job_key = v.job_key ? v.job_key : "";
      if (v.path_choice < NR_CHOICE_MODEL || v.path_choice > NR_CHOICE_RING)
        return invalid("path_choice: " + std::to_string(v.path_choice) +
                       " is not an nr_path_choice (0..2)");
      o.path_choice = static_cast<netreduce::PathChoice>(v.path_choice);
      o.measure_links = v.measure_links != 0;
      o.box_us = v.box_us;
      o.rack = v.rack ? v.rack : "";
      o.ring_order = v.ring_order ? v.ring_order : "";
    }
    auto c = std::make_unique<nr_comm>();
    const Error e = netreduce::Communicator::create(rank, world, device ? device : "", gid_index,
                                                    bootstrap, o, c->c);
    if (!e.ok()) return set(e);
    *out = c.release();
    return NR_OK;
  });
}

nr_status(nr_comm_create)(int rank, int world, const char* device, int gid_index,
                          const char* bootstrap, const nr_options* opts, nr_comm** out) {
  return nr_comm_create_sized(rank, world, device, gid_index, bootstrap, opts, kPreRuleOptionsSize,
                              out);
}

void nr_comm_destroy(nr_comm* comm) {
  try {
    delete comm;
  } catch (...) {
  }
}

nr_status nr_allreduce(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                       nr_op op, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.allreduce(send, recv, count, dt(dtype), op_of(op), timeout_ms);
  });
}

nr_status nr_allreduce_async(nr_comm* comm, const void* send, void* recv, size_t count,
                             nr_dtype dtype, nr_op op, int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.allreduce_async(send, recv, count, dt(dtype), op_of(op), h, timeout_ms);
  });
}

nr_status nr_broadcast(nr_comm* comm, void* buf, size_t count, nr_dtype dtype, int root,
                       int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.broadcast(buf, count, dt(dtype), root, timeout_ms);
  });
}

nr_status nr_broadcast_async(nr_comm* comm, void* buf, size_t count, nr_dtype dtype, int root,
                             int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.broadcast_async(buf, count, dt(dtype), root, h, timeout_ms);
  });
}

nr_status nr_all_gather(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                        int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.all_gather(send, recv, count, dt(dtype), timeout_ms);
  });
}

nr_status nr_all_gather_async(nr_comm* comm, const void* send, void* recv, size_t count,
                              nr_dtype dtype, int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.all_gather_async(send, recv, count, dt(dtype), h, timeout_ms);
  });
}

nr_status nr_reduce_scatter(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                            nr_dtype dtype, nr_op op, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.reduce_scatter(send, recv, recv_count, dt(dtype), op_of(op), timeout_ms);
  });
}

nr_status nr_reduce_scatter_async(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                                  nr_dtype dtype, nr_op op, int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.reduce_scatter_async(send, recv, recv_count, dt(dtype), op_of(op), h, timeout_ms);
  });
}

nr_status nr_reduce(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                    nr_op op, int root, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.reduce(send, recv, count, dt(dtype), op_of(op), root, timeout_ms);
  });
}

nr_status nr_reduce_async(nr_comm* comm, const void* send, void* recv, size_t count, nr_dtype dtype,
                          nr_op op, int root, int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.reduce_async(send, recv, count, dt(dtype), op_of(op), root, h, timeout_ms);
  });
}

nr_status nr_allreduce_premul(nr_comm* comm, const void* send, void* recv, size_t count,
                              nr_dtype dtype, double factor, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.allreduce_premul(send, recv, count, dt(dtype), factor, timeout_ms);
  });
}

nr_status nr_allreduce_premul_async(nr_comm* comm, const void* send, void* recv, size_t count,
                                    nr_dtype dtype, double factor, int timeout_ms,
                                    nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.allreduce_premul_async(send, recv, count, dt(dtype), factor, h, timeout_ms);
  });
}

nr_status nr_reduce_scatter_premul(nr_comm* comm, const void* send, void* recv, size_t recv_count,
                                   nr_dtype dtype, double factor, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.reduce_scatter_premul(send, recv, recv_count, dt(dtype), factor, timeout_ms);
  });
}

nr_status nr_reduce_scatter_premul_async(nr_comm* comm, const void* send, void* recv,
                                         size_t recv_count, nr_dtype dtype, double factor,
                                         int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.reduce_scatter_premul_async(send, recv, recv_count, dt(dtype), factor, h, timeout_ms);
  });
}

nr_status nr_barrier(nr_comm* comm, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) { return c.barrier(timeout_ms); });
}

nr_status nr_barrier_async(nr_comm* comm, int timeout_ms, nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.barrier_async(h, timeout_ms);
  });
}

nr_status nr_barrier_path(nr_comm* comm, nr_path_choice path, int timeout_ms) {
  return call(comm, [&](netreduce::Communicator& c) {
    return c.barrier(static_cast<netreduce::PathChoice>(path), timeout_ms);
  });
}

nr_status nr_barrier_path_async(nr_comm* comm, nr_path_choice path, int timeout_ms,
                                nr_request** out) {
  return call_async(comm, out, [&](netreduce::Communicator& c, netreduce::AllreduceHandle& h) {
    return c.barrier_async(static_cast<netreduce::PathChoice>(path), h, timeout_ms);
  });
}

nr_status nr_wait(nr_request* req, int timeout_ms) {
  return guarded([&]() -> nr_status {
    if (!req) return invalid("request: null");
    const Error e = req->h.wait(timeout_ms);
    if (req->h.test()) req->finished = true;
    return set(e);
  });
}

nr_status nr_test(nr_request* req) {
  return guarded([&]() -> nr_status {
    if (!req) return invalid("request: null");
    Error e;
    if (!req->h.test(&e)) return NR_IN_PROGRESS;
    req->finished = true;
    return set(e);
  });
}

void nr_request_free(nr_request* req) {
  if (!req) return;
  // A running request would be written to after the free: wait for it.
  if (!req->finished) (void)req->h.wait(-1);
  delete req;
}

nr_status nr_comm_path(const nr_comm* comm, nr_path* path, const char** reason) {
  if (!comm || !comm->c) return invalid("comm: null");
  if (path) *path = comm->c->path() == netreduce::Path::ina ? NR_PATH_INA : NR_PATH_RING;
  if (reason) *reason = comm->c->path_reason().c_str();
  return NR_OK;
}

int nr_comm_rank(const nr_comm* comm) { return comm && comm->c ? comm->c->rank() : -1; }
int nr_comm_world(const nr_comm* comm) { return comm && comm->c ? comm->c->world() : -1; }
uint32_t nr_comm_ring_id(const nr_comm* comm) { return comm && comm->c ? comm->c->ring_id() : 0; }
int nr_comm_rings(const nr_comm* comm) { return comm && comm->c ? comm->c->rings() : -1; }
int nr_comm_failovers(const nr_comm* comm) { return comm && comm->c ? comm->c->failovers() : -1; }
int nr_comm_local_rank(const nr_comm* comm) { return comm && comm->c ? comm->c->local_rank() : -1; }
int nr_comm_local_size(const nr_comm* comm) { return comm && comm->c ? comm->c->local_size() : -1; }

uint64_t nr_comm_calls(const nr_comm* comm, nr_call kind, nr_path path) {
  if (!comm || !comm->c || kind < NR_CALL_ALL_REDUCE || kind > NR_CALL_BARRIER ||
      (path != NR_PATH_INA && path != NR_PATH_RING))
    return 0;
  return comm->c->calls(static_cast<netreduce::CallKind>(kind),
                        path == NR_PATH_INA ? netreduce::Path::ina : netreduce::Path::ring);
}

nr_status nr_comm_links(const nr_comm* comm, double* alpha_us, double* gbps, double* box_us,
                        int* measured) {
  if (!comm || !comm->c) return invalid("comm: null");
  const netreduce::LinkFigures& f = comm->c->links();
  if (alpha_us) *alpha_us = f.alpha_us;
  if (gbps) *gbps = f.gbps;
  if (box_us) *box_us = f.box_us;
  if (measured) *measured = f.measured ? 1 : 0;
  return NR_OK;
}

nr_status nr_request_record(nr_request* req, nr_path* path, uint32_t* steps, uint64_t* bytes_sent) {
  return guarded([&]() -> nr_status {
    if (!req) return invalid("request: null");
    if (!req->h.test(nullptr)) return NR_IN_PROGRESS;
    const netreduce::CallRecord r = req->h.record();
    if (path) *path = r.path == netreduce::Path::ina ? NR_PATH_INA : NR_PATH_RING;
    if (steps) *steps = r.steps;
    if (bytes_sent) *bytes_sent = r.bytes_sent;
    return NR_OK;
  });
}

const char* nr_last_error(void) { return g_last_error.c_str(); }

const char* nr_status_string(nr_status s) {
  if (s == NR_IN_PROGRESS) return "in_progress";
  if (static_cast<int>(s) < 0 || static_cast<int>(s) > 6) return "unknown";
  return netreduce::to_string(static_cast<ErrorCode>(static_cast<int>(s)));
}

}  // extern "C"
