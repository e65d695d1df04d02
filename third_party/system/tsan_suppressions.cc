// ThreadSanitizer builds only (bazel --config=tsan, which links each test's
// libraries into its binary so that this definition overrides the runtime's):
// what TSan must not check in Debian's libraries, which are not built with
// TSan. Linked in through the targets that use them (BUILD.bazel).
//
// - LibTorch: its atomic reference counting is invisible to TSan. When one of
//   our threads reads a tensor and drops its reference, and another thread
//   later drops the last one inside LibTorch, the free there looks unordered
//   with the reads: a false report, since the reference count orders them.
// - RocksDB: its memtable is read and written concurrently by design
//   (lock-free, with atomics TSan cannot see), so its memcpy/memcmp on rows
//   look like races.
// Interceptors called from these libraries (their malloc/free, memcpy and
// mutexes) are not checked; our own code, and its locking, still is.

#if defined(__SANITIZE_THREAD__)
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libtorch_cpu.so\n"
         "called_from_lib:librocksdb.so\n"
         "race:rocksdb::\n";
}
#endif
