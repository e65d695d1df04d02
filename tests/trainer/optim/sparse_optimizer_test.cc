// The fused sparse optimizers against their textbook formulas, computed by
// hand in doubles on small tables over several steps.
#include "trainer/optim/sparse_optimizer.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace deltastream {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 5;
constexpr int64_t kDim = 3;

at::Tensor Table() {
  return at::arange(kRows * kDim, at::kDouble).reshape({kRows, kDim}) / 10.0;
}

// Gradients of step s for the touched rows {1, 3}.
at::Tensor Grad(int step) {
  return at::tensor({0.5, -1.0, 2.0, 0.25, 0.0, -0.75}, at::kDouble)
             .reshape({2, kDim}) *
         (step + 1);
}

const at::Tensor kIds = at::tensor({1, 3}, at::kLong);

double At(const at::Tensor& t, int64_t r, int64_t c) {
  return t[r][c].item<double>();
}

// Runs 3 steps and checks every element against `expected(row, col, w0, g_s)`
// applied step by step with `state` per element.
TEST(SparseOptimizerTest, SgdIsWMinusLrG) {
  SparseOptimizerConfig config{SparseOptimizerType::kSgd, 0.1};
  at::Tensor w = Table();
  const at::Tensor w0 = w.clone();
  SparseTableOptimizer optimizer(config, w);
  for (int s = 0; s < 3; ++s) optimizer.Update(w, kIds, Grad(s));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kDim; ++c) {
      double expected = At(w0, r, c);
      if (r == 1 || r == 3) {
        for (int s = 0; s < 3; ++s)
          expected -= 0.1 * At(Grad(s), r == 1 ? 0 : 1, c);
      }
      EXPECT_NEAR(At(w, r, c), expected, 1e-12) << r << "," << c;
    }
  }
  EXPECT_FALSE(optimizer.has_row_state());
  EXPECT_THAT(optimizer.RowStates(kIds).status().message(),
              HasSubstr("no per-row optimizer state"));
}

TEST(SparseOptimizerTest, AdagradAccumulatesSquaresPerElement) {
  SparseOptimizerConfig config{SparseOptimizerType::kAdagrad, 0.5};
  config.eps = 1e-6;
  config.initial_accumulator_value = 0.1;
  at::Tensor w = Table();
  const at::Tensor w0 = w.clone();
  SparseTableOptimizer optimizer(config, w);
  for (int s = 0; s < 3; ++s) optimizer.Update(w, kIds, Grad(s));
  at::Tensor states = *optimizer.RowStates(at::arange(kRows, at::kLong));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kDim; ++c) {
      double weight = At(w0, r, c), sum = 0.1;
      if (r == 1 || r == 3) {
        for (int s = 0; s < 3; ++s) {
          const double g = At(Grad(s), r == 1 ? 0 : 1, c);
          sum += g * g;
          weight -= 0.5 * g / (std::sqrt(sum) + 1e-6);
        }
      }
      EXPECT_NEAR(At(w, r, c), weight, 1e-12) << r << "," << c;
      EXPECT_NEAR(At(states, r, c), sum, 1e-12) << r << "," << c;
    }
  }
}

TEST(SparseOptimizerTest, RowwiseAdagradKeepsOneMeanSquarePerRow) {
  SparseOptimizerConfig config{SparseOptimizerType::kRowwiseAdagrad, 0.5};
  config.eps = 1e-6;
  at::Tensor w = Table();
  const at::Tensor w0 = w.clone();
  SparseTableOptimizer optimizer(config, w);
  for (int s = 0; s < 3; ++s) optimizer.Update(w, kIds, Grad(s));
  at::Tensor states = *optimizer.RowStates(at::arange(kRows, at::kLong));
  ASSERT_EQ(states.sizes(), (std::vector<int64_t>{kRows, 1}));
  for (int64_t r = 0; r < kRows; ++r) {
    double sum = 0;
    std::vector<double> weight(kDim);
    for (int64_t c = 0; c < kDim; ++c) weight[c] = At(w0, r, c);
    if (r == 1 || r == 3) {
      for (int s = 0; s < 3; ++s) {
        double mean_square = 0;
        for (int64_t c = 0; c < kDim; ++c) {
          const double g = At(Grad(s), r == 1 ? 0 : 1, c);
          mean_square += g * g / kDim;
        }
        sum += mean_square;
        for (int64_t c = 0; c < kDim; ++c) {
          weight[c] -=
              0.5 * At(Grad(s), r == 1 ? 0 : 1, c) / (std::sqrt(sum) + 1e-6);
        }
      }
    }
    EXPECT_NEAR(At(states, r, 0), sum, 1e-12) << r;
    for (int64_t c = 0; c < kDim; ++c) {
      EXPECT_NEAR(At(w, r, c), weight[c], 1e-12) << r << "," << c;
    }
  }
}

TEST(SparseOptimizerTest, AdamWithBiasCorrectionAndLazyRows) {
  SparseOptimizerConfig config{SparseOptimizerType::kAdam, 0.01};
  config.beta1 = 0.8;
  config.beta2 = 0.9;
  config.eps = 1e-7;
  at::Tensor w = Table();
  const at::Tensor w0 = w.clone();
  SparseTableOptimizer optimizer(config, w);
  // Step 2 touches row 1 only: row 3 keeps its m and v (lazy), but the
  // table's step count still advances.
  const at::Tensor only_row1 = at::tensor({1}, at::kLong);
  optimizer.Update(w, kIds, Grad(0));
  optimizer.Update(w, only_row1, Grad(1).narrow(0, 0, 1));
  optimizer.Update(w, kIds, Grad(2));
  at::Tensor m_all = *optimizer.RowStates(at::arange(kRows, at::kLong));
  for (int64_t r : {1, 3}) {
    for (int64_t c = 0; c < kDim; ++c) {
      double weight = At(w0, r, c), m = 0, v = 0;
      for (int s = 0; s < 3; ++s) {
        if (s == 1 && r == 3) continue;
        const double g = At(Grad(s), r == 1 ? 0 : 1, c);
        m = 0.8 * m + 0.2 * g;
        v = 0.9 * v + 0.1 * g * g;
        const double t = s + 1;
        const double m_hat = m / (1 - std::pow(0.8, t));
        const double v_hat = v / (1 - std::pow(0.9, t));
        weight -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-7);
      }
      EXPECT_NEAR(At(w, r, c), weight, 1e-12) << r << "," << c;
      EXPECT_NEAR(At(m_all, r, c), m, 1e-12) << r << "," << c;
    }
  }
  for (int64_t r : {0, 2, 4}) {
    EXPECT_TRUE(at::equal(w[r], w0[r])) << r;
  }
}

TEST(SparseOptimizerTest, WeightDecayAddsToTheGradient) {
  SparseOptimizerConfig config{SparseOptimizerType::kSgd, 0.1};
  config.weight_decay = 0.5;
  at::Tensor w = Table();
  const at::Tensor w0 = w.clone();
  SparseTableOptimizer optimizer(config, w);
  optimizer.Update(w, kIds, Grad(0));
  EXPECT_NEAR(At(w, 1, 2),
              At(w0, 1, 2) - 0.1 * (At(Grad(0), 0, 2) + 0.5 * At(w0, 1, 2)),
              1e-12);
}

TEST(SparseOptimizerTest, StateTensorsRoundTrip) {
  SparseOptimizerConfig config{SparseOptimizerType::kAdam, 0.01};
  at::Tensor w = Table();
  SparseTableOptimizer a(config, w);
  a.Update(w, kIds, Grad(0));
  at::Tensor w2 = Table();
  SparseTableOptimizer b(config, w2);
  std::vector<std::pair<std::string, at::Tensor>> states = a.StateTensors();
  ASSERT_EQ(states.size(), 3u);
  ASSERT_TRUE(b.LoadStateTensors(states).ok());
  at::Tensor w_a = w.clone(), w_b = w.clone();
  a.Update(w_a, kIds, Grad(1));
  b.Update(w_b, kIds, Grad(1));
  EXPECT_TRUE(at::equal(w_a, w_b));

  states.pop_back();
  EXPECT_THAT(b.LoadStateTensors(states).message(), HasSubstr("3 state"));
  states = a.StateTensors();
  states[0].second = at::zeros({2, 2}, at::kDouble);
  EXPECT_THAT(b.LoadStateTensors(states).message(), HasSubstr("momentum1"));
}

TEST(SparseOptimizerTest, RepeatedIdsWithTheirSumActLikeDistinctIds) {
  for (SparseOptimizerType type :
       {SparseOptimizerType::kSgd, SparseOptimizerType::kAdagrad,
        SparseOptimizerType::kRowwiseAdagrad, SparseOptimizerType::kAdam}) {
    SparseOptimizerConfig config{type, 0.1};
    at::Tensor distinct = Table(), repeated = Table();
    SparseTableOptimizer a(config, distinct), b(config, repeated);
    a.Update(distinct, kIds, Grad(0));
    // Row 1 three times, row 3 twice, each repeat carrying the row's sum.
    at::Tensor ids = at::tensor({1, 1, 1, 3, 3}, at::kLong);
    at::Tensor grad =
        Grad(0).index_select(0, at::tensor({0, 0, 0, 1, 1}, at::kLong));
    b.Update(repeated, ids, grad);
    EXPECT_TRUE(at::equal(distinct, repeated)) << SparseOptimizerName(type);
    if (a.has_row_state()) {
      at::Tensor all = at::arange(kRows, at::kLong);
      EXPECT_TRUE(at::equal(*a.RowStates(all), *b.RowStates(all)))
          << SparseOptimizerName(type);
    }
  }
}

TEST(SparseOptimizerTest, ParsesNamesAndRejectsBadSettings) {
  EXPECT_EQ(*ParseSparseOptimizer("rowwise_adagrad"),
            SparseOptimizerType::kRowwiseAdagrad);
  EXPECT_THAT(ParseSparseOptimizer("lamb").status().message(),
              HasSubstr("unknown sparse optimizer 'lamb'"));
  SparseOptimizerConfig config;
  config.eps = 0;
  EXPECT_FALSE(ValidateOptimizer(config).ok());
  config.eps = 1e-8;
  config.beta1 = 1;
  EXPECT_FALSE(ValidateOptimizer(config).ok());
  config.beta1 = 0.9;
  config.learning_rate = -1;
  EXPECT_FALSE(ValidateOptimizer(config).ok());
  config.learning_rate = 0.1;
  EXPECT_TRUE(ValidateOptimizer(config).ok());
}

}  // namespace
}  // namespace deltastream
