// Atomic file replacement: see include/dspark/io/atomic_file.hpp.
#include "dspark/io/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "dspark/error.hpp"

namespace dspark::io {

namespace {

std::atomic<unsigned long> g_temp_counter{0};

std::string error_message(const std::string& path, const char* operation, int err) {
  return path + ": " + operation + " failed: " + std::strerror(err);
}

// Directory holding `path`, for the final fsync ("." for a bare file name).
std::string parent_directory(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

void close_quietly(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes);
  writer.commit();
}

void write_json_atomic(const std::string& path, const nlohmann::json& value) {
  std::string text;
  try {
    text = value.dump(2);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(path + ": cannot serialise JSON: " + e.what());
  }
  text += '\n';
  write_file_atomic(path, text);
}

AtomicFileWriter::AtomicFileWriter(const std::string& path) { open(path); }

AtomicFileWriter::~AtomicFileWriter() { discard(); }

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      bytes_written_(std::exchange(other.bytes_written_, 0)) {
  other.temp_path_.clear();
}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    discard();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    other.temp_path_.clear();
    fd_ = std::exchange(other.fd_, -1);
    bytes_written_ = std::exchange(other.bytes_written_, 0);
  }
  return *this;
}

void AtomicFileWriter::fail(const char* operation, int err) {
  discard();
  throw Error(error_message(path_, operation, err));
}

void AtomicFileWriter::open(const std::string& path) {
  discard();
  if (path.empty()) throw Error("cannot write a file with an empty path");
  path_ = path;
  bytes_written_ = 0;
  // O_EXCL plus a per-process counter makes the name unique; retry on the
  // off chance that a stale file of a crashed process with our pid remains.
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string candidate = path + ".tmp." + std::to_string(::getpid()) + "." +
                            std::to_string(g_temp_counter.fetch_add(1));
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      temp_path_ = std::move(candidate);
      return;
    }
    if (errno != EEXIST) {
      throw Error(error_message(path, "creating temporary file", errno));
    }
  }
  throw Error(error_message(path, "creating temporary file", EEXIST));
}

void AtomicFileWriter::write(std::string_view bytes) { write(bytes.data(), bytes.size()); }

void AtomicFileWriter::write(const void* data, std::size_t n_bytes) {
  if (!is_open()) throw std::logic_error("AtomicFileWriter::write on a writer that is not open");
  const char* p = static_cast<const char*>(data);
  while (n_bytes > 0) {
    const ssize_t n = ::write(fd_, p, n_bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (n == 0) fail("write", EIO);
    p += n;
    n_bytes -= static_cast<std::size_t>(n);
    bytes_written_ += static_cast<std::size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (!is_open()) throw std::logic_error("AtomicFileWriter::commit on a writer that is not open");
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename", errno);
  temp_path_.clear();

  // Make the rename durable. Some file systems cannot fsync a directory and
  // answer EINVAL; the data is then as durable as that file system allows.
  const int dir_fd = ::open(parent_directory(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) throw Error(error_message(path_, "opening directory for fsync", errno));
  if (::fsync(dir_fd) != 0 && errno != EINVAL) {
    const int err = errno;
    close_quietly(dir_fd);
    throw Error(error_message(path_, "fsync of directory", err));
  }
  close_quietly(dir_fd);
}

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
}

}  // namespace dspark::io
