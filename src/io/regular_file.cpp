#include "dspark/io/regular_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "dspark/error.hpp"

namespace dspark::io {

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw Error(path + ": " + what + " expected, but it cannot be read: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw Error(path + ": " + what + " expected, found a directory");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": " + what + " expected, found something that is not a regular file");
}

}  // namespace dspark::io
