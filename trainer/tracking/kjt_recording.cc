#include "trainer/tracking/kjt_recording.h"

#include <vector>

namespace deltastream {

absl::Status RecordKjtLookup(Tracker& tracker, const KeyedJaggedTensor& kjt,
                             const at::Tensor& embeddings) {
  std::vector<FeatureIds> features;
  features.reserve(kjt.keys().size());
  for (int64_t k = 0; k < kjt.num_keys(); ++k) {
    features.push_back({kjt.keys()[k], kjt.ValuesOf(k)});
  }
  return tracker.RecordLookup(features, embeddings);
}

}  // namespace deltastream
