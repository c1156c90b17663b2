// `dspark export-data` (include/dspark/train/export_data.hpp): a regen data
// set of SmolLM2 conversations written as DeepSpec / ShareGPT JSONL, with the
// prompt from the prompts file, the decoded response without its end-of-turn
// token, unfinished responses counted (and left out on request), the
// re-tokenization check, and the refusals.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "dspark/error.hpp"
#include "dspark/model/loaded_model.hpp"
#include "dspark/train/data.hpp"
#include "dspark/train/export_data.hpp"
#include "test_util.hpp"

namespace {

using namespace dspark;
using namespace dspark::train;
using json = nlohmann::json;

std::vector<json> read_lines(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(test::read_bytes(path));
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(TrainExportData, WritesConversationsDeepSpecReads) {
  DSPARK_REQUIRE_MODEL();
  const LoadedModel m = LoadedModel::load(test::model_path());
  ASSERT_TRUE(m.chat);
  const std::vector<PromptEntry> prompts = {{"p-1", "chat", "What is the capital of France?"},
                                            {"p-2", "math", "What is 12 times 11?"},
                                            {"p-3", "chat", "Name a colour."}};
  const TokenId eot = m.stop_ids.back();
  auto sequence = [&](const PromptEntry& p, const std::string& response, bool finished) {
    TrainSequence s;
    s.id = p.id;
    s.tokens = m.encode_prompt(p.text, true);
    s.loss_mask.assign(s.tokens.size(), 0);
    std::vector<TokenId> r = m.tokenizer->encode(response, false);
    if (finished) r.push_back(eot);
    s.tokens.insert(s.tokens.end(), r.begin(), r.end());
    s.loss_mask.resize(s.tokens.size(), 1);
    return s;
  };
  std::vector<TrainSequence> seqs = {sequence(prompts[0], "The capital of France is Paris.", true),
                                     sequence(prompts[1], "12 times 11 is 132. To see", false),
                                     sequence(prompts[2], "Blue.", true)};
  // A response whose ids are not what the tokenizer makes of its text
  // ("Blue" spelled as single letters) exports its text, but does not
  // re-tokenize exactly.
  TrainSequence odd;
  odd.id = prompts[2].id;
  odd.tokens = m.encode_prompt(prompts[2].text, true);
  odd.loss_mask.assign(odd.tokens.size(), 0);
  for (const char* piece : {"B", "l", "u", "e", "."}) {
    const std::vector<TokenId> one = m.tokenizer->encode(piece, false);
    ASSERT_EQ(one.size(), 1u) << piece;
    odd.tokens.push_back(one[0]);
  }
  odd.tokens.push_back(eot);
  odd.loss_mask.resize(odd.tokens.size(), 1);
  seqs.push_back(odd);
  test::TempDir dir;
  write_dataset(dir.file("data"), m.target->info().id, seqs, 4096, {{"chat_template", true}});
  const TrainDataset data = TrainDataset::load(dir.file("data"));

  const ConversationExportStats st = export_conversations(data, prompts, m, dir.file("out.jsonl"));
  EXPECT_EQ(st.written, 4);
  EXPECT_EQ(st.unfinished, 1);
  EXPECT_EQ(st.dropped, 0);
  EXPECT_EQ(st.reencoded_exactly, 3);
  const auto lines = read_lines(dir.file("out.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], json::parse(R"({"id": "p-1", "conversations": [
      {"role": "user", "content": "What is the capital of France?"},
      {"role": "assistant", "content": "The capital of France is Paris."}]})"));
  EXPECT_EQ(lines[1]["conversations"][1]["content"], "12 times 11 is 132. To see");
  EXPECT_EQ(lines[3]["conversations"][1]["content"], "Blue.");

  ConversationExportOptions o;
  o.format = ConversationFormat::ShareGPT;
  o.drop_unfinished = true;
  const ConversationExportStats s2 = export_conversations(data, prompts, m, dir.file("share.jsonl"), o);
  EXPECT_EQ(s2.written, 3);
  EXPECT_EQ(s2.dropped, 1);
  const auto l2 = read_lines(dir.file("share.jsonl"));
  ASSERT_EQ(l2.size(), 3u);
  EXPECT_EQ(l2[0]["conversations"][0], json::parse(R"({"from": "human", "value": "What is the capital of France?"})"));
  EXPECT_EQ(l2[1]["id"], "p-3");
  EXPECT_EQ(l2[1]["conversations"][1], json::parse(R"({"from": "gpt", "value": "Blue."})"));

  // Refusals: a prompt id missing from the prompts file, raw data, two turns.
  try {
    export_conversations(data, {prompts[0], prompts[1]}, m, dir.file("x.jsonl"));
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'p-3'"), std::string::npos) << e.what();
  }
  write_dataset(dir.file("raw"), m.target->info().id, seqs, 4096, {{"chat_template", false}});
  EXPECT_THROW(export_conversations(TrainDataset::load(dir.file("raw")), prompts, m, dir.file("x.jsonl")),
               InvalidArgument);
  std::vector<TrainSequence> two = {seqs[0]};
  two[0].loss_mask[1] = 1;
  write_dataset(dir.file("two"), m.target->info().id, two, 4096, {{"chat_template", true}});
  EXPECT_THROW(export_conversations(TrainDataset::load(dir.file("two")), prompts, m, dir.file("x.jsonl")),
               FormatError);
  write_dataset(dir.file("other"), "llama/other", seqs);
  EXPECT_THROW(export_conversations(TrainDataset::load(dir.file("other")), prompts, m, dir.file("x.jsonl")),
               InvalidArgument);
}

}  // namespace
