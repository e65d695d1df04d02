#ifndef DELTASTREAM_CLIENTS_NPZ_FILE_H_
#define DELTASTREAM_CLIENTS_NPZ_FILE_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "clients/delta_client.h"

namespace deltastream {

// Writes named arrays as a NumPy .npz file (what numpy.savez writes): a ZIP
// archive, entries stored uncompressed, one "<name>.npy" per array in NPY
// format 1.0, C order, little-endian. dtypes: int64 '<i8', int32 '<i4',
// float32 '<f4', float16 '<f2', float64 '<f8', bool '|b1', uint8 '|u1';
// bfloat16, which NumPy lacks, is written as float32 (exact). ZIP64 records
// are written when an entry or the archive passes 4 GiB (or always, with
// `force_zip64`). Device or non-contiguous tensors are copied to contiguous
// host memory first.
// The file appears whole or not at all, and survives a crash once written:
// base/file_io's DurableFile (to "<path>.tmp", fsync'd, renamed, the
// directory fsync'd). Errors name the path; no exception escapes.
absl::Status WriteNpz(
    const std::string& path,
    const std::vector<std::pair<std::string, at::Tensor>>& arrays,
    bool force_zip64 = false);

// A delta as .npz (deltactl get --out=F.npz), for NumPy or PyTorch without
// this project (np.load(F), then f["<fqn>/ids"] ...):
//   "<fqn>/ids"     int64 [n], ascending
//   "<fqn>/states"  [n, ...] tracked states, when the mode has them
//   "<fqn>/values"  [n, dim] current rows, when the server reads live rows
//   "<fqn>/scores"  float32 [n], when asked for
//   "__delta__/start_batch", "__delta__/end_batch"  int64 scalars: the
//       batches [start, end) read
//   "__delta__/resync_required"  bool scalar
//   "__delta__/consumer"  uint8 [k]: the consumer's name in UTF-8
// Tables with no rows are written with zero rows.
absl::Status WriteDeltaNpz(const std::string& path, const ReceivedDelta& delta);

}  // namespace deltastream

#endif  // DELTASTREAM_CLIENTS_NPZ_FILE_H_
