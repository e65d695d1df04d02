// The wire property test (issue 21): random well-typed but adversarial
// requests (sizes, shapes, dtypes, integer extremes, names) against the real
// tracker_server on loopback. After each request the server lives and the
// code is one the service documents (never UNKNOWN or INTERNAL: no exception
// crossed a handler); at every check point the control consumer's read holds
// exactly the rows of the records the server accepted. Bounded: a fixed
// number of requests, each call with a deadline, seconds in all.
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "clients/delta_client.h"
#include "tests/integration/server_process.h"

namespace deltastream {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

class Adversary {
 public:
  explicit Adversary(uint64_t seed) : rng_(seed) {}

  int64_t Pick(std::initializer_list<int64_t> values) {
    std::vector<int64_t> v(values);
    return v[rng_() % v.size()];
  }
  int64_t Integer() {
    return Pick({0, 1, -1, 2, 7, 64, 1 << 20, kMax, kMax - 1, kMin, kMin + 1,
                 int64_t{1} << 40, (int64_t{1} << 40) + 1, 1000000007});
  }
  std::string Name() {
    switch (rng_() % 9) {
      case 0:
        return "";
      case 1:
        return std::string(257, 'a');
      case 2:
        return std::string(256, 'b');
      case 3:
        return "a b";
      case 4:
        return "caf\xc3\xa9";
      case 5:
        return std::string("nul\0x", 5);
      case 6:
        return "../t";
      case 7:
        return "victim";
      default:
        return "t" + std::to_string(rng_() % 3);
    }
  }
  at::Tensor Ids() {
    const int64_t n = Pick({0, 1, 3, 1000});
    switch (rng_() % 6) {
      case 0:
        return at::tensor(std::vector<int64_t>{kMax, kMin, -1}, at::kLong);
      case 1:
        return at::randint(0, 100, {n}, at::kInt);  // wrong dtype
      case 2:
        return at::randint(0, 100, {n, 2}, at::kLong);  // 2-D
      default:
        return at::randint(0, 100, {n}, at::kLong);
    }
  }
  at::Tensor States(int64_t rows) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    switch (rng_() % 8) {
      case 0:
        return at::Tensor();
      case 1:
        return at::ones({rows, 0});
      case 2:
        return at::ones({rows, 2, 1});
      case 3:
        return at::full({rows, 2}, nan);
      case 4:
        return at::ones({rows + 1, 2});
      case 5:
        return at::ones({rows, 2}, at::kDouble);
      case 6:
        return at::ones({rows, 3}, at::kInt);
      default:
        return at::randn({rows, 2});
    }
  }
  uint64_t Next() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// Codes the service documents for refused requests.
bool Documented(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

TEST(WirePropertyTest, AdversarialRequestsLeaveTheServerAndControlWhole) {
  ServerProcess server({"--mode=embedding", "--consumers=control,victim",
                        "--max_message_bytes=1048576"});
  ASSERT_GT(server.port(), 0);
  ClientOptions options;
  options.timeout = std::chrono::milliseconds(5000);
  options.stream_timeout = std::chrono::milliseconds(5000);
  auto client = DeltaClient::Create(server.target(), options);
  Adversary adversary(20261124);
  // What the control consumer must read at the next check: per table, the
  // IDs of every record the server accepted since its last read.
  std::map<std::string, std::set<int64_t>> expected;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int requests = 0;
  for (int i = 0; i < 400 && std::chrono::steady_clock::now() < deadline; ++i) {
    absl::Status status;
    std::string what;
    switch (adversary.Next() % 6) {
      case 0:
      case 1: {  // Record
        RecordTable table{adversary.Name(), adversary.Ids(), at::Tensor()};
        table.states = adversary.States(table.ids.size(0));
        what = "record " + table.fqn.substr(0, 20);
        auto recorded = client->Record({{table}});
        status = recorded.status();
        if (status.ok()) {
          at::Tensor ids = table.ids.contiguous();
          for (int64_t k = 0; k < ids.numel(); ++k) {
            expected[table.fqn].insert(ids.data_ptr<int64_t>()[k]);
          }
        }
        break;
      }
      case 2: {  // GetDelta as another consumer, with odd options
        v1::GetDeltaRequest request;
        request.set_consumer(adversary.Name());
        if (adversary.Next() % 2) request.add_fqns(adversary.Name());
        request.set_max_chunk_bytes(adversary.Integer());
        if (adversary.Next() % 2) {
          request.mutable_top_k()->set_count(adversary.Integer());
        } else if (adversary.Next() % 2) {
          request.mutable_top_k()->set_percentage(
              static_cast<double>(adversary.Integer()));
        }
        request.set_include_scores(adversary.Next() % 2);
        request.set_all_rows(adversary.Next() % 4 == 0);
        what = "get " + request.consumer().substr(0, 20);
        status = client->GetDelta(request).status();
        break;
      }
      case 3: {  // Subscribe with extreme periods, cancelled quickly
        v1::SubscribeRequest request;
        request.mutable_read()->set_consumer(
            adversary.Next() % 2 ? "victim" : adversary.Name());
        request.set_every_steps(adversary.Integer());
        request.set_every_ms(adversary.Integer());
        request.set_dense_every_steps(adversary.Integer());
        request.set_dense_every_ms(adversary.Integer());
        CallCanceller subscription;
        std::thread canceller([&subscription] {
          std::this_thread::sleep_for(std::chrono::milliseconds(150));
          subscription.Cancel();
        });
        int pushes = 0;
        status = client->Subscribe(
            request, [&](ReceivedDelta&&) { return ++pushes < 50; },
            &subscription);
        canceller.join();
        what = "subscribe every_steps=" + std::to_string(request.every_steps());
        EXPECT_LT(pushes, 50) << what;  // no hot loop of pushes
        break;
      }
      case 4: {  // Commit with extreme batches
        what = "commit";
        status = client->Commit(adversary.Name(), adversary.Integer());
        break;
      }
      default: {  // Consumers come and go (never the control)
        const std::string name = adversary.Name();
        if (name == "control") continue;
        what = "consumer " + name.substr(0, 20);
        status = adversary.Next() % 2 ? client->AddConsumer(name).status()
                                      : client->RemoveConsumer(name).status();
        break;
      }
    }
    ++requests;
    EXPECT_TRUE(Documented(status.code())) << what << ": " << status;
    ASSERT_TRUE(client->Status().ok()) << "the server died after " << what;
    if (i % 50 == 49) {
      ASSERT_TRUE(client->Step().ok());
      v1::GetDeltaRequest control;
      control.set_consumer("control");
      auto delta = client->GetDelta(control);
      ASSERT_TRUE(delta.ok()) << delta.status();
      std::map<std::string, std::set<int64_t>> read;
      for (const auto& [fqn, table] : delta->tables) {
        at::Tensor ids = table.ids.contiguous();
        if (ids.numel() == 0) continue;
        read[fqn].insert(ids.data_ptr<int64_t>(),
                         ids.data_ptr<int64_t>() + ids.numel());
      }
      for (auto it = expected.begin(); it != expected.end();) {
        it = it->second.empty() ? expected.erase(it) : std::next(it);
      }
      EXPECT_EQ(read, expected) << "after request " << i;
      expected.clear();
    }
  }
  EXPECT_GE(requests, 100);
  EXPECT_EQ(server.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace deltastream
