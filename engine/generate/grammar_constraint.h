// The grammar engine as a generator constraint: a LogitsMaskHook over one grammar Matcher, so a
// job samples only tokens the grammar allows, appends the continuation the grammar forces without
// sampling, and ends when the grammar is complete.
//
// Masks: fill_mask allows exactly the tokens the matcher allows; EOS ids only where the output so
// far is a complete match. Accepting EOS terminates the matcher and the generator ends the job
// (reason stop_token). A token outside the grammar reaching accept() is an exl::Error.
//
// Forced tokens (the canonical-tokenization rule): when the matcher's forced_bytes() F is
// non-empty, let P be the bytes of the last generated token (empty at the start; for tokenizers
// with a SentencePiece dummy prefix, "\n" + P so the prefix space lands outside P and F). The text
// P + F is encoded with the tokenizer; its tokens are forced only when
//  - the encoding has a token boundary exactly where F starts (the sampled text keeps its
//    canonical split; otherwise nothing is forced this step and the model samples under the mask),
//  - and each forced token ends strictly before the end of F (what follows F may merge with the
//    last piece, so its boundary is not certain) — except when the grammar is complete after F
//    (accepting and allowing nothing but EOS): then every token of F and one EOS id are forced.
// F is cut back to a whole UTF-8 character first (and, with a dummy prefix, loses trailing spaces,
// which SentencePiece normalization strips); when the tokens' bytes are not exactly the text
// (normalization changed it), nothing is forced. So forced tokens are the ones a tokenizer would
// produce for the text, and sampling resumes at the first boundary that depends on the model.
//
// Thread-safety: a GrammarConstraint belongs to one job (the generator's stepping thread).
// shared_token_index and the compile helpers are thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace exl {

// The grammar view of a tokenizer's vocabulary: each token's exact bytes, special tokens other
// than EOS as empty (never allowed), the tokenizer's EOS ids. Built once per distinct vocabulary
// (keyed by its content) and cached for the life of the process.
std::shared_ptr<const TokenIndex> shared_token_index(const Tokenizer& tokenizer);

// Compiles for `tokenizer`'s vocabulary, under options.budget / `budget` unless a GrammarBudget is
// already active on this thread (grammar/grammar_budget.h). Throw GrammarError naming the bad
// keyword / position, GrammarBudgetError / GrammarCancelled when the budget stops the compilation,
// and a GrammarError when nothing at all satisfies the grammar (a contradictory schema): a
// constraint that allows no output is refused here rather than failing the generation.
std::shared_ptr<const CompiledGrammar> compile_json_schema_for(const nlohmann::ordered_json& schema,
                                                               const Tokenizer& tokenizer,
                                                               const JsonSchemaOptions& options = {});
std::shared_ptr<const CompiledGrammar> compile_regex_for(std::string_view pattern, const Tokenizer& tokenizer,
                                                         const GrammarBudget& budget = {});
std::shared_ptr<const CompiledGrammar> compile_grammar_for(Grammar grammar, const Tokenizer& tokenizer);

// Through the process-wide compiled-grammar cache (grammar/grammar_cache.h): the grammar cached
// for (tokenizer's vocabulary, source, options), else compile()'s result. `source` names the
// grammar's builder and its canonical input ("json_schema:" + the schema's JSON); `options` the
// compile options that shape it. Failures are cached, or not, as grammar_cache.h says.
std::shared_ptr<const CompiledGrammar> cached_grammar_for(const Tokenizer& tokenizer, std::string source,
                                                          std::string options, const GrammarCache::Compile& compile);
// compile_json_schema_for through that cache.
std::shared_ptr<const CompiledGrammar> cached_json_schema_for(const nlohmann::ordered_json& schema,
                                                              const Tokenizer& tokenizer,
                                                              const JsonSchemaOptions& options = {});

class GrammarConstraint : public LogitsMaskHook {
 public:
  // The grammar must have been compiled with shared_token_index(tokenizer) (or an index of the
  // same vocabulary). The tokenizer must outlive the constraint.
  GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar, const Tokenizer& tokenizer);

  void fill_mask(std::span<uint32_t> mask) override;
  void accept(int32_t token) override;
  std::vector<int32_t> forced_tokens(std::span<const int32_t> generated) override;
  bool terminated() const override { return matcher_.is_terminated(); }
  // The tokens of the forced text F under the same rule, but up to the end of F: the last piece,
  // which what follows F may still merge with, is only likely. Empty where nothing is forced.
  std::vector<int32_t> likely_tokens(std::span<const int32_t> generated) override;
  bool can_draft() const override { return true; }
  bool try_accept(int32_t token) override;
  void rollback(size_t n) override { matcher_.rollback(n); }

  const Matcher& matcher() const { return matcher_; }

 private:
  bool complete_after(std::string_view forced);
  std::vector<int32_t> tokens_of_forced_bytes(std::span<const int32_t> generated, bool certain);

  std::shared_ptr<const CompiledGrammar> grammar_;
  const Tokenizer& tok_;
  Matcher matcher_;
  std::vector<uint32_t> scratch_;
};

// A constraint for a fresh job over `grammar`.
std::shared_ptr<GrammarConstraint> make_grammar_constraint(std::shared_ptr<const CompiledGrammar> grammar,
                                                           const Tokenizer& tokenizer);

}  // namespace exl
