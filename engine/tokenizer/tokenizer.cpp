#include "engine/tokenizer/tokenizer.h"

#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/formats/model_dir.h"
#include "engine/tokenizer/sentencepiece_tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"

namespace exl {

namespace fs = std::filesystem;

namespace {

// End-of-turn tokens of the chat formats we know; added to eos when the vocabulary has them.
constexpr std::string_view kEndOfTurn[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>"};

// A tokenizer_config token entry: "text", {"content": "text"} or null.
std::optional<std::string> token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// config.json / generation_config.json ids: a number, a list of numbers, or null.
std::vector<int32_t> config_ids(const nlohmann::json& cfg, const char* key) {
  std::vector<int32_t> out;
  auto it = cfg.find(key);
  if (it == cfg.end()) return out;
  auto take = [&](const nlohmann::json& v) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  };
  if (it->is_array())
    for (const auto& v : *it) take(v);
  else
    take(*it);
  return out;
}

}  // namespace

const std::string& Tokenizer::token_bytes(int32_t id) const {
  EXL_CHECK(id >= 0 && id < vocab_size(), "engine: tokenizer: token id ", id, " out of range [0, ", vocab_size(), ")");
  return tokens_[id].bytes;
}

bool Tokenizer::is_special(int32_t id) const {
  EXL_CHECK(id >= 0 && id < vocab_size(), "engine: tokenizer: token id ", id, " out of range [0, ", vocab_size(), ")");
  return tokens_[id].special;
}

void Tokenizer::append_token_bytes(DecodeState& state, int32_t id, bool skip_special, std::string& out) const {
  const std::string& bytes = token_bytes(id);
  if (tokens_[id].special) {
    if (!skip_special) out += bytes;
    state.segment_start = true;
    return;
  }
  if (bytes.empty()) return;
  std::string_view b = bytes;
  bool drop = (dummy_prefix_ == DummyPrefix::every_segment && state.segment_start) ||
              (dummy_prefix_ == DummyPrefix::first_segment && state.sequence_start);
  if (drop && b[0] == ' ') b.remove_prefix(1);
  out += b;
  state.segment_start = state.sequence_start = false;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  DecodeState state;
  for (int32_t id : ids) append_token_bytes(state, id, skip_special, raw);
  return utf8::lossy(raw);
}

void Tokenizer::resolve_special_ids(const nlohmann::json& tok_cfg, const nlohmann::json& cfg,
                                    const nlohmann::json& gen) {
  auto lookup = [&](const nlohmann::json& v) -> std::optional<int32_t> {
    auto text = token_text(v);
    return text ? piece_id(*text) : std::nullopt;
  };
  auto in_range = [&](int32_t id) { return id >= 0 && id < vocab_size(); };
  auto pick = [&](const char* tok_key, const char* id_key, std::optional<int32_t> dflt) -> std::optional<int32_t> {
    if (tok_cfg.contains(tok_key)) {
      if (tok_cfg[tok_key].is_null()) return std::nullopt;
      if (auto id = lookup(tok_cfg[tok_key])) return id;
    }
    for (const auto* j : {&cfg, &gen})
      for (int32_t id : config_ids(*j, id_key))
        if (in_range(id)) return id;
    return dflt;
  };

  SpecialTokenIds s;
  s.bos = pick("bos_token", "bos_token_id", specials_.bos);
  s.pad = pick("pad_token", "pad_token_id", specials_.pad);
  s.eos = specials_.eos;
  if (tok_cfg.contains("eos_token"))
    if (auto id = lookup(tok_cfg["eos_token"])) s.eos.insert(*id);
  for (const auto* j : {&cfg, &gen})
    for (int32_t id : config_ids(*j, "eos_token_id"))
      if (in_range(id)) s.eos.insert(id);
  for (auto text : kEndOfTurn)
    if (auto id = piece_id(text); id && is_special(*id)) s.eos.insert(*id);

  auto flag = tok_cfg.find("add_bos_token");
  if (flag != tok_cfg.end() && flag->is_boolean())
    s.add_bos = flag->get<bool>();
  else if (!s.bos)
    s.add_bos = false;
  else
    s.add_bos = file_add_bos_.value_or(true);
  specials_ = std::move(s);
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& dir) {
  EXL_CHECK(fs::is_directory(dir), "engine: tokenizer: '", dir.string(), "' is not a directory");
  std::unique_ptr<Tokenizer> tok;
  if (fs::exists(dir / "tokenizer.json"))
    tok = std::make_unique<BpeTokenizer>(dir / "tokenizer.json");
  else if (fs::exists(dir / "tokenizer.model"))
    tok = std::make_unique<SentencePieceTokenizer>(dir / "tokenizer.model");
  else
    fail("engine: tokenizer: '", dir.string(), "' has neither tokenizer.json nor tokenizer.model");
  auto opt_json = [&](const char* name) {
    fs::path p = dir / name;
    if (!fs::exists(p)) return nlohmann::json::object();
    nlohmann::json j = read_json_file(p);
    EXL_CHECK(j.is_object(), "engine: tokenizer: '", p.string(), "' is not a JSON object");
    return j;
  };
  nlohmann::json tok_cfg = opt_json("tokenizer_config.json"), cfg = opt_json("config.json"),
                 gen = opt_json("generation_config.json");
  tok->resolve_special_ids(tok_cfg, cfg, gen);
  return tok;
}

}  // namespace exl
