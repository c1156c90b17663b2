// Fuzz target: a drafter directory's dspark.json as the checkpoint loader
// reads it (read_drafter_json, then config_from_json). Every input must give
// a validated config or throw dspark::Error.
#include <filesystem>

#include "dspark/error.hpp"
#include "dspark/speculative/drafter_config.hpp"
#include "fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dspark;
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_path("drafter");
    std::filesystem::create_directories(d);
    return d;
  }();
  fuzz::write_file(dir + "/dspark.json", fuzz::as_text(data, size));
  try {
    const nlohmann::json j = read_drafter_json(dir);
    const DrafterConfig c = config_from_json(j, "dspark.json");
    // What was read back writes out and reads back the same.
    nlohmann::json again = j;
    again["config"] = config_to_json(c);
    const DrafterConfig d = config_from_json(again, "dspark.json");
    if (config_to_json(d) != config_to_json(c)) std::abort();
  } catch (const Error&) {
  }
  return 0;
}
