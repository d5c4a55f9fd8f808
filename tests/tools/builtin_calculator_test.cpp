#include <gtest/gtest.h>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/exact_decimal.h"
#include "tool_test_util.h"

namespace exl {
namespace builtin_calculator_test {

using nlohmann::json;
using test::contains;

class Calculator : public ::testing::Test {
 protected:
  Calculator() { reg.add(make_calculator_tool(opts)); }
  ToolResult calc(const std::string& expr, std::optional<int> sig = std::nullopt) {
    json args = {{"expression", expr}};
    if (sig) args["significant_digits"] = *sig;
    return test::call_now(reg, "calculator", args);
  }
  std::string ok(const std::string& expr) {
    ToolResult r = calc(expr);
    EXPECT_FALSE(r.is_error) << expr << " -> " << r.content;
    return r.content;
  }
  std::string err(const std::string& expr) {
    ToolResult r = calc(expr);
    EXPECT_TRUE(r.is_error) << expr << " -> " << r.content;
    return r.content;
  }
  BuiltinToolOptions opts;
  ToolRegistry reg;
};

TEST_F(Calculator, ExactDecimalArithmetic) {
  EXPECT_EQ(ok("0.1 + 0.2"), "0.3");
  EXPECT_EQ(ok("0.3 - 0.1 - 0.2"), "0");
  EXPECT_EQ(ok("1.10 * 3"), "3.3");
  EXPECT_EQ(ok("10 / 4"), "2.5");
  EXPECT_EQ(ok("-7 / 2"), "-3.5");
  EXPECT_EQ(ok("1/1024"), "0.0009765625");
  EXPECT_EQ(ok("(1/3) * 3"), "1");
  EXPECT_EQ(ok("1/3 + 1/3 + 1/3"), "1");
  EXPECT_EQ(ok("2 + 3 * 4"), "14");
  EXPECT_EQ(ok("(2 + 3) * 4"), "20");
  EXPECT_EQ(ok("8 / 2 / 2"), "2");
  EXPECT_EQ(ok("10 - 2 - 3"), "5");
  EXPECT_EQ(ok("--3"), "3");
  EXPECT_EQ(ok("-(2 - 5)"), "3");
  EXPECT_EQ(ok("+4"), "4");
  EXPECT_EQ(ok(".5 + 5."), "5.5");
  EXPECT_EQ(ok("1.5e3 + 2E-2"), "1500.02");
  EXPECT_EQ(ok("0.000"), "0");
  EXPECT_EQ(ok("  12\t*\n2 "), "24");
}

TEST_F(Calculator, PowersAreRightAssociativeAndBindTighterThanUnaryMinus) {
  EXPECT_EQ(ok("2^200"), "1606938044258990275541962092341162602522202993782792835301376");
  EXPECT_EQ(ok("2^3^2"), "512");
  EXPECT_EQ(ok("-2^2"), "-4");
  EXPECT_EQ(ok("(-2)^3"), "-8");
  EXPECT_EQ(ok("2^-3"), "0.125");
  EXPECT_EQ(ok("0.5^2"), "0.25");
  EXPECT_EQ(ok("7^0"), "1");
  EXPECT_EQ(ok("(-1)^1000001"), "-1");
  EXPECT_EQ(ok("1^100000000000000000000"), "1");
  EXPECT_TRUE(contains(err("2^0.5"), "is not an integer"));
}

TEST_F(Calculator, BigIntegersAreExact) {
  EXPECT_EQ(ok("123456789012345678901234567890 * 987654321098765432109876543210"),
            "121932631137021795226185032733622923332237463801111263526900");
  EXPECT_EQ(ok("2^200 - 2^200 + 1"), "1");
  EXPECT_EQ(ok("99999999999999999999999999999999999999 + 1"), "100000000000000000000000000000000000000");
  // 10^999 has exactly 1000 digits, the default cap.
  const std::string big = ok("10^999");
  EXPECT_EQ(big.size(), 1000u);
  EXPECT_EQ(big, "1" + std::string(999, '0'));
}

TEST_F(Calculator, NonTerminatingQuotientsAreRoundedAndSaySo) {
  EXPECT_EQ(ok("1/3"),
            "0.33333333333333333333333333333333 (rounded to 32 significant digits; the exact value does not "
            "terminate; as a fraction: 1/3)");
  ToolResult r = calc("2/3", 5);
  EXPECT_FALSE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("0.66667 (rounded to 5 significant digits")) << r.content;
  EXPECT_TRUE(calc("-1/7", 10).content.starts_with("-0.1428571429 (")) << calc("-1/7", 10).content;
  EXPECT_TRUE(calc("200/3", 3).content.starts_with("66.7 (")) << calc("200/3", 3).content;
  EXPECT_TRUE(calc("1/3e10", 4).content.starts_with("3.333e-11 (")) << calc("1/3e10", 4).content;
  EXPECT_TRUE(calc("10^40/3", 4).content.starts_with("3.333e+39 (")) << calc("10^40/3", 4).content;
  EXPECT_TRUE(calc("0.9999999/0.9999999999", 3).content.starts_with("1.00 (")) << calc("0.9999999/0.9999999999", 3).content;
}

TEST_F(Calculator, DivisionByZero) {
  EXPECT_EQ(err("1/0"), "calculator: division by zero at position 2");
  EXPECT_EQ(err("5 / (2 - 2)"), "calculator: division by zero at position 3");
  EXPECT_TRUE(contains(err("0^-1"), "division by zero"));
}

TEST_F(Calculator, SyntaxErrorsNamePositions) {
  EXPECT_EQ(err("1 +"), "calculator: syntax error at position 4: expected a number or '(', found the end");
  EXPECT_EQ(err("(1 + 2"), "calculator: syntax error at position 7: expected ')', found the end");
  EXPECT_EQ(err("1 2"), "calculator: syntax error at position 3: unexpected '2'");
  EXPECT_EQ(err("abc"), "calculator: syntax error at position 1: expected a number or '(', found 'a'");
  EXPECT_EQ(err("1.2.3"), "calculator: syntax error at position 4: a number has a second '.'");
  EXPECT_EQ(err("2 * * 3"), "calculator: syntax error at position 5: expected a number or '(', found '*'");
  EXPECT_EQ(err("()"), "calculator: syntax error at position 2: expected a number or '(', found ')'");
  EXPECT_EQ(err("1 )"), "calculator: syntax error at position 3: unexpected ')'");
}

TEST_F(Calculator, SizeLimits) {
  EXPECT_EQ(err("10^1000"), "calculator: number too large: more than 1000 digits");
  EXPECT_EQ(err("9^100000000"), "calculator: number too large: more than 1000 digits");
  EXPECT_EQ(err("2^(10^30)"), "calculator: number too large: more than 1000 digits");
  EXPECT_TRUE(contains(err("1e1000"), "too large"));
  EXPECT_TRUE(contains(err(std::string(1001, '7')), "number at position 1 too large: more than 1000 digits"));
  EXPECT_TRUE(contains(err("1/" + std::string(600, '7') + "/" + std::string(600, '3')), "too large"));
  EXPECT_TRUE(contains(err(std::string(300, '(') + "1" + std::string(300, ')')), "nested deeper than 200"));
  EXPECT_TRUE(contains(err(std::string(300, '-') + "1"), "nested deeper than 200"));
}

TEST_F(Calculator, SchemaRejectsBadArguments) {
  for (const json& bad : {json::object(), json{{"expression", ""}}, json{{"expression", 5}},
                          json{{"expression", "1"}, {"extra", 1}}, json{{"expression", "1/3"}, {"significant_digits", 0}},
                          json{{"expression", std::string(10001, '1')}}}) {
    ToolResult r = test::call_now(reg, "calculator", bad);
    EXPECT_TRUE(r.is_error) << bad.dump();
    EXPECT_TRUE(r.content.starts_with("invalid arguments for tool 'calculator'")) << r.content;
  }
}

TEST_F(Calculator, DirectInvokeWithMalformedArgumentsIsAnError) {
  auto tool = make_calculator_tool(opts);
  ToolResult r = test::invoke_now(*tool, json::object());
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("calculator: invalid arguments: ")) << r.content;
  r = test::invoke_now(*tool, {{"expression", 12}});
  EXPECT_TRUE(r.is_error);
  EXPECT_TRUE(r.content.starts_with("calculator: invalid arguments: ")) << r.content;
}

TEST(ExactDecimal, ParseAndFormat) {
  EXPECT_EQ(parse_decimal("12.50", 100), Rational(25, 2));
  EXPECT_EQ(parse_decimal("1e-3", 100), Rational(1, 1000));
  EXPECT_EQ(parse_decimal("0001", 100), Rational(1));
  EXPECT_THROW(parse_decimal("1.2.3", 100), Error);
  EXPECT_THROW(parse_decimal("", 100), Error);
  EXPECT_THROW(parse_decimal("1e", 100), Error);
  EXPECT_EQ(format_decimal(Rational(-1, 8), 5).text, "-0.125");
  EXPECT_TRUE(format_decimal(Rational(-1, 8), 5).exact);
  DecimalText third = format_decimal(Rational(1, 3), 3);
  EXPECT_EQ(third.text, "0.333");
  EXPECT_FALSE(third.exact);
  EXPECT_EQ(format_decimal(Rational(1, 3000000), 2).text, "3.3e-7");
  EXPECT_EQ(format_decimal(Rational(1, 300000), 2).text, "0.0000033");
  EXPECT_EQ(format_decimal(Rational(999999, 1000001), 3).text, "1.00");
}

}  // namespace builtin_calculator_test
}  // namespace exl
