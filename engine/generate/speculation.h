// Speculative decoding by prompt lookup (n-gram drafts): a job whose output copies spans of its
// own context (an extraction quoting its document, a tool call repeating names) proposes the
// tokens that followed the latest earlier occurrence of its last n tokens, and the target model
// checks all of them in one forward pass (Generator, engine/generate/generator.h).
//
// Under a grammar (a mask hook that can draft, LogitsMaskHook::can_draft) the draft walks the
// grammar: each guess is kept only while the grammar allows it, the tokens the grammar forces
// after it join the draft (they are certain once the guess is accepted), and where the grammar
// forces text whose last token is not certain (`": "` before a string value) that token is the
// guess. Guesses match the context without regard to one leading space (lookup_classes), so a
// value quoted from a document ("Ghent" after a quote) finds the document's " Ghent". A job with
// forced tokens pending drafts after them in the same pass.
//
// Exactness: a draft only decides which positions get logits in a pass. The generator samples
// position by position from the target's logits, exactly as without speculation (same sampler
// state, random stream, mask, penalties and forced tokens, in the same order), and keeps the
// draft's K/V only up to the first position where the emitted tokens and the draft differ. For a
// one-token draft distribution this is the standard acceptance rule (accept d with probability
// p(d)), so the output is the same token for token, sampled or greedy — provided the backend's
// logits for a position do not depend on how many positions share its pass (the CPU backend's do
// not). Sampled jobs rarely accept, so `auto` speculates for greedy jobs only.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace exl {

enum class Speculation : uint8_t {
  none,   // one token per forward pass
  ngram,  // prompt-lookup drafts, whatever the sampling settings
  draft,  // a draft model's greedy drafts (GeneratorOptions::draft_model), whatever the sampling
  auto_,  // for greedy jobs (temperature 0) without log-probabilities: the draft model when one is
          // loaded, else ngram; none otherwise
};
std::string_view to_string(Speculation s);
// "none" | "ngram" | "draft" | "auto"; nullopt for anything else.
std::optional<Speculation> parse_speculation(std::string_view text);

// The draft for the context `tokens` (prompt and generated so far): for n from max_ngram down to
// min_ngram, the latest earlier occurrence of the last n tokens, and up to max_draft tokens that
// followed it. Empty when no such occurrence exists or max_draft <= 0.
// With `classes` (indexed by token id), tokens match when their classes are equal, so that the
// same word matches with or without its leading space (lookup_classes).
std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int max_draft, int max_ngram = 3,
                                 int min_ngram = 2, std::span<const int32_t> classes = {});

// Per token id: the id of the token whose bytes are its bytes without one leading space, where
// such a token exists, else its own id. A word copied from a document after a quote ("Ghent")
// then matches the document's " Ghent".
std::vector<int32_t> lookup_classes(const Tokenizer& tokenizer);

// A job's draft length, adapted to how much of its drafts the target accepts: grows by one after
// a fully accepted draft, halves after a draft rejected at its first token (bounds [1, max]).
struct DraftLength {
  int cur = 4;
  int max = 8;
  void update(int drafted, int accepted);
};

}  // namespace exl
