// current_time: the clock's time, to the second, as ISO 8601 in UTC ("...Z") or at a fixed offset.
#include <cstdio>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/function_tool.h"

namespace exl {
namespace {

// Minutes east of UTC for "UTC", "Z" or ±HH:MM (-12:00..+14:00).
int parse_offset(const std::string& tz) {
  if (tz == "UTC" || tz == "Z") return 0;
  auto digit = [&](size_t k) { return tz[k] >= '0' && tz[k] <= '9'; };
  if (tz.size() != 6 || (tz[0] != '+' && tz[0] != '-') || !digit(1) || !digit(2) || tz[3] != ':' || !digit(4) ||
      !digit(5))
    fail("current_time: timezone '", tz, "' is not UTC, Z or an offset like +05:30");
  const int h = (tz[1] - '0') * 10 + (tz[2] - '0'), m = (tz[4] - '0') * 10 + (tz[5] - '0');
  const int minutes = (tz[0] == '-' ? -1 : 1) * (h * 60 + m);
  if (m > 59 || minutes < -12 * 60 || minutes > 14 * 60)
    fail("current_time: timezone '", tz, "' is outside -12:00..+14:00");
  return minutes;
}

std::string iso8601(std::chrono::system_clock::time_point t, int offset_minutes) {
  using namespace std::chrono;
  const auto local = floor<seconds>(t) + minutes(offset_minutes);
  const auto day = floor<days>(local);
  const year_month_day ymd(day);
  const hh_mm_ss<seconds> hms(local - day);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d", int(ymd.year()), unsigned(ymd.month()),
                unsigned(ymd.day()), int(hms.hours().count()), int(hms.minutes().count()),
                int(hms.seconds().count()));
  std::string out = buf;
  if (offset_minutes == 0) return out + "Z";
  const int a = offset_minutes < 0 ? -offset_minutes : offset_minutes;
  std::snprintf(buf, sizeof buf, "%c%02d:%02d", offset_minutes < 0 ? '-' : '+', a / 60, a % 60);
  return out + buf;
}

}  // namespace

std::shared_ptr<Tool> make_current_time_tool(const BuiltinToolOptions& opts) {
  ToolSpec spec{"current_time",
                "The current date and time as ISO 8601, in UTC or at a fixed UTC offset.",
                {{"type", "object"},
                 {"properties",
                  {{"timezone",
                    {{"type", "string"},
                     {"pattern", "^(UTC|Z|[+-][0-9][0-9]:[0-5][0-9])$"},
                     {"description", "UTC (default), Z, or an offset like +05:30 / -08:00"}}}}},
                 {"additionalProperties", false}}};
  auto clock = opts.clock ? opts.clock : [] { return std::chrono::system_clock::now(); };
  return std::make_shared<FunctionTool>(std::move(spec), [clock](const nlohmann::json& args, const CancelToken&) {
    const int offset = parse_offset(args.value("timezone", std::string("UTC")));
    return ToolResult{iso8601(clock(), offset)};
  });
}

}  // namespace exl
