// dspark/error.hpp — exception types shared by every module.
//
// Every failure a user can cause (bad file, bad option, bad request) is thrown
// as dspark::Error (or a subclass) whose message says what was expected and
// what was found. The CLI maps Error to exit status 2; anything else is a bug.
#pragma once

#include <stdexcept>
#include <string>

namespace dspark {

/// A user-facing error: bad input, bad file, bad option. Message is one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A model or checkpoint file that is truncated, corrupt or unsupported.
class FormatError : public Error {
 public:
  using Error::Error;
};

/// An invalid argument (sampling parameter, CLI option, request field).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace dspark
