// A Hugging Face tokenizer.json with a BPE model: byte-level BPE (Llama 3, Qwen2) and
// SentencePiece-style BPE with byte fallback (Mistral, Llama 2 conversions). encode runs the
// pipeline as Hugging Face does: added tokens are cut out of the text first, each remaining
// piece goes through the normalizer and the pre-tokenizer, and each word through BPE.
// Token bytes follow the decoder (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace);
// added tokens contribute their content. Long pieces that share a prefix with a recent one reuse
// its words' ids (PrefixEncodeMemo). encode is safe to call concurrently.
#pragma once
#include <filesystem>
#include <memory>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/prefix_encode_memo.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/text_normalizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace exl {

class BpeTokenizer : public Tokenizer {
 public:
  // Throws exl::Error naming the file when it is unreadable, malformed or uses an unsupported
  // component.
  explicit BpeTokenizer(const std::filesystem::path& json_file);

  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const override;
  std::vector<int32_t> encode_marked(std::string_view text, std::span<const TextRange> markup) const override;
  std::optional<int32_t> piece_id(std::string_view piece) const override;

  // Encodings of long text pieces that reused a stored prefix's words (PrefixEncodeMemo: pieces of
  // 1 KiB or more after the normalizer, for settling pre-tokenizers).
  uint64_t prefix_memo_hits() const;
  // On by default; off, every piece is split whole (the reference the memo is tested against).
  void set_prefix_memo(bool on) { memo_on_ = on; }

 private:
  std::vector<int32_t> encode_pieces(std::span<const AddedTokenSplitter::Piece> pieces, bool add_bos) const;
  // One normalized text piece through the prefix memo: the stored words of its settled prefix, the
  // rest split and encoded, and the piece stored.
  void encode_memoized(std::string_view text, size_t offset, std::vector<int32_t>& ids) const;
  void load(const nlohmann::json& j, const std::string& where);
  void load_decoder(const nlohmann::json& j, const std::string& where);
  void load_post_processor(const nlohmann::json& j);

  std::unique_ptr<BpeModel> model_;
  AddedTokenSplitter added_{{}};
  TextNormalizer normalizer_;
  PreTokenizer pre_;
  mutable PrefixEncodeMemo memo_;
  bool memo_on_ = true;
};

}  // namespace exl
