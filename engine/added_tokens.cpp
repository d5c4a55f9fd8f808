#include "engine/added_tokens.h"

#include <algorithm>
#include <cctype>

#include <re2/re2.h>

#include "kernels/error.h"

namespace exl {

namespace {

std::unique_ptr<RE2> literal_alternation(const std::vector<AddedToken>& tokens, bool with_special) {
  std::vector<const std::string*> lits;
  for (const auto& t : tokens)
    if (!t.content.empty() && (with_special || !t.special)) lits.push_back(&t.content);
  if (lits.empty()) return nullptr;
  std::sort(lits.begin(), lits.end(), [](auto* a, auto* b) { return a->size() > b->size(); });
  std::string pattern;
  for (auto* l : lits) {
    if (!pattern.empty()) pattern += '|';
    pattern += RE2::QuoteMeta(*l);
  }
  RE2::Options opt;
  opt.set_encoding(RE2::Options::EncodingLatin1);
  opt.set_longest_match(true);
  opt.set_log_errors(false);
  opt.set_max_mem(64 << 20);
  auto re = std::make_unique<RE2>(pattern, opt);
  EXL_CHECK(re->ok(), "engine: tokenizer: added tokens do not form a valid pattern: ", re->error());
  return re;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Word characters for single_word: letters, digits, '_' and any non-ASCII character.
bool is_word_byte(char c) {
  auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || std::isalnum(u) || c == '_';
}

}  // namespace

AddedTokenSplitter::AddedTokenSplitter(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) by_content_[tokens_[i].content] = i;
  all_ = literal_alternation(tokens_, true);
  plain_ = literal_alternation(tokens_, false);
}

AddedTokenSplitter::~AddedTokenSplitter() = default;
AddedTokenSplitter::AddedTokenSplitter(AddedTokenSplitter&&) noexcept = default;
AddedTokenSplitter& AddedTokenSplitter::operator=(AddedTokenSplitter&&) noexcept = default;

std::vector<AddedTokenSplitter::Piece> AddedTokenSplitter::split(std::string_view text, bool with_special) const {
  std::vector<Piece> out;
  const RE2* re = with_special ? all_.get() : plain_.get();
  size_t pos = 0, search = 0;
  re2::StringPiece m;
  while (re && search < text.size() && re->Match(text, search, text.size(), RE2::UNANCHORED, &m, 1)) {
    size_t start = static_cast<size_t>(m.data() - text.data());
    size_t end = start + m.size();
    const AddedToken& tok = tokens_[by_content_.at(std::string(m.data(), m.size()))];
    if (tok.single_word && ((start > 0 && is_word_byte(text[start - 1])) ||
                            (end < text.size() && is_word_byte(text[end])))) {
      search = start + 1;
      continue;
    }
    if (tok.lstrip)
      while (start > pos && is_space(text[start - 1])) --start;
    if (tok.rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    if (start > pos) out.push_back({text.substr(pos, start - pos), -1, pos});
    out.push_back({text.substr(start, end - start), tok.id, start});
    pos = search = end;
  }
  if (pos < text.size()) out.push_back({text.substr(pos), -1, pos});
  return out;
}

}  // namespace exl
