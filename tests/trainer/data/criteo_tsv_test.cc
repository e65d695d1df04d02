#include "trainer/data/criteo_tsv.h"

#include <ATen/core/Tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/testing/tensor_values.h"
#include "trainer/data/batch.h"

namespace deltastream {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// A Criteo line: label, 13 integer fields, 26 categorical fields.
struct Line {
  std::string label = "0";
  std::vector<std::string> ints = std::vector<std::string>(13, "1");
  std::vector<std::string> cats = std::vector<std::string>(26, "a");

  std::string Text() const {
    return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t",
                        absl::StrJoin(cats, "\t"));
  }
};

std::string LineWithLabel(int label) {
  Line line;
  line.label = std::to_string(label);
  return line.Text();
}

class CriteoTsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ = absl::StrCat(::testing::TempDir(), "/criteo_",
                              info->test_suite_name(), "_", info->name());
    mkdir(directory_.c_str(), 0755);
  }

  std::string Path(const std::string& name) const {
    return absl::StrCat(directory_, "/", name);
  }

  // Writes `text` as is; returns the path.
  std::string WritePlain(const std::string& name, const std::string& text) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  // Writes `text` gzip-compressed; returns the path.
  std::string WriteGzip(const std::string& name, const std::string& text,
                        const char* mode = "wb6") {
    const std::string path = Path(name);
    gzFile file = gzopen(path.c_str(), mode);
    EXPECT_NE(file, nullptr) << path;
    if (file == nullptr) return path;
    EXPECT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())),
              static_cast<int>(text.size()));
    EXPECT_EQ(gzclose(file), Z_OK);
    return path;
  }

  std::string directory_;
};

std::unique_ptr<CriteoTsvSource> MakeSource(CriteoOptions options) {
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(std::move(options));
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

CriteoOptions OptionsFor(std::vector<std::string> paths,
                         int64_t batch_size = 512) {
  CriteoOptions options;
  options.paths = std::move(paths);
  options.batch_size = batch_size;
  return options;
}

// Every batch until the end; fails the test on an error.
std::vector<Batch> ReadAll(CriteoTsvSource& source) {
  std::vector<Batch> batches;
  while (true) {
    absl::StatusOr<std::optional<Batch>> batch = source.Next();
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok() || !batch->has_value()) break;
    batches.push_back(**std::move(batch));
  }
  return batches;
}

std::vector<int64_t> Sizes(const std::vector<Batch>& batches) {
  std::vector<int64_t> sizes;
  for (const Batch& batch : batches) sizes.push_back(batch.size());
  return sizes;
}

std::vector<float> AllLabels(const std::vector<Batch>& batches) {
  std::vector<float> labels;
  for (const Batch& batch : batches) {
    for (float label : Floats(batch.labels)) labels.push_back(label);
  }
  return labels;
}

TEST_F(CriteoTsvTest, ParsesExactValues) {
  Line first;
  first.label = "1";
  first.ints = {"0",
                "1",
                "",
                "-5",
                "100",
                "7",
                "0",
                "0",
                "0",
                "0",
                "0",
                "0",
                "9223372036854775807"};
  for (int c = 0; c < 26; ++c) first.cats[c] = absl::StrCat(c + 1);  // hex
  first.cats[0] = "68fd1e64";
  first.cats[1] = "";
  first.cats[2] = "FFFFFFFFFFFFFFFF";
  first.cats[3] = "0";
  Line second;  // all empty but the label
  second.ints.assign(13, "");
  second.cats.assign(26, "");
  const std::string path =
      WritePlain("a.tsv", first.Text() + "\n" + second.Text() + "\n");

  CriteoOptions options = OptionsFor({path});
  for (int c = 0; c < 26; ++c) options.num_rows.push_back(1000 + c);
  options.num_rows.erase(options.num_rows.begin());  // the default's value
  ASSERT_THAT(options.num_rows, SizeIs(26));
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  ASSERT_NE(source, nullptr);
  const std::vector<Batch> batches = ReadAll(*source);
  ASSERT_THAT(Sizes(batches), ElementsAre(2));
  const Batch& batch = batches[0];

  EXPECT_THAT(Floats(batch.labels), ElementsAre(1.0f, 0.0f));
  ASSERT_EQ(batch.dense.sizes(), (std::vector<int64_t>{2, 13}));
  EXPECT_EQ(batch.dense.scalar_type(), at::kFloat);
  const std::vector<float> dense = Floats(batch.dense);
  EXPECT_FLOAT_EQ(dense[0], 0.0f);
  EXPECT_FLOAT_EQ(dense[1], static_cast<float>(std::log(2.0)));
  EXPECT_FLOAT_EQ(dense[2], 0.0f);  // empty
  EXPECT_FLOAT_EQ(dense[3], 0.0f);  // negative
  EXPECT_FLOAT_EQ(dense[4], static_cast<float>(std::log(101.0)));
  EXPECT_FLOAT_EQ(dense[5], static_cast<float>(std::log(8.0)));
  EXPECT_FLOAT_EQ(dense[12], static_cast<float>(std::log1p(9.2233720e18)));
  for (int d = 13; d < 26; ++d) EXPECT_EQ(dense[d], 0.0f) << d;

  const KeyedJaggedTensor& sparse = batch.sparse;
  ASSERT_EQ(sparse.num_keys(), 26);
  EXPECT_EQ(sparse.stride(), 2);
  EXPECT_FALSE(sparse.has_weights());
  for (int c = 0; c < 26; ++c) {
    EXPECT_EQ(sparse.keys()[c], absl::StrCat("cat_", c));
  }
  EXPECT_THAT(Longs(sparse.LengthsOf(0)), ElementsAre(1, 0));
  EXPECT_THAT(Longs(sparse.ValuesOf(0)), ElementsAre(0x68fd1e64 % 1000));
  EXPECT_THAT(Longs(sparse.LengthsOf(1)), ElementsAre(0, 0));
  EXPECT_THAT(Longs(sparse.ValuesOf(2)),
              ElementsAre(static_cast<int64_t>(0xFFFFFFFFFFFFFFFFull % 1002)));
  EXPECT_THAT(Longs(sparse.ValuesOf(3)), ElementsAre(0));
  // C26 is "26", hexadecimal: 38; C10 is "10": 16.
  EXPECT_THAT(Longs(sparse.ValuesOf(25)), ElementsAre(0x26));
  EXPECT_THAT(Longs(sparse.ValuesOf(9)), ElementsAre(0x10));

  const CriteoStats& stats = source->stats();
  EXPECT_EQ(stats.lines, 2);
  EXPECT_EQ(stats.examples, 2);
  EXPECT_EQ(stats.malformed, 0);
}

TEST_F(CriteoTsvTest, OneNumRowsAppliesToEveryFeature) {
  Line line;
  line.cats.assign(26, "ff");  // 255
  CriteoOptions options = OptionsFor({WritePlain("a.tsv", line.Text())});
  options.num_rows = {100};
  const std::vector<Batch> batches = ReadAll(*MakeSource(options));
  ASSERT_THAT(batches, SizeIs(1));
  for (int64_t id : Longs(batches[0].sparse.values())) EXPECT_EQ(id, 55);
}

TEST_F(CriteoTsvTest, GzipIsToldByContentNotName) {
  const std::string text = LineWithLabel(1) + "\n" + LineWithLabel(0) + "\n";
  const std::string gzip = WriteGzip("data.tsv", text);
  const std::string plain = WritePlain("data.gz", text);
  for (const std::string& path : {gzip, plain}) {
    const std::vector<Batch> batches = ReadAll(*MakeSource(OptionsFor({path})));
    ASSERT_THAT(batches, SizeIs(1)) << path;
    EXPECT_THAT(Floats(batches[0].labels), ElementsAre(1.0f, 0.0f)) << path;
  }
  // Really compressed.
  struct stat info;
  ASSERT_EQ(stat(gzip.c_str(), &info), 0);
  EXPECT_LT(info.st_size, static_cast<off_t>(text.size()));
}

TEST_F(CriteoTsvTest, CrlfAndMissingFinalNewline) {
  Line last;
  last.label = "1";
  last.cats[25] = "beef";
  const std::string path =
      WritePlain("a.tsv", LineWithLabel(0) + "\r\n" + LineWithLabel(1) +
                              "\r\n" + last.Text());  // no final line end
  std::unique_ptr<CriteoTsvSource> source = MakeSource(OptionsFor({path}));
  const std::vector<Batch> batches = ReadAll(*source);
  ASSERT_THAT(Sizes(batches), ElementsAre(3));
  EXPECT_THAT(Floats(batches[0].labels), ElementsAre(0.0f, 1.0f, 1.0f));
  EXPECT_THAT(Longs(batches[0].sparse.ValuesOf(25)),
              ElementsAre(0xa, 0xa, 0xbeef));
  EXPECT_EQ(source->stats().malformed, 0);

  // CRLF and no final newline at once.
  const std::string crlf_last =
      WritePlain("b.tsv", LineWithLabel(0) + "\r\n" + last.Text() + "\r");
  const std::vector<Batch> more = ReadAll(*MakeSource(OptionsFor({crlf_last})));
  ASSERT_THAT(Sizes(more), ElementsAre(2));
  EXPECT_THAT(Longs(more[0].sparse.ValuesOf(25)), ElementsAre(0xa, 0xbeef));
}

TEST_F(CriteoTsvTest, BlankLinesAreIgnored) {
  const std::string path =
      WritePlain("a.tsv", "\n" + LineWithLabel(1) + "\n\r\n\n" +
                              LineWithLabel(0) + "\n\n");
  std::unique_ptr<CriteoTsvSource> source = MakeSource(OptionsFor({path}));
  const std::vector<Batch> batches = ReadAll(*source);
  EXPECT_THAT(AllLabels(batches), ElementsAre(1.0f, 0.0f));
  EXPECT_EQ(source->stats().lines, 2);
  EXPECT_EQ(source->stats().malformed, 0);
}

TEST_F(CriteoTsvTest, EmptyFileEndsAtOnce) {
  const std::string path = WritePlain("empty.tsv", "");
  std::unique_ptr<CriteoTsvSource> source = MakeSource(OptionsFor({path}));
  EXPECT_THAT(ReadAll(*source), SizeIs(0));
  EXPECT_EQ(source->stats().lines, 0);
}

TEST_F(CriteoTsvTest, SplitsIntoBatchesWithAShortLast) {
  std::string text;
  for (int i = 0; i < 7; ++i) text += LineWithLabel(i % 2) + "\n";
  std::unique_ptr<CriteoTsvSource> source =
      MakeSource(OptionsFor({WritePlain("a.tsv", text)}, 3));
  const std::vector<Batch> batches = ReadAll(*source);
  EXPECT_THAT(Sizes(batches), ElementsAre(3, 3, 1));
  EXPECT_EQ(batches[2].sparse.stride(), 1);
  EXPECT_EQ(batches[2].dense.sizes(), (std::vector<int64_t>{1, 13}));
  EXPECT_THAT(AllLabels(batches),
              ElementsAre(0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f));
  // The end stays the end.
  absl::StatusOr<std::optional<Batch>> after = source->Next();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_FALSE(after->has_value());
  EXPECT_EQ(source->stats().examples, 7);
}

TEST_F(CriteoTsvTest, ExactMultipleHasNoEmptyBatch) {
  std::string text;
  for (int i = 0; i < 6; ++i) text += LineWithLabel(1) + "\n";
  EXPECT_THAT(
      Sizes(ReadAll(*MakeSource(OptionsFor({WritePlain("a.tsv", text)}, 3)))),
      ElementsAre(3, 3));
}

TEST_F(CriteoTsvTest, BatchesSpanFiles) {
  const std::string a =
      WritePlain("a.tsv", LineWithLabel(1) + "\n" + LineWithLabel(1) + "\n");
  const std::string b = WriteGzip(
      "b.tsv.gz", absl::StrCat(LineWithLabel(0), "\n", LineWithLabel(0), "\n",
                               LineWithLabel(1), "\n"));
  const std::string c = WritePlain("c.tsv", "");
  std::unique_ptr<CriteoTsvSource> source =
      MakeSource(OptionsFor({a, c, b}, 4));
  const std::vector<Batch> batches = ReadAll(*source);
  EXPECT_THAT(Sizes(batches), ElementsAre(4, 1));
  EXPECT_THAT(AllLabels(batches), ElementsAre(1.0f, 1.0f, 0.0f, 0.0f, 1.0f));
}

TEST_F(CriteoTsvTest, LoopStartsAgainAtTheFirstFile) {
  const std::string a =
      WritePlain("a.tsv", LineWithLabel(1) + "\n" + LineWithLabel(0) + "\n");
  const std::string b = WritePlain("b.tsv", LineWithLabel(0));
  CriteoOptions options = OptionsFor({a, b}, 2);
  options.loop = true;
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  std::vector<float> labels;
  for (int i = 0; i < 9; ++i) {
    absl::StatusOr<std::optional<Batch>> batch = source->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value()) << "batch " << i;
    ASSERT_EQ((*batch)->size(), 2);  // full, across passes
    for (float label : Floats((*batch)->labels)) labels.push_back(label);
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    EXPECT_EQ(labels[i], i % 3 == 0 ? 1.0f : 0.0f) << i;
  }
  EXPECT_EQ(source->stats().examples, 18);
}

TEST_F(CriteoTsvTest, LoopOverNoExamplesEnds) {
  CriteoOptions options = OptionsFor({WritePlain("empty.tsv", "\n")}, 2);
  options.loop = true;
  EXPECT_THAT(ReadAll(*MakeSource(options)), SizeIs(0));
}

TEST_F(CriteoTsvTest, MalformedLinesAreSkippedCountedAndShown) {
  Line bad_int;
  bad_int.ints[2] = "12x";
  Line bad_hex;
  bad_hex.cats[4] = "xyz";
  Line long_hex;
  long_hex.cats[0] = "12345678901234567";  // 17 digits
  Line overflow;
  overflow.ints[0] = "9223372036854775808";
  Line spaced;
  spaced.ints[0] = " 1";
  std::vector<std::string> lines = {
      LineWithLabel(1),
      "1\t2\t3",  // 3 fields
      bad_int.Text(),
      absl::StrCat("2", LineWithLabel(0).substr(1)),  // label 2
      bad_hex.Text(),
      long_hex.Text(),
      overflow.Text(),
      spaced.Text(),
      LineWithLabel(0) + "\t",  // 41 fields
      std::string(70000, 'x'),  // too long
      LineWithLabel(0),
  };
  CriteoOptions options =
      OptionsFor({WritePlain("bad.tsv", absl::StrJoin(lines, "\n"))});
  options.malformed_grace_lines = 100;
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  const std::vector<Batch> batches = ReadAll(*source);
  EXPECT_THAT(AllLabels(batches), ElementsAre(1.0f, 0.0f));
  const CriteoStats& stats = source->stats();
  EXPECT_EQ(stats.lines, 11);
  EXPECT_EQ(stats.examples, 2);
  EXPECT_EQ(stats.malformed, 9);
  ASSERT_THAT(stats.malformed_examples,
              SizeIs(CriteoTsvSource::kMaxMalformedExamples));
  const std::string path = options.paths[0];
  EXPECT_EQ(stats.malformed_examples[0], path + ":2: 3 fields, expected 40");
  EXPECT_EQ(stats.malformed_examples[1],
            path + ":3: I3 '12x' is not a 64-bit integer");
  EXPECT_EQ(stats.malformed_examples[2], path + ":4: label '2' is not 0 or 1");
  EXPECT_EQ(stats.malformed_examples[3],
            path + ":5: C5 'xyz' is not 1-16 hexadecimal digits");
  EXPECT_THAT(stats.malformed_examples[4], HasSubstr(":6: C1 '1234"));
}

TEST_F(CriteoTsvTest, LongLinesAcrossChunksAreSkipped) {
  // A 3 MiB line spans several 1 MiB chunks; the reader drops it and goes on.
  const std::string text =
      absl::StrCat(LineWithLabel(1), "\n", std::string(3 << 20, '7'), "\n",
                   std::string(CriteoTsvSource::kMaxLineBytes + 1, '8'), "\r\n",
                   LineWithLabel(0), "\n", std::string(100000, '9'));
  for (const std::string& path :
       {WritePlain("long.tsv", text), WriteGzip("long.gz", text)}) {
    CriteoOptions options = OptionsFor({path});
    options.malformed_grace_lines = 10;
    std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
    const std::vector<Batch> batches = ReadAll(*source);
    EXPECT_THAT(AllLabels(batches), ElementsAre(1.0f, 0.0f)) << path;
    EXPECT_EQ(source->stats().malformed, 3) << path;
    EXPECT_THAT(
        source->stats().malformed_examples,
        ElementsAre(HasSubstr(":2: line longer than 65536 bytes"),
                    HasSubstr(":3: line longer"), HasSubstr(":5: line longer")))
        << path;
  }
}

TEST_F(CriteoTsvTest, TooManyMalformedLinesFail) {
  std::string text;
  for (int i = 0; i < 5; ++i) text += "garbage\n";
  for (int i = 0; i < 20; ++i) text += LineWithLabel(1) + "\n";
  CriteoOptions options = OptionsFor({WritePlain("bad.tsv", text)}, 100);
  options.malformed_grace_lines = 10;
  options.max_malformed_fraction = 0.1;
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  absl::StatusOr<std::optional<Batch>> batch = source->Next();
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss);
  const std::string message(batch.status().message());
  // Enforced from line 11 on: 5 of 11 > 10%.
  EXPECT_THAT(message, HasSubstr("5 of 11 lines are malformed"));
  EXPECT_THAT(message, HasSubstr("max_malformed_fraction 10%"));
  EXPECT_THAT(message, HasSubstr(options.paths[0] + ":1: 1 fields"));
  EXPECT_THAT(message, HasSubstr(options.paths[0] + ":5: 1 fields"));
  // The error is final.
  absl::StatusOr<std::optional<Batch>> again = source->Next();
  EXPECT_EQ(again.status(), batch.status());
}

TEST_F(CriteoTsvTest, MalformedFractionWaitsForTheGraceLines) {
  std::string text;
  for (int i = 0; i < 5; ++i) text += "garbage\n";
  for (int i = 0; i < 5; ++i) text += LineWithLabel(1) + "\n";
  CriteoOptions options = OptionsFor({WritePlain("bad.tsv", text)});
  options.malformed_grace_lines = 10;
  options.max_malformed_fraction = 0.1;
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  EXPECT_THAT(Sizes(ReadAll(*source)), ElementsAre(5));
  EXPECT_EQ(source->stats().malformed, 5);
}

TEST_F(CriteoTsvTest, DefaultToleranceAcceptsOnePercent) {
  std::string text;
  for (int i = 0; i < 2000; ++i) {
    // Line 100k is malformed: never more than 1% so far.
    text += (i % 100 == 99 ? std::string("junk") : LineWithLabel(1)) + "\n";
  }
  std::unique_ptr<CriteoTsvSource> source =
      MakeSource(OptionsFor({WritePlain("a.tsv", text)}));
  EXPECT_THAT(Sizes(ReadAll(*source)), ElementsAre(512, 512, 512, 444));
  EXPECT_EQ(source->stats().malformed, 20);
}

TEST_F(CriteoTsvTest, DataWithOnlyMalformedLinesFails) {
  std::unique_ptr<CriteoTsvSource> source =
      MakeSource(OptionsFor({WritePlain("a.csv", "1,2,3\n4,5,6\n")}));
  absl::StatusOr<std::optional<Batch>> batch = source->Next();
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(batch.status().message(), HasSubstr("no valid example"));
  EXPECT_THAT(batch.status().message(), HasSubstr("a.csv:1: 1 fields"));
}

TEST_F(CriteoTsvTest, MissingFileIsRefusedAtCreateNamingThePath) {
  const std::string good = WritePlain("good.tsv", LineWithLabel(1));
  const std::string missing = Path("missing.tsv");
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(OptionsFor({good, missing}, 1));
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(source.status().message(), HasSubstr(missing));
}

TEST_F(CriteoTsvTest, FileGoneSinceCreateIsNotFoundNamingThePath) {
  const std::string good = WritePlain("good.tsv", LineWithLabel(1));
  const std::string missing = WritePlain("gone.tsv", LineWithLabel(1));
  std::unique_ptr<CriteoTsvSource> source =
      MakeSource(OptionsFor({good, missing}, 1));
  ASSERT_EQ(std::remove(missing.c_str()), 0);
  absl::StatusOr<std::optional<Batch>> first = source->Next();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->has_value());
  absl::StatusOr<std::optional<Batch>> second = source->Next();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(second.status().message(), HasSubstr(missing));
}

TEST_F(CriteoTsvTest, DirectoryIsRejected) {
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(OptionsFor({directory_}));
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(source.status().message(), HasSubstr(directory_));
}

TEST_F(CriteoTsvTest, UnreadableFileIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads every file";
  const std::string path = WritePlain("secret.tsv", LineWithLabel(1));
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
      CriteoTsvSource::Create(OptionsFor({path}));
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(source.status().message(), HasSubstr(path));
}

TEST_F(CriteoTsvTest, TruncatedGzipIsDataLoss) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text += LineWithLabel(i % 2) + "\n";
  const std::string whole = WriteGzip("whole.gz", text);
  std::ifstream in(whole, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  const std::string path =
      WritePlain("cut.gz", bytes.substr(0, bytes.size() / 2));
  std::unique_ptr<CriteoTsvSource> source = MakeSource(OptionsFor({path}));
  absl::Status status;
  for (int i = 0; i < 100 && status.ok(); ++i) {
    absl::StatusOr<std::optional<Batch>> batch = source->Next();
    status = batch.status();
    if (batch.ok() && !batch->has_value()) break;
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(path));
}

// The disk's read error is not damaged data: /proc/self/mem opens and its
// first page (never mapped) fails to read with EIO.
TEST_F(CriteoTsvTest, AReadErrorIsTheDisksNotDataLoss) {
  const std::string path = Path("eio.tsv");
  ASSERT_EQ(symlink("/proc/self/mem", path.c_str()), 0);
  std::unique_ptr<CriteoTsvSource> source = MakeSource(OptionsFor({path}));
  absl::StatusOr<std::optional<Batch>> batch = source->Next();
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kUnknown)
      << batch.status();
  EXPECT_THAT(batch.status().message(), HasSubstr("Input/output error"));
  EXPECT_THAT(batch.status().message(), HasSubstr(path));
}

TEST_F(CriteoTsvTest, RejectsBadOptionsNamingTheField) {
  auto expect_invalid = [](const CriteoOptions& options,
                           const std::string& field) {
    absl::StatusOr<std::unique_ptr<CriteoTsvSource>> source =
        CriteoTsvSource::Create(options);
    ASSERT_FALSE(source.ok()) << field;
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(source.status().message(), HasSubstr(field));
  };
  const CriteoOptions good =
      OptionsFor({WritePlain("x.tsv", LineWithLabel(1))});
  ASSERT_TRUE(CriteoTsvSource::Create(good).ok());
  CriteoOptions options = good;
  options.paths.clear();
  expect_invalid(options, "paths");
  options = good;
  options.batch_size = 0;
  expect_invalid(options, "batch_size");
  options = good;
  options.num_rows = {1, 2};
  expect_invalid(options, "num_rows");
  options.num_rows = {};
  expect_invalid(options, "num_rows");
  options.num_rows = {0};
  expect_invalid(options, "num_rows[0]");
  options.num_rows.assign(26, 5);
  options.num_rows[7] = -1;
  expect_invalid(options, "num_rows[7]");
  options = good;
  options.max_malformed_fraction = 1.5;
  expect_invalid(options, "max_malformed_fraction");
  options.max_malformed_fraction = std::nan("");
  expect_invalid(options, "max_malformed_fraction");
  options = good;
  options.malformed_grace_lines = -1;
  expect_invalid(options, "malformed_grace_lines");
}

// A large gzip file streamed end to end: lines of varying length cross the
// 1 MiB chunks (~80 MB of text) at arbitrary places.
TEST_F(CriteoTsvTest, StreamsALargeGzipFile) {
  constexpr int kLines = 300000;
  const std::string path = Path("large.tsv.gz");
  gzFile file = gzopen(path.c_str(), "wb1");
  ASSERT_NE(file, nullptr);
  int64_t label_sum = 0, present_cat0 = 0, id_sum_cat0 = 0;
  double dense0_sum = 0;
  uint64_t state = 12345;
  std::string chunk;
  for (int i = 0; i < kLines; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t bits = state >> 16;
    const int label = static_cast<int>(bits & 1);
    label_sum += label;
    const int dense0 = static_cast<int>(bits % 1000);
    dense0_sum += static_cast<float>(std::log1p(static_cast<double>(dense0)));
    absl::StrAppend(&chunk, label, "\t", dense0);
    for (int d = 1; d < 13; ++d) {
      if ((bits >> d) & 1)
        absl::StrAppend(&chunk, "\t", d * i);
      else
        absl::StrAppend(&chunk, "\t");
    }
    for (int c = 0; c < 26; ++c) {
      const bool present = ((bits >> (c + 13)) & 3) != 0;
      const uint32_t hash = static_cast<uint32_t>(bits * (c + 1) + i);
      if (present) {
        absl::StrAppend(&chunk, "\t", absl::Hex(hash));
        if (c == 0) {
          ++present_cat0;
          id_sum_cat0 += hash % 1000;
        }
      } else {
        absl::StrAppend(&chunk, "\t");
      }
    }
    chunk += (i % 7 == 0) ? "\r\n" : "\n";
    if (chunk.size() > (1 << 20) || i == kLines - 1) {
      ASSERT_EQ(
          gzwrite(file, chunk.data(), static_cast<unsigned>(chunk.size())),
          static_cast<int>(chunk.size()));
      chunk.clear();
    }
  }
  ASSERT_EQ(gzclose(file), Z_OK);

  CriteoOptions options = OptionsFor({path}, 4096);
  options.num_rows = {1000};
  std::unique_ptr<CriteoTsvSource> source = MakeSource(options);
  int64_t examples = 0, read_labels = 0, read_present = 0, read_ids = 0;
  double read_dense0 = 0;
  int batches = 0;
  while (true) {
    absl::StatusOr<std::optional<Batch>> batch = source->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    const Batch& b = **batch;
    ++batches;
    examples += b.size();
    read_labels += static_cast<int64_t>(b.labels.sum().item<double>());
    read_dense0 += b.dense.select(1, 0).to(at::kDouble).sum().item<double>();
    read_present += b.sparse.LengthsOf(0).sum().item<int64_t>();
    read_ids += b.sparse.ValuesOf(0).sum().item<int64_t>();
  }
  EXPECT_EQ(examples, kLines);
  EXPECT_EQ(batches, (kLines + 4095) / 4096);
  EXPECT_EQ(read_labels, label_sum);
  EXPECT_EQ(read_present, present_cat0);
  EXPECT_EQ(read_ids, id_sum_cat0);
  EXPECT_NEAR(read_dense0, dense0_sum, 1e-6 * dense0_sum);
  EXPECT_EQ(source->stats().lines, kLines);
  EXPECT_EQ(source->stats().malformed, 0);
}

}  // namespace
}  // namespace deltastream
