#include "engine/formats/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace safetensors_test {

std::string make_file(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[i] = char((n >> (8 * i)) & 0xff);
  s += header;
  s += std::string(data_bytes, '\x01');
  return s;
}

SafetensorsHeader parse(const std::string& f) {
  return parse_safetensors_header({reinterpret_cast<const std::byte*>(f.data()), f.size()}, "t.safetensors");
}

std::string error_of(const std::string& f) {
  try {
    parse(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, ParsesValidHeader) {
  auto h = parse(make_file(R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F16","shape":[2,3],"data_offsets":[8,20]},"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 20));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].dtype, DType::f16);
  EXPECT_EQ(h.tensors[1].numel(), 6);
  EXPECT_EQ(h.metadata.at("format"), "pt");
}

TEST(Safetensors, ReadsRealStoriesFile) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  SafetensorsFile f(test::shared_dir() / "models/stories260K-hf/model.safetensors");
  EXPECT_EQ(f.header().tensors.size(), 47u);
  const TensorInfo* t = f.find("model.embed_tokens.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::f32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(f.view(*t).data.size(), 512u * 64 * 4);
}

struct BadCase {
  const char* what;
  std::string file;
  const char* expect;  // substring of the message
};

TEST(Safetensors, MalformedHeadersGiveClearErrors) {
  std::string good = make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  std::vector<BadCase> cases = {
      {"too short", "abc", "too short"},
      {"truncated header", good.substr(0, 20), "runs past the end"},
      {"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "exceeds the limit"},
      {"not json", make_file("{not json}", 0), "not valid JSON"},
      {"not an object", make_file("[1,2]", 0), "not a JSON object"},
      {"unknown dtype", make_file(R"({"a":{"dtype":"F8X","shape":[2],"data_offsets":[0,2]}})", 2), "unknown dtype 'F8X'"},
      {"negative dim", make_file(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2), "negative dimension"},
      {"offset out of range", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4), "run past the data section"},
      {"size mismatch", make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "need 12"},
      {"overlap", make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "overlaps"},
      {"reversed offsets", make_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4), "reversed"},
      {"gap", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "gap of 4 bytes"},
      {"trailing bytes", make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), "trailing bytes"},
      {"missing offsets", make_file(R"({"a":{"dtype":"F32","shape":[1]}})", 4), "data_offsets"},
      {"shape overflow", make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4), "overflows"},
  };
  for (const auto& c : cases) {
    std::string msg = error_of(c.file);
    EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": got '" << msg << "'";
  }
}

// Mutates the real header many ways (bit flips, truncation, byte substitutions) and checks
// that parsing either succeeds with in-bounds tensors or throws exl::Error: never crashes.
TEST(Safetensors, MutatedHeaderCorpusNeverCrashes) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  std::string f = test::read_file(test::shared_dir() / "models/stories260K-hf/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  std::string head = f.substr(0, 8 + n);
  uint32_t rng = 12345;
  auto next = [&] { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; };
  int ok = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = f;
    int kind = iter % 4;
    size_t pos = next() % head.size();
    if (kind == 0) m[pos] = char(m[pos] ^ (1 << (next() % 8)));
    else if (kind == 1) m = m.substr(0, next() % m.size());
    else if (kind == 2) m[pos] = "0123456789[]{},:\"-e."[next() % 20];
    else { m.erase(pos, 1 + next() % 8); }
    try {
      auto h = parse(m);
      for (const auto& t : h.tensors) ASSERT_LE(h.data_start + t.offset + t.nbytes, m.size());
      ++ok;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(ok, 0);
}

}  // namespace safetensors_test
}  // namespace exl
