// Llama-family target (GGUF general.architecture = "llama"); see llama.cpp.
#pragma once

#include <memory>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"
#include "dspark/ops/linear.hpp"

namespace dspark {

/// Builds a Llama-family target from an open GGUF file. Quantized weights
/// stay in the file's mapping, which the model keeps open.
std::unique_ptr<TargetModel> make_llama(std::shared_ptr<const io::GGUFFile> file, ops::Compute compute);

}  // namespace dspark
