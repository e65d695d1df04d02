// .npz files as NumPy reads them: the real numpy (Debian's python3-numpy)
// loads what WriteNpz and WriteDeltaNpz write, and the ZIP structure is
// checked byte by byte.

#include "clients/npz_file.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/zip_checksums.h"

namespace deltastream {
namespace {

// A path in a directory of this process's own (tests may run in parallel
// processes without TEST_TMPDIR, as under ctest -j).
std::string TempPath(const std::string& name) {
  static const std::string dir = [] {
    const char* root = std::getenv("TEST_TMPDIR");
    std::string pattern =
        std::string(root != nullptr ? root : "/tmp") + "/npz_file_test.XXXXXX";
    return std::string(mkdtemp(pattern.data()));
  }();
  return dir + "/" + name;
}

// Runs Python with NumPy on `script`, with `npz` as sys.argv[1]; returns its
// stdout, failing the test when it exits non-zero.
std::string RunNumpy(const std::string& npz, const std::string& script) {
  const std::string file = TempPath("script.py");
  std::ofstream(file) << "import sys, numpy as np\n" << script;
  FILE* pipe =
      popen(("/usr/bin/python3 " + file + " " + npz + " 2>&1").c_str(), "r");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    out.append(buffer, n);
  }
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << "python3 with numpy failed (run "
                          "deploy/install-deps.sh for python3-numpy):\n"
                       << out;
  return out;
}

TEST(NpzFileTest, NumpyLoadsEveryDtypeAndShape) {
  const std::string path = TempPath("arrays.npz");
  std::vector<std::pair<std::string, at::Tensor>> arrays = {
      {"i64", at::arange(-3, 4, at::kLong)},
      {"f32", at::arange(12, at::kFloat).reshape({3, 4}) / 8},
      {"f16", at::arange(6, at::kFloat).reshape({2, 3}).to(at::kHalf)},
      {"bf16", at::arange(4, at::kFloat).to(at::kBFloat16) * 2},
      {"f64", at::arange(4, at::kDouble) / 3},
      {"i32", at::arange(5, at::kInt)},
      {"b", at::tensor({1, 0, 1}).to(at::kBool)},
      {"u8", at::arange(3, at::kByte)},
      {"scalar", at::scalar_tensor(42, at::kLong)},
      {"empty", at::empty({0, 7})},
      {"strided", at::arange(20, at::kFloat).reshape({4, 5}).t()},
      {"dir/nested.name", at::ones({2, 2, 2})},
  };
  ASSERT_TRUE(WriteNpz(path, arrays).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  std::string out = RunNumpy(
      path,
      "f = np.load(sys.argv[1])\n"
      "for k in sorted(f.files):\n"
      "    a = f[k]\n"
      "    print(k, a.dtype.str, a.shape, a.astype(np.float64).sum())\n"
      "assert (f['strided'] == np.arange(20, dtype=np.float32)"
      ".reshape(4, 5).T).all()\n"
      "assert f['scalar'] == 42\n");
  EXPECT_NE(out.find("i64 <i8 (7,) 0.0"), std::string::npos) << out;
  EXPECT_NE(out.find("f32 <f4 (3, 4) 8.25"), std::string::npos) << out;
  EXPECT_NE(out.find("f16 <f2 (2, 3) 15.0"), std::string::npos) << out;
  EXPECT_NE(out.find("bf16 <f4 (4,) 12.0"), std::string::npos) << out;
  EXPECT_NE(out.find("f64 <f8 (4,) 2.0"), std::string::npos) << out;
  EXPECT_NE(out.find("i32 <i4 (5,) 10.0"), std::string::npos) << out;
  EXPECT_NE(out.find("b |b1 (3,) 2.0"), std::string::npos) << out;
  EXPECT_NE(out.find("u8 |u1 (3,) 3.0"), std::string::npos) << out;
  EXPECT_NE(out.find("scalar <i8 () 42.0"), std::string::npos) << out;
  EXPECT_NE(out.find("empty <f4 (0, 7) 0.0"), std::string::npos) << out;
  EXPECT_NE(out.find("strided <f4 (5, 4) 190.0"), std::string::npos) << out;
  EXPECT_NE(out.find("dir/nested.name <f4 (2, 2, 2) 8.0"), std::string::npos)
      << out;
}

TEST(NpzFileTest, Zip64RecordsReadByNumpy) {
  const std::string path = TempPath("zip64.npz");
  ASSERT_TRUE(WriteNpz(path,
                       {{"a", at::arange(10, at::kLong)}, {"b", at::ones({3})}},
                       /*force_zip64=*/true)
                  .ok());
  std::string out = RunNumpy(path,
                             "f = np.load(sys.argv[1])\n"
                             "print(int(f['a'].sum()), float(f['b'].sum()))\n");
  EXPECT_EQ(out, "45 3.0\n");
}

uint32_t Le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}
uint16_t Le16(const std::string& s, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[at]) |
                               (static_cast<uint8_t>(s[at + 1]) << 8));
}

TEST(NpzFileTest, ZipStructureAndChecksums) {
  const std::string path = TempPath("structure.npz");
  ASSERT_TRUE(WriteNpz(path, {{"x", at::arange(100, at::kFloat)}}).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string zip = bytes.str();
  // Local header, then the .npy entry.
  ASSERT_EQ(Le32(zip, 0), 0x04034b50u);
  EXPECT_EQ(Le16(zip, 8), 0);  // stored
  const uint32_t crc = Le32(zip, 14);
  const uint32_t size = Le32(zip, 18);
  const uint16_t name_length = Le16(zip, 26);
  EXPECT_EQ(zip.substr(30, name_length), "x.npy");
  const size_t data = 30 + name_length + Le16(zip, 28);
  EXPECT_EQ(zip.substr(data, 8), std::string("\x93NUMPY\x01\x00", 8));
  const uint32_t preamble = 10 + Le16(zip, data + 8);
  EXPECT_EQ(preamble % 64, 0u);  // aligned, as NumPy writes it
  EXPECT_EQ(size, preamble + 400u);
  EXPECT_EQ(crc,
            crc32(0, reinterpret_cast<const Bytef*>(zip.data() + data), size));
  // End of central directory: one entry, pointing at the directory.
  const size_t end = zip.size() - 22;
  ASSERT_EQ(Le32(zip, end), 0x06054b50u);
  EXPECT_EQ(Le16(zip, end + 10), 1);
  const uint32_t directory = Le32(zip, end + 16);
  EXPECT_EQ(directory, data + size);
  EXPECT_EQ(Le32(zip, directory), 0x02014b50u);
  EXPECT_EQ(Le32(zip, directory + 16), crc);
}

// Offsets of a crafted ZIP64 archive that point before its first byte (a
// locator offset near 2^64 wrapped the bounds check) are DataLoss, never a
// read outside the archive: it lies right after a page no one may read.
TEST(NpzFileTest, OffsetsOutsideTheArchiveAreDataLoss) {
  const std::string path = TempPath("wrapped.npz");
  ASSERT_TRUE(WriteNpz(path, {{"a", at::arange(30, at::kLong)}},
                       /*force_zip64=*/true)
                  .ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  const std::string zip = bytes.str();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t mapped = page + (zip.size() + page - 1) / page * page;
  void* memory = mmap(nullptr, mapped, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  char* archive = static_cast<char*>(memory) + page;
  ASSERT_EQ(mprotect(memory, page, PROT_NONE), 0);
  // The locator's offset of the ZIP64 end record (8 bytes, 12 before the
  // end record of 22): 16 bytes before the archive, wrapped.
  const size_t locator = zip.size() - 22 - 20;
  ASSERT_EQ(zip.compare(locator, 4, "PK\x06\x07"), 0);
  for (const uint64_t offset : {~uint64_t{15}, ~uint64_t{0}}) {
    std::string bad = zip;
    for (int i = 0; i < 8; ++i) {
      bad[locator + 8 + i] = static_cast<char>(offset >> (8 * i));
    }
    std::memcpy(archive, bad.data(), bad.size());
    EXPECT_EQ(
        VerifyZipChecksums(absl::string_view(archive, bad.size()), path).code(),
        absl::StatusCode::kDataLoss)
        << offset;
  }
  munmap(memory, mapped);
}

// base/zip_checksums reads what WriteNpz writes (ZIP64 too) and refuses
// every flipped byte of an entry and a torn archive; a failed rewrite leaves
// the previous export.
TEST(NpzFileTest, ArchivesVerifyAndARefusedRewriteKeepsThePreviousOne) {
  const std::string path = TempPath("verified.npz");
  for (bool zip64 : {false, true}) {
    SCOPED_TRACE(zip64);
    ASSERT_TRUE(
        WriteNpz(path,
                 {{"a", at::arange(300, at::kLong)}, {"b", at::ones({7, 3})}},
                 zip64)
            .ok());
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string zip = bytes.str();
    EXPECT_TRUE(VerifyZipChecksums(zip, path).ok());
    for (size_t at = 100; at < 2400; at += 50) {  // inside entry "a"
      std::string bad = zip;
      bad[at] ^= 0x01;
      EXPECT_EQ(VerifyZipChecksums(bad, path).code(),
                absl::StatusCode::kDataLoss)
          << at;
    }
    EXPECT_EQ(VerifyZipChecksums(zip.substr(0, zip.size() - 3), path).code(),
              absl::StatusCode::kDataLoss);
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream before;
  before << in.rdbuf();
  EXPECT_FALSE(WriteNpz(path, {{"c", at::ones({2}, at::kComplexFloat)}}).ok());
  std::ifstream again(path, std::ios::binary);
  std::stringstream after;
  after << again.rdbuf();
  EXPECT_EQ(before.str(), after.str());
}

TEST(NpzFileTest, UnwritablePathIsAnErrorAndLeavesNoFile) {
  const std::string path = "/nonexistent-dir/delta.npz";
  absl::Status status = WriteNpz(path, {{"x", at::ones({2})}});
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-dir/delta.npz"),
            std::string::npos)
      << status;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  // An array NumPy has no dtype for: nothing is left behind either.
  const std::string other = TempPath("bad_dtype.npz");
  status = WriteNpz(other, {{"c", at::ones({2}, at::kComplexFloat)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_FALSE(std::filesystem::exists(other));
  EXPECT_FALSE(std::filesystem::exists(other + ".tmp"));
}

TEST(NpzFileTest, DeltaLayoutAsDocumented) {
  ReceivedDelta delta;
  delta.header.set_consumer("predictor");
  delta.header.set_start_batch(3);
  delta.header.set_end_batch(7);
  ReceivedTable& table = delta.tables["sparse.ec.t1"];
  table.ids = at::tensor({2, 5, 9}, at::kLong);
  table.states = at::arange(6, at::kFloat).reshape({3, 2});
  table.scores = at::tensor({0.5f, 1.5f, 2.5f});
  delta.tables["sparse.ec.t2"].ids = at::empty({0}, at::kLong);
  const std::string path = TempPath("delta.npz");
  ASSERT_TRUE(WriteDeltaNpz(path, delta).ok());
  std::string out = RunNumpy(
      path,
      "f = np.load(sys.argv[1])\n"
      "print(sorted(f.files))\n"
      "print(f['sparse.ec.t1/ids'].tolist(), f['sparse.ec.t1/states'].shape,"
      " f['sparse.ec.t1/scores'].tolist(), f['sparse.ec.t2/ids'].shape)\n"
      "print(int(f['__delta__/start_batch']), int(f['__delta__/end_batch']),"
      " bool(f['__delta__/resync_required']),"
      " f['__delta__/consumer'].tobytes().decode())\n");
  EXPECT_EQ(out,
            "['__delta__/consumer', '__delta__/end_batch', "
            "'__delta__/resync_required', '__delta__/start_batch', "
            "'sparse.ec.t1/ids', 'sparse.ec.t1/scores', "
            "'sparse.ec.t1/states', 'sparse.ec.t2/ids']\n"
            "[2, 5, 9] (3, 2) [0.5, 1.5, 2.5] (0,)\n"
            "3 7 False predictor\n");
}

}  // namespace
}  // namespace deltastream
