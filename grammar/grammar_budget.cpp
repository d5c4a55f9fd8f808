#include "grammar/grammar_budget.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace exl {

namespace {

enum class BudgetTrip : uint8_t { none, exceeded, cancelled };

struct BudgetMeter {
  bool active = false;
  GrammarBudget budget;
  std::chrono::steady_clock::time_point deadline, next_cancel_poll;
  size_t states = 0, bytes = 0;
  uint32_t ticks = 0;
  BudgetTrip trip = BudgetTrip::none;
  std::string message;
};

thread_local BudgetMeter t_budget_meter;

constexpr auto kCancelPollInterval = std::chrono::milliseconds(5);
constexpr uint32_t kClockEvery = 64;  // charges between clock reads

[[noreturn]] void throw_trip(const BudgetMeter& m) {
  if (m.trip == BudgetTrip::cancelled) throw GrammarCancelled(m.message);
  throw GrammarBudgetError(m.message);
}

template <class... Parts>
[[noreturn]] void trip(BudgetMeter& m, BudgetTrip kind, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  m.trip = kind;
  m.message = os.str();
  throw_trip(m);
}

void poll_clock(BudgetMeter& m) {
  const auto now = std::chrono::steady_clock::now();
  if (m.budget.timeout.count() > 0 && now > m.deadline)
    trip(m, BudgetTrip::exceeded, "grammar: budget: compilation took longer than the limit of ",
         m.budget.timeout.count(), " ms");
  if (m.budget.cancelled && now >= m.next_cancel_poll) {
    m.next_cancel_poll = now + kCancelPollInterval;
    if (m.budget.cancelled()) trip(m, BudgetTrip::cancelled, "grammar: compilation cancelled (the request went away)");
  }
}

}  // namespace

GrammarBudgetScope::GrammarBudgetScope(const GrammarBudget& budget) {
  BudgetMeter& m = t_budget_meter;
  if (m.active) return;
  owner_ = true;
  m = BudgetMeter{};
  m.active = true;
  m.budget = budget;
  const auto now = std::chrono::steady_clock::now();
  m.deadline = now + budget.timeout;
  m.next_cancel_poll = now;
}

GrammarBudgetScope::~GrammarBudgetScope() {
  if (owner_) t_budget_meter = BudgetMeter{};
}

void GrammarBudgetScope::check() const {
  const BudgetMeter& m = t_budget_meter;
  if (m.active && m.trip != BudgetTrip::none) throw_trip(m);
}

void grammar_charge(size_t states, size_t bytes) {
  BudgetMeter& m = t_budget_meter;
  if (!m.active) return;
  if (m.trip != BudgetTrip::none) throw_trip(m);
  m.states += states;
  m.bytes += bytes;
  if (m.states > m.budget.max_states)
    trip(m, BudgetTrip::exceeded, "grammar: budget: the grammar needs more than the limit of ", m.budget.max_states,
         " automaton states");
  if (m.bytes > m.budget.max_bytes)
    trip(m, BudgetTrip::exceeded, "grammar: budget: the grammar needs more than the limit of ",
         m.budget.max_bytes >> 20, " MiB of automata");
  if (++m.ticks % kClockEvery == 0) poll_clock(m);
}

void grammar_release(size_t bytes) {
  BudgetMeter& m = t_budget_meter;
  if (m.active) m.bytes -= std::min(bytes, m.bytes);
}

void grammar_budget_check() {
  const BudgetMeter& m = t_budget_meter;
  if (m.active && m.trip != BudgetTrip::none) throw_trip(m);
}

void grammar_poll() {
  BudgetMeter& m = t_budget_meter;
  if (!m.active) return;
  if (m.trip != BudgetTrip::none) throw_trip(m);
  if (++m.ticks % kClockEvery == 0) poll_clock(m);
}

size_t grammar_automaton_limit() {
  const BudgetMeter& m = t_budget_meter;
  return m.active ? m.budget.max_automaton_states : GrammarBudget{}.max_automaton_states;
}

GrammarSpent grammar_spent() {
  const BudgetMeter& m = t_budget_meter;
  return m.active ? GrammarSpent{m.states, m.bytes} : GrammarSpent{};
}

}  // namespace exl
