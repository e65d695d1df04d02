#ifndef DELTASTREAM_BASE_ZIP_CHECKSUMS_H_
#define DELTASTREAM_BASE_ZIP_CHECKSUMS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deltastream {

// Checks a ZIP archive held in memory (a LibTorch checkpoint, which
// torch::pickle_load reads without checking its CRCs; an .npz export): its
// end records (ZIP64 included), every central-directory entry, and the CRC-32
// of every stored (uncompressed) entry's bytes. OK when sound; DataLoss
// naming `name` and the first problem otherwise (a torn archive, a flipped
// byte). Compressed entries are refused: the system writes none.
// Thread-safe (no state).
absl::Status VerifyZipChecksums(absl::string_view bytes,
                                absl::string_view name);

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_ZIP_CHECKSUMS_H_
