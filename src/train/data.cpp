// Training data set reader/writer; see include/dspark/train/data.hpp.
#include "dspark/train/data.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dspark/error.hpp"
#include "dspark/io/atomic_file.hpp"
#include "dspark/io/safetensors.hpp"

namespace dspark::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kDatasetFormat = "dspark-regen-v1";

std::string shard_name(size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "data-%05zu.safetensors", i);
  return buf;
}

const at::Tensor& need(const io::SafetensorsData& d, const std::string& name, const std::string& file) {
  auto it = d.tensors.find(name);
  if (it == d.tensors.end()) throw FormatError(file + ": missing tensor '" + name + "'");
  if (it->second.dim() != 1)
    throw FormatError(file + ": tensor '" + name + "' must be 1-D, has shape " + c10::str(it->second.sizes()));
  return it->second;
}

}  // namespace

TrainDataset TrainDataset::load(const std::string& dir) {
  const std::string mpath = (fs::path(dir) / "manifest.json").string();
  if (!fs::is_directory(dir)) throw Error(dir + ": training data directory does not exist");
  std::ifstream in(mpath);
  if (!in) throw Error(mpath + ": cannot open (expected a data set written by `dspark regen`)");
  TrainDataset ds;
  try {
    ds.manifest = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(mpath + ": invalid JSON: " + e.what());
  }
  const auto& m = ds.manifest;
  if (!m.is_object() || !m.contains("target_id") || !m["target_id"].is_string())
    throw FormatError(mpath + ": expected an object with a string 'target_id'");
  if (!m.contains("shards") || !m["shards"].is_array())
    throw FormatError(mpath + ": expected an array 'shards'");
  ds.target_id = m["target_id"].get<std::string>();
  if (m.contains("format") && m["format"] != kDatasetFormat)
    throw FormatError(mpath + ": format " + m["format"].dump() + ", expected \"" + kDatasetFormat + "\"");
  for (const auto& entry : m["shards"]) {
    const bool named =
        entry.is_string() || (entry.is_object() && entry.contains("file") && entry["file"].is_string());
    if (!named) throw FormatError(mpath + ": shard entry " + entry.dump() + " names no file");
    const std::string fname = entry.is_string() ? entry.get<std::string>() : entry["file"].get<std::string>();
    if (fname.find("..") != std::string::npos || fs::path(fname).is_absolute())
      throw FormatError(mpath + ": shard file '" + fname + "' must be a plain name inside the directory");
    const std::string file = (fs::path(dir) / fname).string();
    if (!fs::exists(file)) throw Error(file + ": shard listed in manifest.json does not exist");
    io::SafetensorsData d = io::load_safetensors(file);
    const at::Tensor& tok = need(d, "tokens", file);
    const at::Tensor& off = need(d, "offsets", file);
    const at::Tensor& msk = need(d, "loss_mask", file);
    if (tok.scalar_type() != at::kInt && tok.scalar_type() != at::kLong)
      throw FormatError(file + ": tensor 'tokens' must be I32 (or I64)");
    if (off.scalar_type() != at::kLong) throw FormatError(file + ": tensor 'offsets' must be I64");
    if (msk.scalar_type() != at::kByte && msk.scalar_type() != at::kBool)
      throw FormatError(file + ": tensor 'loss_mask' must be U8 (or BOOL)");
    const int64_t n_tok = tok.size(0);
    if (msk.size(0) != n_tok)
      throw FormatError(file + ": 'loss_mask' has " + std::to_string(msk.size(0)) + " entries, 'tokens' " +
                        std::to_string(n_tok));
    if (off.size(0) < 1) throw FormatError(file + ": 'offsets' is empty (expected n_seq + 1 entries)");
    at::Tensor t32 = tok.to(at::kLong);
    if (n_tok > 0 && t32.min().item<int64_t>() < 0) throw FormatError(file + ": negative token id");
    const int64_t* o = off.data_ptr<int64_t>();
    const int64_t* tp = t32.data_ptr<int64_t>();
    at::Tensor m8 = msk.to(at::kByte);
    const uint8_t* mp = m8.data_ptr<uint8_t>();
    std::vector<std::string> ids;
    if (auto it = d.metadata.find("prompt_ids"); it != d.metadata.end()) {
      try {
        ids = nlohmann::json::parse(it->second).get<std::vector<std::string>>();
      } catch (const nlohmann::json::exception&) {
        throw FormatError(file + ": metadata 'prompt_ids' is not a JSON array of strings");
      }
      if (static_cast<int64_t>(ids.size()) != off.size(0) - 1)
        throw FormatError(file + ": metadata 'prompt_ids' names " + std::to_string(ids.size()) +
                          " prompts, 'offsets' describes " + std::to_string(off.size(0) - 1) + " sequences");
    }
    if (o[0] != 0) throw FormatError(file + ": 'offsets' must start at 0, starts at " + std::to_string(o[0]));
    if (o[off.size(0) - 1] != n_tok)
      throw FormatError(file + ": 'offsets' ends at " + std::to_string(o[off.size(0) - 1]) + ", expected " +
                        std::to_string(n_tok) + " (the token count)");
    for (int64_t s = 0; s + 1 < off.size(0); ++s)
      if (o[s + 1] < o[s]) throw FormatError(file + ": 'offsets' decreases at entry " + std::to_string(s + 1));
    for (int64_t s = 0; s + 1 < off.size(0); ++s) {
      TrainSequence seq;
      if (!ids.empty()) seq.id = ids[static_cast<size_t>(s)];
      seq.tokens.assign(tp + o[s], tp + o[s + 1]);
      seq.loss_mask.assign(mp + o[s], mp + o[s + 1]);
      for (auto& v : seq.loss_mask) v = v ? 1 : 0;
      ds.sequences.push_back(std::move(seq));
    }
  }
  if (m.contains("n_sequences")) {
    if (!m["n_sequences"].is_number_integer())
      throw FormatError(mpath + ": 'n_sequences' must be an integer");
    if (m["n_sequences"].get<int64_t>() != static_cast<int64_t>(ds.sequences.size()))
      throw FormatError(mpath + ": 'n_sequences' is " + std::to_string(m["n_sequences"].get<int64_t>()) +
                        " but the shards hold " + std::to_string(ds.sequences.size()) + " sequences");
  }
  return ds;
}

TrainDataset TrainDataset::load(const std::vector<std::string>& dirs) {
  if (dirs.empty()) throw InvalidArgument("no training data directory given");
  if (dirs.size() == 1) return load(dirs[0]);
  TrainDataset all;
  all.manifest = {{"parts", nlohmann::json::array()}};
  for (size_t i = 0; i < dirs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (fs::weakly_canonical(dirs[i]) == fs::weakly_canonical(dirs[j]))
        throw InvalidArgument(dirs[i] + ": data directory given twice");
    TrainDataset part = load(dirs[i]);
    if (i == 0) all.target_id = part.target_id;
    if (part.target_id != all.target_id)
      throw InvalidArgument(dirs[i] + ": generated by '" + part.target_id + "', " + dirs[0] + " by '" +
                            all.target_id + "'; data sets trained on together must come from one target");
    std::move(part.sequences.begin(), part.sequences.end(), std::back_inserter(all.sequences));
    all.manifest["parts"].push_back(std::move(part.manifest));
  }
  all.manifest["target_id"] = all.target_id;
  return all;
}

std::string data_label(const std::vector<std::string>& dirs) {
  std::string s;
  for (const auto& d : dirs) s += (s.empty() ? "" : " + ") + d;
  return s;
}

int64_t TrainDataset::supervised_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences)
    for (uint8_t v : s.loss_mask) n += v;
  return n;
}

void write_dataset(const std::string& dir, const std::string& target_id,
                   const std::vector<TrainSequence>& sequences, int64_t per_shard,
                   const nlohmann::json& extra) {
  if (per_shard < 1) throw InvalidArgument("write_dataset: per_shard must be >= 1");
  for (size_t i = 0; i < sequences.size(); ++i)
    if (sequences[i].tokens.size() != sequences[i].loss_mask.size())
      throw InvalidArgument("write_dataset: sequence " + std::to_string(i) + " has " +
                            std::to_string(sequences[i].tokens.size()) + " tokens but " +
                            std::to_string(sequences[i].loss_mask.size()) + " mask entries");
  fs::create_directories(dir);
  nlohmann::json shards = nlohmann::json::array();
  int64_t total_tok = 0, total_sup = 0;
  for (size_t b = 0, shard = 0; b < sequences.size() || (sequences.empty() && shard == 0); ++shard) {
    const size_t e = std::min(sequences.size(), b + static_cast<size_t>(per_shard));
    int64_t n_tok = 0;
    for (size_t i = b; i < e; ++i) n_tok += static_cast<int64_t>(sequences[i].tokens.size());
    at::Tensor tok = at::empty({n_tok}, at::kInt), msk = at::empty({n_tok}, at::kByte);
    at::Tensor off = at::empty({static_cast<int64_t>(e - b) + 1}, at::kLong);
    int64_t pos = 0, n_sup = 0;
    off.data_ptr<int64_t>()[0] = 0;
    nlohmann::json ids = nlohmann::json::array();
    for (size_t i = b; i < e; ++i) {
      const auto& s = sequences[i];
      ids.push_back(s.id.empty() ? "seq-" + std::to_string(i) : s.id);
      for (uint8_t v : s.loss_mask) n_sup += v ? 1 : 0;
      std::copy(s.tokens.begin(), s.tokens.end(), tok.data_ptr<int32_t>() + pos);
      std::copy(s.loss_mask.begin(), s.loss_mask.end(), msk.data_ptr<uint8_t>() + pos);
      pos += static_cast<int64_t>(s.tokens.size());
      off.data_ptr<int64_t>()[i - b + 1] = pos;
    }
    const std::string name = shard_name(shard);
    io::save_safetensors((fs::path(dir) / name).string(), {{"tokens", tok}, {"offsets", off}, {"loss_mask", msk}},
                         {{"format", kDatasetFormat}, {"prompt_ids", ids.dump()}, {"dropped_ids", "[]"}});
    shards.push_back({{"file", name},
                      {"n_sequences", static_cast<int64_t>(e - b)},
                      {"n_tokens", n_tok},
                      {"n_supervised", n_sup},
                      {"n_dropped", 0}});
    total_tok += n_tok;
    total_sup += n_sup;
    b = e;
    if (sequences.empty()) break;
  }
  nlohmann::json m = {{"format", kDatasetFormat},
                      {"target_id", target_id},
                      {"n_sequences", static_cast<int64_t>(sequences.size())},
                      {"n_tokens", total_tok},
                      {"n_supervised", total_sup},
                      {"n_dropped", 0},
                      {"shards", shards}};
  for (const auto& [k, v] : extra.items()) m[k] = v;
  io::write_json_atomic((fs::path(dir) / "manifest.json").string(), m);
}

}  // namespace dspark::train
