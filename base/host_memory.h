#ifndef DELTASTREAM_BASE_HOST_MEMORY_H_
#define DELTASTREAM_BASE_HOST_MEMORY_H_

namespace deltastream {

// Makes freed host memory stay in the process for reuse, for programs that
// allocate and free large tensors over and over (a server's deltas, a store's
// compactions, benchmarks). Call once, first thing in main().
//
// Why: on VMs a fresh page costs microseconds to fault in, and by default
// glibc returns large blocks to the kernel on free; LibTorch's CPU allocator
// also uses posix_memalign, whose blocks glibc does not reuse for the next
// aligned request of the same size (the heap grows instead). So every delta
// would fault in all its pages again (stream_bench: most of a read's time).
// This sets glibc to keep freed memory (no mmap for large blocks, no trim, one
// arena so that gRPC's many threads share the reused heap) and installs a
// LibTorch CPU allocator that aligns malloc'd blocks by hand. Tensors made
// before the call keep their own deleters. The footprint then stays at its
// peak, as a cache would.
void KeepHostMemoryForReuse();

}  // namespace deltastream

#endif  // DELTASTREAM_BASE_HOST_MEMORY_H_
