// Binding local ranks to cores of their own (trainer/comm/core_binding.h):
// how the cores are split, that a bound thread and the threads it starts
// run on those cores only, and that the rank runs an intra-op thread on each.
#include "trainer/comm/core_binding.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace deltastream {
namespace {

using Cores = std::vector<int>;

TEST(LocalRankCoresTest, SplitsTheCoresIntoContiguousGroups) {
  const Cores eight = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(LocalRankCores(eight, 0, 2), (Cores{0, 1, 2, 3}));
  EXPECT_EQ(LocalRankCores(eight, 1, 2), (Cores{4, 5, 6, 7}));
  EXPECT_EQ(LocalRankCores(eight, 3, 4), (Cores{6, 7}));
  EXPECT_EQ(LocalRankCores(eight, 0, 1), eight);
}

TEST(LocalRankCoresTest, TheFirstGroupsTakeTheCoresLeftOver) {
  const Cores seven = {0, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(LocalRankCores(seven, 0, 3), (Cores{0, 1, 2}));
  EXPECT_EQ(LocalRankCores(seven, 1, 3), (Cores{3, 4}));
  EXPECT_EQ(LocalRankCores(seven, 2, 3), (Cores{5, 6}));
}

TEST(LocalRankCoresTest, KeepsTheAllowedCoresNumbers) {
  // A cpuset that is not 0..n-1 (a container's, a taskset's).
  const Cores allowed = {2, 3, 8, 9};
  EXPECT_EQ(LocalRankCores(allowed, 0, 2), (Cores{2, 3}));
  EXPECT_EQ(LocalRankCores(allowed, 1, 2), (Cores{8, 9}));
}

TEST(LocalRankCoresTest, MoreRanksThanCoresShareThemInTurn) {
  const Cores two = {0, 1};
  EXPECT_EQ(LocalRankCores(two, 0, 4), (Cores{0}));
  EXPECT_EQ(LocalRankCores(two, 1, 4), (Cores{1}));
  EXPECT_EQ(LocalRankCores(two, 2, 4), (Cores{0}));
  EXPECT_EQ(LocalRankCores(two, 3, 4), (Cores{1}));
  EXPECT_EQ(LocalRankCores({}, 0, 2), Cores{});
}

TEST(BindToLocalRankCoresTest, RefusesARankOutsideTheNode) {
  EXPECT_EQ(BindToLocalRankCores(2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BindToLocalRankCores(-1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BindToLocalRankCores(0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BindToLocalRankCoresTest, TheThreadAndThoseItStartsRunOnItsCores) {
  absl::StatusOr<Cores> allowed = AllowedCores();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  ASSERT_FALSE(allowed->empty());
  // On a thread of its own: the binding stays with that thread.
  Cores bound, seen_by_child, seen_after;
  std::thread rank([&] {
    absl::StatusOr<Cores> cores = BindToLocalRankCores(1, 2);
    ASSERT_TRUE(cores.ok()) << cores.status();
    bound = *cores;
    std::thread child([&] { seen_by_child = *AllowedCores(); });
    child.join();
    seen_after = *AllowedCores();
  });
  rank.join();
  EXPECT_EQ(bound, LocalRankCores(*allowed, 1, 2));
  EXPECT_EQ(seen_after, bound);
  EXPECT_EQ(seen_by_child, bound);
  EXPECT_EQ(*AllowedCores(), *allowed);  // this thread is not bound
}

TEST(BindToLocalRankCoresTest, ARankRunsAnIntraOpThreadPerCoreOfItsOwn) {
  absl::StatusOr<Cores> allowed = AllowedCores();
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  const int own = static_cast<int>(LocalRankCores(*allowed, 0, 2).size());
  // Each case binds a thread of its own; the intra-op threads are the
  // process's. 7: a count no binding here gives.
  auto threads_after_binding = [](int local_world_size) {
    at::set_num_threads(7);
    std::thread rank(
        [&] { ASSERT_TRUE(BindToLocalRankCores(0, local_world_size).ok()); });
    rank.join();
    return at::get_num_threads();
  };
  ASSERT_EQ(unsetenv("OMP_NUM_THREADS"), 0);
  EXPECT_EQ(threads_after_binding(2), own);
  // The one rank of a node keeps what it has.
  EXPECT_EQ(threads_after_binding(1), 7);
  // So does a rank whose environment sets a value (torchrun's, the user's).
  ASSERT_EQ(setenv("OMP_NUM_THREADS", "1", 1), 0);
  EXPECT_EQ(threads_after_binding(2), 7);
  unsetenv("OMP_NUM_THREADS");
}

}  // namespace
}  // namespace deltastream
