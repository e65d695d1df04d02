#ifndef DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_FIXTURE_H_
#define DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_FIXTURE_H_

// The model and helpers the tracker's own tests share (tracker_*_test.cc).

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/tracker_service/tracker_test_util.h"
#include "tracker_service/tracker.h"

namespace deltastream {

inline constexpr char kT1[] = "sparse.ec.embeddings.t1";
inline constexpr char kT2[] = "sparse.ec.embeddings.t2";
inline constexpr char kT3[] = "sparse.ebc.embedding_bags.t3";

inline std::vector<TrackedModule> Model() {
  return {
      {"_dmp_wrapped_module.module.sparse.ec",
       /*pooled=*/false,
       {{"t1", {"f1", "f2"}}, {"t2", {"f3"}}}},
      {"module.sparse.ebc", /*pooled=*/true, {{"t3", {"f4"}}}},
  };
}

// Options of an embedding-mode tracker that leaves the pooled module ("ebc")
// untracked: Model()'s two sequence tables, kT1 and kT2.
inline TrackerOptions EmbeddingOptions() {
  TrackerOptions options;
  options.mode = TrackingMode::kEmbedding;
  options.fqns_to_skip = {"ebc"};
  return options;
}

inline std::unique_ptr<Tracker> MakeTracker(TrackerOptions options,
                                            LiveRowsReader* reader = nullptr) {
  if (options.modules.empty()) options.modules = Model();
  auto tracker = Tracker::Create(std::move(options), reader);
  EXPECT_TRUE(tracker.ok()) << tracker.status();
  return *std::move(tracker);
}

inline Delta Read(Tracker& tracker, const std::string& consumer = "default") {
  DeltaRequest request;
  request.consumer = consumer;
  auto delta = tracker.GetDelta(request);
  EXPECT_TRUE(delta.ok()) << delta.status();
  return *std::move(delta);
}

inline std::vector<int64_t> IdsOf(const Delta& delta, const std::string& fqn) {
  auto it = delta.tables.find(fqn);
  return it == delta.tables.end() ? std::vector<int64_t>{}
                                  : ToIds(it->second.ids);
}

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRACKER_SERVICE_TRACKER_FIXTURE_H_
