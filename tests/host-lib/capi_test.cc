// The C API: bad arguments and the missing device come back as status codes
// with a message, never as a crash or an exception.
#include <infiniband/verbs.h>

#include <catch2/catch.hpp>
#include <string>

#include "netreduce/netreduce.h"
#include "netreduce/netreduce.hpp"

namespace {
bool have_rdma_device() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  if (l) ibv_free_device_list(l);
  return n > 0;
}
}  // namespace

TEST_CASE("C API: bad arguments are status codes with messages", "[hostlib][capi]") {
  nr_comm* c = reinterpret_cast<nr_comm*>(0x1);
  CHECK(nr_comm_create(0, 2, nullptr, 0, nullptr, nullptr, &c) == NR_ERR_INVALID_ARGUMENT);
  CHECK(c == nullptr);
  CHECK(std::string(nr_last_error()).find("bootstrap") != std::string::npos);
  CHECK(nr_comm_create(0, 2, nullptr, 0, "127.0.0.1:1", nullptr, nullptr) ==
        NR_ERR_INVALID_ARGUMENT);
  float x = 1;
  CHECK(nr_allreduce(nullptr, &x, &x, 1, NR_FP32, NR_SUM, 10) == NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("comm") != std::string::npos);
  nr_request* r = nullptr;
  CHECK(nr_allreduce_async(nullptr, &x, &x, 1, NR_FP32, NR_SUM, 10, &r) == NR_ERR_INVALID_ARGUMENT);
  CHECK(r == nullptr);
  // avg and the pre-multiplied sums: the C++ values, the same checks.
  static_assert(NR_AVG == static_cast<int>(netreduce::Op::avg));
  CHECK(nr_allreduce(nullptr, &x, &x, 1, NR_FP32, NR_AVG, 10) == NR_ERR_INVALID_ARGUMENT);
  CHECK(nr_allreduce_premul(nullptr, &x, &x, 1, NR_FP32, 0.5, 10) == NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()) == "comm: null");
  CHECK(nr_reduce_scatter_premul(nullptr, &x, &x, 1, NR_FP32, 0.5, 10) == NR_ERR_INVALID_ARGUMENT);
  CHECK(nr_allreduce_premul_async(nullptr, &x, &x, 1, NR_FP32, 0.5, 10, &r) ==
        NR_ERR_INVALID_ARGUMENT);
  CHECK(r == nullptr);
  CHECK(nr_reduce_scatter_premul_async(nullptr, &x, &x, 1, NR_FP32, 0.5, 10, nullptr) ==
        NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()) == "out: null pointer");
  CHECK(nr_wait(nullptr, 0) == NR_ERR_INVALID_ARGUMENT);
  CHECK(nr_test(nullptr) == NR_ERR_INVALID_ARGUMENT);
  nr_request_free(nullptr);
  nr_comm_destroy(nullptr);
  CHECK(nr_comm_rank(nullptr) == -1);
  CHECK(std::string(nr_status_string(NR_ERR_TIMEOUT)) == "timeout");
  CHECK(std::string(nr_status_string(static_cast<nr_status>(99))) == "unknown");
  nr_options o;
  nr_options_init(&o);
  CHECK(o.msg_len == 4);
  CHECK(o.payload_bytes == 1024);
  // The fields appended after 0.1.0 carry the C++ defaults.
  const netreduce::Options d;
  CHECK(o.qp_timeout == d.qp_timeout);
  CHECK(o.qp_timeout == 14);
  CHECK(o.delete_ring_at_close == 1);
  CHECK(o.lease_ms == d.lease_ms);
  CHECK(o.failback_calls == d.failback_calls);
  CHECK(o.job_key == nullptr);
  CHECK(nr_comm_ring_id(nullptr) == 0);
  CHECK(nr_comm_failovers(nullptr) == -1);
  // The path choice and the model's figures, and the statistics.
  CHECK(o.path_choice == NR_CHOICE_INA);
  CHECK(o.measure_links == 1);
  CHECK(o.box_us == d.box_us);
  static_assert(NR_CALL_BARRIER == static_cast<int>(netreduce::CallKind::barrier));
  static_assert(NR_CALL_REDUCE_SCATTER == static_cast<int>(netreduce::CallKind::reduce_scatter));
  CHECK(nr_comm_calls(nullptr, NR_CALL_ALL_REDUCE, NR_PATH_INA) == 0);
  CHECK(nr_comm_links(nullptr, nullptr, nullptr, nullptr, nullptr) == NR_ERR_INVALID_ARGUMENT);
  CHECK(nr_request_record(nullptr, nullptr, nullptr, nullptr) == NR_ERR_INVALID_ARGUMENT);
  CHECK(nr_barrier_path(nullptr, NR_CHOICE_RING, -1) == NR_ERR_INVALID_ARGUMENT);
  o.path_choice = 3;
  CHECK(nr_comm_create(0, 2, nullptr, 0, "127.0.0.1:1", &o, &c) == NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("path_choice: 3") != std::string::npos);
}

TEST_CASE("C API: no RDMA device", "[hostlib][capi]") {
  if (have_rdma_device()) {
    WARN("this machine has an RDMA device: the no-device path is not exercised");
    return;
  }
  nr_comm* c = nullptr;
  nr_options o;
  nr_options_init(&o);
  o.connect_timeout_ms = 500;
  CHECK(nr_comm_create(0, 2, "", 0, "127.0.0.1:29999", &o, &c) == NR_ERR_NO_DEVICE);
  CHECK(c == nullptr);
  CHECK(std::string(nr_last_error()).find("no RDMA device") != std::string::npos);
}
