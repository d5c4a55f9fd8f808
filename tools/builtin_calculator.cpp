// calculator: a recursive-descent evaluator over exact rationals.
//   expr  := term (('+' | '-') term)*
//   term  := unary (('*' | '/') unary)*
//   unary := ('-' | '+') unary | power
//   power := primary ('^' unary)?        (right-associative; -2^2 = -4; integer exponents)
//   primary := number | '(' expr ')'
// Positions in messages are 1-based character columns of the expression.
#include <algorithm>
#include <cmath>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/exact_decimal.h"
#include "tools/function_tool.h"

namespace exl {
namespace {

constexpr size_t kMaxExpression = 10000;
constexpr int kMaxNesting = 200;
constexpr double kLog2Of10 = 3.3219280948873623;

class Evaluator {
 public:
  Evaluator(std::string_view text, size_t max_digits)
      : s_(text),
        max_digits_(max_digits),
        max_bits_(size_t(std::ceil(double(max_digits) * kLog2Of10))),
        check_bits_(size_t(std::floor(double(max_digits) * kLog2Of10)) - 1) {}

  Rational run() {
    Rational v = expr(0);
    skip();
    if (i_ < s_.size()) syntax(cat("unexpected '", s_[i_], "'"));
    return v;
  }

 private:
  [[noreturn]] void syntax(const std::string& what) const {
    fail("calculator: syntax error at position ", i_ + 1, ": ", what);
  }
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void depth_check(int depth) const {
    if (depth > kMaxNesting) fail("calculator: expression nested deeper than ", kMaxNesting, " levels");
  }
  Rational capped(Rational v) const {
    // |x| < 2^(msb+1) <= 10^max_digits below check_bits_, so only larger values need counting.
    if (msb_or_zero(numerator(v)) >= check_bits_ || msb_or_zero(denominator(v)) >= check_bits_) check_digits(v);
    return v;
  }
  static size_t msb_or_zero(const BigInt& v) { return v == 0 ? 0 : size_t(boost::multiprecision::msb(BigInt(abs(v)))); }
  void check_digits(const Rational& v) const {
    if (decimal_digits(numerator(v)) > max_digits_ || decimal_digits(denominator(v)) > max_digits_)
      fail("calculator: number too large: more than ", max_digits_, " digits");
  }

  Rational expr(int depth) {
    depth_check(depth);
    Rational v = term(depth);
    for (;;) {
      if (eat('+')) v = capped(v + term(depth));
      else if (eat('-')) v = capped(v - term(depth));
      else return v;
    }
  }
  Rational term(int depth) {
    Rational v = unary(depth);
    for (;;) {
      skip();
      const size_t at = i_;
      if (eat('*')) {
        v = capped(v * unary(depth));
      } else if (eat('/')) {
        Rational d = unary(depth);
        if (d == 0) fail("calculator: division by zero at position ", at + 1);
        v = capped(v / d);
      } else {
        return v;
      }
    }
  }
  Rational unary(int depth) {
    depth_check(depth);
    if (eat('-')) return -unary(depth + 1);
    if (eat('+')) return unary(depth + 1);
    return power(depth);
  }
  Rational power(int depth) {
    Rational base = primary(depth);
    skip();
    const size_t at = i_;
    if (!eat('^')) return base;
    Rational e = unary(depth + 1);
    if (denominator(e) != 1) fail("calculator: exponent at position ", at + 2, " is not an integer");
    return raise(base, numerator(e), at);
  }
  Rational raise(const Rational& base, const BigInt& e, size_t at) const {
    const BigInt n = numerator(base), d = denominator(base);
    if (n == 0) {
      if (e < 0) fail("calculator: division by zero at position ", at + 1, " (0 to a negative power)");
      return e == 0 ? Rational(1) : Rational(0);
    }
    if (abs(n) == 1 && d == 1) return (n < 0 && e % 2 != 0) ? Rational(-1) : Rational(1);
    const BigInt mag = abs(e);
    const size_t bits = std::max(msb_or_zero(n), msb_or_zero(d));
    if (mag > BigInt(max_bits_) || BigInt(bits) * mag > BigInt(max_bits_))
      fail("calculator: number too large: more than ", max_digits_, " digits");
    const unsigned k = mag.convert_to<unsigned>();
    Rational r(BigInt(boost::multiprecision::pow(n, k)), BigInt(boost::multiprecision::pow(d, k)));
    if (e < 0) r = 1 / r;
    return capped(r);
  }
  Rational primary(int depth) {
    skip();
    if (i_ >= s_.size()) syntax("expected a number or '(', found the end");
    if (s_[i_] == '(') {
      ++i_;
      Rational v = expr(depth + 1);
      if (!eat(')')) syntax(i_ < s_.size() ? cat("expected ')', found '", s_[i_], "'") : "expected ')', found the end");
      return v;
    }
    const size_t start = i_;
    auto digit = [&](size_t k) { return k < s_.size() && s_[k] >= '0' && s_[k] <= '9'; };
    if (!digit(i_) && !(s_[i_] == '.' && digit(i_ + 1))) syntax(cat("expected a number or '(', found '", s_[i_], "'"));
    while (digit(i_) || s_[i_] == '.') ++i_;
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      size_t k = i_ + 1;
      if (k < s_.size() && (s_[k] == '+' || s_[k] == '-')) ++k;
      if (digit(k)) {
        i_ = k;
        while (digit(i_)) ++i_;
      }
    }
    const std::string_view lit = s_.substr(start, i_ - start);
    if (std::count(lit.begin(), lit.end(), '.') > 1) {
      i_ = start + lit.find('.', lit.find('.') + 1);
      syntax("a number has a second '.'");
    }
    try {
      return capped(parse_decimal(lit, max_digits_));
    } catch (const Error&) {
      fail("calculator: number at position ", start + 1, " too large: more than ", max_digits_, " digits");
    }
  }

  std::string_view s_;
  size_t i_ = 0;
  size_t max_digits_, max_bits_, check_bits_;
};

}  // namespace

std::shared_ptr<Tool> make_calculator_tool(const BuiltinToolOptions& opts) {
  ToolSpec spec{"calculator",
                "Exact arithmetic on decimal numbers of any size: + - * / ^ (integer exponents), parentheses, "
                "unary minus. Results are exact decimals; a quotient that does not terminate (1/3) is rounded to "
                "significant_digits digits and marked as rounded.",
                {{"type", "object"},
                 {"properties",
                  {{"expression",
                    {{"type", "string"}, {"minLength", 1}, {"maxLength", kMaxExpression},
                     {"description", "e.g. (0.1 + 0.2) * 3 / 7"}}},
                   {"significant_digits",
                    {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000},
                     {"description", "digits shown for a non-terminating result"}}}}},
                 {"required", {"expression"}},
                 {"additionalProperties", false}}};
  const size_t max_digits = size_t(std::max(1, opts.calculator_max_digits));
  const int default_sig = opts.calculator_significant_digits;
  return std::make_shared<FunctionTool>(std::move(spec), [max_digits, default_sig](const nlohmann::json& args,
                                                                                    const CancelToken&) {
    const std::string expr = args.at("expression").get<std::string>();
    const int sig = args.contains("significant_digits") ? args["significant_digits"].get<int>() : default_sig;
    Rational v = Evaluator(expr, max_digits).run();
    DecimalText out = format_decimal(v, sig);
    if (out.exact) return ToolResult{out.text};
    std::string note = cat(out.text, " (rounded to ", sig, " significant digits; the exact value does not terminate");
    const std::string frac = cat(numerator(v), "/", denominator(v));
    if (frac.size() <= 120) note += "; as a fraction: " + frac;
    return ToolResult{note + ")"};
  });
}

}  // namespace exl
