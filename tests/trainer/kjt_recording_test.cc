#include "trainer/tracking/kjt_recording.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/tracker_service/tracker_test_util.h"

namespace deltastream {
namespace {

// An EmbeddingCollection "sparse.ec" with table "items" (features "item",
// "clicked") and table "users" (feature "user").
std::unique_ptr<Tracker> MakeTracker(TrackingMode mode) {
  TrackerOptions options;
  options.mode = mode;
  options.modules = {{"_dmp_wrapped_module.module.sparse.ec",
                      false,
                      {{"items", {"item", "clicked"}}, {"users", {"user"}}}}};
  auto tracker = Tracker::Create(options);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

TEST(KjtRecordingTest, RecordsEveryKeyIntoItsTable) {
  auto tracker = MakeTracker(TrackingMode::kEmbedding);
  // Batch of 2: item [3], [1]; clicked [3, 8], []; user [5], [6].
  auto kjt = KeyedJaggedTensor::FromLengths(
      {"item", "clicked", "user"}, Ids({3, 1, 3, 8, 5, 6}),
      at::tensor({1, 1, 2, 0, 1, 1}, at::kLong));
  ASSERT_TRUE(kjt.ok()) << kjt.status();
  // The lookup's rows: row i holds value i.
  at::Tensor embeddings = at::arange(6, at::kFloat).unsqueeze(1).expand({6, 2});
  ASSERT_TRUE(RecordKjtLookup(*tracker, *kjt, embeddings).ok());

  auto delta = tracker->GetDelta({});
  ASSERT_TRUE(delta.ok()) << delta.status();
  const TableDelta& items = delta->tables["sparse.ec.embeddings.items"];
  EXPECT_EQ(ToIds(items.ids), (std::vector<int64_t>{1, 3, 8}));
  // ID 3 first appears at position 0 (value 0), 1 at 1, 8 at 3.
  EXPECT_EQ(ToFloats(items.states), (std::vector<float>{1, 1, 0, 0, 3, 3}));
  const TableDelta& users = delta->tables["sparse.ec.embeddings.users"];
  EXPECT_EQ(ToIds(users.ids), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(ToFloats(users.states), (std::vector<float>{4, 4, 5, 5}));
}

TEST(KjtRecordingTest, MismatchedEmbeddingsAreRefused) {
  auto tracker = MakeTracker(TrackingMode::kEmbedding);
  auto kjt = KeyedJaggedTensor::FromLengths({"item"}, Ids({1, 2, 3}),
                                            at::tensor({3}, at::kLong));
  ASSERT_TRUE(kjt.ok());
  EXPECT_EQ(RecordKjtLookup(*tracker, *kjt, at::ones({2, 4})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tracker->Status().usage.total.lookups, 0);
}

}  // namespace
}  // namespace deltastream
