#ifndef DELTASTREAM_TESTS_CRASH_DIRECTORY_CONTENTS_H_
#define DELTASTREAM_TESTS_CRASH_DIRECTORY_CONTENTS_H_

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace deltastream {

// Every regular file under `dir` (recursively) with its bytes, by path: to
// show that a refusal changed nothing, and to put a directory back. An
// unreadable or missing directory gives what could be read.
inline std::map<std::string, std::string> DirectoryContents(
    const std::string& dir) {
  std::map<std::string, std::string> contents;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(dir, error)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    contents[entry.path().string()] = bytes.str();
  }
  return contents;
}

}  // namespace deltastream

#endif  // DELTASTREAM_TESTS_CRASH_DIRECTORY_CONTENTS_H_
