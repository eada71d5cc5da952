// SHA-256 (OpenSSL EVP) for cache keys and payload checksums.
#pragma once

#include <string>
#include <string_view>

namespace gj::cache {

std::string sha256_hex(std::string_view bytes);  // 64 lower-case hex characters

}  // namespace gj::cache
