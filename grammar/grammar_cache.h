// Compiled grammars by what shapes them, so a schema seen again reuses its CompiledGrammar and
// the mask caches its matchers have filled. One process-wide instance (shared_grammar_cache)
// serves every caller: the HTTP API's output constraints, agent turns and the job commands.
//
// Key: the vocabulary (TokenIndex::id(), unique for the life of the process, so an index freed
// and another allocated at its address never meet), the grammar's source text as its caller
// writes it canonically (a schema's JSON, a tool-call spec) and the compile options that change
// the grammar (whitespace, property order, ...). A budget is not part of the key: it decides
// whether a compilation finishes, not what it produces.
//
// Failures: a compilation stopped by its budget or cancelled (GrammarBudgetError,
// GrammarCancelled, or any GrammarError thrown while the thread's active budget has tripped) is
// never cached, and neither is any exception that is not a GrammarError. Other GrammarErrors (a
// schema the grammar engine cannot enforce) are deterministic and cached as errors: a later get
// rethrows the same error without compiling.
//
// Bound: at most max_entries entries and max_bytes bytes (CompiledGrammar::memory_bytes, which
// grows as matchers fill its caches, plus the key), least recently used evicted first, measured
// again at every insertion. A grammar larger than max_bytes alone is returned but not kept.
// Evicting only drops the cache's reference: jobs holding the grammar keep it alive.
//
// Thread-safety: every member function may be called from any thread. `compile` runs without the
// cache's lock held, so two threads missing on one key both compile; the first to finish is kept
// and returned to both.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/matcher.h"

namespace exl {

struct GrammarCacheKey {
  uint64_t vocabulary = 0;  // TokenIndex::id() the grammar is compiled for (0: none)
  std::string source;       // the grammar's source text, canonical for its caller
  std::string options;      // the compile options that shape the grammar
  bool operator==(const GrammarCacheKey&) const = default;
};

struct GrammarCacheLimits {
  size_t max_entries = 64;
  size_t max_bytes = size_t(512) << 20;
};

struct GrammarCacheStats {
  size_t entries = 0;
  size_t bytes = 0;  // as measured at the last insertion
  uint64_t hits = 0, misses = 0;
};

class GrammarCache {
 public:
  using Compile = std::function<std::shared_ptr<const CompiledGrammar>()>;

  explicit GrammarCache(GrammarCacheLimits limits = {});

  // The grammar cached under key, or compile()'s result, cached as the header says. Rethrows what
  // compile throws (and a cached deterministic GrammarError on a hit). compile must not return null.
  std::shared_ptr<const CompiledGrammar> get(const GrammarCacheKey& key, const Compile& compile);
  GrammarCacheStats stats() const;
  void clear();

 private:
  struct KeyHash {
    size_t operator()(const GrammarCacheKey& k) const;
  };
  struct Entry {
    GrammarCacheKey key;
    std::shared_ptr<const CompiledGrammar> grammar;  // null for a cached error
    std::exception_ptr error;
    size_t bytes = 0;
  };
  using Lru = std::list<Entry>;  // most recently used first

  std::shared_ptr<const CompiledGrammar> insert(Entry entry);
  void evict_to_limits();

  const GrammarCacheLimits limits_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<GrammarCacheKey, Lru::iterator, KeyHash> index_;
  size_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0;
};

// The process-wide cache (default limits).
GrammarCache& shared_grammar_cache();

}  // namespace exl
