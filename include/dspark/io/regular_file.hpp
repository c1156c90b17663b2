// dspark/io/regular_file.hpp — checks a path names a readable regular file
// before a reader opens it, so that a directory, a FIFO or a device gets a
// clear error instead of a stream failure deep inside a parser (or, for a
// FIFO, an open(2) that blocks forever).
#pragma once

#include <string>

namespace dspark::io {

/// Throws dspark::Error "<path>: <what> expected, found a directory" (or
/// "... does not exist", "... not a regular file") unless `path` names an
/// existing regular file (a symbolic link to one is fine). `what` describes
/// the expected file, e.g. "an SPS profile (JSON file)".
void require_regular_file(const std::string& path, const std::string& what);

}  // namespace dspark::io
