// `dspark`: command-line front end. Exit status: 0 success, 2 bad input
// (bad option, bad file, bad prompt), 1 internal error.
#include <unistd.h>

#include <cstdlib>

#include "app.hpp"

namespace {

// The OpenMP runtime under ATen reads its wait settings once, when it is
// loaded, before main runs. By default an idle worker spins for about 300,000
// iterations before it sleeps: on an idle machine that is what makes the
// forward's many short parallel regions cheap, but when other processes
// compete for the cores the spinning workers take the time the working ones
// need (plain decode on 2 busy cores: 12.5 tok/s spinning, 35 tok/s with
// GOMP_SPINCOUNT=1000 or OMP_WAIT_POLICY=PASSIVE; on an idle machine 121,
// 115-120 and 75-80 tok/s). A spin count of 1000 keeps both. When the user
// has chosen neither setting, set it and restart this process image so the
// runtime sees it.
void ensure_short_openmp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // The executable's own path, not /proc/self/exe: the process keeps its
  // name (ps, top, pkill dspark).
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0 || n >= static_cast<ssize_t>(sizeof self - 1)) return;
  self[n] = '\0';
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv(self, argv);
  // execv returned: keep going with the default settings.
}

}  // namespace

int main(int argc, char** argv) {
  ensure_short_openmp_spin(argv);
  return dspark::cli::run(argc, argv);
}
