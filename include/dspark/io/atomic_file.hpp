// dspark/io/atomic_file.hpp — crash-safe replacement of a file's contents.
//
// Implements the POSIX write-temp / fsync / rename / fsync-directory protocol:
// the new contents go to a fresh temporary file in the destination's own
// directory (rename(2) is atomic only within one file system), named
// "<path>.tmp.<pid>.<counter>" and created with O_EXCL so that concurrent
// writers never share one; the temporary file is fsync'ed, renamed over the
// destination, and the directory is fsync'ed so that the rename itself is
// durable. A reader of `path` therefore sees either the complete old contents
// or the complete new contents, never a mix or a truncated file, even across a
// crash or power loss.
//
// On any failure before the rename the temporary file is removed, an existing
// `path` is left untouched, and dspark::Error is thrown naming the path, the
// failing system call and strerror(errno). A failure of the final directory
// fsync (after the rename) still throws, but by then `path` already holds the
// new contents.
//
// The new file is created with mode 0666 masked by the process umask; the mode,
// owner and extended attributes of a replaced file are not carried over. When
// `path` is a symbolic link, the link itself is replaced, not its target.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dspark::io {

/// Atomically replaces (or creates) `path` with exactly `bytes`.
///
/// Throws dspark::Error "<path>: <operation> failed: <strerror>" when the
/// directory does not exist or is not writable, the disk is full, `path` names
/// a directory, or any other system call fails; the previous file, if any, is
/// left as it was and no temporary file remains.
void write_file_atomic(const std::string& path, std::string_view bytes);

/// Atomically replaces `path` with `value` pretty-printed as UTF-8 JSON
/// (2-space indentation, keys in the object's own order, trailing newline).
///
/// Throws dspark::InvalidArgument when `value` holds a string that is not valid
/// UTF-8, and dspark::Error for I/O failures as write_file_atomic does.
void write_json_atomic(const std::string& path, const nlohmann::json& value);

/// Streaming form of write_file_atomic for contents produced piece by piece:
///
///   AtomicFileWriter w(path);   // creates the temporary file
///   w.write(header); w.write(data.data(), data.size());
///   w.commit();                 // fsync, rename over `path`, fsync directory
///
/// Until commit() returns, `path` is untouched. Destroying (or discard()ing) a
/// writer that was opened but not committed removes the temporary file, so an
/// exception thrown between open and commit leaves nothing behind.
///
/// Move-only. Errors from open/write/commit throw dspark::Error with the
/// destination path and strerror; after such an error the temporary file has
/// already been removed and the writer is closed. Calling write() or commit()
/// on a writer that is not open throws std::logic_error (a programming error).
class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  /// Same as default construction followed by open(path).
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Creates the temporary file next to `path`. A writer that is already open
  /// is discarded first. Throws dspark::Error when the directory of `path`
  /// does not exist or the file cannot be created.
  void open(const std::string& path);

  /// Appends bytes to the temporary file (retrying short writes and EINTR).
  void write(std::string_view bytes);
  void write(const void* data, std::size_t n_bytes);

  /// fsyncs and closes the temporary file, renames it over the destination and
  /// fsyncs the directory. Afterwards the writer is closed (is_open() false).
  void commit();

  /// Closes and removes the temporary file without touching the destination.
  /// No-op when not open. Never throws.
  void discard() noexcept;

  bool is_open() const { return fd_ >= 0; }
  /// Destination path given to open(); empty before the first open.
  const std::string& path() const { return path_; }
  /// Temporary file currently being written; empty when not open.
  const std::string& temp_path() const { return temp_path_; }
  /// Bytes written since open().
  std::size_t bytes_written() const { return bytes_written_; }

 private:
  [[noreturn]] void fail(const char* operation, int err);
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  std::size_t bytes_written_ = 0;
};

}  // namespace dspark::io
