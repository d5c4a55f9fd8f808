#include "engine/tokenizer/bpe_tokenizer.h"

#include "engine/tokenizer/byte_level.h"
#include "engine/formats/model_dir.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"

namespace exl {

namespace {

using utf8::kMetaspace;

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
  return s;
}

// "<0xXX>" -> the byte, if `piece` is one.
std::optional<char> fallback_byte(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return std::nullopt;
  int v = 0;
  for (char c : piece.substr(3, 2)) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + d;
  }
  return static_cast<char>(v);
}

// What the decoder does to one token, flattened.
struct DecoderSteps {
  bool byte_level = false;
  bool byte_fallback = false;
  std::vector<std::pair<std::string, std::string>> replaces;
  std::string metaspace;  // replacement char mapped back to " ", if a Metaspace decoder is present

  void add(const nlohmann::json& j, const std::string& where) {
    if (j.is_null()) return;
    std::string type = j.at("type").get<std::string>();
    if (type == "Sequence") {
      for (const auto& d : j.at("decoders")) add(d, where);
    } else if (type == "ByteLevel") {
      byte_level = true;
    } else if (type == "ByteFallback") {
      byte_fallback = true;
    } else if (type == "Replace") {
      const auto& pat = j.at("pattern");
      EXL_CHECK(pat.contains("String"), "engine: tokenizer: '", where, "': decoder Replace with a regex is not supported");
      replaces.emplace_back(pat.at("String").get<std::string>(), j.at("content").get<std::string>());
    } else if (type == "Metaspace") {
      metaspace = j.value("replacement", std::string(kMetaspace));
    } else if (type != "Fuse" && type != "Strip") {
      fail("engine: tokenizer: '", where, "': decoder type '", type, "' is not supported");
    }
  }

  std::string bytes_of(const std::string& piece) const {
    if (byte_fallback)
      if (auto b = fallback_byte(piece)) return std::string(1, *b);
    std::string s = piece;
    for (const auto& [from, to] : replaces) s = replace_all(std::move(s), from, to);
    if (!metaspace.empty()) s = replace_all(std::move(s), metaspace, " ");
    if (byte_level) s = byte_level::decode(s);
    return s;
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(const std::filesystem::path& json_file) {
  nlohmann::json j = read_json_file(json_file);
  std::string where = json_file.string();
  try {
    load(j, where);
  } catch (const nlohmann::json::exception& e) {
    fail("engine: tokenizer: '", where, "': unexpected structure: ", e.what());
  }
}

void BpeTokenizer::load(const nlohmann::json& j, const std::string& where) {
  EXL_CHECK(j.is_object() && j.contains("model"), "engine: tokenizer: '", where, "': no 'model' object");
  model_ = std::make_unique<BpeModel>(j.at("model"), where);

  std::vector<AddedToken> added;
  if (j.contains("added_tokens") && !j.at("added_tokens").is_null()) {
    for (const auto& a : j.at("added_tokens")) {
      AddedToken t;
      EXL_CHECK(!a.at("id").is_number_float(), "engine: tokenizer: '", where, "': added token id ", a.at("id").dump(),
                " is not an integer");
      int64_t id = a.at("id").get<int64_t>();
      EXL_CHECK(id >= 0 && id < (int64_t{1} << 30), "engine: tokenizer: '", where, "': added token id ", id,
                " out of range");
      t.id = static_cast<int32_t>(id);
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", false);
      added.push_back(std::move(t));
    }
  }

  int32_t n = 0;
  for (const auto& [piece, id] : model_->vocab()) n = std::max(n, id + 1);
  for (const auto& t : added) n = std::max(n, t.id + 1);
  tokens_.assign(n, Token{});

  DecoderSteps dec;
  dec.add(j.value("decoder", nlohmann::json()), where);
  for (const auto& [piece, id] : model_->vocab()) tokens_[id].bytes = dec.bytes_of(piece);
  for (const auto& t : added) tokens_[t.id] = Token{t.content, t.special};
  added_ = AddedTokenSplitter(std::move(added));

  normalizer_ = TextNormalizer::from_json(j.value("normalizer", nlohmann::json()), where);
  pre_ = PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()), where);
  if (normalizer_.prepends_metaspace() || pre_.metaspace_prepend() == PreTokenizer::Prepend::always)
    dummy_prefix_ = DummyPrefix::every_segment;
  else if (pre_.metaspace_prepend() == PreTokenizer::Prepend::first)
    dummy_prefix_ = DummyPrefix::first_segment;
  load_post_processor(j.value("post_processor", nlohmann::json()));
}

// A TemplateProcessing post-processor (alone or inside a Sequence) tells whether bos is added.
void BpeTokenizer::load_post_processor(const nlohmann::json& j) {
  if (j.is_null()) return;
  std::string type = j.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& p : j.value("processors", nlohmann::json::array())) load_post_processor(p);
    return;
  }
  if (type != "TemplateProcessing") return;
  file_add_bos_ = false;
  const auto& single = j.at("single");
  if (single.empty() || !single[0].contains("SpecialToken")) return;
  std::string name = single[0]["SpecialToken"].at("id").get<std::string>();
  if (auto id = piece_id(name)) {
    file_add_bos_ = true;
    specials_.bos = *id;
  }
}

std::optional<int32_t> BpeTokenizer::piece_id(std::string_view piece) const {
  for (const auto& t : added_.tokens())
    if (t.content == piece) return t.id;
  return model_->find(piece);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special) const {
  return encode_pieces(added_.split(text, add_special), add_special);
}

std::vector<int32_t> BpeTokenizer::encode_marked(std::string_view text, std::span<const TextRange> markup) const {
  return encode_pieces(added_.split(text, markup), true);
}

std::vector<int32_t> BpeTokenizer::encode_pieces(std::span<const AddedTokenSplitter::Piece> pieces,
                                                 bool add_bos) const {
  std::vector<int32_t> ids;
  if (add_bos && specials_.add_bos && specials_.bos) ids.push_back(*specials_.bos);
  std::string storage;
  std::vector<std::string_view> words;
  for (const auto& piece : pieces) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
      continue;
    }
    std::string normalized;
    std::string_view norm = piece.text;
    if (!normalizer_.is_identity()) norm = normalized = normalizer_.apply(piece.text);
    if (memo_on_ && pre_.settles_at_word_ends() && norm.size() >= PrefixEncodeMemo::kMinBytes) {
      encode_memoized(norm, piece.offset, ids);
      continue;
    }
    words.clear();
    pre_.run(norm, piece.offset, storage, words);
    for (auto w : words) model_->encode_word(w, pre_.byte_level(), ids);
  }
  return ids;
}

void BpeTokenizer::encode_memoized(std::string_view text, size_t offset, std::vector<int32_t>& ids) const {
  PrefixEncodeMemo::Words done;
  const size_t from = memo_.reuse(text, done);
  const std::string_view rest = text.substr(from);
  std::string storage;
  std::vector<std::string_view> words;
  pre_.run(rest, offset + from, storage, words);
  for (auto w : words) {
    model_->encode_word(w, pre_.byte_level(), done.ids);
    done.word_end.push_back(uint32_t(from + size_t(w.data() - rest.data()) + w.size()));
    done.id_end.push_back(uint32_t(done.ids.size()));
  }
  ids.insert(ids.end(), done.ids.begin(), done.ids.end());
  memo_.store(text, std::move(done));
}

uint64_t BpeTokenizer::prefix_memo_hits() const { return memo_.hits(); }

}  // namespace exl
