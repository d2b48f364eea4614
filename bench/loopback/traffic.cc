#include "bench/loopback/traffic.h"

#include <bit>
#include <cstring>

#include "wire/icrc.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::bench {

namespace {

// A small non-negative integer (at most 2^11, so exact in every dtype) as
// the little-endian bytes of the dtype.
void store_int(wire::Dtype d, unsigned v, uint8_t* out) {
  switch (d) {
    case wire::Dtype::fp32: {
      const uint32_t b = std::bit_cast<uint32_t>(static_cast<float>(v));
      std::memcpy(out, &b, 4);
      break;
    }
    case wire::Dtype::bf16: {  // the upper half of the fp32 pattern: exact for v < 256
      const uint16_t b =
          static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(v)) >> 16);
      std::memcpy(out, &b, 2);
      break;
    }
    case wire::Dtype::fp16: {  // binary16 by hand: exponent and 10-bit fraction
      uint16_t b = 0;
      if (v) {
        const int e = std::bit_width(v) - 1;  // v = 2^e * 1.f
        const uint32_t frac = (v << (10 - e)) & 0x3FF;
        b = static_cast<uint16_t>((e + 15) << 10 | frac);
      }
      std::memcpy(out, &b, 2);
      break;
    }
    case wire::Dtype::int32: {
      const int32_t b = static_cast<int32_t>(v);
      std::memcpy(out, &b, 4);
      break;
    }
    case wire::Dtype::int64: {
      const int64_t b = v;
      std::memcpy(out, &b, 8);
      break;
    }
    case wire::Dtype::fp64: {
      const double b = v;
      std::memcpy(out, &b, 8);
      break;
    }
  }
}

unsigned value(unsigned rank, unsigned tmpl, size_t e) {
  return static_cast<unsigned>((5 * rank + 3 * tmpl + e) % 16);
}

}  // namespace

std::string check(const TrafficSpec& s) {
  if (s.ranks < 2 || s.ranks > Traffic::kMaxRanks) return "ranks: must be 2..16";
  if (s.pmtu != 256 && s.pmtu != 512 && s.pmtu != 1024 && s.pmtu != 2048 && s.pmtu != 4096)
    return "payload: must be 256, 512, 1024, 2048 or 4096";
  if (s.msg_len < 1 || s.msg_len > 64) return "msg_len: must be 1..64";
  if (!wire::is_valid_dtype(static_cast<uint8_t>(s.dtype))) return "dtype: unknown";
  if (s.window < 1 || s.window > 1024) return "window: must be 1..1024";
  return "";
}

Traffic::Traffic(const TrafficSpec& spec) : spec_(spec) {
  data_bytes_ = wire::message_capacity(spec_.msg_len, spec_.pmtu);
  const size_t esize = wire::dtype_size(spec_.dtype);
  data_bytes_ -= data_bytes_ % esize;
  max_frame_ = 14 + 20 + 8 + 12 + 16 + 4 + spec_.pmtu + 4;
  const size_t elems = data_bytes_ / esize;
  data_.assign(size_t{spec_.ranks} * kTemplates * data_bytes_, 0);
  sum_.assign(size_t{kTemplates} * data_bytes_, 0);
  for (unsigned t = 0; t < kTemplates; ++t)
    for (size_t e = 0; e < elems; ++e) {
      unsigned total = 0;
      for (unsigned r = 0; r < spec_.ranks; ++r) {
        const unsigned v = value(r, t, e);
        total += v;
        store_int(spec_.dtype, v, &data_[(size_t{r} * kTemplates + t) * data_bytes_ + e * esize]);
      }
      store_int(spec_.dtype, total, &sum_[size_t{t} * data_bytes_ + e * esize]);
    }
  for (unsigned t = 0; t < kTemplates; ++t)
    sum_crc_[t] = wire::crc32(0, &sum_[size_t{t} * data_bytes_], data_bytes_);
}

// Rank r at 10.77.<ring id's low byte>.(r + 1): rings of different ids
// (--workers 2) have disjoint members, unless members_of names one id for
// all (--stripes: one job's rings, told apart by their QPs).
testing::RingAddressing Traffic::addressing() const {
  const uint32_t id = spec_.members_of ? spec_.members_of : spec_.ring_id;
  return {spec_.ranks, 10u << 24 | 77u << 16 | (id & 0xFF) << 8 | 1u, spec_.qpn0};
}

uint32_t Traffic::member(unsigned rank) const { return addressing().ip(rank); }

std::vector<uint32_t> Traffic::members() const { return addressing().members(); }

uint32_t Traffic::psn0(unsigned rank) const { return (0xFFFF00u + rank * 0x101u) & wire::kPsnMask; }

const uint8_t* Traffic::data_of(unsigned rank, uint64_t n) const {
  return &data_[(size_t{rank} * kTemplates + n % kTemplates) * data_bytes_];
}

const uint8_t* Traffic::sum_of(uint64_t n) const {
  return &sum_[size_t(n % kTemplates) * data_bytes_];
}

size_t Traffic::build_with(unsigned rank, uint64_t n, uint32_t k, const uint8_t* data, uint32_t imm,
                           uint8_t* out, size_t cap) const {
  const testing::RingAddressing a = addressing();
  const unsigned succ = a.succ(rank);
  wire::InaMessage m = a.message(
      rank, spec_.ring_id, static_cast<uint32_t>(spec_.msg_id0 + n), spec_.dtype,
      wire::ReduceOp::sum,
      wire::psn_add(psn0(rank), static_cast<uint32_t>((n * spec_.msg_len) & wire::kPsnMask)), data,
      data_bytes_, spec_.pmtu);
  m.base.src_mac = {0x02, 0x4E, 0x52, 0x00, 0x00, static_cast<uint8_t>(rank + 1)};
  m.base.dst_mac = {0x02, 0x4E, 0x52, 0x00, 0x00, static_cast<uint8_t>(succ + 1)};
  m.va = 0x7f0000000000ull + (n % (2 * spec_.window)) * spec_.msg_len * spec_.pmtu;
  m.rkey = 0x1234;
  m.imm = imm;
  return wire::build_message_packet(m, k, out, cap);
}

size_t Traffic::build(unsigned rank, uint64_t n, uint32_t k, uint8_t* out, size_t cap) const {
  return build_with(rank, n, k, data_of(rank, n), static_cast<uint32_t>(n), out, cap);
}

Traffic::Verdict Traffic::check_frame(const uint8_t* frame, size_t len, bool aggregated,
                                      uint64_t base, uint64_t count, Id& id,
                                      uint8_t* scratch) const {
  wire::ParsedFrame p;
  if (wire::parse_frame(frame, len, p) != wire::ParseStatus::ok) return Verdict::unknown;
  uint32_t src;
  std::memcpy(&src, frame + p.l3 + 12, 4);
  src = __builtin_bswap32(src);
  const uint32_t first = member(0);
  if (src < first || src >= first + spec_.ranks) return Verdict::unknown;
  id.rank = src - first;
  uint32_t psn;
  std::memcpy(&psn, frame + p.bth + 8, 4);
  psn = __builtin_bswap32(psn) & wire::kPsnMask;
  // PSN distance from packet 0 of message `base`: (n - base) * msg_len + k,
  // unambiguous while a check window spans less than 2^24 packets.
  const uint32_t start =
      wire::psn_add(psn0(id.rank), static_cast<uint32_t>((base * spec_.msg_len) & wire::kPsnMask));
  const uint32_t d = (psn - start) & wire::kPsnMask;
  const uint64_t off = d / spec_.msg_len;
  id.k = d % spec_.msg_len;
  if (off >= count) return Verdict::unknown;
  id.n = base + off;
  const uint8_t* data = aggregated ? sum_of(id.n) : data_of(id.rank, id.n);
  // A reduced message's last packet carries the box's seal (src/engine/digest.h).
  const uint32_t msg_id = static_cast<uint32_t>(spec_.msg_id0 + id.n);
  const uint32_t imm =
      aggregated ? msg_id ^ sum_crc_[id.n % kTemplates] : static_cast<uint32_t>(id.n);
  const size_t want = build_with(id.rank, id.n, id.k, data, imm, scratch, max_frame_);
  if (want == 0 || want != len || std::memcmp(scratch, frame, len) != 0) return Verdict::bad;
  return Verdict::good;
}

}  // namespace netreduce::bench
