#include "engine/formats/model_config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kernels/error.h"

namespace exl {
namespace model_config_test {

nlohmann::json small_llama_config() {
  return nlohmann::json::parse(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
      "vocab_size": 32, "max_position_embeddings": 128})");
}

std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Found by fuzz_model_config: 1.2e106 as an integer field was converted to int64 (undefined
// behaviour), and an unsigned 2^64-1 wrapped to -1, which max_position_embeddings accepted.
TEST(ModelConfig, IntegerFieldsOutsideInt64AreRejected) {
  const nlohmann::json bad_values[] = {nlohmann::json(18446744073709551615ull), nlohmann::json(9223372036854775808ull),
                                       nlohmann::json(1.2e106), nlohmann::json(-1e300),
                                       nlohmann::json(9223372036854775808.0)};
  for (const auto& bad : bad_values) {
    nlohmann::json j = small_llama_config();
    j["max_position_embeddings"] = bad;
    const std::string msg = config_error(j);
    EXPECT_NE(msg.find("config.json"), std::string::npos) << bad.dump() << ": '" << msg << "'";
    EXPECT_NE(msg.find("'max_position_embeddings'"), std::string::npos) << bad.dump() << ": '" << msg << "'";
  }
}

TEST(ModelConfig, IntegerFieldsAtTheInt64LimitsAndWholeFloatsAreRead) {
  nlohmann::json j = small_llama_config();
  j["max_position_embeddings"] = 9223372036854775807ll;
  EXPECT_EQ(parse_model_config(j, "config.json").max_position_embeddings, 9223372036854775807ll);
  j["max_position_embeddings"] = 8192.0;
  EXPECT_EQ(parse_model_config(j, "config.json").max_position_embeddings, 8192);
  j["max_position_embeddings"] = 8192.5;
  EXPECT_NE(config_error(j).find("'max_position_embeddings' must be a 64-bit integer"), std::string::npos);
}

}  // namespace model_config_test
}  // namespace exl
