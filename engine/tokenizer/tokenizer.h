// Text <-> token ids, agreeing token for token with the reference tokenizers (libsentencepiece for
// tokenizer.model, Hugging Face tokenizers for tokenizer.json).
//
// Every token has a byte string (token_bytes) and decode is defined on it:
//   decode(ids) = lossy UTF-8 of the concatenated token bytes, where one leading space is dropped
//   from a token that starts a text segment into which encode put a SentencePiece dummy prefix
//   (see DummyPrefix). Invalid UTF-8 (a model may emit half a character) becomes U+FFFD per
//   maximal invalid subpart, as Hugging Face decode does.
// So decode(encode(s, false)) == s for any valid UTF-8 s, except where the tokenizer's own
// normalization changes the text (NFC, SentencePiece remove_extra_whitespaces, unknown pieces).
//
// Prompts built from untrusted text: encode(text, true) parses special-token text wherever it
// appears, so a chat turn rendered to one string and encoded that way lets a user write
// "<|im_end|>" and open a turn of their own. encode_marked takes the byte ranges where special
// tokens are allowed (a chat template's own markup; see sessions/chat_template.h RenderedPrompt)
// and encodes special-token text anywhere else as plain text: the ids of such text never contain
// a special id. Text without special-token text outside the ranges encodes exactly as with
// encode(text, true).
//
// Immutable after loading apart from internal caches; encode/decode are safe to call from
// several threads at once.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/added_tokens.h"

namespace exl {

// Ids with a role. eos holds every id that ends a generation: the end-of-sequence token and the
// end-of-turn tokens the vocabulary has (<|eot_id|>, <|im_end|>, ...).
struct SpecialTokenIds {
  std::optional<int32_t> bos;
  std::set<int32_t> eos;
  std::optional<int32_t> pad;
  bool add_bos = false;  // encode(text, add_special=true) starts with bos
};

// Where encode prepends a SentencePiece dummy prefix ("▁", a space) to a text segment, so where
// decode drops one leading space again. Segments are the stretches of text between special
// tokens; the sequence start counts as a segment start.
enum class DummyPrefix {
  none,           // byte-level BPE and tokenizer.json files without Prepend/Metaspace
  every_segment,  // SentencePiece add_dummy_prefix, Prepend("▁") normalizer, Metaspace "always"
  first_segment,  // Metaspace "first": only the text at the start of the sequence
};

// Where a decoder stands between tokens; decode and Detokenizer step through it alike.
struct DecodeState {
  bool segment_start = true;  // the next text token starts a segment
  bool sequence_start = true;  // no text token yet
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`. With add_special, the text of special tokens ("<|eot_id|>", "<s>") is
  // parsed into their ids and bos is prepended when add_bos(); without it, special-token text is
  // encoded as ordinary text and nothing is added. Non-special added tokens (Qwen's "<think>")
  // are always recognised, as Hugging Face does.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special = true) const = 0;
  // As encode(text, true), except that special-token text becomes a special id only where it lies
  // wholly inside one of `markup` (byte ranges of text, sorted by begin, not overlapping);
  // anywhere else it is tokenized as ordinary text (see the file comment). The whole text is
  // encoded in one pass, so dummy prefixes and pre-tokenization fall as encode(text, true) puts
  // them.
  virtual std::vector<int32_t> encode_marked(std::string_view text, std::span<const TextRange> markup) const = 0;

  // The text of `ids` (see the file comment). skip_special leaves special tokens out. Throws
  // exl::Error for an id outside [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The exact bytes token `id` contributes to decoded text: byte-fallback "<0x0A>" -> "\n",
  // SentencePiece "▁" -> " ", byte-level BPE characters mapped back to raw bytes; special tokens
  // -> their text. The one exception decode makes is the dummy-prefix space (DummyPrefix).
  // An id with no token (a hole in the vocabulary) has empty bytes. Throws for ids out of range.
  const std::string& token_bytes(int32_t id) const;
  // Control and special added tokens (bos, eos, <unk>, <|im_start|>, ...).
  bool is_special(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

  // The id of the token written `piece` in the tokenizer files (an added token's content, a
  // vocabulary key, a SentencePiece piece), if any.
  virtual std::optional<int32_t> piece_id(std::string_view piece) const = 0;

  const SpecialTokenIds& special_ids() const { return specials_; }
  std::optional<int32_t> bos_id() const { return specials_.bos; }
  const std::set<int32_t>& eos_ids() const { return specials_.eos; }
  std::optional<int32_t> pad_id() const { return specials_.pad; }
  bool add_bos() const { return specials_.add_bos; }
  bool is_eos(int32_t id) const { return specials_.eos.count(id) > 0; }
  // Replaces the special ids.
  void set_special_ids(SpecialTokenIds ids) { specials_ = std::move(ids); }
  // Sets the special ids from a model directory's JSON files ({} when absent) over the
  // tokenizer file's own, by the rules given at load_tokenizer, which calls it.
  void resolve_special_ids(const nlohmann::json& tokenizer_config, const nlohmann::json& config,
                           const nlohmann::json& generation_config);

  DummyPrefix dummy_prefix() const { return dummy_prefix_; }

  // Appends token `id`'s contribution to raw decoded bytes (before the lossy UTF-8 step) and
  // advances `state`. decode is this over all ids, then utf8::lossy.
  void append_token_bytes(DecodeState& state, int32_t id, bool skip_special, std::string& out) const;

 protected:
  struct Token {
    std::string bytes;
    bool special = false;
  };
  std::vector<Token> tokens_;
  SpecialTokenIds specials_;           // as the tokenizer file itself has them
  std::optional<bool> file_add_bos_;  // a tokenizer.json TemplateProcessing's verdict
  DummyPrefix dummy_prefix_ = DummyPrefix::none;
};

// Loads the tokenizer of a model or tokenizer directory: tokenizer.json when present, else
// tokenizer.model. Special ids come from tokenizer_config.json (bos_token/eos_token/pad_token as
// strings or {"content": ...}; add_bos_token), config.json and generation_config.json
// (bos_token_id, eos_token_id as a number or list, pad_token_id), falling back to the tokenizer
// file itself. Resolution:
//  - bos: tokenizer_config bos_token (null means none), else config.json, else
//    generation_config, else the tokenizer file's own (SentencePiece bos piece).
//  - eos: the union of all sources plus the end-of-turn specials the vocabulary has.
//  - pad: like bos.
//  - add_bos: tokenizer_config add_bos_token; else false when bos_token is null or no bos is
//    known; else a tokenizer.json TemplateProcessing post-processor decides (adds bos iff its
//    template starts with the bos token); else true.
// Throws exl::Error naming the directory or file when it is missing, unreadable or malformed.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& dir);

}  // namespace exl
