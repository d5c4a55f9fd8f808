// Exact rational numbers for the calculator: a reduced fraction of arbitrary-size integers
// (Boost.Multiprecision cpp_int / cpp_rational), read from decimal literals and written back as
// decimals.
//
// Writing: a value whose reduced denominator has no prime factors but 2 and 5 has a terminating
// decimal expansion and is written exactly ("0.3", "-2.5", "1606938044258990275541962092341162602522202993782792835301376");
// any other value is rounded half away from zero to `significant_digits` significant digits,
// plain ("0.33333") when its decimal exponent is in [-6, significant_digits), otherwise in
// scientific notation ("1.4285714e-9"), and marked inexact.
#pragma once
#include <string>
#include <string_view>

#include <boost/multiprecision/cpp_int.hpp>

namespace exl {

using BigInt = boost::multiprecision::cpp_int;
using Rational = boost::multiprecision::cpp_rational;

// Decimal digits of |v| (1 for 0).
size_t decimal_digits(const BigInt& v);

// Parses digits[.digits][e[+-]digits] or .digits[...] exactly. Throws exl::Error
// ("tools: decimal: ...") for anything else or more than `max_digits` digits or exponent magnitude.
Rational parse_decimal(std::string_view text, size_t max_digits);

struct DecimalText {
  std::string text;
  bool exact = true;
};

DecimalText format_decimal(const Rational& value, int significant_digits);

}  // namespace exl
