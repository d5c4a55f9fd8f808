// Formats against their RFCs' grammars, with examples from the RFCs (RFC 3986 5.4 and 1.1.2,
// RFC 3339 5.8, RFC 6570 1.2, RFC 5321 4.5.3.1) and the strings a loose pattern let through. A
// format accepts only what its RFC accepts (a subset where json_schema.h says so).
#include <gtest/gtest.h>

#include <string>

#include "grammar_test_util.h"

namespace exl {
namespace json_schema_format_test {

bool fmt_ok(const std::string& format, const std::string& value) {
  return test::schema_accepts(R"({"type":"string","format":")" + format + R"("})",
                              nlohmann::json(value).dump());
}

TEST(GrammarJsonSchemaFormat, UriReferenceFollowsRfc3986) {
  for (const char* v : {"g:h", "g", "./g", "g/", "/g", "//g", "?y", "g?y", "#s", "g#s", "g?y#s", ";x", "g;x",
                        "", ".", "./", "..", "../g", "../..", "../../g", "//[v1.fe]/p", "a/b:c",
                        "http://a/b/c/d;p?q", "file:///etc/hosts", "//u:p@h:8080/x?y#z", "ldap://[2001:db8::7]/c=GB?one"})
    EXPECT_TRUE(fmt_ok("uri-reference", v)) << v;
  // "://" and "1:b": a first relative segment with a colon; the rest: ports, brackets, at-signs.
  for (const char* v : {"://", "1:b", ":", "/[::1]", "//example.com:abc/p", "//a@b@example.com/",
                        "//[::ffff:192.168.0.01]/p", "%41:b", "a b", "\\\\x", "http://[::1", "#a#b", "%4"})
    EXPECT_FALSE(fmt_ok("uri-reference", v)) << v;
}

TEST(GrammarJsonSchemaFormat, UriIsAbsoluteRfc3986) {
  for (const char* v : {"ftp://ftp.is.co.za/rfc/rfc1808.txt", "http://www.ietf.org/rfc/rfc2396.txt",
                        "ldap://[2001:db8::7]/c=GB?objectClass?one", "mailto:John.Doe@example.com",
                        "news:comp.infosystems.www.servers.unix", "tel:+1-816-555-1212", "telnet://192.0.2.16:80/",
                        "urn:oasis:names:specification:docbook:dtd:xml:4.1.2", "http://a/b?c#d", "a:"})
    EXPECT_TRUE(fmt_ok("uri", v)) << v;
  for (const char* v : {"//a/b", "/abc", "abc", "1a:b", "http://example.com:abc/path", "https://[@example.org/t",
                        "http:/[::1]", "http://[::ffff:01.2.3.4]", "http://2001:0db8:85a3::7334", "http://a/é"})
    EXPECT_FALSE(fmt_ok("uri", v)) << v;
}

TEST(GrammarJsonSchemaFormat, IriAddsUcsCharsOnly) {
  EXPECT_TRUE(fmt_ok("iri", "http://ƒøø.ßår/?∂éœ=πîx#πîüx"));
  EXPECT_TRUE(fmt_ok("iri-reference", "#ƒrägmênt"));
  EXPECT_TRUE(fmt_ok("iri", "http://a/?\xee\x80\x80"));   // iprivate (U+E000) in a query
  EXPECT_FALSE(fmt_ok("iri", "http://a/#\xee\x80\x80"));  // but not in a fragment
  EXPECT_FALSE(fmt_ok("iri", "http://a/\xc2\x80"));        // U+0080 is no ucschar
  EXPECT_FALSE(fmt_ok("iri-reference", "://"));
  EXPECT_FALSE(fmt_ok("iri", "http://2001:0db8:85a3:0000:0000:8a2e:0370:7334"));
}

TEST(GrammarJsonSchemaFormat, DatesKnowLeapYears) {
  for (const char* v : {"2024-02-29", "2000-02-29", "1600-02-29", "2021-02-28", "1985-04-12", "0001-01-01"})
    EXPECT_TRUE(fmt_ok("date", v)) << v;
  for (const char* v : {"2021-02-29", "2100-02-29", "1900-02-29", "0100-02-29", "0000-01-01", "2024-04-31"})
    EXPECT_FALSE(fmt_ok("date", v)) << v;
  EXPECT_TRUE(fmt_ok("date-time", "1985-04-12T23:20:50.52Z"));
  EXPECT_TRUE(fmt_ok("date-time", "1996-12-19T16:39:57-08:00"));
  EXPECT_FALSE(fmt_ok("date-time", "2023-02-29T00:00:00Z"));
}

TEST(GrammarJsonSchemaFormat, HostnamesAndEmailsKeepTheirLengthLimits) {
  std::string l62(62, 'a'), l63(63, 'a'), l64(64, 'a');
  EXPECT_TRUE(fmt_ok("hostname", "www.example.com"));
  EXPECT_TRUE(fmt_ok("hostname", l63 + ".com"));
  EXPECT_TRUE(fmt_ok("hostname", l62 + "." + l62 + "." + l62 + "." + l62));  // 251 characters
  EXPECT_FALSE(fmt_ok("hostname", l64 + ".com"));
  EXPECT_FALSE(fmt_ok("hostname", l63 + "." + l63 + "." + l63 + "." + l62));  // 254 characters
  EXPECT_FALSE(fmt_ok("hostname", "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z." + l63 + ".com"));
  EXPECT_FALSE(fmt_ok("hostname", "xn--X"));        // an A-label whose Punycode is not checked
  EXPECT_FALSE(fmt_ok("hostname", "ab--c.com"));    // "--" in the 3rd and 4th position
  EXPECT_FALSE(fmt_ok("hostname", "-a.com"));
  EXPECT_FALSE(fmt_ok("hostname", "example.123"));  // all-numeric top-level label
  EXPECT_FALSE(fmt_ok("idn-hostname", "实例.测试"));  // the ASCII subset only
  EXPECT_TRUE(fmt_ok("email", "joe.bloggs@example.com"));
  EXPECT_TRUE(fmt_ok("email", l64 + "@example.com"));
  EXPECT_FALSE(fmt_ok("email", l64 + "a@example.com"));  // local part over 64 characters
  EXPECT_FALSE(fmt_ok("email", "a@" + l63 + "." + l63 + "." + l63 + ".com"));  // over 254 in all
  EXPECT_FALSE(fmt_ok("email", "a..b@example.com"));
  EXPECT_FALSE(fmt_ok("email", "a@123"));
}

TEST(GrammarJsonSchemaFormat, UriTemplatesFollowRfc6570) {
  for (const char* v : {"http://example.com/{var}", "{+path}/here", "{#x,hello,y}", "X{.list*}", "{/var:3}",
                        "{;x,y}", "{?q,lang}", "{&x}", "{a.b}", "{%41}", "map?{x,y}"})
    EXPECT_TRUE(fmt_ok("uri-template", v)) << v;
  for (const char* v : {"{a..b}", "{a.}", "a\x7f", "{x", "{=x}", "{x:0}", "{x:12345}", "a%2", "a b", "a\xc2\x80"})
    EXPECT_FALSE(fmt_ok("uri-template", v)) << v;
}

bool bounded_ok(const std::string& format, int max_length, const std::string& value) {
  return test::schema_accepts(R"({"type":"string","format":")" + format + R"(","maxLength":)" +
                                  std::to_string(max_length) + "}",
                              nlohmann::json(value).dump());
}

// With maxLength the format and the bound are one automaton: never longer than the bound, still
// the format's grammar.
TEST(GrammarJsonSchemaFormat, MaxLengthBoundsFormats) {
  EXPECT_TRUE(bounded_ok("hostname", 10, "abcde.com"));
  EXPECT_TRUE(bounded_ok("hostname", 10, "a.bc.d.ef"));
  EXPECT_FALSE(bounded_ok("hostname", 10, "abcdefg.com"));
  EXPECT_FALSE(bounded_ok("hostname", 10, "ab-.com"));
  EXPECT_TRUE(bounded_ok("hostname", 100, "www.example.com"));
  EXPECT_FALSE(bounded_ok("hostname", 100, std::string(60, 'a') + "." + std::string(40, 'b')));
  EXPECT_TRUE(bounded_ok("email", 10, "abcd@e.com"));
  EXPECT_FALSE(bounded_ok("email", 10, "abcd@ef.com"));
  EXPECT_FALSE(bounded_ok("email", 2, "a@b"));
  EXPECT_TRUE(bounded_ok("email", 255, "joe.bloggs@example.com"));
  EXPECT_FALSE(bounded_ok("email", 255, std::string(65, 'a') + "@example.com"));
  EXPECT_TRUE(bounded_ok("uri", 12, "http://a.com"));
  EXPECT_FALSE(bounded_ok("uri", 12, "http://ab.com"));
  EXPECT_FALSE(bounded_ok("uri-reference", 255, "://"));
  EXPECT_FALSE(bounded_ok("uri-reference", 255, "1:b"));
}

}  // namespace json_schema_format_test
}  // namespace exl
