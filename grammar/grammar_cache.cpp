#include "grammar/grammar_cache.h"

#include <utility>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"

namespace exl {

namespace {

// The key is held twice: in its entry and in the index.
size_t key_bytes(const GrammarCacheKey& k) { return 2 * (sizeof(GrammarCacheKey) + k.source.size() + k.options.size()) + 64; }

}  // namespace

size_t GrammarCache::KeyHash::operator()(const GrammarCacheKey& k) const {
  size_t h = std::hash<std::string>()(k.source);
  h ^= std::hash<std::string>()(k.options) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= std::hash<uint64_t>()(k.vocabulary) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h;
}

GrammarCache::GrammarCache(GrammarCacheLimits limits) : limits_(limits) {}

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const GrammarCacheKey& key, const Compile& compile) {
  std::exception_ptr cached_error;
  {
    std::lock_guard lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second);
      if (it->second->grammar) return it->second->grammar;
      cached_error = it->second->error;
    } else {
      ++misses_;
    }
  }
  if (cached_error) std::rethrow_exception(cached_error);
  std::shared_ptr<const CompiledGrammar> grammar;
  try {
    grammar = compile();
  } catch (const GrammarBudgetError&) {
    throw;
  } catch (const GrammarCancelled&) {
    throw;
  } catch (const GrammarError&) {
    grammar_budget_check();  // a GrammarError from a compilation whose budget tripped: not deterministic
    insert(Entry{key, nullptr, std::current_exception(), 0});
    throw;
  }
  if (!grammar) grammar_fail("grammar: cache: the compile function returned no grammar");
  return insert(Entry{key, std::move(grammar), nullptr, 0});
}

std::shared_ptr<const CompiledGrammar> GrammarCache::insert(Entry entry) {
  std::lock_guard lock(mu_);
  if (auto it = index_.find(entry.key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    if (it->second->grammar) return it->second->grammar;
    if (!entry.grammar) return nullptr;
    lru_.erase(it->second);
    index_.erase(it);
  }
  std::shared_ptr<const CompiledGrammar> grammar = entry.grammar;
  lru_.push_front(std::move(entry));
  index_.emplace(lru_.front().key, lru_.begin());
  evict_to_limits();
  return grammar;
}

void GrammarCache::evict_to_limits() {
  bytes_ = 0;
  for (Entry& e : lru_) {
    e.bytes = key_bytes(e.key) + (e.grammar ? e.grammar->memory_bytes() : 256);
    bytes_ += e.bytes;
  }
  while (!lru_.empty() && (lru_.size() > limits_.max_entries || bytes_ > limits_.max_bytes)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

GrammarCacheStats GrammarCache::stats() const {
  std::lock_guard lock(mu_);
  return {lru_.size(), bytes_, hits_, misses_};
}

void GrammarCache::clear() {
  std::lock_guard lock(mu_);
  lru_.clear();
  index_.clear();
  bytes_ = 0;
}

GrammarCache& shared_grammar_cache() {
  static GrammarCache cache;
  return cache;
}

}  // namespace exl
