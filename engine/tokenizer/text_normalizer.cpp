#include "engine/tokenizer/text_normalizer.h"

#include <re2/re2.h>

#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"

namespace exl {

namespace {

using utf8::kMetaspace;

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string_view::npos; pos = hit + from.size()) {
    out.append(s.substr(pos, hit - pos));
    out.append(to);
  }
  out.append(s.substr(pos));
  return out;
}

// RE2 rewrite strings treat backslashes specially; a literal replacement needs them doubled.
std::string literal_rewrite(std::string_view s) { return replace_all(s, "\\", "\\\\"); }

}  // namespace

TextNormalizer TextNormalizer::from_json(const nlohmann::json& j, std::string_view where) {
  TextNormalizer n;
  if (!j.is_null()) n.add(j, where);
  return n;
}

void TextNormalizer::add(const nlohmann::json& j, std::string_view where) {
  std::string type = j.at("type").get<std::string>();
  if (type == "Sequence") {
    for (const auto& s : j.at("normalizers")) add(s, where);
  } else if (type == "NFC") {
    // Identity; see the header.
  } else if (type == "Prepend") {
    steps_.push_back({Kind::prepend, j.at("prepend").get<std::string>(), {}, nullptr});
  } else if (type == "Replace") {
    const auto& pat = j.at("pattern");
    std::string content = j.at("content").get<std::string>();
    if (pat.contains("String")) {
      steps_.push_back({Kind::replace_string, pat.at("String").get<std::string>(), content, nullptr});
    } else {
      std::string rx = pat.at("Regex").get<std::string>();
      RE2::Options opt;
      opt.set_log_errors(false);
      auto re = std::make_shared<RE2>(rx, opt);
      EXL_CHECK(re->ok(), "engine: tokenizer: '", where, "': normalizer Replace regex '", rx, "': ", re->error());
      steps_.push_back({Kind::replace_regex, rx, literal_rewrite(content), std::move(re)});
    }
  } else {
    fail("engine: tokenizer: '", where, "': normalizer type '", type, "' is not supported");
  }
}

std::string TextNormalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const auto& st : steps_) {
    switch (st.kind) {
      case Kind::prepend:
        if (!s.empty()) s.insert(0, st.text);
        break;
      case Kind::replace_string:
        s = replace_all(s, st.text, st.content);
        break;
      case Kind::replace_regex:
        RE2::GlobalReplace(&s, *st.re, st.content);
        break;
    }
  }
  return s;
}

bool TextNormalizer::prepends_metaspace() const {
  for (const auto& st : steps_)
    if (st.kind == Kind::prepend && st.text == kMetaspace) return true;
  return false;
}

}  // namespace exl
