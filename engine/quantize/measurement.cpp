#include "engine/quantize/measurement.h"

#include <charconv>
#include <fstream>

#include "engine/formats/model_dir.h"
#include "kernels/error.h"

namespace exl {

namespace measurement_impl {

// One candidate table row: segments per linear, written as in exl2-engine.md §8.5.
BlockLayout layout_of(std::initializer_list<const char*> texts) {
  BlockLayout out;
  for (const char* t : texts) out.push_back(parse_quant_option(t));
  return out;
}

}  // namespace measurement_impl

std::span<const BlockLayout> attention_candidates() {
  using measurement_impl::layout_of;
  static const std::vector<BlockLayout> table = {
      layout_of({"3:0.05@64,2@64", "3:0.05@64,2@64", "3:0.05@64,2@64", "3:0.05@64,2@64"}),
      layout_of({"3:0.1@64,2@64", "3:0.1@64,2@64", "3:0.25@64,2@64", "3:0.1@64,2@64"}),
      layout_of({"3:0.1@64,2@64", "3:0.1@64,2@64", "4:0.1@128,3@128", "3:0.1@64,2@64"}),
      layout_of({"3:0.1@64,2@64", "3:0.1@64,2@64", "4:0.1@128,3@128", "4:0.1@128,3@128"}),
      layout_of({"4:0.1@128,3@128", "4:0.1@128,3@128", "4:0.1@128,3@128", "4:0.1@128,3@128"}),
      layout_of({"4:0.1@128,3@128", "4:0.1@128,3@128", "4:0.1@64,3@64", "4:0.1@128,3@128"}),
      layout_of({"4@128", "4@128", "4@128", "4@128"}),
      layout_of({"4@128", "4@128", "4@64", "4@128"}),
      layout_of({"4@64", "4@64", "4@32", "4@64"}),
      layout_of({"4@32", "4@32", "4@32", "4@32"}),
      layout_of({"5:0.1@128,4@128", "5:0.1@128,4@128", "5:0.1@64,4@64", "5:0.1@128,4@128"}),
      layout_of({"5:0.1@64,4@64", "5:0.1@64,4@64", "5:0.1@32,4@32", "5:0.1@64,4@64"}),
      layout_of({"5:0.1@64,4@64", "5:0.1@64,4@64", "5@64", "5:0.1@64,4@64"}),
      layout_of({"5:0.1@32,4@32", "5:0.1@32,4@32", "5@32", "5:0.1@32,4@32"}),
      layout_of({"6:0.1@128,5@128", "6:0.1@128,5@128", "6@128", "6:0.1@128,5@128"}),
      layout_of({"6:0.1@32,5@32", "6:0.1@32,5@32", "6@32", "6:0.1@32,5@32"}),
      layout_of({"6@128", "6@128", "6@128", "6@128"}),
      layout_of({"6@32", "6@32", "8@32", "6@32"}),
      layout_of({"8@128", "8@128", "8@128", "8@128"}),
  };
  return table;
}

std::span<const BlockLayout> mlp_candidates() {
  using measurement_impl::layout_of;
  static const std::vector<BlockLayout> table = {
      layout_of({"3:0.05@64,2@64", "3:0.05@64,2@64", "6:0.05@32,3:0.2@64,2@64"}),
      layout_of({"3:0.1@64,2@64", "3:0.25@64,2@64", "6:0.05@32,3:0.2@64,2@64"}),
      layout_of({"3:0.1@64,2@64", "3:0.3@64,2@64", "5:0.05@32,3@32"}),
      layout_of({"3:0.1@64,2@64", "3:0.3@64,2@64", "5:0.05@32,4@32"}),
      layout_of({"4:0.1@128,3@128", "4:0.25@128,3@128", "8:0.05@32,4:0.1@128,3@128"}),
      layout_of({"4:0.1@32,3@32", "4:0.25@32,3@32", "8:0.05@32,4:0.1@32,3@32"}),
      layout_of({"4:0.1@32,3@32", "4:0.25@32,3@32", "8:0.05@32,4@128"}),
      layout_of({"4@128", "4@32", "8:0.05@32,4@128"}),
      layout_of({"4@32", "4@32", "8:0.05@32,4@32"}),
      layout_of({"5:0.1@128,4@128", "5:0.25@128,4@128", "8:0.05@32,5:0.1@128,4@128"}),
      layout_of({"5:0.1@32,4@32", "5:0.25@32,4@32", "8:0.05@32,5:0.1@32,4@32"}),
      layout_of({"6:0.1@128,5@128", "6:0.25@128,5@128", "8:0.05@32,6:0.1@128,5@128"}),
      layout_of({"6:0.1@32,5@32", "6:0.25@32,5@32", "8:0.05@32,6:0.1@32,5@32"}),
      layout_of({"6@128", "6@128", "8:0.05@32,6@128"}),
      layout_of({"8:0.1@128,6@128", "8:0.1@128,6@128", "8:0.15@128,6@128"}),
      layout_of({"8:0.1@128,6@128", "8:0.1@128,6@128", "8@128"}),
      layout_of({"8@128", "8@128", "8@128"}),
  };
  return table;
}

QuantOption parse_quant_option(std::string_view text) {
  QuantOption o;
  auto bad = [&](std::string_view why) -> QuantSegment {
    fail("engine: quantize: layout '", text, "': ", why, " (expected segments like \"8:0.15@128,6@128\")");
  };
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view seg = text.substr(at, comma - at);
    const size_t amp = seg.find('@'), colon = seg.find(':');
    if (amp == std::string_view::npos) bad("a segment has no '@group_size'");
    QuantSegment s;
    const std::string_view bits = seg.substr(0, std::min(colon, amp));
    const std::string_view gs = seg.substr(amp + 1);
    if (std::from_chars(bits.data(), bits.data() + bits.size(), s.bits).ptr != bits.data() + bits.size() ||
        std::from_chars(gs.data(), gs.data() + gs.size(), s.group_size).ptr != gs.data() + gs.size())
      bad("bad number");
    s.fraction = 1.0;
    if (colon != std::string_view::npos && colon < amp) {
      const std::string f(seg.substr(colon + 1, amp - colon - 1));
      size_t used = 0;
      try {
        s.fraction = std::stod(f, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != f.size() || !(s.fraction > 0 && s.fraction <= 1)) bad("bad fraction");
    }
    if (!(s.bits == 2 || s.bits == 3 || s.bits == 4 || s.bits == 5 || s.bits == 6 || s.bits == 8)) bad("bad width");
    if (!(s.group_size == 32 || s.group_size == 64 || s.group_size == 128)) bad("bad group size");
    o.push_back(s);
    at = comma + 1;
  }
  return o;
}

nlohmann::json to_json(const Measurement& m) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& b : m.blocks) {
    nlohmann::json opts = nlohmann::json::array();
    for (const auto& o : b.options) {
      nlohmann::json layout = nlohmann::json::array();
      for (const auto& q : o.layout) layout.push_back(to_string(q));
      opts.push_back({{"layout", layout}, {"bits", o.bits}, {"error", o.error}, {"output_error", o.output_error}});
    }
    blocks.push_back({{"name", b.name}, {"sensitivity", b.sensitivity}, {"options", opts}});
  }
  return {{"format", "exlagent-measurement-1"}, {"model", m.model}, {"calibration", m.calibration}, {"blocks", blocks}};
}

Measurement measurement_from_json(const nlohmann::json& j, std::string_view where) {
  auto need = [&](bool ok, std::string_view what) {
    EXL_CHECK(ok, "engine: quantize: measurement '", where, "': ", what);
  };
  need(j.is_object() && j.value("format", "") == "exlagent-measurement-1",
       "not an exlagent measurement (\"format\": \"exlagent-measurement-1\")");
  need(j.contains("blocks") && j["blocks"].is_array(), "no \"blocks\" array");
  Measurement m;
  m.model = j.value("model", "");
  m.calibration = j.value("calibration", "");
  for (const auto& b : j["blocks"]) {
    need(b.is_object() && b.contains("name") && b["name"].is_string() && b.contains("options") &&
             b["options"].is_array() && !b["options"].empty(),
         "a block without \"name\" or \"options\"");
    BlockMeasurement bm;
    bm.name = b["name"].get<std::string>();
    need(b.value("sensitivity", 0.0) >= 0, cat("block '", bm.name, "': a negative \"sensitivity\""));
    bm.sensitivity = b.value("sensitivity", 0.0);
    for (const auto& o : b["options"]) {
      need(o.is_object() && o.contains("layout") && o["layout"].is_array() && o.contains("bits") &&
               o["bits"].is_number_integer() && o.contains("error") && o["error"].is_number(),
           cat("block '", bm.name, "': an option without \"layout\", integer \"bits\" or \"error\""));
      BlockOptionScore s;
      for (const auto& l : o["layout"]) {
        need(l.is_string(), cat("block '", bm.name, "': a layout that is not a string"));
        s.layout.push_back(parse_quant_option(l.get<std::string>()));
      }
      s.bits = o["bits"].get<int64_t>();
      s.error = o["error"].get<double>();
      s.output_error = o.value("output_error", 0.0);
      bm.options.push_back(std::move(s));
    }
    m.blocks.push_back(std::move(bm));
  }
  return m;
}

void save_measurement(const Measurement& m, const std::filesystem::path& file) {
  const auto tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp);
    f << to_json(m).dump(1) << "\n";
    EXL_CHECK(f.good(), "engine: quantize: cannot write '", tmp, "'");
  }
  std::filesystem::rename(tmp, file);
}

Measurement load_measurement(const std::filesystem::path& file) {
  return measurement_from_json(read_json_file(file), file.string());
}

}  // namespace exl
