#include "tests/testing/test_dirs.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace deltastream {

std::string TestTempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string FreshDir(const std::string& name) {
  const std::string dir =
      TestTempDir() + "/" + name + "." + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace deltastream
