#include "tools/exact_decimal.h"

#include <algorithm>

#include "kernels/error.h"

namespace exl {
namespace {

BigInt pow10(size_t n) { return BigInt(boost::multiprecision::pow(BigInt(10), unsigned(n))); }

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Strips factors f from v; returns how many.
size_t strip(BigInt& v, unsigned f) {
  size_t n = 0;
  while (v != 0 && v % f == 0) {
    v /= f;
    ++n;
  }
  return n;
}

std::string with_point(std::string digits, size_t frac) {
  if (frac == 0) return digits;
  if (digits.size() <= frac) digits.insert(0, frac - digits.size() + 1, '0');
  digits.insert(digits.size() - frac, 1, '.');
  return digits;
}

}  // namespace

size_t decimal_digits(const BigInt& v) {
  if (v == 0) return 1;
  return BigInt(abs(v)).str().size();
}

Rational parse_decimal(std::string_view text, size_t max_digits) {
  size_t i = 0;
  std::string digits;
  size_t frac = 0;
  while (i < text.size() && is_digit(text[i])) digits += text[i++];
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && is_digit(text[i])) {
      digits += text[i++];
      ++frac;
    }
  }
  EXL_CHECK(!digits.empty(), "tools: decimal: '", text, "' is not a number");
  long long exp = 0;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool neg = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) neg = text[i++] == '-';
    EXL_CHECK(i < text.size() && is_digit(text[i]), "tools: decimal: '", text, "': exponent without digits");
    while (i < text.size() && is_digit(text[i])) {
      exp = exp * 10 + (text[i++] - '0');
      EXL_CHECK(exp <= (long long)max_digits, "tools: decimal: '", text, "': exponent larger than ", max_digits);
    }
    if (neg) exp = -exp;
  }
  EXL_CHECK(i == text.size(), "tools: decimal: '", text, "' is not a number");
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size());
  EXL_CHECK(digits.size() - first <= max_digits, "tools: decimal: '", text, "' has more than ", max_digits, " digits");
  BigInt mantissa(first == digits.size() ? std::string("0") : digits.substr(first));
  const long long scale = exp - (long long)frac;
  if (scale >= 0) return Rational(mantissa * pow10(size_t(scale)));
  return Rational(mantissa, pow10(size_t(-scale)));
}

DecimalText format_decimal(const Rational& value, int significant_digits) {
  EXL_CHECK(significant_digits >= 1, "tools: decimal: significant digits must be positive");
  const BigInt num = numerator(value);
  const BigInt den = denominator(value);
  const std::string sign = num < 0 ? "-" : "";
  const BigInt p = abs(num);
  BigInt rest = den;
  const size_t twos = strip(rest, 2), fives = strip(rest, 5);
  if (rest == 1) {
    const size_t k = std::max(twos, fives);
    BigInt scaled = p * pow10(k) / den;
    return {sign + with_point(scaled.str(), k), true};
  }
  // 10^e <= p/den < 10^(e+1)
  long long e = (long long)decimal_digits(p) - (long long)decimal_digits(den);
  const bool below = e >= 0 ? p < den * pow10(size_t(e)) : p * pow10(size_t(-e)) < den;
  if (below) --e;
  const long long shift = significant_digits - 1 - e;  // scaled = round(p/den * 10^shift)
  BigInt n = shift >= 0 ? p * pow10(size_t(shift)) : p;
  BigInt d = shift >= 0 ? den : den * pow10(size_t(-shift));
  BigInt q = n / d, r = n % d;
  if (2 * r >= d) ++q;
  if (q == pow10(size_t(significant_digits))) {
    q /= 10;
    ++e;
  }
  std::string s = q.str();
  std::string text;
  if (e >= -6 && e < significant_digits) {
    text = with_point(s, size_t(significant_digits - 1 - e));
  } else {
    text = s.substr(0, 1) + (s.size() > 1 ? "." + s.substr(1) : "") + "e" + (e >= 0 ? "+" : "") + std::to_string(e);
  }
  return {sign + text, false};
}

}  // namespace exl
