// Accumulate mode's header store (cells.h).
#include "engine/cells.h"

#include <cstring>

namespace netreduce::engine::detail {

void store_header(StoredHdr& sh, const Pkt& pkt, const wire::ParsedFrame& p, uint16_t data_off,
                  uint16_t data_len, uint32_t head_crc) noexcept {
  sh.parsed = p;
  sh.frame_len = p.end;
  sh.meta = pkt.meta;
  sh.data_off = data_off;
  sh.head_crc = head_crc;
  std::memcpy(sh.bytes, pkt.data, data_off);
  std::memcpy(sh.pad_bytes, pkt.data + data_off + data_len, p.pad);
}

void rebuild_header(const StoredHdr& sh, uint16_t data_len, uint8_t* out) noexcept {
  std::memcpy(out, sh.bytes, sh.data_off);
  std::memcpy(out + sh.data_off + data_len, sh.pad_bytes, sh.parsed.pad);
}

}  // namespace netreduce::engine::detail
