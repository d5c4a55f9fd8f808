// References that need more than a JSON pointer into the document: base URIs ($id, resolved per
// RFC 3986 §5.2 against the enclosing resource), anchors of embedded resources, documents of the
// schema store (JsonSchemaOptions::schema_store), and $dynamicRef/$dynamicAnchor. The document is
// rewritten into one whose every $ref is a JSON pointer ("#/...") into itself: each schema
// resource reached is copied once per dynamic scope it is reached in (the $dynamicAnchor names
// the scope binds, outermost first), the copies that are not the document itself going under
// kResources.
#include <deque>
#include <map>
#include <set>

#include <re2/re2.h>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"
#include "grammar/json_schema_impl.h"

namespace exl::json_schema_detail {
namespace ref_resolution {

constexpr size_t kMaxResourceCopies = 128;
constexpr char kDefaultBase[] = "exl:/schema";

// RFC 3986 §3 components; a component that is absent differs from one that is empty.
struct UriRef {
  std::optional<std::string> scheme, authority, query, fragment;
  std::string path;
};

UriRef parse_uri_ref(const std::string& s, const std::string& where) {
  // RFC 3986 appendix B
  static const RE2 re(R"(^(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?$)");
  re2::StringPiece g[9];
  if (!RE2::FullMatch(s, re, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5], &g[6], &g[7], &g[8]))
    fail(where, "'" + s + "' is not a URI reference");
  auto opt = [&](int i) -> std::optional<std::string> {
    if (g[i].data() == nullptr) return std::nullopt;
    return std::string(g[i].data(), g[i].size());
  };
  UriRef u;
  u.scheme = opt(1), u.authority = opt(3), u.query = opt(6), u.fragment = opt(8);
  u.path = std::string(g[4].data() ? g[4].data() : "", g[4].size());
  return u;
}

// RFC 3986 §5.2.4
std::string remove_dot_segments(std::string in) {
  std::string out;
  while (!in.empty()) {
    if (in.rfind("../", 0) == 0) in.erase(0, 3);
    else if (in.rfind("./", 0) == 0) in.erase(0, 2);
    else if (in.rfind("/./", 0) == 0) in.replace(0, 3, "/");
    else if (in == "/.") in = "/";
    else if (in.rfind("/../", 0) == 0 || in == "/..") {
      in = in == "/.." ? "/" : in.substr(3);
      size_t p = out.rfind('/');
      out.erase(p == std::string::npos ? 0 : p);
    } else if (in == "." || in == "..") {
      in.clear();
    } else {
      size_t p = in.find('/', in[0] == '/' ? 1 : 0);
      out += in.substr(0, p);
      in = p == std::string::npos ? "" : in.substr(p);
    }
  }
  return out;
}

std::string uri_text(const UriRef& u) {
  std::string s;
  if (u.scheme) s += *u.scheme + ":";
  if (u.authority) s += "//" + *u.authority;
  s += u.path;
  if (u.query) s += "?" + *u.query;
  if (u.fragment) s += "#" + *u.fragment;
  return s;
}

// RFC 3986 §5.2.2 (strict): `ref` resolved against the absolute URI `base`.
UriRef resolve_uri(const std::string& base, const std::string& ref, const std::string& where) {
  UriRef r = parse_uri_ref(ref, where), b = parse_uri_ref(base, where), t;
  if (r.scheme) {
    t = r;
    t.path = remove_dot_segments(r.path);
  } else {
    if (r.authority) {
      t.authority = r.authority, t.path = remove_dot_segments(r.path), t.query = r.query;
    } else {
      if (r.path.empty()) {
        t.path = b.path;
        t.query = r.query ? r.query : b.query;
      } else {
        if (r.path[0] == '/') {
          t.path = remove_dot_segments(r.path);
        } else {
          std::string merged;
          if (b.authority && b.path.empty()) merged = "/" + r.path;
          else {
            size_t slash = b.path.rfind('/');
            merged = (slash == std::string::npos ? "" : b.path.substr(0, slash + 1)) + r.path;
          }
          t.path = remove_dot_segments(merged);
        }
        t.query = r.query;
      }
      t.authority = b.authority;
    }
    t.scheme = b.scheme;
  }
  t.fragment = r.fragment;
  return t;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && isxdigit(uint8_t(s[i + 1])) && isxdigit(uint8_t(s[i + 2]))) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// How a keyword holds subschemas: none, one, an array of them, or an object of them.
enum class Holds { none, one, array, map };

Holds holds_of(const std::string& k, const Json& v) {
  static const std::set<std::string> one = {"additionalItems", "additionalProperties", "contains", "not", "if", "then",
                                            "else", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                                            "contentSchema"};
  static const std::set<std::string> arr = {"allOf", "anyOf", "oneOf", "prefixItems"};
  static const std::set<std::string> map = {"properties", "patternProperties", "$defs", "definitions",
                                            "dependentSchemas", "dependencies"};
  if (k == "items") return v.is_array() ? Holds::array : Holds::one;
  if (one.count(k)) return Holds::one;
  if (arr.count(k) && v.is_array()) return Holds::array;
  if (map.count(k) && v.is_object()) return Holds::map;
  return Holds::none;
}

// Calls f(pointer, subschema) for each subschema directly under the schema object s at `ptr`.
template <class F>
void each_subschema(const Json& s, const std::string& ptr, F&& f) {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    std::string kp = pointer_append(ptr, k);
    switch (holds_of(k, v)) {
      case Holds::one: f(kp, v); break;
      case Holds::array:
        for (size_t i = 0; i < v.size(); ++i) f(pointer_append(kp, std::to_string(i)), v[i]);
        break;
      case Holds::map:
        for (auto m = v.begin(); m != v.end(); ++m)
          if (k != "dependencies" || !m.value().is_array()) f(pointer_append(kp, m.key()), m.value());
        break;
      case Holds::none: break;
    }
  }
}

// draft-07's "$id": "#name", an anchor rather than a base URI
bool is_anchor_id(const Json& id) {
  return id.is_string() && id.get_ref<const std::string&>().rfind('#', 0) == 0;
}

// Deeper schemas are the compiler's to refuse (it stops at 64 levels of normalization).
constexpr int kMaxWalkDepth = 300;

bool needs_rewrite(const Json& s, bool root, int depth = 0) {
  if (!s.is_object() || depth > kMaxWalkDepth) return false;
  if (s.contains("$dynamicRef") || s.contains("$dynamicAnchor")) return true;
  if (s.contains("$ref") && s["$ref"].is_string()) {
    const std::string& r = s["$ref"].get_ref<const std::string&>();
    if (r.empty() || r[0] != '#') return true;
  }
  if (!root && s.contains("$id") && s["$id"].is_string() && !is_anchor_id(s["$id"])) return true;
  bool found = false;
  each_subschema(s, "", [&](const std::string&, const Json& sub) { found = found || needs_rewrite(sub, false, depth + 1); });
  return found;
}

struct Loc {
  int doc = 0;
  std::string ptr;
  auto operator<=>(const Loc&) const = default;
};

// dynamic scope: each $dynamicAnchor name bound, to the schema of its outermost resource
using Scope = std::map<std::string, Loc>;

struct Document {
  const Json* json = nullptr;
  // the resources' roots in this document (pointer -> their dynamic anchors, name -> pointer)
  std::map<std::string, std::map<std::string, std::string>> resources;
  // $ref beside $id: draft 7 and earlier ignore the $id, 2019-09 on do not; 0 when $schema does not say
  int old_draft = 0;
};

class Rewriter {
 public:
  Rewriter(const Json& root, const JsonSchemaOptions& opts) : opts_(opts) {
    add_document(root, kDefaultBase);
  }

  Json run() {
    const Json& root = *docs_[0].json;
    if (root.contains(kResources)) fail("", std::string("'") + kResources + "' is reserved");
    Scope scope = enter({}, Loc{0, ""});
    note_natural(root, "", scope);
    Json out = copy(0, root, "", kDefaultBase, scope);
    Json copies = Json::object();
    while (!jobs_.empty()) {
      Job j = jobs_.front();
      jobs_.pop_front();
      copies[j.name] = copy(j.loc.doc, at(j.loc, ""), j.loc.ptr, resource_uri_.at(j.loc), j.scope);
    }
    if (!copies.empty()) out[kResources] = copies;
    return out;
  }

 private:
  struct Job {
    Loc loc;
    Scope scope;
    std::string name;  // its key under kResources
  };

  const JsonSchemaOptions& opts_;
  std::vector<Document> docs_;
  std::map<std::string, Loc> by_uri_;  // resources by URI, anchors by URI#name
  std::set<std::string> ambiguous_;
  std::map<Loc, std::string> resource_uri_;
  std::map<std::string, std::string> prefix_of_;  // (resource, scope) key -> output pointer
  std::deque<Job> jobs_;
  size_t n_copies_ = 0;

  static int old_draft_of(const Json& doc) {
    if (!doc.is_object() || !doc.contains("$schema") || !doc["$schema"].is_string()) return 0;
    const std::string& v = doc["$schema"].get_ref<const std::string&>();
    for (const char* d : {"draft-03", "draft-04", "draft-06", "draft-07"})
      if (v.find(d) != std::string::npos) return 1;
    return -1;
  }

  void name(const std::string& uri, Loc loc) {
    auto [it, fresh] = by_uri_.emplace(uri, loc);
    if (!fresh && it->second != loc) ambiguous_.insert(uri);
  }

  int add_document(const Json& doc, const std::string& uri) {
    int d = int(docs_.size());
    docs_.push_back(Document{&doc, {}, old_draft_of(doc)});
    if (docs_[d].old_draft == 0 && d > 0) docs_[d].old_draft = docs_[0].old_draft;
    index(d, doc, "", uri, "");
    return d;
  }

  // Whether the $id of s applies: draft 7 and earlier ignore it beside $ref (where the document
  // does not say its draft, copy() refuses a $ref the two readings resolve apart).
  bool id_applies(int d, const Json& s) const {
    if (!s.contains("$id") || !s["$id"].is_string()) return false;
    return !(s.contains("$ref") && docs_[d].old_draft == 1);
  }

  void index(int d, const Json& s, const std::string& ptr, std::string base, std::string resource, int depth = 0) {
    if (depth > kMaxWalkDepth) fail(ptr, "schema nesting deeper than 300");
    if (ptr.empty()) {
      // the document itself is a resource, at the URI it was retrieved from (or its own $id)
      resource_uri_[Loc{d, ""}] = base;
      docs_[d].resources[""];
      name(base, Loc{d, ""});
    }
    if (!s.is_object()) return;
    std::string where = pointer_append(ptr, "$id");
    if (id_applies(d, s)) {
      const std::string& id = s["$id"].get_ref<const std::string&>();
      UriRef u = resolve_uri(base, id, where);
      std::optional<std::string> frag = u.fragment;
      u.fragment.reset();
      std::string uri = uri_text(u);
      if (!is_anchor_id(s["$id"])) {
        base = uri, resource = ptr;
        docs_[d].resources[ptr];
        resource_uri_[Loc{d, ptr}] = uri;
        name(uri, Loc{d, ptr});
      }
      if (frag && !frag->empty()) name(uri + "#" + *frag, Loc{d, ptr});
    }
    for (const char* kw : {"$anchor", "$dynamicAnchor"})
      if (s.contains(kw)) {
        if (!s[kw].is_string()) fail(pointer_append(ptr, kw), "must be a string");
        const std::string& a = s[kw].get_ref<const std::string&>();
        name(base + "#" + a, Loc{d, ptr});
        if (std::string(kw) == "$dynamicAnchor") docs_[d].resources[resource][a] = ptr;
      }
    each_subschema(s, ptr, [&](const std::string& p, const Json& sub) { index(d, sub, p, base, resource, depth + 1); });
  }

  // The scope after entering the resource rooted at `res`: its dynamic anchors, unless bound already.
  Scope enter(Scope scope, const Loc& res) const {
    for (const auto& [n, p] : docs_[res.doc].resources.at(res.ptr)) scope.emplace(n, Loc{res.doc, p});
    return scope;
  }

  static std::string key_of(const Loc& res, const Scope& scope) {
    std::string k = std::to_string(res.doc) + res.ptr;
    for (const auto& [n, l] : scope) k += "\x1f" + n + "\x1e" + std::to_string(l.doc) + l.ptr;
    return k;
  }

  // The embedded resources of the document, at their own place for the scope they get there.
  void note_natural(const Json& s, const std::string& ptr, Scope scope, int depth = 0) {
    if (!s.is_object() || depth > kMaxWalkDepth) return;
    if (!ptr.empty() && docs_[0].resources.count(ptr) && resource_uri_.count(Loc{0, ptr})) {
      scope = enter(scope, Loc{0, ptr});
      prefix_of_.emplace(key_of(Loc{0, ptr}, scope), ptr);
    } else if (ptr.empty()) {
      prefix_of_.emplace(key_of(Loc{0, ""}, scope), "");
    }
    each_subschema(s, ptr, [&](const std::string& p, const Json& sub) { note_natural(sub, p, scope, depth + 1); });
  }

  const Json& at(const Loc& loc, const std::string& where) const {
    const Json* cur = docs_[size_t(loc.doc)].json;
    size_t pos = 0;
    const std::string& p = loc.ptr;
    while (pos < p.size()) {
      size_t next = p.find('/', pos + 1);
      std::string tok = p.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1), key;
      for (size_t i = 0; i < tok.size(); ++i) {
        if (tok[i] == '~' && i + 1 < tok.size() && (tok[i + 1] == '0' || tok[i + 1] == '1')) key += tok[++i] == '0' ? '~' : '/';
        else key += tok[i];
      }
      if (cur->is_object() && cur->contains(key)) cur = &(*cur)[key];
      else if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
               key.size() < 10 && std::stoull(key) < cur->size())
        cur = &(*cur)[std::stoull(key)];
      else fail(where, "'" + p + "' does not resolve");
      if (next == std::string::npos) break;
      pos = next;
    }
    return *cur;
  }

  // The schema a URI (with its fragment) names, from the documents and the schema store.
  Loc locate(const std::string& ref, const UriRef& target, const std::string& where) {
    UriRef u = target;
    u.fragment.reset();
    std::string uri = uri_text(u);
    if (!by_uri_.count(uri)) {
      auto it = opts_.schema_store.find(uri);
      if (it == opts_.schema_store.end())
        fail(where, "'" + ref + "'" + (ref == uri ? "" : " names '" + uri + "', which") +
                        " is neither a resource of this schema nor in the schema store");
      add_document(it->second, uri);
    }
    if (ambiguous_.count(uri)) fail(where, "'" + uri + "' identifies more than one schema");
    Loc loc = by_uri_.at(uri);
    std::string frag = percent_decode(target.fragment.value_or(""));
    if (frag.empty()) return loc;
    if (frag[0] == '/') {
      std::string canonical;
      size_t pos = 0;
      while (pos < frag.size()) {
        size_t next = frag.find('/', pos + 1);
        canonical += "/" + frag.substr(pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
        if (next == std::string::npos) break;
        pos = next;
      }
      Loc t{loc.doc, loc.ptr + canonical};
      at(t, where);
      return t;
    }
    std::string anchor = uri + "#" + frag;
    if (ambiguous_.count(anchor)) fail(where, "'" + ref + "': more than one schema has this anchor");
    auto it = by_uri_.find(anchor);
    if (it == by_uri_.end()) fail(where, "'" + ref + "': no schema has the anchor '" + frag + "'");
    return it->second;
  }

  Loc resource_of(const Loc& loc) const {
    const auto& rs = docs_[size_t(loc.doc)].resources;
    std::string best;
    for (const auto& [p, anchors] : rs)
      if (loc.ptr.rfind(p, 0) == 0 && (loc.ptr.size() == p.size() || loc.ptr[p.size()] == '/') && p.size() >= best.size())
        best = p;
    return Loc{loc.doc, best};
  }

  // The rewritten reference: a JSON pointer into the output, to the copy of the target's resource
  // for the scope it is reached in.
  std::string rewrite(const std::string& ref, bool dynamic, const std::string& base, const Scope& scope,
                      const std::string& where) {
    UriRef t = resolve_uri(base, ref, where);
    Loc target = locate(ref, t, where);
    std::string frag = percent_decode(t.fragment.value_or(""));
    if (dynamic && !frag.empty() && frag[0] != '/') {
      const Json& s = at(target, where);
      if (s.is_object() && s.contains("$dynamicAnchor") && s["$dynamicAnchor"] == frag && scope.count(frag))
        target = scope.at(frag);
    }
    Loc res = resource_of(target);
    Scope inner = enter(scope, res);
    std::string key = key_of(res, inner);
    auto it = prefix_of_.find(key);
    if (it == prefix_of_.end()) {
      if (n_copies_ >= kMaxResourceCopies)
        fail(where, "'" + ref + "': more than 128 (resource, dynamic scope) pairs are reached");
      std::string n = std::to_string(n_copies_++);
      it = prefix_of_.emplace(key, pointer_append(pointer_append("", kResources), n)).first;
      jobs_.push_back(Job{res, inner, n});
    }
    std::string out = "#";
    for (char c : it->second + target.ptr.substr(res.ptr.size())) out += c == '%' ? std::string("%25") : std::string(1, c);
    return out;
  }

  // `loose`: s is under a keyword that holds no schema (an unknown keyword), compiled only if a
  // JSON pointer reaches it; a reference there that resolves nowhere becomes one that fails then.
  Json copy(int d, const Json& s, const std::string& ptr, std::string base, Scope scope, bool loose = false) {
    if (s.is_array() && loose) {
      Json a = Json::array();
      for (size_t i = 0; i < s.size(); ++i) a.push_back(copy(d, s[i], pointer_append(ptr, std::to_string(i)), base, scope, true));
      return a;
    }
    if (!s.is_object()) return s;
    grammar_poll();
    const std::string parent_base = base;
    if (id_applies(d, s) && !is_anchor_id(s["$id"])) {
      Loc here{d, ptr};
      if (resource_uri_.count(here)) {
        base = resource_uri_.at(here);
        if (!ptr.empty()) scope = enter(scope, here);
      }
    }
    Json out = Json::object();
    std::optional<std::string> dynamic_ref;
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      std::string kp = pointer_append(ptr, k);
      if (k == "$id" || k == "$anchor" || k == "$dynamicAnchor") continue;
      if ((k == "$ref" || k == "$dynamicRef") && !v.is_string()) {
        if (!loose) fail(kp, "must be a string");
        out[k] = v;
        continue;
      }
      if (loose && (k == "$ref" || k == "$dynamicRef")) {
        try {
          out[k] = rewrite(v.get<std::string>(), k == "$dynamicRef", base, scope, kp);
        } catch (const GrammarError&) {
          grammar_budget_check();
          out[k] = "exl:unresolved:" + v.get<std::string>();
        }
        continue;
      }
      if (k == "$ref") {
        if (docs_[d].old_draft == 0 && base != parent_base) {
          std::optional<Loc> draft7, later;
          try {
            draft7 = locate(v.get<std::string>(), resolve_uri(parent_base, v.get<std::string>(), kp), kp);
            later = locate(v.get<std::string>(), resolve_uri(base, v.get<std::string>(), kp), kp);
          } catch (const GrammarError&) {
            grammar_budget_check();
          }
          if (draft7 && draft7 != later)
            fail(pointer_append(ptr, "$id"),
                 "$id beside $ref: draft 7 ignores it, 2019-09 on do not, and the $ref resolves apart; say which with "
                 "$schema");
        }
        out[k] = rewrite(v.get<std::string>(), false, base, scope, kp);
        continue;
      }
      if (k == "$dynamicRef") {
        dynamic_ref = rewrite(v.get<std::string>(), true, base, scope, kp);
        if (!s.contains("$ref")) out["$ref"] = *dynamic_ref, dynamic_ref.reset();
        continue;
      }
      switch (holds_of(k, v)) {
        case Holds::one: out[k] = copy(d, v, kp, base, scope, loose); break;
        case Holds::array: {
          Json a = Json::array();
          for (size_t i = 0; i < v.size(); ++i) a.push_back(copy(d, v[i], pointer_append(kp, std::to_string(i)), base, scope, loose));
          out[k] = a;
          break;
        }
        case Holds::map: {
          Json m = Json::object();
          for (auto e = v.begin(); e != v.end(); ++e)
            m[e.key()] = k == "dependencies" && e.value().is_array() ? e.value()
                                                                      : copy(d, e.value(), pointer_append(kp, e.key()), base, scope, loose);
          out[k] = m;
          break;
        }
        case Holds::none: {
          static const std::set<std::string> data = {"enum", "const", "default", "examples", "example", "required",
                                                     "type", "dependentRequired", "$comment", "description", "title"};
          out[k] = data.count(k) ? v : copy(d, v, kp, base, scope, true);
          break;
        }
      }
    }
    if (dynamic_ref) {
      if (!out.contains("allOf")) out["allOf"] = Json::array();
      out["allOf"].push_back(Json{{"$ref", *dynamic_ref}});
    }
    return out;
  }
};

}  // namespace ref_resolution

std::optional<Json> resolve_references(const Json& root, const JsonSchemaOptions& opts) {
  if (!ref_resolution::needs_rewrite(root, true)) return std::nullopt;
  return ref_resolution::Rewriter(root, opts).run();
}

}  // namespace exl::json_schema_detail
