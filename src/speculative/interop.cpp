// Format dispatch for drafter export/import; see include/dspark/speculative/interop.hpp.
#include "dspark/speculative/interop.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "dspark/error.hpp"
#include "interop_util.hpp"

namespace dspark {

std::string to_string(DrafterFormat f) { return f == DrafterFormat::GGUF ? "gguf" : "hf"; }

DrafterFormat parse_drafter_format(const std::string& s) {
  if (s == "gguf") return DrafterFormat::GGUF;
  if (s == "hf") return DrafterFormat::HF;
  throw InvalidArgument("unknown drafter format '" + s + "' (expected gguf or hf)");
}

DrafterFormat detect_drafter_format(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "config.json")) return DrafterFormat::HF;
    throw Error(path + ": a directory without config.json (expected a Hugging Face drafter directory or a GGUF file)");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open (expected a GGUF file or a Hugging Face drafter directory)");
  char magic[4] = {};
  f.read(magic, 4);
  if (f.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0) return DrafterFormat::GGUF;
  throw FormatError(path + ": not a GGUF file (no GGUF magic) and not a directory with config.json");
}

bool bf16_exact(const Drafter& d) { return interop::all_bf16_exact(d.params()); }

InteropNotes export_drafter(const Drafter& drafter, const TargetInfo& target, DrafterFormat format,
                            const std::string& path, const ExportOptions& opts) {
  return format == DrafterFormat::GGUF ? interop::export_gguf(drafter, target, path, opts)
                                       : interop::export_hf(drafter, target, path, opts);
}

Drafter import_drafter(const std::string& path, const TargetInfo& target, DrafterFormat format,
                       InteropNotes* notes) {
  InteropNotes local;
  InteropNotes& n = notes ? *notes : local;
  return format == DrafterFormat::GGUF ? interop::import_gguf(path, target, n) : interop::import_hf(path, target, n);
}

}  // namespace dspark
