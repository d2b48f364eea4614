#include "host-lib/comm_impl.h"
namespace netreduce {
Error Communicator::create(int, int, const std::string&, int, const std::string&, const Options&,
                           std::unique_ptr<Communicator>&) {
  return Error::make(ErrorCode::no_device, "no RDMA device");
}
}  // namespace netreduce
