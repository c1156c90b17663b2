// The `dspark` command line as a function, shared by the executable and the
// Python module.
#pragma once

namespace dspark::cli {

/// Parses `argv` (argv[0] is the program name) and runs the selected
/// subcommand. Output goes to stdout, errors to stderr as "error: ...".
/// Returns the exit status: 0 success, 2 bad input (bad option, bad file,
/// bad prompt), 1 internal error. `invalid_argument` (when given) is set when
/// an argument's value was refused (an option the parser refuses, or
/// dspark::InvalidArgument), as opposed to a file or the work failing.
int run(int argc, char** argv, bool* invalid_argument = nullptr);

}  // namespace dspark::cli
