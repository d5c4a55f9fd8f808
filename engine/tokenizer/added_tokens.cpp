#include "engine/tokenizer/added_tokens.h"

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

// The end of the range holding byte `pos`, or 0 when none does.
size_t range_end_at(std::span<const TextRange> ranges, size_t pos) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), pos,
                             [](size_t p, const TextRange& r) { return p < r.begin; });
  if (it == ranges.begin()) return 0;
  --it;
  return pos < it->end ? it->end : 0;
}

bool inside_one(std::span<const TextRange> ranges, size_t begin, size_t end) {
  const size_t limit = range_end_at(ranges, begin);
  return limit > begin && end <= limit;
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
  return split_impl(text, with_special, nullptr);
}

std::vector<AddedTokenSplitter::Piece> AddedTokenSplitter::split(std::string_view text,
                                                                 std::span<const TextRange> special_ranges) const {
  return split_impl(text, true, &special_ranges);
}

std::vector<AddedTokenSplitter::Piece> AddedTokenSplitter::split_impl(
    std::string_view text, bool with_special, const std::span<const TextRange>* special_ranges) const {
  std::vector<Piece> out;
  const RE2* re = with_special ? all_.get() : plain_.get();
  size_t pos = 0, search = 0;
  re2::StringPiece m;
  while (re && search < text.size() && re->Match(text, search, text.size(), RE2::UNANCHORED, &m, 1)) {
    size_t start = static_cast<size_t>(m.data() - text.data());
    size_t end = start + m.size();
    const AddedToken* tok = &tokens_[by_content_.at(std::string(m.data(), m.size()))];
    if (tok->special && special_ranges && !inside_one(*special_ranges, start, end)) {
      // Not a special token here. The longest token that may start here instead: a special one
      // ending inside the range holding `start` (markup followed by content), or a non-special one.
      const AddedToken* alt = nullptr;
      size_t alt_size = 0;
      if (size_t limit = range_end_at(*special_ranges, start);
          limit > start && all_->Match(text, start, limit, RE2::ANCHOR_START, &m, 1)) {
        alt = &tokens_[by_content_.at(std::string(m.data(), m.size()))];
        alt_size = m.size();
      }
      if (plain_ && plain_->Match(text, start, text.size(), RE2::ANCHOR_START, &m, 1) && m.size() > alt_size) {
        alt = &tokens_[by_content_.at(std::string(m.data(), m.size()))];
        alt_size = m.size();
      }
      if (!alt) {
        search = start + 1;
        continue;
      }
      tok = alt;
      end = start + alt_size;
    }
    if (tok->single_word && ((start > 0 && is_word_byte(text[start - 1])) ||
                             (end < text.size() && is_word_byte(text[end])))) {
      search = start + 1;
      continue;
    }
    if (tok->lstrip)
      while (start > pos && is_space(text[start - 1])) --start;
    if (tok->rstrip)
      while (end < text.size() && is_space(text[end])) ++end;
    if (start > pos) out.push_back({text.substr(pos, start - pos), -1, pos});
    out.push_back({text.substr(start, end - start), tok->id, start});
    pos = search = end;
  }
  if (pos < text.size()) out.push_back({text.substr(pos), -1, pos});
  return out;
}

}  // namespace exl
