#ifndef DELTASTREAM_TESTS_TESTING_TEST_DIRS_H_
#define DELTASTREAM_TESTS_TESTING_TEST_DIRS_H_

// Scratch space for tests, under Bazel and under ctest alike.

#include <string>

namespace deltastream {

// The test's scratch directory: Bazel's TEST_TMPDIR, else /tmp.
std::string TestTempDir();

// A path for a directory of the test's own: TestTempDir()/<name>.<pid>
// (the pid keeps tests that share /tmp, as under ctest -j, apart), removed
// with everything below it if it exists, not created.
std::string FreshDir(const std::string& name);

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_TESTING_TEST_DIRS_H_
