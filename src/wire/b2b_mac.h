// The box-to-box frames' keyed MAC (wire/b2b.h): one installation's key
// made into a ready MAC, on the control thread; used by one engine thread.
//
// Construction (a nonce-free MAC, hash then PRF): from the installation's
// 32-byte key K, two keys are derived once,
//   k_poly = HMAC-SHA256(K, "netreduce b2b poly1305")           32 bytes
//   k_aes  = HMAC-SHA256(K, "netreduce b2b aes-128")[0, 16)     16 bytes
// and the mac of a frame's UDP payload m (header with the mac field zero,
// then the data) is
//   mac = AES-128-ENCRYPT(k_aes, Poly1305(k_poly, m))
// Poly1305 under a fixed key is an almost-universal hash (two messages of L
// 16-byte blocks collide with probability at most 8L / 2^106), and its
// result never leaves the box unencrypted, so seeing any number of frames
// tells nothing about k_poly, and a frame of the box's never repeats a
// (key, nonce) pair a Wegman-Carter MAC would need: a message id that
// wraps, a resend, a restarted box all leave it sound. Chosen for cost:
// on the development machine BLAKE2b, HMAC-SHA256 and SipHash took 1.5 to
// 8 times as long per 1 KB frame (engine-bench prints this MAC's cost).
// One key per tree: any box of the tree can seal a frame as any other.
//
// Example: a leaf seals its partial of 1,024 data bytes: Poly1305 over the
// 48-byte header (mac zero) and the data, 67 blocks; one AES block on the
// 16-byte result; the frame's mac field takes it. The parent does the same
// over what it received and compares (constant time).
//
// Threads: built and destroyed on the control thread; seal and verify on
// the one thread that owns the tree (they reuse the OpenSSL contexts: no
// allocation, not reentrant).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/b2b.h"

typedef struct evp_mac_ctx_st EVP_MAC_CTX;
typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace netreduce::wire {

class B2bMac {
 public:
  explicit B2bMac(const B2bKey& key);
  ~B2bMac();
  B2bMac(const B2bMac&) = delete;
  B2bMac& operator=(const B2bMac&) = delete;

  // False when OpenSSL could not set the contexts up (error() says why):
  // seal and verify then refuse every frame.
  bool ok() const noexcept { return ok_; }
  const std::string& error() const noexcept { return error_; }

  // Writes the mac of the UDP payload [hdr, hdr + sizeof(B2bHdr) + data_len)
  // into its header. False (the mac left zero) only when !ok().
  bool seal(uint8_t* hdr, size_t data_len) noexcept;
  // Whether the header's mac is this key's for the payload.
  bool verify(const uint8_t* hdr, size_t data_len) noexcept;

  // A key's public name, the first kB2bKeyIdBytes of SHA-256(key): reports
  // show it where they cannot show the key, so boxes can be compared.
  static constexpr size_t kKeyIdBytes = 8;
  static std::string key_id(const B2bKey& key);

 private:
  // Derives the keys and builds the contexts; the error, or empty.
  std::string setup(const B2bKey& key, uint8_t k_aes[32]);
  bool compute(const uint8_t* hdr, size_t data_len, uint8_t out[kB2bMacBytes]) noexcept;

  uint8_t k_poly_[32] = {};
  EVP_MAC_CTX* poly_ = nullptr;
  EVP_CIPHER_CTX* aes_ = nullptr;
  bool ok_ = false;
  std::string error_;
};

// Lowercase hex of p[0, n): keys in tree JSON, key ids in reports.
std::string to_hex(const uint8_t* p, size_t n);

}  // namespace netreduce::wire
