#ifndef DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_
#define DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trainer/modules/embedding_config.h"

namespace deltastream {
namespace testing {

// A table config with every field set (-Wmissing-field-initializers).
inline EmbeddingTableConfig Table(const std::string& name, int64_t rows,
                                  int64_t dim,
                                  std::vector<std::string> features,
                                  Pooling pooling = Pooling::kSum) {
  EmbeddingTableConfig table;
  table.name = name;
  table.num_embeddings = rows;
  table.embedding_dim = dim;
  table.feature_names = std::move(features);
  table.pooling = pooling;
  return table;
}

}  // namespace testing
}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TRAINER_SHARDING_TABLE_CONFIGS_H_
