// Llama-family target (GGUF general.architecture = "llama"); see llama.cpp.
#pragma once

#include <memory>

#include "dspark/io/gguf.hpp"
#include "dspark/model/target.hpp"

namespace dspark {

/// Builds a Llama-family target from an open GGUF file (weights are
/// dequantized to bf16; the file may be closed afterwards).
std::unique_ptr<TargetModel> make_llama(const io::GGUFFile& file);

}  // namespace dspark
