#include "base/zip_checksums.h"

#include <zlib.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEnd = 0x06054b50;
constexpr uint32_t kEnd64 = 0x06064b50;
constexpr uint32_t kEnd64Locator = 0x07064b50;
constexpr uint32_t kMax32 = 0xffffffffu;

// A little-endian read; 0 where it would leave `bytes` (an offset of a
// damaged archive, whose checks then fail on the zero).
uint64_t Get(absl::string_view bytes, uint64_t at, int size) {
  if (at > bytes.size() || bytes.size() - at < static_cast<uint64_t>(size)) {
    return 0;
  }
  uint64_t value = 0;
  for (int i = size - 1; i >= 0; --i) {
    value = value << 8 | static_cast<uint8_t>(bytes[at + i]);
  }
  return value;
}

}  // namespace

absl::Status VerifyZipChecksums(absl::string_view bytes,
                                absl::string_view name) {
  auto corrupt = [&name](auto&&... what) {
    return absl::DataLossError(
        absl::StrCat("'", name, "' is a damaged archive: ", what...));
  };
  const uint64_t size = bytes.size();
  // The end record: 22 bytes and a comment of up to 64 KiB.
  uint64_t end = size;
  for (uint64_t at = size >= 22 ? size - 22 : 0;
       size >= 22 && at + 22 + 65535 >= size; --at) {
    if (Get(bytes, at, 4) == kEnd) {
      end = at;
      break;
    }
    if (at == 0) break;
  }
  if (end == size) return corrupt("no end record (truncated?)");
  uint64_t entries = Get(bytes, end + 10, 2);
  uint64_t directory_size = Get(bytes, end + 12, 4);
  uint64_t directory = Get(bytes, end + 16, 4);
  if (entries == 0xffff || directory_size == kMax32 || directory == kMax32) {
    if (end < 20 || Get(bytes, end - 20, 4) != kEnd64Locator) {
      return corrupt("no ZIP64 end locator");
    }
    const uint64_t end64 = Get(bytes, end - 20 + 8, 8);
    if (end64 > end || end - end64 < 56 || Get(bytes, end64, 4) != kEnd64) {
      return corrupt("no ZIP64 end record");
    }
    entries = Get(bytes, end64 + 32, 8);
    directory_size = Get(bytes, end64 + 40, 8);
    directory = Get(bytes, end64 + 48, 8);
  }
  if (directory > end || directory_size > end - directory) {
    return corrupt("the central directory lies outside the file");
  }
  uint64_t at = directory;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > directory + directory_size ||
        Get(bytes, at, 4) != kCentralHeader) {
      return corrupt("central directory entry ", i, " is damaged");
    }
    const uint64_t method = Get(bytes, at + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(Get(bytes, at + 16, 4));
    uint64_t stored = Get(bytes, at + 20, 4);
    const uint64_t name_bytes = Get(bytes, at + 28, 2);
    const uint64_t extra_bytes = Get(bytes, at + 30, 2);
    const uint64_t comment_bytes = Get(bytes, at + 32, 2);
    uint64_t local = Get(bytes, at + 42, 4);
    const uint64_t next = at + 46 + name_bytes + extra_bytes + comment_bytes;
    if (next > directory + directory_size) {
      return corrupt("central directory entry ", i, " is damaged");
    }
    // ZIP64 sizes and offset: in extra field 1, those that are 0xffffffff,
    // in the order uncompressed size, compressed size, offset.
    const bool uncompressed_64 = Get(bytes, at + 24, 4) == kMax32;
    for (uint64_t x = at + 46 + name_bytes;
         x + 4 <= at + 46 + name_bytes + extra_bytes;) {
      const uint64_t id = Get(bytes, x, 2);
      const uint64_t length = Get(bytes, x + 2, 2);
      if (id == 1) {
        uint64_t field = x + 4;
        if (uncompressed_64) field += 8;
        if (stored == kMax32) {
          stored = Get(bytes, field, 8);
          field += 8;
        }
        if (local == kMax32) local = Get(bytes, field, 8);
      }
      x += 4 + length;
    }
    if (method != 0) return corrupt("entry ", i, " is compressed");
    if (local > directory || directory - local < 30 ||
        Get(bytes, local, 4) != kLocalHeader) {
      return corrupt("entry ", i, " has no local header");
    }
    const uint64_t data =
        local + 30 + Get(bytes, local + 26, 2) + Get(bytes, local + 28, 2);
    if (data > directory || stored > directory - data) {
      return corrupt("entry ", i, " lies outside the file");
    }
    const uint32_t actual = static_cast<uint32_t>(
        crc32_z(crc32_z(0, nullptr, 0),
                reinterpret_cast<const Bytef*>(bytes.data() + data), stored));
    if (actual != crc) {
      return corrupt("entry ", std::string(bytes.substr(at + 46, name_bytes)),
                     " fails its CRC-32");
    }
    at = next;
  }
  return absl::OkStatus();
}

}  // namespace deltastream
