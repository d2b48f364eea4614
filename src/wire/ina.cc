#include "wire/ina.h"

#include <cstring>

namespace netreduce::wire {

std::optional<Dtype> parse_dtype(std::string_view s) noexcept {
#define NETREDUCE_X(name, value, bytes) \
  if (s == #name) return Dtype::name;
  NETREDUCE_DTYPES(NETREDUCE_X)
#undef NETREDUCE_X
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view s) noexcept {
#define NETREDUCE_X(name, value) \
  if (s == #name) return ReduceOp::name;
  NETREDUCE_OPS(NETREDUCE_X)
#undef NETREDUCE_X
  return std::nullopt;
}

std::optional<InaInfo> ina_decode(const uint8_t* payload, size_t len) noexcept {
  if (len < sizeof(InaHdr)) return std::nullopt;
  const auto* h = reinterpret_cast<const InaHdr*>(payload);
  if (h->magic.host() != kInaMagic) return std::nullopt;
  InaInfo i;
  i.version = h->version;
  i.dtype = h->dtype;
  i.op = h->op;
  i.flags = h->flags;
  i.ring_id = h->ring_id.host();
  i.rank = h->rank.host();
  i.msg_len = h->msg_len.host();
  i.msg_id = h->msg_id.host();
  return i;
}

void ina_encode(const InaInfo& info, uint8_t* dst) noexcept {
  InaHdr h;
  h.magic.set(kInaMagic);
  h.version = info.version;
  h.dtype = info.dtype;
  h.op = info.op;
  h.flags = info.flags;
  h.ring_id.set(info.ring_id);
  h.rank.set(info.rank);
  h.msg_len.set(info.msg_len);
  h.msg_id.set(info.msg_id);
  h.reserved.set(0);
  std::memcpy(dst, &h, sizeof(h));
}

}  // namespace netreduce::wire
