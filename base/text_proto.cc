#include "base/text_proto.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace deltastream {
namespace {

// Keeps the parser's first error with its position.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!first_.empty()) return;
    first_ =
        absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

absl::Status ParseTextProto(absl::string_view text,
                            google::protobuf::Message* message) {
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  message->Clear();
  if (!parser.ParseFromString(std::string(text), message)) {
    return absl::InvalidArgumentError(errors.first().empty() ? "does not parse"
                                                             : errors.first());
  }
  return absl::OkStatus();
}

}  // namespace deltastream
