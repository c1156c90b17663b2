// The target families: one file each (model/<arch>.cpp), built on the shared
// decoder scaffolding (decoder.hpp). load_target dispatches on
// general.architecture through the table in target.cpp.
#pragma once

#include <memory>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/linear.hpp"

namespace dspark {

/// general.architecture = "llama" (Llama 2/3, SmolLM2, ...).
std::unique_ptr<TargetModel> make_llama(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute);
/// general.architecture = "gemma3" (Gemma 3 text models).
std::unique_ptr<TargetModel> make_gemma3(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute);
/// general.architecture = "qwen3" (Qwen3 dense models).
std::unique_ptr<TargetModel> make_qwen3(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute);

}  // namespace dspark
