#include <cmath>
#include <mutex>
#include <set>

#include "grammar/code_set.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema_impl.h"
#include "grammar/regex.h"

namespace exl::json_schema_detail {
namespace {

constexpr size_t kMaxDfaStates = 200000;
constexpr uint64_t kMaxLengthWithPattern = 2000;
constexpr char kNumberRegex[] = "-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?";

// How a format is wanted: alone, or inside a product with other string constraints, where `lean`
// drops rare alternatives that would multiply the product's states (IP literals in URIs) and
// `max_chars` is a maxLength that hostnames and emails build in rather than intersect.
struct FormatVariant {
  bool lean = false;
  uint64_t max_chars = kUnbounded;
  auto operator<=>(const FormatVariant&) const = default;
};

// A format as the intersection of full-match regexes over the string's characters. Each is
// exact to its RFC's grammar or a strict subset of it (the subset is named in json_schema.h), so
// a format never accepts a string its RFC rejects. `length_built_in`: the strings are at most
// v.max_chars characters by construction. Empty for a name that is no enforced format.
struct FormatSpec {
  std::vector<std::string> regexes;
  bool length_built_in = false;
};

std::optional<FormatSpec> format_spec(const std::string& f, const FormatVariant& v = {}) {
  // RFC 3339 full-date, with Feb 29 only in leap years and without year 0000 (which the
  // proleptic calendar of most validators lacks).
  static const std::string year = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})";
  static const std::string leap_year = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)";
  static const std::string date = "(?:" + year +
                                  "-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
                                  "|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + leap_year + "-02-29)";
  // A leap second (:60) is valid only at 23:59 UTC; accepted here only with a zero offset (sound,
  // but rejects e.g. 15:59:60-08:00).
  static const std::string time =
      "(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
      "|23:59:60(?:\\.[0-9]+)?(?:[Zz]|[+-]00:00))";
  static const std::string date_time = date + "[Tt]" + time;
  // RFC 1123 host names of at most `total` characters (RFC 1034 3.1): labels of letters, digits
  // and inner hyphens, none with "--" in the 3rd and 4th position (RFC 5891 4.2.3.1: A-labels
  // "xn--" are refused, as their Punycode is not checked). The length bounds are a subset that
  // needs no counter of the whole name: up to n labels of at most m characters, with
  // n * (m + 1) - 1 <= total (for 253 characters: 3 labels of up to 63, 4 of 62, 8 of 30, 16 of
  // 14, 32 of 6). With each branch seeing the same label index and position, the automaton stays
  // at a few thousand states instead of the ~100,000 of an exact count.
  auto label = [](uint64_t m) {
    const std::string an = "[A-Za-z0-9]", anh = "[A-Za-z0-9-]";
    if (m == 1) return an;
    if (m < 5) return an + "(?:" + anh + "{0," + std::to_string(m - 2) + "}" + an + ")?";
    return an + "(?:" + anh + "{0,2}" + an + "|" + anh + "(?:" + an + anh + "|-" + an + ")" + anh + "{0," +
           std::to_string(m - 5) + "}" + an + ")?";
  };
  auto hostname_within = [&](uint64_t total) {
    std::string alts;
    uint64_t last_m = 0;
    for (uint64_t n : {32, 16, 8, 4, 3, 2, 1}) {
      if ((total + 1) / n < 2) continue;
      uint64_t m = std::min<uint64_t>(63, (total + 1) / n - 1);
      if (m == last_m) continue;
      last_m = m;
      if (!alts.empty()) alts += '|';
      alts += label(m) + "(?:\\." + label(m) + "){0," + std::to_string(n - 1) + "}";
    }
    return alts.empty() ? std::string("[^\\s\\S]") : "(?:" + alts + ")";
  };
  // Under a maxLength of at most 64 the plain label grammar is intersected with the exact count
  // instead (small enough, and the tiers would refuse e.g. "e.com" within 5).
  const bool count_exactly = v.max_chars <= 64;
  const std::string plain_hostname = label(63) + "(?:\\." + label(63) + ")*";
  const std::string hostname = count_exactly ? plain_hostname : hostname_within(std::min<uint64_t>(v.max_chars, 253));
  // The last label has a letter (RFC 3696 2: top-level domains are not all-numeric).
  static const std::string last_label_letter = "(?:[^.]*\\.)*[^.]*[A-Za-z][^.]*";
  // RFC 5321 Mailbox with a Dot-string local part of at most 64 characters and a host name domain
  // of at most 189 (the whole at most 254, RFC 5321 4.5.3.1); no quoted local parts, no address
  // literals. Under a smaller maxLength T (over 64) the local part takes at most (T - 1) / 2 and
  // the domain the rest.
  static const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
  const uint64_t mail_max = std::min<uint64_t>(v.max_chars, 254);
  const uint64_t local_max = count_exactly ? 64 : std::min<uint64_t>(64, (mail_max - 1) / 2);
  const std::string email = atext + "+(?:\\." + atext + "+)*@" +
                            (count_exactly ? plain_hostname : hostname_within(mail_max - 1 - local_max));
  const std::string local_len = "[^@]{1," + std::to_string(local_max) + "}@[^@]*";
  static const std::string domain_letter = "[^@]*@(?:[^.]*\\.)*[^.]*[A-Za-z][^.]*";
  static const std::string uuid = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
  static const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
  static const std::string ipv4 = octet + "(?:\\." + octet + "){3}";
  static const std::string h = "[0-9A-Fa-f]{1,4}";
  static const std::string ipv6 =
      "(?:(?:" + h + ":){7}" + h + "|(?:" + h + ":){1,7}:|(?:" + h + ":){1,6}:" + h + "|(?:" + h + ":){1,5}(?::" + h +
      "){1,2}|(?:" + h + ":){1,4}(?::" + h + "){1,3}|(?:" + h + ":){1,3}(?::" + h + "){1,4}|(?:" + h + ":){1,2}(?::" + h +
      "){1,5}|" + h + ":(?::" + h + "){1,6}|:(?:(?::" + h + "){1,7}|:)|(?:" + h + ":){6}" + ipv4 + "|::(?:" + h +
      ":){0,5}" + ipv4 + "|(?:" + h + ":){1,5}:" + ipv4 + ")";
  static const std::string json_pointer = "(?:/(?:[^~/]|~[01])*)*";
  static const std::string rel_json_pointer = "(?:0|[1-9][0-9]*)(?:#|" + json_pointer + ")";
  static const std::string dur_time = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)";
  static const std::string duration =
      "P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:" + dur_time + ")?|" + dur_time + "|[0-9]+W)";
  // RFC 3986 (URI, URI-reference) and RFC 3987 (IRI, IRI-reference) collected ABNF, rule by rule;
  // `u` is the unreserved set (iunreserved for IRIs), `q` what a query adds (iprivate).
  static const std::string ucschar =
      "\\u00A0-\\uD7FF\\uF900-\\uFDCF\\uFDF0-\\uFFEF\\u{10000}-\\u{1FFFD}\\u{20000}-\\u{2FFFD}\\u{30000}-\\u{3FFFD}"
      "\\u{40000}-\\u{4FFFD}\\u{50000}-\\u{5FFFD}\\u{60000}-\\u{6FFFD}\\u{70000}-\\u{7FFFD}\\u{80000}-\\u{8FFFD}"
      "\\u{90000}-\\u{9FFFD}\\u{A0000}-\\u{AFFFD}\\u{B0000}-\\u{BFFFD}\\u{C0000}-\\u{CFFFD}\\u{D0000}-\\u{DFFFD}"
      "\\u{E1000}-\\u{EFFFD}";
  static const std::string iprivate = "\\uE000-\\uF8FF\\u{F0000}-\\u{FFFFD}\\u{100000}-\\u{10FFFD}";
  auto uri_grammar = [&](const std::string& u, const std::string& q, bool reference) {
    const std::string pct = "%[0-9A-Fa-f]{2}", sub = "!$&'()*+,;=";
    const std::string pchar = "(?:[" + u + sub + ":@]|" + pct + ")";
    const std::string segment = pchar + "*", segment_nz = pchar + "+";
    const std::string segment_nz_nc = "(?:[" + u + sub + "@]|" + pct + ")+";
    const std::string query = "(?:[" + u + sub + ":@/?" + q + "]|" + pct + ")*";
    const std::string fragment = "(?:[" + u + sub + ":@/?]|" + pct + ")*";
    const std::string ip_literal = v.lean ? "[^\\s\\S]"
                                          : "\\[(?:" + ipv6 + "|v[0-9A-Fa-f]+\\.[A-Za-z0-9\\-._~" + sub + ":]+)\\]";
    const std::string reg_name = "(?:[" + u + sub + "]|" + pct + ")*";
    const std::string userinfo = "(?:[" + u + sub + ":]|" + pct + ")*";
    const std::string authority = "(?:" + userinfo + "@)?(?:" + ip_literal + "|" + reg_name + ")(?::[0-9]*)?";
    const std::string path_abempty = "(?:/" + segment + ")*";
    const std::string path_absolute = "/(?:" + segment_nz + "(?:/" + segment + ")*)?";
    const std::string path_rootless = segment_nz + "(?:/" + segment + ")*";
    const std::string path_noscheme = segment_nz_nc + "(?:/" + segment + ")*";
    const std::string tail = "(?:\\?" + query + ")?(?:#" + fragment + ")?";
    const std::string absolute = "[A-Za-z][A-Za-z0-9+.\\-]*:(?://" + authority + path_abempty + "|" + path_absolute +
                                 "|" + path_rootless + ")?" + tail;
    if (!reference) return absolute;
    return "(?:" + absolute + "|(?://" + authority + path_abempty + "|" + path_absolute + "|" + path_noscheme + ")?" +
           tail + ")";
  };
  static const std::string ascii_u = "A-Za-z0-9\\-._~";
  // RFC 6570 levels 1-4 (operators reserved for extensions refused).
  static const std::string varchar = "(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})";
  static const std::string varspec = varchar + "(?:\\.?" + varchar + ")*(?::[1-9][0-9]{0,3}|\\*)?";
  static const std::string uri_template = "(?:[!#$&(-;=?-\\[\\]_a-z~" + ucschar + iprivate + "]|%[0-9A-Fa-f]{2}|\\{[+#./;?&]?" +
                                          varspec + "(?:," + varspec + ")*\\})*";
  // The internationalized forms accept their ASCII subset only (IDNA 2008's contextual rules are
  // not regular enough to check here).
  if (f == "hostname" || f == "idn-hostname") return FormatSpec{{hostname, last_label_letter}, !count_exactly};
  if (f == "email" || f == "idn-email") return FormatSpec{{email, local_len, domain_letter}, !count_exactly};
  if (f == "uri") return FormatSpec{{uri_grammar(ascii_u, "", false)}};
  if (f == "uri-reference") return FormatSpec{{uri_grammar(ascii_u, "", true)}};
  if (f == "iri") return FormatSpec{{uri_grammar(ascii_u + ucschar, iprivate, false)}};
  if (f == "iri-reference") return FormatSpec{{uri_grammar(ascii_u + ucschar, iprivate, true)}};
  static const std::map<std::string, std::string> table = {
      {"json-pointer", json_pointer}, {"relative-json-pointer", rel_json_pointer}, {"duration", duration},
      {"uri-template", uri_template}, {"date", date}, {"time", time}, {"date-time", date_time}, {"uuid", uuid},
      {"ipv4", ipv4}, {"ipv6", ipv6}};
  auto it = table.find(f);
  if (it == table.end()) return std::nullopt;
  return FormatSpec{{it->second}};
}

// Formats defined by JSON Schema 2020-12 that are not enforced: a schema using one is refused.
// Any other format name is unknown to the spec and, as the spec says, only an annotation.
const std::set<std::string> kSpecFormats = {"regex"};

Rule regex_dfa(const std::string& pattern, bool search) {
  GrammarBuilder tb;
  int32_t r = tb.add_rule("pattern");
  tb.frags(r).set_root(emit_regex(tb, r, pattern, {.search = search, .json_string = true, .byte_only = true}));
  return determinize_bytes(tb.nfa(r), "pattern", kMaxDfaStates);
}

// The content automaton of a format variant, built once per process and shared (the state count
// is charged to the active budget on every use, as a fresh build would be).
std::shared_ptr<const Rule> format_dfa(const std::string& f, const FormatVariant& v, const FormatSpec& spec) {
  static std::mutex mu;
  static std::map<std::pair<std::string, FormatVariant>, std::shared_ptr<const Rule>> cache;
  {
    std::lock_guard lock(mu);
    auto it = cache.find({f, v});
    if (it != cache.end()) {
      grammar_charge(it->second->states.size(), 0);
      return it->second;
    }
  }
  Rule r = regex_dfa(spec.regexes[0], false);
  for (size_t i = 1; i < spec.regexes.size(); ++i) r = intersect_bytes(r, regex_dfa(spec.regexes[i], false), false, kMaxDfaStates);
  r.name = "format " + f;
  auto out = std::make_shared<const Rule>(std::move(r));
  std::lock_guard lock(mu);
  if (cache.size() > 256) cache.clear();
  cache.emplace(std::make_pair(f, v), out);
  return out;
}

// minLength or maxLength of n, capped at cap; dflt when absent. Anything but a non-negative
// number is an error (converting a negative or huge double to uint64 is undefined).
uint64_t string_length_kw(const Json& n, const char* kw, uint64_t dflt, double cap, const std::string& ptr) {
  if (!n.contains(kw)) return dflt;
  const Json& v = n[kw];
  if (!v.is_number() || v.get<double>() < 0) fail(pointer_append(ptr, kw), "must be a non-negative integer");
  return uint64_t(std::min(v.get<double>(), cap));
}

std::optional<double> number_kw(const Json& n, const char* kw, const std::string& ptr) {
  if (!n.contains(kw)) return std::nullopt;
  const Json& v = n[kw];
  if (v.is_boolean()) return std::nullopt;
  if (!v.is_number()) fail(pointer_append(ptr, kw), "must be a number");
  return v.get<double>();
}

std::string digits(Int v) {
  if (v == 0) return "0";
  std::string out;
  for (; v > 0; v /= 10) out.insert(out.begin(), char('0' + int(v % 10)));
  return out;
}

constexpr double kMaxBound = 1e37;

// An exact integer from a JSON number that is integral (ceil/floor applied to others).
Int json_int(const Json& v, bool ceil_it, const std::string& ptr) {
  if (v.is_number_unsigned()) return Int(v.get<uint64_t>());
  if (v.is_number_integer()) return Int(v.get<int64_t>());
  double d = ceil_it ? std::ceil(v.get<double>()) : std::floor(v.get<double>());
  if (!std::isfinite(d) || std::fabs(d) > kMaxBound) fail(ptr, "bound out of the supported range");
  return Int(d);
}

bool json_integral(const Json& v) {
  return v.is_number_integer() || v.is_number_unsigned() || v.get<double>() == std::floor(v.get<double>());
}


// A finite JSON number as exact decimal digits: sign, integer digits (no leading zeros), fraction
// digits (no trailing zeros), from its shortest round-trip text.
struct Decimal {
  bool neg = false;
  std::string ip, fp;
};

Decimal decimal_of(const Json& v, const std::string& ptr) {
  std::string t = v.dump();
  Decimal d;
  size_t i = 0;
  if (t[i] == '-') d.neg = true, ++i;
  std::string mant;
  long point = -1;
  for (; i < t.size() && (isdigit(uint8_t(t[i])) || t[i] == '.'); ++i) {
    if (t[i] == '.') point = long(mant.size());
    else mant += t[i];
  }
  if (point < 0) point = long(mant.size());
  long e = i < t.size() ? std::stol(t.substr(i + 1)) : 0;
  if (e > 36 || e < -36) fail(ptr, "bound " + t + " out of the supported range");
  point += e;
  while (point <= 0) mant.insert(mant.begin(), '0'), ++point;
  while (long(mant.size()) < point) mant += '0';
  d.ip = mant.substr(0, size_t(point));
  d.fp = mant.substr(size_t(point));
  while (d.ip.size() > 1 && d.ip[0] == '0') d.ip.erase(d.ip.begin());
  while (!d.fp.empty() && d.fp.back() == '0') d.fp.pop_back();
  return d;
}
}  // namespace

bool format_asserted(const std::string& f) { return format_spec(f).has_value() || kSpecFormats.count(f) > 0; }

Frag SchemaCompiler::ws(int32_t rule) {
  FragBuilder fb = gb_.frags(rule);
  if (opts_.whitespace != JsonSchemaOptions::Whitespace::flexible) return fb.empty();
  return gb_.frags(rule).star(gb_.frags(rule).alt({fb.bytes(' ', ' '), gb_.frags(rule).bytes('\t', '\t'),
                                                  gb_.frags(rule).bytes('\n', '\n'), gb_.frags(rule).bytes('\r', '\r')}));
}

Frag SchemaCompiler::sep(int32_t rule, char c) {
  if (opts_.whitespace == JsonSchemaOptions::Whitespace::spaced)
    return gb_.frags(rule).literal(std::string{c, ' '});
  Frag a = ws(rule);
  Frag b = gb_.frags(rule).bytes(uint8_t(c), uint8_t(c));
  Frag d = ws(rule);
  return gb_.frags(rule).seq({a, b, d});
}

int32_t SchemaCompiler::json_char_rule() {
  if (json_char_ >= 0) return json_char_;
  json_char_ = gb_.add_rule("json_char");
  FragBuilder fb = gb_.frags(json_char_);
  fb.set_root(emit_code_set(fb, CodeSet::all(), true));
  return json_char_;
}

int32_t SchemaCompiler::any_string_rule() {
  if (any_string_ >= 0) return any_string_;
  any_string_ = gb_.add_rule("string");
  FragBuilder fb = gb_.frags(any_string_);
  Frag ch = emit_code_set(fb, CodeSet::all(), true);
  fb.set_root(fb.seq({fb.literal("\""), fb.star(ch), fb.literal("\"")}));
  return any_string_;
}

int32_t SchemaCompiler::any_value_rule() {
  if (any_value_ >= 0) return any_value_;
  any_value_ = gb_.add_rule("value");
  int32_t obj = gb_.add_rule("object"), arr = gb_.add_rule("array"), str = any_string_rule();
  int32_t member = gb_.add_rule("member");
  {
    FragBuilder fb = gb_.frags(any_value_);
    std::vector<Frag> alts = {fb.call(obj), fb.call(arr), fb.call(str), emit_regex(gb_, any_value_, kNumberRegex, {}),
                              fb.literal("true"), fb.literal("false"), fb.literal("null")};
    fb.set_root(fb.alt(alts));
  }
  {
    FragBuilder fb = gb_.frags(member);
    fb.set_root(fb.seq({fb.call(str), sep(member, ':'), fb.call(any_value_)}));
  }
  {
    FragBuilder fb = gb_.frags(obj);
    Frag list = fb.seq({fb.call(member), fb.star(fb.seq({sep(obj, ','), fb.call(member)}))});
    fb.set_root(fb.seq({fb.literal("{"), ws(obj), fb.opt(list), ws(obj), fb.literal("}")}));
  }
  {
    FragBuilder fb = gb_.frags(arr);
    Frag list = fb.seq({fb.call(any_value_), fb.star(fb.seq({sep(arr, ','), fb.call(any_value_)}))});
    fb.set_root(fb.seq({fb.literal("["), ws(arr), fb.opt(list), ws(arr), fb.literal("]")}));
  }
  return any_value_;
}

Frag SchemaCompiler::int_range(int32_t rule, IntBound lo, IntBound hi) {
  // numbers in [a, b] (b = nullopt: unbounded) written canonically, a >= 0
  auto same_len = [&](auto&& self, const std::string& A, const std::string& B) -> Frag {
    FragBuilder fb = gb_.frags(rule);
    if (A.empty()) return fb.empty();
    if (A == B) return fb.literal(A);
    if (A.find_first_not_of('0') == std::string::npos && B.find_first_not_of('9') == std::string::npos) {
      std::vector<Frag> any;
      for (size_t i = 0; i < A.size(); ++i) any.push_back(gb_.frags(rule).bytes('0', '9'));
      return gb_.frags(rule).seq(any);
    }
    if (A[0] == B[0]) return gb_.frags(rule).seq({fb.literal(A.substr(0, 1)), self(self, A.substr(1), B.substr(1))});
    size_t n = A.size() - 1;
    std::vector<Frag> alts;
    alts.push_back(gb_.frags(rule).seq({fb.literal(A.substr(0, 1)), self(self, A.substr(1), std::string(n, '9'))}));
    if (A[0] + 1 <= B[0] - 1) {
      std::vector<Frag> parts{gb_.frags(rule).bytes(uint8_t(A[0] + 1), uint8_t(B[0] - 1))};
      for (size_t i = 0; i < n; ++i) parts.push_back(gb_.frags(rule).bytes('0', '9'));
      alts.push_back(gb_.frags(rule).seq(parts));
    }
    alts.push_back(gb_.frags(rule).seq({gb_.frags(rule).literal(B.substr(0, 1)), self(self, std::string(n, '0'), B.substr(1))}));
    return gb_.frags(rule).alt(alts);
  };
  auto range = [&](Int a, std::optional<Int> b) -> Frag {
    std::vector<Frag> alts;
    std::string sa = digits(a), sb = b ? digits(*b) : "";
    size_t la = sa.size();
    size_t lb = b ? sb.size() : la;
    for (size_t L = la; L <= lb; ++L) {
      std::string A = sa;
      if (L != la) A.assign(L, '0'), A[0] = '1';
      std::string B = (b && L == lb) ? sb : std::string(L, '9');
      if (A > B) continue;
      alts.push_back(same_len(same_len, A, B));
    }
    if (!b) {
      std::vector<Frag> parts{gb_.frags(rule).bytes('1', '9')};
      for (size_t i = 0; i < la; ++i) parts.push_back(gb_.frags(rule).bytes('0', '9'));
      parts.push_back(gb_.frags(rule).star(gb_.frags(rule).bytes('0', '9')));
      alts.push_back(gb_.frags(rule).seq(parts));
    }
    return gb_.frags(rule).alt(alts);
  };
  std::vector<Frag> alts;
  if (!hi || *hi >= 0) {
    Int a = lo ? std::max<Int>(*lo, 0) : 0;
    std::optional<Int> b = hi;
    if (!b || a <= *b) alts.push_back(range(a, b));
  }
  if (!lo || *lo < 0) {
    Int a = hi && *hi < 0 ? -*hi : 1;
    std::optional<Int> b;
    if (lo) b = -*lo;
    if (!b || a <= *b) alts.push_back(gb_.frags(rule).seq({gb_.frags(rule).literal("-"), range(a, b)}));
  }
  return gb_.frags(rule).alt(alts);
}

Frag SchemaCompiler::integer_frag(int32_t rule, const Json& n, const std::string& ptr) {
  IntBound lo, hi;
  bool ex_min = n.contains("exclusiveMinimum") && n["exclusiveMinimum"] == true;
  bool ex_max = n.contains("exclusiveMaximum") && n["exclusiveMaximum"] == true;
  auto num = [&](const char* kw) -> const Json* {
    if (!n.contains(kw) || n[kw].is_boolean()) return nullptr;
    if (!n[kw].is_number()) fail(pointer_append(ptr, kw), "must be a number");
    return &n[kw];
  };
  if (const Json* v = num("minimum")) lo = json_int(*v, true, pointer_append(ptr, "minimum")) + ((ex_min && json_integral(*v)) ? 1 : 0);
  if (const Json* v = num("exclusiveMinimum")) {
    Int x = json_int(*v, false, pointer_append(ptr, "exclusiveMinimum")) + 1;
    lo = lo ? std::max(*lo, x) : x;
  }
  if (const Json* v = num("maximum")) hi = json_int(*v, false, pointer_append(ptr, "maximum")) - ((ex_max && json_integral(*v)) ? 1 : 0);
  if (const Json* v = num("exclusiveMaximum")) {
    Int x = json_int(*v, true, pointer_append(ptr, "exclusiveMaximum")) - 1;
    hi = hi ? std::min(*hi, x) : x;
  }
  if (lo && hi && *lo > *hi) return gb_.frags(rule).alt({});
  // 1.0 is an integer from draft-06 on; draft-04 and earlier say "without a fraction"
  if (!opts_.integer_zero_fraction || old_draft()) return int_range(rule, lo, hi);
  Frag zeros = gb_.frags(rule).opt(gb_.frags(rule).seq({gb_.frags(rule).literal("."), gb_.frags(rule).plus(gb_.frags(rule).bytes('0', '0'))}));
  return gb_.frags(rule).seq({int_range(rule, lo, hi), zeros});
}

// Fraction digit strings (non-empty) that compare, padded with zeros, >= F (> F if strict) when
// `greater`, else <= F (< F if strict). F is non-empty and ends in a non-zero digit.
Frag SchemaCompiler::fraction_cmp(int32_t rule, const std::string& f, bool greater, bool strict) {
  auto fb = [&] { return gb_.frags(rule); };
  auto any = [&] { return fb().star(fb().bytes('0', '9')); };
  Frag tail;
  if (greater) tail = strict ? fb().seq({any(), fb().bytes('1', '9'), any()}) : any();
  else tail = strict ? fb().alt({}) : fb().star(fb().bytes('0', '0'));
  for (size_t k = f.size(); k-- > 0;) {
    uint8_t c = uint8_t(f[k]);
    std::vector<Frag> alts{fb().seq({fb().bytes(c, c), tail})};
    if (greater && c < '9') alts.push_back(fb().seq({fb().bytes(c + 1, '9'), any()}));
    if (!greater && c > '0') alts.push_back(fb().seq({fb().bytes('0', c - 1), any()}));
    if (!greater && k > 0) alts.push_back(fb().empty());  // shorter: below F
    tail = fb().alt(alts);
  }
  return tail;
}

// Numbers without exponent that are >= D (lower) or <= D (upper), strictly if `strict`; D is a
// non-integer decimal.
Frag SchemaCompiler::decimal_bound(int32_t rule, const Json& bound, bool lower, bool strict, const std::string& ptr) {
  Decimal d = decimal_of(bound, ptr);
  auto fb = [&] { return gb_.frags(rule); };
  auto frac = [&] { return fb().opt(fb().seq({fb().literal("."), fb().plus(fb().bytes('0', '9'))})); };
  auto any_mag = [&] { return fb().seq({int_range(rule, Int(0), std::nullopt), frac()}); };
  Int ip = 0;
  for (char c : d.ip) ip = ip * 10 + (c - '0');
  // magnitudes >= D (above) or <= D (below)
  auto mag = [&](bool above) {
    if (above)
      return fb().alt({fb().seq({int_range(rule, ip + 1, std::nullopt), frac()}),
                       fb().seq({fb().literal(d.ip + "."), fraction_cmp(rule, d.fp, true, strict)})});
    std::vector<Frag> alts;
    if (ip > 0) alts.push_back(fb().seq({int_range(rule, Int(0), ip - 1), frac()}));
    alts.push_back(fb().seq({fb().literal(d.ip), fb().opt(fb().seq({fb().literal("."), fraction_cmp(rule, d.fp, false, strict)}))}));
    return fb().alt(alts);
  };
  // x >= D: D >= 0: M >= D, no sign; D < 0: any x >= 0, or -M with M <= |D|. x <= D mirrors it.
  if (lower == !d.neg) return d.neg ? fb().seq({fb().literal("-"), mag(true)}) : mag(true);
  if (lower) return fb().alt({any_mag(), fb().seq({fb().literal("-"), mag(false)})});
  return fb().alt({fb().seq({fb().literal("-"), any_mag()}), mag(false)});
}

// Numbers: exact for any finite bounds; such numbers are written without an exponent.
Frag SchemaCompiler::number_frag(int32_t rule, const Json& n, const std::string& ptr) {
  struct Cut {
    const char* kw;
    bool lower, strict;
  };
  std::vector<Cut> cuts;
  bool ex_min = n.contains("exclusiveMinimum") && n["exclusiveMinimum"] == true;
  bool ex_max = n.contains("exclusiveMaximum") && n["exclusiveMaximum"] == true;
  for (Cut c : {Cut{"minimum", true, ex_min}, Cut{"maximum", false, ex_max}, Cut{"exclusiveMinimum", true, true},
                Cut{"exclusiveMaximum", false, true}})
    if (n.contains(c.kw) && n[c.kw].is_number() && !json_integral(n[c.kw])) cuts.push_back(c);
  if (!cuts.empty()) {
    Json relaxed = n;
    for (const Cut& c : cuts) relaxed.erase(c.kw);
    int32_t r = gb_.add_rule(fresh(ptr + "/bounds"));
    gb_.frags(r).set_root(number_frag(r, relaxed, ptr));
    Rule d = determinize_bytes(gb_.nfa(r), "number", 200000);
    for (const Cut& c : cuts) {
      int32_t b = gb_.add_rule(fresh(ptr + "/" + c.kw));
      gb_.frags(b).set_root(decimal_bound(b, n[c.kw], c.lower, c.strict, pointer_append(ptr, c.kw)));
      d = intersect_bytes(d, determinize_bytes(gb_.nfa(b), "number", 200000), false, 200000);
      gb_.set_from_dfa(b, d);
    }
    gb_.set_from_dfa(r, d);
    return gb_.frags(rule).dfa(d);
  }
  return integral_number_frag(rule, n, ptr);
}

// Numbers with integer-valued bounds (or none).
Frag SchemaCompiler::integral_number_frag(int32_t rule, const Json& n, const std::string& ptr) {
  bool ex_min_b = n.contains("exclusiveMinimum") && n["exclusiveMinimum"] == true;
  bool ex_max_b = n.contains("exclusiveMaximum") && n["exclusiveMaximum"] == true;
  enum Kind { none, incl, excl };
  Kind lk = none, uk = none;
  Int lv = 0, uv = 0;
  auto bound = [&](const char* kw, Kind kind, bool lower) {
    auto v = number_kw(n, kw, ptr);
    if (!v) return;
    if (!json_integral(n[kw])) fail(pointer_append(ptr, kw), "non-integer bounds on type number are not supported");
    Int x = json_int(n[kw], false, pointer_append(ptr, kw));
    Kind& k = lower ? lk : uk;
    Int& cur = lower ? lv : uv;
    bool tighter = k == none || (lower ? (x > cur || (x == cur && kind == excl)) : (x < cur || (x == cur && kind == excl)));
    if (tighter) k = kind, cur = x;
  };
  bound("minimum", ex_min_b ? excl : incl, true);
  bound("exclusiveMinimum", excl, true);
  bound("maximum", ex_max_b ? excl : incl, false);
  bound("exclusiveMaximum", excl, false);
  if (lk == none && uk == none) return emit_regex(gb_, rule, kNumberRegex, {});
  // one sign: magnitude M >= 0 with int part I; M-bounds (kind, value)
  auto side = [&](Kind lok, Int lov, Kind upk, Int upv) -> std::vector<Frag> {
    std::vector<Frag> out;
    IntBound A = 0, B;
    bool nz_point = false, z_point = false;
    if (lok == incl) A = std::max<Int>(0, lov);
    if (lok == excl) {
      if (lov < 0) A = 0;
      else A = lov + 1, nz_point = true;
    }
    if (upk == incl) {
      if (upv < 0) return out;
      B = upv - 1, z_point = true;
    }
    if (upk == excl) {
      if (upv <= 0) return out;
      B = upv - 1;
    }
    auto any_frac = [&] { return gb_.frags(rule).opt(gb_.frags(rule).seq({gb_.frags(rule).literal("."), gb_.frags(rule).plus(gb_.frags(rule).bytes('0', '9'))})); };
    auto zero_frac = [&] { return gb_.frags(rule).opt(gb_.frags(rule).seq({gb_.frags(rule).literal("."), gb_.frags(rule).plus(gb_.frags(rule).bytes('0', '0'))})); };
    auto nz_frac = [&] {
      return gb_.frags(rule).seq({gb_.frags(rule).literal("."), gb_.frags(rule).star(gb_.frags(rule).bytes('0', '9')),
                                  gb_.frags(rule).bytes('1', '9'), gb_.frags(rule).star(gb_.frags(rule).bytes('0', '9'))});
    };
    if (!B || *A <= *B) out.push_back(gb_.frags(rule).seq({int_range(rule, A, B), any_frac()}));
    if (nz_point && (!B || lov <= *B)) out.push_back(gb_.frags(rule).seq({gb_.frags(rule).literal(digits(lov)), nz_frac()}));
    if (z_point && upv >= *A) out.push_back(gb_.frags(rule).seq({gb_.frags(rule).literal(digits(upv)), zero_frac()}));
    return out;
  };
  std::vector<Frag> alts;
  // x >= 0 (written without '-')
  for (Frag f : side(lk, lv, uk, uv)) alts.push_back(f);
  // x < 0: M = -x > 0
  if (lk == none || lv < 0 || (lk == excl && lv < 0)) {
    Kind mlk = excl;
    Int mlv = 0;
    if (uk != none && uv < 0) mlk = uk, mlv = -uv;  // x <= hi -> M >= -hi ; x < hi -> M > -hi
    Kind muk = none;
    Int muv = 0;
    if (lk != none) muk = lk, muv = -lv;  // x >= lo -> M <= -lo ; x > lo -> M < -lo
    for (Frag f : side(mlk, mlv, muk, muv)) alts.push_back(gb_.frags(rule).seq({gb_.frags(rule).literal("-"), f}));
  }
  return gb_.frags(rule).alt(alts);
}

// JSON string bodies of min..max characters, built directly: one copy of the one-character
// automaton per count.
Rule SchemaCompiler::length_dfa(uint64_t min, uint64_t max) {
  static const Rule one = [] {
    Nfa nfa;
    FragBuilder fb(nfa);
    fb.set_root(emit_code_set(fb, CodeSet::all(), true));
    return determinize_bytes(nfa, "char", 1000);
  }();
  uint64_t blocks = max == kUnbounded ? min + 1 : max + 1;
  std::vector<int32_t> inner;  // non-accepting states of `one`, in order
  std::vector<int32_t> pos(one.states.size(), -1);
  for (size_t s = 0; s < one.states.size(); ++s)
    if (!one.states[s].accepting) pos[s] = int32_t(inner.size()), inner.push_back(int32_t(s));
  Rule r;
  r.name = "length";
  r.byte_class = one.byte_class;
  r.n_classes = one.n_classes;
  size_t per = inner.size();
  auto id = [&](uint64_t block, int32_t s) { return int32_t(block * per + size_t(pos[size_t(s)])); };
  const size_t n_states = size_t(blocks) * per;
  if (n_states > grammar_automaton_limit())
    grammar_fail("grammar: json_schema: a string length bound of ", blocks - 1, " characters needs ", n_states,
                 " automaton states, more than the limit of ", grammar_automaton_limit());
  grammar_charge(n_states, 0);
  r.states.resize(n_states);
  r.trans.assign(r.states.size() * size_t(r.n_classes), -1);
  for (uint64_t b = 0; b < blocks; ++b) {
    bool last = max != kUnbounded && b == max;
    uint64_t after = max == kUnbounded ? std::min(b + 1, min) : b + 1;
    for (int32_t s : inner) {
      int32_t me = id(b, s);
      if (s == 0) r.states[size_t(me)].accepting = b >= min;
      if (last) continue;
      for (int c = 0; c < one.n_classes; ++c) {
        int32_t t = one.trans[size_t(s) * size_t(one.n_classes) + size_t(c)];
        if (t < 0) continue;
        r.trans[size_t(me) * size_t(r.n_classes) + size_t(c)] = one.states[size_t(t)].accepting ? id(after, 0) : id(b, t);
        r.states[size_t(me)].has_bytes = true;
      }
    }
  }
  return r;
}

Rule SchemaCompiler::key_pattern_dfa(const std::string& pattern, const std::string& ptr) {
  try {
    return regex_dfa(pattern, true);
  } catch (const GrammarError& e) {
    fail(ptr, e.what());
  }
}

Rule SchemaCompiler::literal_set_dfa(const std::vector<std::string>& literals) {
  Nfa nfa;
  FragBuilder fb(nfa);
  std::vector<Frag> alts;
  for (const std::string& l : literals) alts.push_back(fb.literal(l));
  fb.set_root(fb.alt(alts));
  return determinize_bytes(nfa, "literals", kMaxDfaStates);
}

Rule SchemaCompiler::string_content_dfa(const Json& n, const std::string& ptr, bool& trivial) {
  std::vector<Rule> parts;
  trivial = true;
  try {
    if (n.contains("pattern")) {
      Json ps = n["pattern"].is_array() ? n["pattern"] : Json::array({n["pattern"]});
      for (const Json& p : ps) {
        if (!p.is_string()) fail(pointer_append(ptr, "pattern"), "must be a string");
        parts.push_back(regex_dfa(p.get<std::string>(), true));
      }
    }
  } catch (const GrammarError& e) {
    std::string m = e.what();
    if (m.rfind("grammar: json_schema", 0) == 0) throw;
    fail(pointer_append(ptr, "pattern"), m);
  }
  uint64_t min = string_length_kw(n, "minLength", 0, 1e12, ptr);
  uint64_t max = string_length_kw(n, "maxLength", kUnbounded, 1e12, ptr);
  if (n.contains("format") && !ignored("format")) {
    if (!n["format"].is_string()) fail(pointer_append(ptr, "format"), "must be a string");
    const std::string& f = n["format"].get<std::string>();
    FormatVariant v{.lean = !parts.empty() || n.contains(kNotEnum) || n.contains(kNotString) || min > 0 || max != kUnbounded,
                    .max_chars = max};
    std::optional<FormatSpec> spec = format_spec(f, v);
    if (!spec && kSpecFormats.count(f)) fail(pointer_append(ptr, "format"), "unsupported format '" + f + "'");
    if (spec) {
      parts.push_back(*format_dfa(f, v, *spec));
      if (spec->length_built_in) max = kUnbounded;
    }
  }
  if (n.contains(kNotString))
    for (const Json& c : n[kNotString]) {
      bool t = false;
      parts.push_back(intersect_bytes(length_dfa(0, kUnbounded), string_content_dfa(c, ptr, t), true, kMaxDfaStates));
    }
  if (n.contains(kNotEnum)) {
    std::vector<std::string> lits;
    for (const Json& v : n[kNotEnum]) lits.push_back(v.dump().substr(1, v.dump().size() - 2));
    parts.push_back(intersect_bytes(length_dfa(0, kUnbounded), literal_set_dfa(lits), true, kMaxDfaStates));
  }
  if (min > 0 || max != kUnbounded || parts.empty()) {
    if ((max != kUnbounded && max > kMaxLengthWithPattern) || min > kMaxLengthWithPattern)
      fail(ptr, "minLength/maxLength above 2000 combined with pattern/format is not supported");
    parts.push_back(length_dfa(min, max));
  }
  trivial = parts.size() == 1 && !n.contains("pattern") && !n.contains("format") && !n.contains(kNotEnum) &&
            !n.contains(kNotString) && min == 0 &&
            max == kUnbounded;
  Rule r = parts[0];
  try {
    for (size_t i = 1; i < parts.size(); ++i) r = intersect_bytes(r, parts[i], false, kMaxDfaStates);
  } catch (const GrammarBudgetError&) {
    throw;
  } catch (const GrammarCancelled&) {
    throw;
  } catch (const GrammarError& e) {
    fail(ptr, std::string("the string's pattern/format/length constraints together are too large an automaton (") +
                  e.what() + ")");
  }
  return r;
}

Rule SchemaCompiler::multiple_of_dfa(const Json& m, const std::string& ptr) {
  if (!m.is_number() || m.get<double>() <= 0) fail(ptr, "must be a positive number");
  std::string text = m.dump();
  if (text.find_first_of("eE") != std::string::npos) fail(ptr, "multipleOf " + text + ": exponent form is not supported");
  size_t dot = text.find('.');
  size_t q = dot == std::string::npos ? 0 : text.size() - dot - 1;
  std::string digits_only = dot == std::string::npos ? text : text.substr(0, dot) + text.substr(dot + 1);
  while (q > 0 && digits_only.back() == '0') digits_only.pop_back(), --q;
  uint64_t p = std::stoull(digits_only);
  if (p == 0 || p * (q + 2) > 20000) fail(ptr, "multipleOf " + text + " is not supported (too fine-grained)");
  // states: int part residue r -> 2 + r; fraction (r, j digits) -> 2 + p + j * p + r
  Nfa nfa;
  auto st = [&](uint64_t r, int64_t j) { return int32_t(2 + (j < 0 ? 0 : p * uint64_t(j + 1)) + r); };
  size_t n_states = 2 + p * (q + 2);
  while (nfa.out.size() < n_states) nfa.add_state();
  int32_t signed_start = nfa.add_state();
  FragBuilder fb(nfa);
  fb.eps(0, signed_start);
  nfa.out[0].push_back({NfaEdge::Kind::bytes, '-', '-', -1, signed_start});
  uint64_t pow10q = 1;
  for (size_t i = 0; i < q; ++i) pow10q = pow10q * 10 % p;
  for (int d = 0; d <= 9; ++d)
    nfa.out[size_t(signed_start)].push_back({NfaEdge::Kind::bytes, uint8_t('0' + d), uint8_t('0' + d), -1, st(uint64_t(d) % p, -1)});
  for (uint64_t r = 0; r < p; ++r) {
    int32_t s = st(r, -1);
    for (int d = 0; d <= 9; ++d)
      nfa.out[size_t(s)].push_back({NfaEdge::Kind::bytes, uint8_t('0' + d), uint8_t('0' + d), -1, st((r * 10 + uint64_t(d)) % p, -1)});
    nfa.out[size_t(s)].push_back({NfaEdge::Kind::bytes, '.', '.', -1, st(r, 0)});
    if (r * pow10q % p == 0) fb.eps(s, 1);
    for (size_t j = 0; j <= q; ++j) {
      int32_t f = st(r, int64_t(j));
      uint64_t scale = 1;
      for (size_t i = j; i < q; ++i) scale = scale * 10 % p;
      if (r * scale % p == 0) fb.eps(f, 1);
      if (j < q) {
        for (int d = 0; d <= 9; ++d)
          nfa.out[size_t(f)].push_back({NfaEdge::Kind::bytes, uint8_t('0' + d), uint8_t('0' + d), -1, st((r * 10 + uint64_t(d)) % p, int64_t(j + 1))});
      } else {
        nfa.out[size_t(f)].push_back({NfaEdge::Kind::bytes, '0', '0', -1, f});
      }
    }
  }
  return determinize_bytes(nfa, "multipleOf", kMaxDfaStates);
}

namespace {

// '"', a string body the byte-only DFA c accepts, '"' as one DFA built directly (null when c
// accepts nothing, or could read a '"' where it may also end: a body reads '"' only inside an
// escape, where it cannot end).
std::shared_ptr<const Rule> quoted_rule(const Rule& c) {
  if (c.states.empty()) return nullptr;
  auto nc = size_t(c.n_classes);
  uint8_t qc = c.byte_class['"'];
  Rule r;
  r.name = "quoted";
  r.byte_class = c.byte_class;
  r.byte_class['"'] = uint8_t(nc);
  r.n_classes = int32_t(nc + 1);
  size_t n = c.states.size() + 2, fin = n - 1, rc = nc + 1;
  r.states.resize(n);
  r.trans.assign(n * rc, -1);
  r.trans[0 * rc + nc] = 1;
  r.states[0].has_bytes = true;
  r.states[fin].accepting = true;
  for (size_t s = 0; s < c.states.size(); ++s) {
    DfaState& ds = r.states[s + 1];
    for (size_t k = 0; k < nc; ++k) {
      int32_t t = c.trans[s * nc + k];
      if (t >= 0) r.trans[(s + 1) * rc + k] = t + 1, ds.has_bytes = true;
    }
    int32_t tq = c.trans[s * nc + qc];
    if (tq >= 0 && c.states[s].accepting) return nullptr;
    if (tq >= 0) r.trans[(s + 1) * rc + nc] = tq + 1;
    if (c.states[s].accepting) r.trans[(s + 1) * rc + nc] = int32_t(fin), ds.has_bytes = true;
  }
  return std::make_shared<const Rule>(std::move(r));
}

// quoted_rule of JSON string text of min..max characters, shared by every schema.
std::shared_ptr<const Rule> quoted_length_rule(uint64_t min, uint64_t max) {
  static std::mutex mu;
  static std::map<std::pair<uint64_t, uint64_t>, std::shared_ptr<const Rule>> cache;
  {
    std::lock_guard lock(mu);
    auto it = cache.find({min, max});
    if (it != cache.end()) return it->second;
  }
  auto out = quoted_rule(SchemaCompiler::length_dfa(min, max));
  if (!out) return nullptr;
  std::lock_guard lock(mu);
  if (cache.size() > 256) cache.clear();
  cache.emplace(std::make_pair(min, max), out);
  return out;
}

// quoted_rule of a format's content automaton, shared by every schema.
std::shared_ptr<const Rule> quoted_format_rule(const std::string& f, const FormatSpec& spec) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Rule>> cache;
  {
    std::lock_guard lock(mu);
    auto it = cache.find(f);
    if (it != cache.end()) return it->second;
  }
  auto out = quoted_rule(*format_dfa(f, {}, spec));
  if (!out) return nullptr;
  std::lock_guard lock(mu);
  cache.emplace(f, out);
  return out;
}

}  // namespace

Frag SchemaCompiler::string_frag(int32_t rule, const Json& n, const std::string& ptr) {
  bool has_re = n.contains("pattern") || n.contains(kNotEnum) || n.contains(kNotString) ||
                (n.contains("format") && !ignored("format") && (!n["format"].is_string() || format_asserted(n["format"].get<std::string>())));
  uint64_t min = string_length_kw(n, "minLength", 0, 4e9, ptr);
  uint64_t max = string_length_kw(n, "maxLength", kUnbounded, 4e9, ptr);
  if (min > max) return gb_.frags(rule).alt({});
  if (!has_re && min == 0 && max == kUnbounded) return gb_.frags(rule).call(any_string_rule());
  if (!has_re && (min > kMaxLengthWithPattern || (max != kUnbounded && max > kMaxLengthWithPattern))) {
    // very long bounds: a counter over single characters (exact, but masks get slower)
    Frag body = repeat_frag(rule, json_char_rule(), uint32_t(min), uint32_t(max));
    return gb_.frags(rule).seq({gb_.frags(rule).literal("\""), body, gb_.frags(rule).literal("\"")});
  }
  Json keywords = Json::object();
  for (const char* kw : {"pattern", "format", "minLength", "maxLength", kNotEnum, kNotString})
    if (n.contains(kw)) keywords[kw] = n[kw];
  std::string key = keywords.dump();
  if (auto it = string_rules_.find(key); it != string_rules_.end()) return gb_.frags(rule).call(it->second);
  std::shared_ptr<const Rule> q;
  if (!has_re) q = quoted_length_rule(min, max);
  if (!q && min == 0 && max == kUnbounded && !n.contains("pattern") && !n.contains(kNotEnum) && !n.contains(kNotString) &&
      n["format"].is_string())
    if (std::optional<FormatSpec> spec = format_spec(n["format"].get<std::string>()))
      q = quoted_format_rule(n["format"].get<std::string>(), *spec);
  if (!q) {
    bool trivial = false;
    Rule d = string_content_dfa(n, ptr, trivial);
    q = quoted_rule(d);
    if (!q)
      return gb_.frags(rule).seq({gb_.frags(rule).literal("\""), gb_.frags(rule).dfa(d), gb_.frags(rule).literal("\"")});
  }
  int32_t r = gb_.add_rule(fresh(pointer_append(ptr, "string")));
  gb_.set_dfa(r, std::move(q));
  string_rules_.emplace(std::move(key), r);
  return gb_.frags(rule).call(r);
}

Grammar SchemaCompiler::run() {
  int32_t root = gb_.add_rule("root");
  compile_into(root, root_, "", 0);
  return gb_.finish(root);
}

}  // namespace exl::json_schema_detail
