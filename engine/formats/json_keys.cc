#include "shardckpt/engine/formats/json_keys.h"

#include <nlohmann/json.hpp>

#include <unordered_set>

namespace shardckpt {
namespace {

class KeysAtPath : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit KeysAtPath(const std::vector<std::string>& path) : path_(path) {}
  JsonKeys keys;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return Open(true); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& name) override {
    const size_t depth = open_.size();
    if (inside_ && depth == path_.size() + 1) {
      if (!seen_.insert(name).second && keys.duplicate.empty()) keys.duplicate = name;
      keys.names.push_back(name);
    }
    key_at_[depth - 1] = name;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // A container opens at depth open_.size() + 1; it is the wanted object when every object
  // above it holds it under the path's key (the first match only).
  bool Open(bool object) {
    const size_t depth = open_.size() + 1;
    if (depth > kMaxJsonDepth) {
      keys.too_deep = true;
      return false;
    }
    if (object && !keys.found && depth == path_.size() + 1) {
      bool matches = true;
      for (size_t d = 0; d + 1 < depth && matches; ++d) matches = open_[d] && key_at_[d] == path_[d];
      if (matches) keys.found = inside_ = true;
    }
    open_.push_back(object);
    key_at_.emplace_back();
    return true;
  }
  bool Close() {
    if (open_.empty()) return false;
    if (inside_ && open_.size() == path_.size() + 1) inside_ = false;
    open_.pop_back();
    key_at_.pop_back();
    return true;
  }

  const std::vector<std::string>& path_;
  std::vector<bool> open_;             // by depth: an object (true) or an array
  std::vector<std::string> key_at_;    // by depth: the key being read in that object
  std::unordered_set<std::string> seen_;
  bool inside_ = false;
};

}  // namespace

JsonKeys JsonObjectKeys(const std::string& text, const std::vector<std::string>& path) {
  KeysAtPath sax(path);
  if (!nlohmann::json::sax_parse(text, &sax)) {
    JsonKeys none;
    none.too_deep = sax.keys.too_deep;
    return none;
  }
  return sax.keys;
}

}  // namespace shardckpt
