#ifndef DELTASTREAM_TRAINER_CURSOR_AGREEMENT_H_
#define DELTASTREAM_TRAINER_CURSOR_AGREEMENT_H_

// Consumers' cursors agreed across the ranks of a sharded trainer after a
// restore (docs/sharding.md, "Restarts").
//
// Each rank snapshots its own tracker at the same step, but a consumer's
// commit (or a read, or AddConsumer) is one RPC per rank: it can reach one
// rank before that rank's snapshot and another after. Restored, the ranks
// would then hold the consumer a read apart, and a merged read would start
// at different batches on different ranks (a column-wise table's blocks then
// disagree). The ranks exchange their consumers' positions and each takes
// the agreed one.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "tracker_service/tracker.h"
#include "trainer/comm/process_group.h"

namespace deltastream {

// The consumers every rank takes, from every rank's Tracker::SaveConsumers()
// (in rank order; the same answer on every rank). Per consumer, by name:
//  - its cursors (the default one and each table's) are the furthest any
//    rank holds: a commit or a read reaches every rank with one cut's end,
//    so a rank behind it would send rows again that the consumer holds, and
//    from another batch than the others;
//  - its pending reads (acknowledged mode) are every rank's, once each,
//    oldest first, less those the agreed cursors cover; a read's
//    lost_through is the highest any rank holds;
//  - a resync flag any rank holds, every rank holds; lost_ids the highest;
//  - a consumer that some ranks lack is added there.
// A rank can serve a position only where its store's lookups are apart
// there: the current batch or later, or one of its compaction bounds (a
// consumer's cursor of that table, a pending read's end); elsewhere its rows
// below the position may be deleted or compacted together with later ones.
// A pending read whose end some rank cannot serve is dropped (on every rank:
// its rows are delivered again, as for a read no longer committable); a
// consumer whose agreed cursor some rank cannot serve must resync (the flag,
// on every rank), since that rank cannot give it exactly the rows after it.
std::vector<ConsumerState> AgreeConsumers(absl::Span<const TrackerState> ranks);

// What AgreeCursors changed on this rank.
struct CursorAgreement {
  int consumers = 0;  // agreed, every rank's together
  int moved = 0;      // whose cursors or pending reads changed here
  int added = 0;      // that this rank lacked
  int resync = 0;     // newly flagged for a resync here
};

// A rank of a sharded trainer after its tracker was restored (every rank
// calls it, from one thread, before any step and before its service answers
// Topology): exchanges every rank's Tracker::SaveConsumers() through two
// all-gathers (sizes, then the padded bytes; labels "cursors.sizes" and
// "cursors.agree") and sets AgreeConsumers' answer (Tracker::SetConsumers).
// Errors: the collective's (a rank gone: within the group's timeout);
// DataLoss when a rank's bytes do not decode.
absl::StatusOr<CursorAgreement> AgreeCursors(Tracker& tracker,
                                             ProcessGroup& group);

// One line for the trainer's log, e.g. "cursors agreed across 2 ranks: 3
// consumers, 1 moved, 0 added, 0 told to resync".
std::string DescribeCursorAgreement(const CursorAgreement& agreement,
                                    int world_size);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CURSOR_AGREEMENT_H_
