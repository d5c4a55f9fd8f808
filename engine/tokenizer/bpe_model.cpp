#include "engine/tokenizer/bpe_model.h"

#include <cstdio>
#include <queue>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"

namespace exl {

namespace {

std::string byte_token(int b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

std::string optional_string(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  return it->get<std::string>();
}

}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, std::string_view where) {
  std::string type = model.value("type", std::string("BPE"));
  EXL_CHECK(type == "BPE", "engine: tokenizer: '", where, "': model type '", type, "' is not supported (only BPE)");
  EXL_CHECK(optional_string(model, "continuing_subword_prefix").empty() &&
                optional_string(model, "end_of_word_suffix").empty(),
            "engine: tokenizer: '", where, "': BPE continuing_subword_prefix/end_of_word_suffix are not supported");
  const auto& vocab = model.at("vocab");
  EXL_CHECK(vocab.is_object(), "engine: tokenizer: '", where, "': model.vocab must be an object");
  vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    EXL_CHECK(!it.value().is_number_float(), "engine: tokenizer: '", where, "': vocab entry '", it.key(), "' has id ",
              it.value().dump(), ", not an integer");
    int64_t id = it.value().get<int64_t>();
    EXL_CHECK(id >= 0 && id < (int64_t{1} << 30), "engine: tokenizer: '", where, "': vocab entry '", it.key(),
              "' has id ", id, " out of range");
    vocab_.emplace(it.key(), static_cast<int32_t>(id));
  }

  const auto& merges = model.at("merges");
  EXL_CHECK(merges.is_array(), "engine: tokenizer: '", where, "': model.merges must be an array");
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string a, b;
    const auto& m = merges[r];
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      EXL_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "engine: tokenizer: '", where,
                "': merge ", r, " '", s, "' is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      EXL_CHECK(m.is_array() && m.size() == 2, "engine: tokenizer: '", where, "': merge ", r, " is not a pair");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    auto ia = find(a), ib = find(b), iab = find(a + b);
    EXL_CHECK(ia && ib && iab, "engine: tokenizer: '", where, "': merge ", r, " ('", a, "', '", b,
              "') uses a token missing from the vocabulary");
    merges_.emplace(pair_key(*ia, *ib), Merge{static_cast<uint32_t>(r), *iab});
  }

  std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) {
    unk_ = find(unk);
    EXL_CHECK(unk_.has_value(), "engine: tokenizer: '", where, "': unk_token '", unk, "' is not in the vocabulary");
  }
  fuse_unk_ = model.value("fuse_unk", false);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = find(byte_level::char_of(static_cast<uint8_t>(b))).value_or(-1);
    fallback_ids_[b] = find(byte_token(b)).value_or(-1);
  }
}

std::optional<int32_t> BpeModel::find(std::string_view piece) const {
  auto it = vocab_.find(piece);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::initial_symbols(std::string_view word, bool byte_level, std::vector<int32_t>& syms) const {
  auto push_unk = [&] {
    if (!unk_) return;
    if (fuse_unk_ && !syms.empty() && syms.back() == *unk_) return;
    syms.push_back(*unk_);
  };
  if (byte_level) {
    for (char c : word) {
      int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0)
        syms.push_back(id);
      else
        push_unk();
    }
    return;
  }
  for (size_t pos = 0; pos < word.size();) {
    utf8::Char c = utf8::decode(word, pos);
    std::string_view ch = word.substr(pos, c.len);
    pos += c.len;
    if (auto id = find(ch)) {
      syms.push_back(*id);
      continue;
    }
    bool have_bytes = byte_fallback_;
    for (char b : ch) have_bytes = have_bytes && fallback_ids_[static_cast<uint8_t>(b)] >= 0;
    if (have_bytes) {
      for (char b : ch) syms.push_back(fallback_ids_[static_cast<uint8_t>(b)]);
    } else {
      push_unk();
    }
  }
}

void BpeModel::merge(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  if (n < 2) return;
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Cand {
    uint32_t rank;
    int32_t pos, right, id;
  };
  auto later = [](const Cand& x, const Cand& y) { return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(later)> queue(later);
  auto consider = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges_.find(pair_key(syms[left], syms[next[left]]));
    if (it != merges_.end()) queue.push({it->second.rank, left, next[left], it->second.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    Cand c = queue.top();
    queue.pop();
    if (syms[c.pos] < 0 || next[c.pos] != c.right || syms[c.right] < 0) continue;
    auto it = merges_.find(pair_key(syms[c.pos], syms[c.right]));
    if (it == merges_.end() || it->second.id != c.id) continue;
    syms[c.pos] = c.id;
    syms[c.right] = -1;
    next[c.pos] = next[c.right];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> syms;
  std::optional<int32_t> whole;
  if (ignore_merges_) whole = byte_level ? find(byte_level::encode(word)) : find(word);
  if (whole) {
    syms.push_back(*whole);
  } else {
    initial_symbols(word, byte_level, syms);
    merge(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (cache_.size() < kCacheWords) cache_.emplace(std::string(word), std::move(syms));
  }
}

}  // namespace exl
