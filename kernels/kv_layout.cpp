#include "kernels/kv_layout.h"

#include "kernels/error.h"

namespace exl {

std::string to_string(KvFormat f) {
  switch (f) {
    case KvFormat::f32: return "f32";
    case KvFormat::fp16: return "fp16";
    case KvFormat::q8: return "q8";
    case KvFormat::q4: return "q4";
  }
  return "?";
}

KvFormat kv_format_from_string(const std::string& s) {
  if (s == "f32") return KvFormat::f32;
  if (s == "fp16") return KvFormat::fp16;
  if (s == "q8") return KvFormat::q8;
  if (s == "q4") return KvFormat::q4;
  fail("kernels: kv cache: unknown cache format '", s, "' (expected f32, fp16, q8 or q4)");
}

}  // namespace exl
