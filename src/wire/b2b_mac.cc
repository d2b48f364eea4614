// Box-to-box MAC (b2b_mac.h) over OpenSSL's Poly1305, AES-128 and HMAC-SHA256.
#include "wire/b2b_mac.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

namespace netreduce::wire {

namespace {

constexpr size_t kMacOffset = offsetof(B2bHdr, mac);
constexpr char kPolyLabel[] = "netreduce b2b poly1305";
constexpr char kAesLabel[] = "netreduce b2b aes-128";

std::string openssl_error(const char* what) {
  char buf[256] = "unknown error";
  if (const unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return std::string(what) + ": " + buf;
}

bool hmac_sha256(const B2bKey& key, const char* label, uint8_t out[32]) {
  unsigned len = 0;
  return HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
              reinterpret_cast<const unsigned char*>(label), std::strlen(label), out,
              &len) != nullptr &&
         len == 32;
}

}  // namespace

B2bMac::B2bMac(const B2bKey& key) {
  uint8_t k_aes[32];
  error_ = setup(key, k_aes);
  OPENSSL_cleanse(k_aes, sizeof k_aes);
  ok_ = error_.empty();
}

std::string B2bMac::setup(const B2bKey& key, uint8_t k_aes[32]) {
  if (!hmac_sha256(key, kPolyLabel, k_poly_) || !hmac_sha256(key, kAesLabel, k_aes))
    return openssl_error("HMAC-SHA256");
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "POLY1305", nullptr);
  if (!mac) return openssl_error("EVP_MAC_fetch(POLY1305)");
  poly_ = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);  // the context keeps its own reference
  aes_ = EVP_CIPHER_CTX_new();
  if (!poly_ || !aes_) return openssl_error("EVP context");
  if (EVP_EncryptInit_ex(aes_, EVP_aes_128_ecb(), nullptr, k_aes, nullptr) != 1 ||
      EVP_CIPHER_CTX_set_padding(aes_, 0) != 1)
    return openssl_error("AES-128");
  return {};
}

B2bMac::~B2bMac() {
  EVP_MAC_CTX_free(poly_);
  EVP_CIPHER_CTX_free(aes_);
  OPENSSL_cleanse(k_poly_, sizeof k_poly_);
}

bool B2bMac::compute(const uint8_t* hdr, size_t data_len, uint8_t out[kB2bMacBytes]) noexcept {
  static constexpr uint8_t kZero[kB2bMacBytes] = {};
  uint8_t hash[16];
  size_t hash_len = 0;
  int aes_len = 0;
  return ok_ && EVP_MAC_init(poly_, k_poly_, sizeof k_poly_, nullptr) == 1 &&
         EVP_MAC_update(poly_, hdr, kMacOffset) == 1 &&
         EVP_MAC_update(poly_, kZero, sizeof kZero) == 1 &&
         EVP_MAC_update(poly_, hdr + sizeof(B2bHdr), data_len) == 1 &&
         EVP_MAC_final(poly_, hash, &hash_len, sizeof hash) == 1 && hash_len == sizeof hash &&
         EVP_EncryptUpdate(aes_, out, &aes_len, hash, sizeof hash) == 1 &&
         aes_len == static_cast<int>(kB2bMacBytes);
}

bool B2bMac::seal(uint8_t* hdr, size_t data_len) noexcept {
  uint8_t mac[kB2bMacBytes];
  if (!compute(hdr, data_len, mac)) return false;
  std::memcpy(hdr + kMacOffset, mac, sizeof mac);
  return true;
}

bool B2bMac::verify(const uint8_t* hdr, size_t data_len) noexcept {
  uint8_t want[kB2bMacBytes];
  return compute(hdr, data_len, want) && CRYPTO_memcmp(want, hdr + kMacOffset, sizeof want) == 0;
}

std::string B2bMac::key_id(const B2bKey& key) {
  uint8_t d[32];
  unsigned len = 0;
  if (EVP_Digest(key.data(), key.size(), d, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    return {};
  return to_hex(d, kKeyIdBytes);
}

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += hex[p[i] >> 4];
    s += hex[p[i] & 15];
  }
  return s;
}

}  // namespace netreduce::wire
