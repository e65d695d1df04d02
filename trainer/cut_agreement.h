#ifndef DELTASTREAM_TRAINER_CUT_AGREEMENT_H_
#define DELTASTREAM_TRAINER_CUT_AGREEMENT_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tracker_service/step_cuts.h"
#include "trainer/comm/process_group.h"

namespace deltastream {

// At a step boundary of a sharded trainer (every rank calls it at the same
// step, from its training thread): agrees with the other ranks on the
// consistent cuts that wait on every rank (one AllGather of
// StepCuts::kMaxPerBoundary ids per rank, label "cuts.agree"), serves them
// here (StepCuts::Serve: the training thread holds until this rank's reads
// of them are done, at most `hold_limit`), and returns how many were read.
// A cut some rank has not received yet waits for a later boundary. The
// collective's error (a rank gone: within the group's timeout).
absl::StatusOr<int> ServeAgreedCuts(StepCuts& cuts, ProcessGroup& group,
                                    absl::Duration hold_limit);

}  // namespace deltastream

#endif  // DELTASTREAM_TRAINER_CUT_AGREEMENT_H_
