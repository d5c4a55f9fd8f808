// A SentencePiece tokenizer.model, encoded by libsentencepiece itself (the reference).
// With add_special, the text of control and unknown pieces ("<s>", "</s>", "<unk>") is parsed
// into their ids and the text between them is encoded piece by piece, each with its own dummy
// prefix, as Hugging Face's Llama tokenizer (legacy mode) does; encode_marked does so only inside
// markup, and control-piece text elsewhere stays in its piece (libsentencepiece never encodes
// text into a control id). Token bytes: byte pieces
// "<0xXX>" -> the byte, "▁" -> " ", control and unknown pieces -> their text (special).
#pragma once
#include <filesystem>
#include <memory>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace exl {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Throws exl::Error naming the file when libsentencepiece cannot load it.
  explicit SentencePieceTokenizer(const std::filesystem::path& model_file);
  ~SentencePieceTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const override;
  std::vector<int32_t> encode_marked(std::string_view text, std::span<const TextRange> markup) const override;
  std::optional<int32_t> piece_id(std::string_view piece) const override;

 private:
  std::vector<int32_t> encode_pieces(std::span<const AddedTokenSplitter::Piece> pieces) const;
  void encode_text(std::string_view text, std::vector<int32_t>& ids) const;

  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  AddedTokenSplitter specials_text_{{}};
};

}  // namespace exl
