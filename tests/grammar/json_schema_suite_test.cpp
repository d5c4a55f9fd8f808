// JSON-Schema-Test-Suite (draft2020-12 and draft7, required files; and the optional format files
// of both), the suite's remotes/ as the schema store: every case is compiled with property order
// "any" and compact whitespace, and every instance's compact serialization is checked. A case
// passes when the schema compiled and the instance was classified right. Accepting an invalid
// instance (false positive) is never allowed; schemas we cannot enforce must fail to compile
// instead. Prints a per-file table; with EXL_SUITE_VERBOSE=1 in the environment also every group
// that does not pass whole, with the compile error or the misclassified instances.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "grammar/grammar_error.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "test_support.h"

namespace exl {
namespace json_schema_suite_test {

struct Counts {
  int cases = 0, pass = 0, false_pos = 0, false_neg = 0, compile_err = 0, compile_err_valid = 0;
};

// The suite's remotes/ folder as the schema store, each file at http://localhost:1234/<its path>,
// where the suite's tests expect to find it.
std::map<std::string, nlohmann::ordered_json> suite_remotes() {
  std::map<std::string, nlohmann::ordered_json> store;
  auto dir = test::shared_dir() / "data/json-schema-test-suite/remotes";
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json")
      store["http://localhost:1234/" + std::filesystem::relative(e.path(), dir).generic_string()] =
          nlohmann::ordered_json::parse(test::read_file(e.path()));
  return store;
}

// Runs every *.json file of `sub` (relative to the suite's tests/ folder); returns the totals.
Counts run_suite_dir(const std::string& sub) {
  auto dir = test::shared_dir() / "data/json-schema-test-suite/tests" / sub;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  JsonSchemaOptions opts;
  opts.property_order = JsonSchemaOptions::PropertyOrder::any;
  opts.integer_zero_fraction = true;
  opts.schema_store = suite_remotes();
  std::map<std::string, Counts> table;
  Counts total;
  std::vector<std::string> false_positives;
  const bool verbose = std::getenv("EXL_SUITE_VERBOSE") != nullptr;
  for (const auto& f : files) {
    auto groups = nlohmann::ordered_json::parse(test::read_file(f));
    Counts& c = table[f.filename().string()];
    for (const auto& g : groups) {
      std::shared_ptr<CompiledGrammar> cg;
      std::string error;
      try {
        cg = std::make_shared<CompiledGrammar>(compile_json_schema(g["schema"], opts), nullptr);
      } catch (const GrammarError& e) {
        error = e.what();
      }
      if (verbose && !cg)
        std::printf("NO-COMPILE %s: %s (%zu cases): %s\n", f.filename().string().c_str(),
                    g["description"].get<std::string>().c_str(), g["tests"].size(), error.c_str());
      for (const auto& t : g["tests"]) {
        bool valid = t["valid"].get<bool>();
        ++c.cases;
        if (!cg) {
          ++c.compile_err;
          c.compile_err_valid += valid;
          continue;
        }
        Matcher m(cg);
        bool ok = m.accept_bytes(t["data"].dump()) && m.is_accepting();
        if (ok == valid) ++c.pass;
        else if (ok) {
          ++c.false_pos;
          false_positives.push_back(f.filename().string() + ": " + g["description"].get<std::string>() + " / " +
                                    t["description"].get<std::string>() + " " + t["data"].dump());
        } else {
          ++c.false_neg;
          if (verbose)
            std::printf("FALSE NEGATIVE %s: %s / %s %s\n", f.filename().string().c_str(),
                        g["description"].get<std::string>().c_str(), t["description"].get<std::string>().c_str(),
                        t["data"].dump().c_str());
        }
      }
    }
  }
  std::printf("%s\n%-28s %6s %6s %6s %6s %8s\n", sub.c_str(), "file", "cases", "pass", "FP", "FN", "no-comp");
  for (const auto& [name, c] : table) {
    std::printf("%-28s %6d %6d %6d %6d %8d\n", name.c_str(), c.cases, c.pass, c.false_pos, c.false_neg, c.compile_err);
    total.cases += c.cases, total.pass += c.pass, total.false_pos += c.false_pos, total.false_neg += c.false_neg;
    total.compile_err += c.compile_err, total.compile_err_valid += c.compile_err_valid;
  }
  std::printf("%-28s %6d %6d %6d %6d %8d  (pass %.1f%%; uncompiled cases with invalid instances: %d)\n", "TOTAL",
              total.cases, total.pass, total.false_pos, total.false_neg, total.compile_err,
              100.0 * total.pass / total.cases, total.compile_err - total.compile_err_valid);
  for (const auto& fp : false_positives) std::printf("FALSE POSITIVE: %s\n", fp.c_str());
  return total;
}

TEST(GrammarJsonSchemaSuite, Draft2020_12) {
  EXL_REQUIRE_SHARED("data/json-schema-test-suite/tests/draft2020-12");
  Counts total = run_suite_dir("draft2020-12");
  EXPECT_EQ(total.false_pos, 0);
  EXPECT_GE(total.pass, 1203);  // of 1299 (92.6%; session 19)
}

TEST(GrammarJsonSchemaSuite, Draft7) {
  EXL_REQUIRE_SHARED("data/json-schema-test-suite/tests/draft7");
  Counts total = run_suite_dir("draft7");
  EXPECT_EQ(total.false_pos, 0);
  EXPECT_GE(total.pass, 875);  // of 927 (94.4%; session 19)
}

// The other drafts' required files and 2020-12's optional ones: no pass-rate floor (old keywords
// are refused), but no false accept either. (draft7/optional/content.json expects
// contentMediaType/contentEncoding to be asserted, which draft 7 leaves optional and we treat as
// annotations, as 2020-12 does.)
TEST(GrammarJsonSchemaSuite, OtherDraftsNeverAcceptInvalid) {
  EXL_REQUIRE_SHARED("data/json-schema-test-suite/tests/draft2019-09");
  for (const char* d : {"draft2019-09", "draft6", "draft4", "draft2020-12/optional"})
    EXPECT_EQ(run_suite_dir(d).false_pos, 0) << d;
}

// Every asserted format against the suite's own valid and invalid examples: a format we cannot
// check exactly must reject what it is unsure of (or refuse to compile), never accept.
TEST(GrammarJsonSchemaSuite, FormatsNeverAcceptInvalid) {
  EXL_REQUIRE_SHARED("data/json-schema-test-suite/tests/draft2020-12/optional/format");
  EXPECT_EQ(run_suite_dir("draft2020-12/optional/format").false_pos, 0);
  EXPECT_EQ(run_suite_dir("draft7/optional/format").false_pos, 0);
}

}  // namespace json_schema_suite_test
}  // namespace exl
