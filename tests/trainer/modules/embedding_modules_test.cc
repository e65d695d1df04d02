// EmbeddingBagCollection and EmbeddingCollection: outputs and gradients
// against a dense reference table (autograd through at::embedding_bag and
// index_select on an ordinary leaf tensor), the fused update touching only
// looked-up rows, KJT and feature-dict inputs giving identical outputs, hooks,
// checkpoint state and errors.
#include "trainer/modules/embedding_modules.h"

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding_bag.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trainer/sparse/feature_dict.h"
#include "trainer/sparse/keyed_jagged_tensor.h"

namespace deltastream {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Two tables: "a" (10 x 4) read by features f1 and f2, "b" (7 x 3) by f3.
EmbeddingModuleOptions Options(
    Pooling pooling = Pooling::kSum,
    SparseOptimizerType optimizer = SparseOptimizerType::kSgd,
    double lr = 1.0) {
  EmbeddingModuleOptions options;
  options.path = "sparse.ebc";
  options.tables = {{"a", 10, 4, {"f1", "f2"}, pooling, at::kDouble},
                    {"b", 7, 3, {"f3"}, pooling, at::kDouble}};
  options.optimizer.type = optimizer;
  options.optimizer.learning_rate = lr;
  options.seed = 42;
  return options;
}

// Batch of 3 examples; an empty example in f2, repeated IDs in f1 and across
// f1/f2.
KeyedJaggedTensor Input(bool weighted = false, bool extra_key = false) {
  std::vector<std::string> keys = {"f1", "f2", "f3"};
  std::vector<int64_t> ids = {1, 1, 4, 9, 4, 0, 2, 6, 5, 6};
  std::vector<int64_t> lengths = {2, 1, 1, 2, 0, 1, 1, 1, 1};
  if (extra_key) {
    keys.insert(keys.begin() + 1, "unused");
    ids.insert(ids.begin() + 4, {100, 200, 300});
    lengths.insert(lengths.begin() + 3, {1, 1, 1});
  }
  std::optional<at::Tensor> weights;
  if (weighted) {
    weights =
        at::linspace(0.1, 1.0, static_cast<int64_t>(ids.size()), at::kFloat);
  }
  return *KeyedJaggedTensor::FromLengths(keys, at::tensor(ids, at::kLong),
                                         at::tensor(lengths, at::kLong),
                                         weights);
}

// The pooled output of one feature from a dense table, with autograd.
at::Tensor DensePooled(const at::Tensor& table, const KeyedJaggedTensor& kjt,
                       int64_t key, int64_t mode) {
  at::Tensor offsets = kjt.At(key).offsets().narrow(0, 0, kjt.stride());
  std::optional<at::Tensor> w = kjt.WeightsOf(key);
  return std::get<0>(
      at::embedding_bag(table, kjt.ValuesOf(key), offsets, false, mode, false,
                        w ? w->to(at::kDouble) : at::Tensor(), false));
}

void CheckGradientAgainstDenseReference(Pooling pooling, bool weighted) {
  EmbeddingModuleOptions options = Options(pooling);
  options.is_weighted = weighted;
  auto ebc = *EmbeddingBagCollection::Create(options);
  const KeyedJaggedTensor input = Input(weighted);
  at::Tensor a = ebc->weight(0).clone().requires_grad_(true);
  at::Tensor b = ebc->weight(1).clone().requires_grad_(true);
  const at::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  const int64_t mode = pooling == Pooling::kSum ? 0 : 1;
  at::Tensor expected =
      at::cat({DensePooled(a, input, 0, mode), DensePooled(a, input, 1, mode),
               DensePooled(b, input, 2, mode)},
              1);
  at::Tensor mix = at::randn({3, 11}, at::kDouble);
  (expected * mix).sum().backward();

  KeyedTensor output = *ebc->Forward(input);
  EXPECT_THAT(output.keys(), ElementsAre("f1", "f2", "f3"));
  EXPECT_THAT(output.length_per_key(), ElementsAre(4, 4, 3));
  ASSERT_TRUE(at::allclose(output.values(), expected.detach(), 1e-12, 1e-12));
  (output.values() * mix).sum().backward();
  // SGD with learning rate 1: the change of each table is minus its gradient.
  EXPECT_TRUE(at::allclose(ebc->weight(0), a0 - a.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(ebc->weight(1), b0 - b.grad(), 1e-12, 1e-12));
}

TEST(EmbeddingBagCollectionTest, SumPoolingGradientMatchesDenseReference) {
  CheckGradientAgainstDenseReference(Pooling::kSum, /*weighted=*/false);
}

TEST(EmbeddingBagCollectionTest, MeanPoolingGradientMatchesDenseReference) {
  CheckGradientAgainstDenseReference(Pooling::kMean, /*weighted=*/false);
}

TEST(EmbeddingBagCollectionTest, WeightedGradientMatchesDenseReference) {
  CheckGradientAgainstDenseReference(Pooling::kSum, /*weighted=*/true);
}

TEST(EmbeddingBagCollectionTest, OnlyLookedUpRowsChange) {
  for (SparseOptimizerType type :
       {SparseOptimizerType::kSgd, SparseOptimizerType::kAdagrad,
        SparseOptimizerType::kRowwiseAdagrad, SparseOptimizerType::kAdam}) {
    auto ebc =
        *EmbeddingBagCollection::Create(Options(Pooling::kSum, type, 0.1));
    const at::Tensor a0 = ebc->weight(0).clone(), b0 = ebc->weight(1).clone();
    ebc->Forward(Input())->values().pow(2).sum().backward();
    std::vector<int64_t> changed_a, changed_b;
    for (int64_t r = 0; r < 10; ++r) {
      if (!at::equal(ebc->weight(0)[r], a0[r])) changed_a.push_back(r);
    }
    for (int64_t r = 0; r < 7; ++r) {
      if (!at::equal(ebc->weight(1)[r], b0[r])) changed_b.push_back(r);
    }
    EXPECT_THAT(changed_a, ElementsAre(0, 1, 2, 4, 9))
        << SparseOptimizerName(type);
    EXPECT_THAT(changed_b, ElementsAre(5, 6)) << SparseOptimizerName(type);
  }
}

TEST(EmbeddingBagCollectionTest, EvaluationUnderNoGradUpdatesNothing) {
  auto ebc = *EmbeddingBagCollection::Create(Options());
  int hooks = 0;
  ebc->AddPostLookupHook([&](const EmbeddingModule&, const ModuleLookup&) {
    ++hooks;
    return absl::OkStatus();
  });
  ebc->AddPostOutputHook([&](const EmbeddingModule&) { ++hooks; });
  const at::Tensor a0 = ebc->weight(0).clone();
  c10::NoGradGuard no_grad;
  KeyedTensor output = *ebc->Forward(Input());
  EXPECT_FALSE(output.values().requires_grad());
  EXPECT_TRUE(at::equal(ebc->weight(0), a0));
  EXPECT_EQ(hooks, 0);
}

TEST(EmbeddingBagCollectionTest, FeatureDictInputGivesIdenticalOutput) {
  auto ebc = *EmbeddingBagCollection::Create(Options(Pooling::kMean));
  c10::NoGradGuard no_grad;
  const KeyedJaggedTensor kjt = Input();
  KeyedTensor from_kjt = *ebc->Forward(kjt);
  KeyedTensor from_dict =
      *ebc->Forward(FeatureDict::FromKeyedJaggedTensor(kjt));
  EXPECT_EQ(from_kjt.keys(), from_dict.keys());
  EXPECT_TRUE(at::equal(from_kjt.values(), from_dict.values()));
  // Extra keys in the input are ignored; the order of keys does not matter.
  KeyedTensor with_extra = *ebc->Forward(Input(false, /*extra_key=*/true));
  EXPECT_TRUE(at::equal(from_kjt.values(), with_extra.values()));
  KeyedTensor reordered = *ebc->Forward(*kjt.Permute({2, 0, 1}));
  EXPECT_TRUE(at::equal(from_kjt.values(), reordered.values()));
}

TEST(EmbeddingBagCollectionTest, HooksSeeIdsAndRowsBeforeTheUpdate) {
  auto ebc = *EmbeddingBagCollection::Create(Options());
  std::vector<std::vector<int64_t>> seen_ids;
  at::Tensor seen_rows_b;
  int outputs = 0;
  ebc->AddPostLookupHook(
      [&](const EmbeddingModule& module, const ModuleLookup& lookup) {
        EXPECT_EQ(module.path(), "sparse.ebc");
        EXPECT_THAT(lookup.features.keys(), ElementsAre("f1", "f2", "f3"));
        for (const at::Tensor& ids : lookup.ids) {
          seen_ids.emplace_back(ids.data_ptr<int64_t>(),
                                ids.data_ptr<int64_t>() + ids.numel());
        }
        seen_rows_b = lookup.rows[1].clone();
        return absl::OkStatus();
      });
  ebc->AddPostOutputHook([&](const EmbeddingModule&) { ++outputs; });
  const at::Tensor b0 = ebc->weight(1).clone();
  ebc->Forward(Input())->values().sum().backward();
  EXPECT_THAT(seen_ids, ElementsAre(ElementsAre(1, 1, 4, 9, 4, 0, 2),
                                    ElementsAre(6, 5, 6)));
  EXPECT_TRUE(at::equal(seen_rows_b,
                        b0.index_select(0, at::tensor({6, 5, 6}, at::kLong))));
  EXPECT_EQ(outputs, 1);
  EXPECT_EQ(ebc->TableFqn(1), "sparse.ebc.embedding_bags.b");

  ebc->AddPostLookupHook([](const EmbeddingModule&, const ModuleLookup&) {
    return absl::InternalError("tracker full");
  });
  EXPECT_THAT(ebc->Forward(Input()).status().message(),
              HasSubstr("tracker full"));
  EXPECT_EQ(outputs, 1);
}

TEST(EmbeddingBagCollectionTest, ClearErrors) {
  EmbeddingModuleOptions options = Options(Pooling::kMean);
  options.is_weighted = true;
  EXPECT_THAT(EmbeddingBagCollection::Create(options).status().message(),
              HasSubstr("mean pooling"));
  options = Options();
  options.tables[1].feature_names = {"f1"};
  EXPECT_THAT(EmbeddingBagCollection::Create(options).status().message(),
              HasSubstr("feature 'f1' is read by tables 'a' and 'b'"));
  options = Options();
  options.tables[0].num_embeddings = 0;
  EXPECT_THAT(EmbeddingBagCollection::Create(options).status().message(),
              HasSubstr("table 'a'"));
  options = Options();
  options.path = "";
  EXPECT_FALSE(EmbeddingBagCollection::Create(options).ok());

  auto ebc = *EmbeddingBagCollection::Create(Options());
  auto missing = *KeyedJaggedTensor::FromLengths(
      {"f1"}, at::tensor({1}, at::kLong), at::tensor({1}, at::kLong));
  EXPECT_EQ(ebc->Forward(missing).status().code(), absl::StatusCode::kNotFound);
  auto out_of_range = *KeyedJaggedTensor::FromLengths(
      {"f1", "f2", "f3"}, at::tensor({1, 2, 70}, at::kLong),
      at::tensor({1, 1, 1}, at::kLong));
  EXPECT_THAT(ebc->Forward(out_of_range).status().message(),
              HasSubstr("lookup failed"));
  options = Options();
  options.is_weighted = true;
  auto weighted = *EmbeddingBagCollection::Create(options);
  EXPECT_THAT(weighted->Forward(Input()).status().message(),
              HasSubstr("no weights"));
}

TEST(EmbeddingCollectionTest, RowsAndGradientMatchDenseReference) {
  EmbeddingModuleOptions options = Options();
  options.path = "seq.ec";
  auto ec = *EmbeddingCollection::Create(options);
  const KeyedJaggedTensor input = Input();
  at::Tensor a = ec->weight(0).clone().requires_grad_(true);
  at::Tensor b = ec->weight(1).clone().requires_grad_(true);
  const at::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  std::vector<at::Tensor> expected = {a.index_select(0, input.ValuesOf(0)),
                                      a.index_select(0, input.ValuesOf(1)),
                                      b.index_select(0, input.ValuesOf(2))};
  std::vector<at::Tensor> mixes;
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (const at::Tensor& e : expected) {
    mixes.push_back(at::randn(e.sizes(), at::kDouble));
    loss = loss + (e * mixes.back()).sum();
  }
  loss.backward();

  FeatureDict output = *ec->Forward(input);
  ASSERT_THAT(output.keys(), ElementsAre("f1", "f2", "f3"));
  at::Tensor module_loss = at::zeros({}, at::kDouble);
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(at::equal(output.At(k).values(), expected[k].detach())) << k;
    EXPECT_TRUE(at::equal(output.At(k).lengths(), input.LengthsOf(k))) << k;
    module_loss = module_loss + (output.At(k).values() * mixes[k]).sum();
  }
  module_loss.backward();
  EXPECT_TRUE(at::allclose(ec->weight(0), a0 - a.grad(), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(ec->weight(1), b0 - b.grad(), 1e-12, 1e-12));
  EXPECT_EQ(ec->TableFqn(0), "seq.ec.embeddings.a");

  options.is_weighted = true;
  EXPECT_THAT(EmbeddingCollection::Create(options).status().message(),
              HasSubstr("pooled"));
}

TEST(EmbeddingCollectionTest, FeatureDictInputGivesIdenticalOutput) {
  EmbeddingModuleOptions options = Options();
  options.path = "seq.ec";
  auto ec = *EmbeddingCollection::Create(options);
  c10::NoGradGuard no_grad;
  FeatureDict from_kjt = *ec->Forward(Input());
  FeatureDict from_dict =
      *ec->Forward(FeatureDict::FromKeyedJaggedTensor(Input()));
  for (int64_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(at::equal(from_kjt.At(k).values(), from_dict.At(k).values()));
  }
}

TEST(EmbeddingModuleTest, StateTensorsRoundTripAndSeedsAreDeterministic) {
  auto first = *EmbeddingBagCollection::Create(
      Options(Pooling::kSum, SparseOptimizerType::kAdam, 0.1));
  auto second = *EmbeddingBagCollection::Create(
      Options(Pooling::kSum, SparseOptimizerType::kAdam, 0.1));
  EXPECT_TRUE(at::equal(first->weight(0), second->weight(0)));
  EXPECT_FALSE(at::equal(first->weight(0).narrow(1, 0, 3).narrow(0, 0, 7),
                         first->weight(1)));
  first->Forward(Input())->values().sum().backward();
  std::vector<std::pair<std::string, at::Tensor>> states =
      first->StateTensors();
  std::vector<std::string> names;
  for (const auto& [name, tensor] : states) names.push_back(name);
  EXPECT_THAT(names,
              ElementsAre("a.weight", "a.momentum1", "a.momentum2", "a.step",
                          "b.weight", "b.momentum1", "b.momentum2", "b.step"));
  ASSERT_TRUE(second->LoadStateTensors(states).ok());
  first->Forward(Input())->values().sum().backward();
  second->Forward(Input())->values().sum().backward();
  EXPECT_TRUE(at::equal(first->weight(0), second->weight(0)));
  EXPECT_TRUE(at::equal(first->weight(1), second->weight(1)));

  states.pop_back();
  EXPECT_THAT(second->LoadStateTensors(states).message(),
              HasSubstr("'b.step' missing"));
}

TEST(EmbeddingModuleTest, ReadsRowsAndOptimizerStates) {
  auto ebc = *EmbeddingBagCollection::Create(
      Options(Pooling::kSum, SparseOptimizerType::kRowwiseAdagrad, 0.1));
  ebc->Forward(Input())->values().sum().backward();
  at::Tensor ids = at::tensor({6, 3}, at::kLong);
  EXPECT_TRUE(
      at::equal(*ebc->ReadRows(1, ids), ebc->weight(1).index_select(0, ids)));
  at::Tensor states = *ebc->ReadOptimizerStates(1, ids);
  EXPECT_EQ(states.sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_GT(states[0].item<double>(), 0);  // row 6 was looked up
  EXPECT_EQ(states[1].item<double>(), 0);  // row 3 was not
  EXPECT_THAT(ebc->ReadRows(1, at::tensor({7}, at::kLong)).status().message(),
              HasSubstr("out of range"));
}

TEST(EmbeddingModuleTest, CudaMatchesCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  EmbeddingModuleOptions options =
      Options(Pooling::kMean, SparseOptimizerType::kAdagrad, 0.1);
  auto cpu = *EmbeddingBagCollection::Create(options);
  options.device = c10::Device(c10::kCUDA, 0);
  auto gpu = *EmbeddingBagCollection::Create(options);
  const KeyedJaggedTensor input = Input();
  for (int step = 0; step < 3; ++step) {
    cpu->Forward(input)->values().pow(2).sum().backward();
    gpu->Forward(input.To(gpu->device()))->values().pow(2).sum().backward();
  }
  EXPECT_TRUE(at::allclose(cpu->weight(0), gpu->weight(0).cpu(), 1e-9, 1e-9));
  EXPECT_TRUE(at::allclose(cpu->weight(1), gpu->weight(1).cpu(), 1e-9, 1e-9));
}

}  // namespace
}  // namespace deltastream
