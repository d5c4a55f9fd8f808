#include "engine/tokenizer/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"

namespace exl {

namespace {

using utf8::kMetaspace;

std::string spaces_for_metaspace(std::string_view piece) {
  std::string out;
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kMetaspace)) {
      out += ' ';
      pos += kMetaspace.size();
    } else {
      out += piece[pos++];
    }
  }
  return out;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::filesystem::path& model_file)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_file.string()) {
  sentencepiece::util::Status status;
  try {
    status = sp_->Load(path_);
  } catch (const std::exception& e) {
    fail("engine: tokenizer: '", path_, "': cannot load SentencePiece model: ", e.what());
  }
  EXL_CHECK(status.ok(), "engine: tokenizer: '", path_, "': cannot load SentencePiece model: ", status.ToString());
  const int n = sp_->GetPieceSize();
  EXL_CHECK(n > 0, "engine: tokenizer: '", path_, "': SentencePiece model has no pieces");
  tokens_.resize(n);
  std::vector<AddedToken> control;
  for (int id = 0; id < n; ++id) {
    const std::string& piece = sp_->IdToPiece(id);
    Token& t = tokens_[id];
    if (sp_->IsControl(id) || sp_->IsUnknown(id)) {
      t = Token{piece, true};
      control.push_back(AddedToken{id, piece, true});
    } else if (sp_->IsByte(id) && piece.size() == 6) {
      t.bytes = std::string(1, static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } else {
      t.bytes = spaces_for_metaspace(piece);
    }
  }
  specials_text_ = AddedTokenSplitter(std::move(control));

  std::vector<std::string> probe;
  if (sp_->Encode("a", &probe).ok() && !probe.empty() && probe[0].starts_with(kMetaspace))
    dummy_prefix_ = DummyPrefix::every_segment;
  if (sp_->bos_id() >= 0) specials_.bos = sp_->bos_id();
  if (sp_->eos_id() >= 0) specials_.eos.insert(sp_->eos_id());
  if (sp_->pad_id() >= 0) specials_.pad = sp_->pad_id();
  specials_.add_bos = specials_.bos.has_value();
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_text(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<int> out;
  auto status = sp_->Encode(text, &out);
  EXL_CHECK(status.ok(), "engine: tokenizer: '", path_, "': SentencePiece encode failed: ", status.ToString());
  ids.insert(ids.end(), out.begin(), out.end());
}

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  if (!add_special) {
    encode_text(text, ids);
    return ids;
  }
  return encode_pieces(specials_text_.split(text, true));
}

std::vector<int32_t> SentencePieceTokenizer::encode_marked(std::string_view text,
                                                           std::span<const TextRange> markup) const {
  return encode_pieces(specials_text_.split(text, markup));
}

std::vector<int32_t> SentencePieceTokenizer::encode_pieces(std::span<const AddedTokenSplitter::Piece> pieces) const {
  std::vector<int32_t> ids;
  if (specials_.add_bos && specials_.bos) ids.push_back(*specials_.bos);
  for (const auto& piece : pieces) {
    if (piece.id >= 0)
      ids.push_back(piece.id);
    else
      encode_text(piece.text, ids);
  }
  return ids;
}

std::optional<int32_t> SentencePieceTokenizer::piece_id(std::string_view piece) const {
  int id = sp_->PieceToId(piece);
  if (id < 0 || id >= sp_->GetPieceSize()) return std::nullopt;
  if (id == sp_->unk_id() && piece != sp_->IdToPiece(id)) return std::nullopt;
  return id;
}

}  // namespace exl
