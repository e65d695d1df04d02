#ifndef DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
#define DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_

// Checkpoint chains from the reads a client pulls. The chain format, loading
// and verification live in store/checkpoint_chain.h (re-exported here); this
// is only the adapter from a received delta to a link.

#include <string>

#include "absl/status/statusor.h"
#include "clients/delta_client.h"
#include "store/checkpoint_chain.h"

namespace deltastream {

// Writes one read of a consumer as a link. An all_rows read
// (header.all_rows) makes a full link covering [0, end_batch), whatever the
// read's start; any other read an increment covering [start_batch, end_batch)
// (a consumer's first read, start_batch -1, starts at 0). The delta's dense
// parameters (if any) are stored as read at end_batch, with its run_id and
// run_start_batch. Needs the delta's values (a tracker served by the trainer
// sends them). FailedPrecondition for an increment from a read whose service
// dropped rows the consumer had not read (resync_required: it would silently
// miss them; an all_rows read is whole and is written) or a table without
// values; otherwise the errors of WriteChainLinkContent.
absl::StatusOr<ChainLink> WriteChainLink(
    const std::string& dir, const ReceivedDelta& delta,
    const ChainWriteOptions& options = ChainWriteOptions());

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_CHECKPOINT_CHAIN_H_
