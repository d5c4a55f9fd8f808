#include "engine/tokenizer/pretokenizer.h"

#include <re2/re2.h>

#include "kernels/error.h"

namespace exl {

namespace {

constexpr std::string_view kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Patterns every alternative of which ends a word on the first character that cannot extend it,
// except whitespace runs (PrefixEncodeMemo's condition): GPT-2's, Llama 3's and Qwen2's.
constexpr std::string_view kSettlingPatterns[] = {
    kGpt2Pattern,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

bool settling(std::string_view pattern) {
  for (std::string_view p : kSettlingPatterns)
    if (p == pattern) return true;
  return false;
}

std::string replace_spaces(std::string_view s, std::string_view by) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (char c : s) {
    if (c == ' ')
      out += by;
    else
      out += c;
  }
  return out;
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, std::string_view where) {
  PreTokenizer p;
  if (j.is_null()) return p;
  p.settles_ = true;
  if (j.at("type") == "Sequence") {
    const auto& list = j.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) p.add(list[i], where, i + 1 == list.size());
  } else {
    p.add(j, where, true);
  }
  return p;
}

void PreTokenizer::add(const nlohmann::json& j, std::string_view where, bool last) {
  std::string type = j.at("type").get<std::string>();
  auto unsupported = [&](std::string_view what) {
    fail("engine: tokenizer: '", where, "': pre_tokenizer ", type, ": ", what, " is not supported");
  };
  if (byte_level_) unsupported("a step after ByteLevel");
  if (type == "Split") {
    if (j.value("behavior", "Isolated") != "Isolated") unsupported("behavior other than Isolated");
    if (j.value("invert", false)) unsupported("invert");
    const auto& pat = j.at("pattern");
    std::string rx = pat.contains("Regex") ? pat.at("Regex").get<std::string>()
                                           : RE2::QuoteMeta(pat.at("String").get<std::string>());
    splits_.emplace_back(rx);
    settles_ = settles_ && settling(rx);
  } else if (type == "ByteLevel") {
    if (!last) unsupported("ByteLevel before other steps");
    byte_level_ = true;
    byte_level_prefix_space_ = j.value("add_prefix_space", false);
    if (byte_level_prefix_space_ && (!splits_.empty() || metaspace_)) unsupported("add_prefix_space after other steps");
    if (j.value("use_regex", true)) splits_.emplace_back(kGpt2Pattern);
    settles_ = settles_ && !byte_level_prefix_space_ && !splits_.empty();
  } else if (type == "Metaspace") {
    if (metaspace_ || !splits_.empty()) unsupported("Metaspace after other steps");
    metaspace_ = true;
    replacement_ = j.value("replacement", std::string("\xE2\x96\x81"));
    if (replacement_.empty()) unsupported("an empty replacement");
    metaspace_split_ = j.value("split", true);
    std::string scheme = j.value("prepend_scheme", std::string(j.value("add_prefix_space", true) ? "always" : "never"));
    if (scheme == "always") prepend_ = Prepend::always;
    else if (scheme == "first") prepend_ = Prepend::first;
    else if (scheme == "never") prepend_ = Prepend::never;
    else unsupported("prepend_scheme '" + scheme + "'");
  } else {
    fail("engine: tokenizer: '", where, "': pre_tokenizer type '", type, "' is not supported");
  }
}

void PreTokenizer::run(std::string_view text, size_t offset, std::string& storage,
                       std::vector<std::string_view>& words) const {
  std::string_view s = text;
  if (metaspace_) {
    bool prepend = prepend_ == Prepend::always || (prepend_ == Prepend::first && offset == 0);
    storage.clear();
    if (prepend && !text.starts_with(' ') && !text.starts_with(replacement_)) storage += replacement_;
    storage += replace_spaces(text, replacement_);
    s = storage;
  } else if (byte_level_prefix_space_ && !text.empty() && text[0] != ' ') {
    storage.assign(1, ' ');
    storage.append(text);
    s = storage;
  }
  std::vector<std::string_view> cur;
  if (metaspace_ && metaspace_split_) {
    for (size_t start = 0; start < s.size();) {
      size_t hit = s.find(replacement_, start + 1);
      if (hit == std::string_view::npos) hit = s.size();
      cur.push_back(s.substr(start, hit - start));
      start = hit;
    }
  } else if (!s.empty()) {
    cur.push_back(s);
  }
  std::vector<std::string_view> next;
  for (const auto& re : splits_) {
    next.clear();
    for (auto w : cur) re.split(w, next);
    cur.swap(next);
  }
  words.insert(words.end(), cur.begin(), cur.end());
}

}  // namespace exl
