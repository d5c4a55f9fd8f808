#include "engine/generate/grammar_constraint.h"

#include <map>
#include <mutex>

#include "engine/tokenizer/utf8.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/regex.h"
#include "kernels/error.h"

namespace exl {

namespace {

// FNV-1a over every token's bytes, its special flag and the EOS ids: equal for equal vocabularies.
uint64_t vocabulary_key(const Tokenizer& tok) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](std::string_view s) {
    for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
    h = (h ^ 0xFFu) * 1099511628211ull;
  };
  for (int32_t i = 0; i < tok.vocab_size(); ++i) {
    mix(tok.token_bytes(i));
    mix(tok.is_special(i) ? "s" : "n");
  }
  for (int32_t e : tok.eos_ids()) mix(std::to_string(e));
  return h;
}

// The longest prefix of s made of whole, valid UTF-8 characters.
size_t whole_chars(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    utf8::Char c = utf8::decode(s, pos);
    if (!c.valid || pos + c.len > s.size()) break;
    pos += c.len;
  }
  return pos;
}

}  // namespace

std::shared_ptr<const TokenIndex> shared_token_index(const Tokenizer& tok) {
  static std::mutex mu;
  static std::map<uint64_t, std::shared_ptr<const TokenIndex>> cache;
  const uint64_t key = vocabulary_key(tok);
  std::lock_guard lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<std::string> bytes(size_t(tok.vocab_size()));
  for (int32_t i = 0; i < tok.vocab_size(); ++i)
    if (!tok.is_special(i)) bytes[size_t(i)] = tok.token_bytes(i);
  std::vector<int32_t> eos(tok.eos_ids().begin(), tok.eos_ids().end());
  auto index = std::make_shared<const TokenIndex>(std::move(bytes), std::move(eos));
  cache.emplace(key, index);
  return index;
}

std::shared_ptr<const CompiledGrammar> compile_grammar_for(Grammar grammar, const Tokenizer& tokenizer) {
  if (accepts_nothing(grammar))
    grammar_fail("grammar: the constraint cannot be satisfied: no output is valid under it (a contradictory schema?)");
  grammar_poll();
  return std::make_shared<const CompiledGrammar>(std::move(grammar), shared_token_index(tokenizer));
}

std::shared_ptr<const CompiledGrammar> compile_json_schema_for(const nlohmann::ordered_json& schema,
                                                               const Tokenizer& tokenizer,
                                                               const JsonSchemaOptions& options) {
  return with_grammar_budget(options.budget, [&] { return compile_grammar_for(compile_json_schema(schema, options), tokenizer); });
}

std::shared_ptr<const CompiledGrammar> compile_regex_for(std::string_view pattern, const Tokenizer& tokenizer,
                                                         const GrammarBudget& budget) {
  return with_grammar_budget(budget, [&] { return compile_grammar_for(compile_regex_grammar(pattern), tokenizer); });
}

std::shared_ptr<const CompiledGrammar> cached_grammar_for(const Tokenizer& tokenizer, std::string source,
                                                          std::string options, const GrammarCache::Compile& compile) {
  const GrammarCacheKey key{shared_token_index(tokenizer)->id(), std::move(source), std::move(options)};
  return shared_grammar_cache().get(key, compile);
}

std::shared_ptr<const CompiledGrammar> cached_json_schema_for(const nlohmann::ordered_json& schema,
                                                              const Tokenizer& tokenizer,
                                                              const JsonSchemaOptions& options) {
  return cached_grammar_for(tokenizer, "json_schema:" + schema.dump(), json_schema_options_key(options),
                            [&] { return compile_json_schema_for(schema, tokenizer, options); });
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const CompiledGrammar> grammar, const Tokenizer& tokenizer)
    : grammar_(std::move(grammar)), tok_(tokenizer), matcher_(grammar_) {
  EXL_CHECK(grammar_->index() != nullptr, "engine: grammar constraint: the grammar has no token index");
  EXL_CHECK(grammar_->index()->vocab_size() == size_t(tokenizer.vocab_size()),
            "engine: grammar constraint: the grammar's vocabulary has ", grammar_->index()->vocab_size(),
            " tokens, the tokenizer ", tokenizer.vocab_size());
}

void GrammarConstraint::fill_mask(std::span<uint32_t> mask) {
  try {
    matcher_.fill_mask(mask);
  } catch (const GrammarError& e) {
    fail("engine: grammar constraint: ", e.what());
  }
}

void GrammarConstraint::accept(int32_t token) {
  bool ok = false;
  try {
    ok = matcher_.accept(token);
  } catch (const GrammarError& e) {
    fail("engine: grammar constraint: ", e.what());
  }
  EXL_CHECK(ok, "engine: grammar constraint: token ", token, " is not allowed by the grammar here");
}

bool GrammarConstraint::try_accept(int32_t token) {
  try {
    return matcher_.accept(token);
  } catch (const GrammarError&) {
    return false;
  }
}

// Whether, after `forced`, the grammar accepts and allows nothing but EOS.
bool GrammarConstraint::complete_after(std::string_view forced) {
  if (!matcher_.accept_bytes(forced)) return false;
  bool done = matcher_.is_accepting();
  if (done) {
    const TokenIndex& idx = *grammar_->index();
    scratch_.assign(idx.mask_words(), 0u);
    matcher_.fill_mask(scratch_);
    for (int32_t e : idx.eos_ids()) scratch_[size_t(e) / 32] &= ~(1u << (e % 32));
    for (uint32_t w : scratch_) done = done && w == 0;
  }
  matcher_.rollback(1);
  return done;
}

std::vector<int32_t> GrammarConstraint::forced_tokens(std::span<const int32_t> generated) {
  return tokens_of_forced_bytes(generated, true);
}

std::vector<int32_t> GrammarConstraint::likely_tokens(std::span<const int32_t> generated) {
  return tokens_of_forced_bytes(generated, false);
}

std::vector<int32_t> GrammarConstraint::tokens_of_forced_bytes(std::span<const int32_t> generated, bool certain) {
  if (matcher_.is_terminated()) return {};
  std::string forced = matcher_.forced_bytes();
  forced.resize(whole_chars(forced));
  std::string context;
  if (tok_.dummy_prefix() != DummyPrefix::none) {
    context = "\n";
    // SentencePiece normalization drops trailing spaces, so they never encode as themselves.
    while (!forced.empty() && forced.back() == ' ') forced.pop_back();
  }
  if (forced.empty()) return {};
  if (!generated.empty()) {
    const int32_t last = generated.back();
    if (tok_.is_special(last)) return {};
    context += tok_.token_bytes(last);
  }
  if (whole_chars(context) != context.size()) return {};
  const std::vector<int32_t> ids = tok_.encode(context + forced, false);
  // Byte offsets of the encoding; a dummy-prefix space, if any, shifts them by one.
  std::string encoded;
  for (int32_t t : ids) encoded += tok_.token_bytes(t);
  const std::string text = context + forced;
  const size_t shift = encoded == text ? 0 : encoded == " " + text ? 1 : std::string::npos;
  if (shift == std::string::npos) return {};  // normalization changed the text: force nothing
  const size_t f_begin = shift + context.size(), f_end = f_begin + forced.size();
  const bool complete = certain && complete_after(forced);
  std::vector<int32_t> out;
  size_t pos = 0;
  bool at_boundary = f_begin == 0;
  for (int32_t t : ids) {
    const std::string& b = tok_.token_bytes(t);
    const size_t end = pos + b.size();
    if (pos == f_begin) at_boundary = true;
    if (pos >= f_begin && at_boundary) {
      if (end > f_end || (certain && end == f_end && !complete)) break;
      if (b.empty() || tok_.is_special(t)) break;
      out.push_back(t);
    }
    pos = end;
  }
  if (!at_boundary) return {};
  size_t covered = 0;
  for (int32_t t : out) covered += tok_.token_bytes(t).size();
  if (complete && covered == forced.size() && !grammar_->index()->eos_ids().empty())
    out.push_back(grammar_->index()->eos_ids().front());
  return out;
}

std::shared_ptr<GrammarConstraint> make_grammar_constraint(std::shared_ptr<const CompiledGrammar> grammar,
                                                           const Tokenizer& tokenizer) {
  return std::make_shared<GrammarConstraint>(std::move(grammar), tokenizer);
}

}  // namespace exl
