#ifndef DELTASTREAM_TRACKER_SERVICE_TABLE_SCORES_H_
#define DELTASTREAM_TRACKER_SERVICE_TABLE_SCORES_H_

#include <string>

#include "absl/status/status.h"
#include "tracker_service/live_rows_reader.h"
#include "tracker_service/top_k.h"
#include "tracker_service/tracker.h"
#include "tracker_service/tracking_mode.h"

namespace deltastream {

// What each tracking mode makes of one table's unique rows at read time: the
// step of Tracker::GetDelta after the store returned `table.ids` (ascending)
// and `table.states` (the stored FIRST or LAST states; undefined when nothing
// was recorded, or in kIdOnly).
//
//  - every tensor is moved to the host;
//  - with a `reader` (which the caller has pinned), `values` are the live
//    rows, and in kMomentumDiff / kRowwiseAdagrad `states` become
//    latest - first of the optimizer's row state;
//  - scores, when `top_k` is set or `include_scores`: kEmbedding
//    ||current - first||_2 (needs `reader`), kMomentumLast the stored norm,
//    kMomentumDiff / kRowwiseAdagrad ||latest - first||_2; kIdOnly has none
//    (the caller refuses that request first);
//  - with `top_k`, only the top rows stay (TopKPositions; a NaN score ranks
//    below every number, so a row whose value is not finite never wins).
//
// Errors: the reader's. Throws nothing (LibTorch errors become statuses).
absl::Status FinishTableDelta(TrackingMode mode, LiveRowsReader* reader,
                              const std::string& fqn, const TopK* top_k,
                              bool include_scores, TableDelta& table);

}  // namespace deltastream

#endif  // DELTASTREAM_TRACKER_SERVICE_TABLE_SCORES_H_
