// exl::Error's layer() and concept_name(): the "layer: concept: " prefix of a message read back.
#include <gtest/gtest.h>

#include "kernels/error.h"

namespace exl {
namespace error_test {

TEST(Error, LayerAndConceptAreTheMessagesFirstParts) {
  const Error e("engine: safetensors: 'a.safetensors': tensor 'x': bad shape");
  EXPECT_EQ(e.layer(), "engine");
  EXPECT_EQ(e.concept_name(), "safetensors");
  const Error spaced("engine: grammar constraint: token 5 is not allowed by the grammar here");
  EXPECT_EQ(spaced.concept_name(), "grammar constraint");
  const Error dcheck("internal: check failed: n > 0 at a.cpp:3");
  EXPECT_EQ(dcheck.layer(), "internal");
  EXPECT_EQ(dcheck.concept_name(), "check failed");
}

TEST(Error, NoLayerNoConcept) {
  for (const char* m : {"calculator: number at position 1 too large", "enginex: a: b", "engine:no space", "engine",
                        "", "runtime: nothing after the layer"}) {
    const Error e(m);
    EXPECT_EQ(e.concept_name(), "") << m;
    if (std::string_view(m).starts_with("runtime")) EXPECT_EQ(e.layer(), "runtime");
    else EXPECT_EQ(e.layer(), "") << m;
  }
}

TEST(Error, EveryCheckThrowsIt) {
  try {
    EXL_CHECK(1 + 1 == 3, "kernels: arithmetic: 1 + 1 is ", 1 + 1);
    FAIL() << "EXL_CHECK passed a false condition";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "kernels: arithmetic: 1 + 1 is 2");
    EXPECT_EQ(e.layer(), "kernels");
    EXPECT_EQ(e.concept_name(), "arithmetic");
  }
}

}  // namespace error_test
}  // namespace exl
