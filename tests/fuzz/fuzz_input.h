#ifndef DELTASTREAM_TESTS_FUZZ_FUZZ_INPUT_H_
#define DELTASTREAM_TESTS_FUZZ_FUZZ_INPUT_H_

// The service fuzzer's input: bytes read from the front (service_fuzzer.cc
// describes the layout).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace deltastream {
namespace service_fuzz {

inline bool Verbose() {
  static const bool verbose =
      std::getenv("DELTASTREAM_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// The fuzz input, read from the front; past its end every read yields zeros.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t remaining() const { return size_ - pos_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // Little-endian (one statement per read: operands are unsequenced).
  uint16_t U16() {
    const uint16_t low = Byte();
    return static_cast<uint16_t>(low | Byte() << 8);
  }
  uint32_t U32() {
    const uint32_t low = U16();
    return low | static_cast<uint32_t>(U16()) << 16;
  }
  uint64_t U64() {
    const uint64_t low = U32();
    return low | static_cast<uint64_t>(U32()) << 32;
  }
  // Up to `n` bytes.
  std::string Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  // A length byte, then that many bytes.
  std::string ShortString() { return Bytes(Byte()); }
  std::string Rest() { return Bytes(remaining()); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace service_fuzz
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_FUZZ_FUZZ_INPUT_H_
