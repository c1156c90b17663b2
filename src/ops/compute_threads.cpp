// See include/dspark/ops/compute_threads.hpp.
#include "dspark/ops/compute_threads.hpp"

#include <omp.h>

namespace dspark::ops {

bool release_worker_threads() { return omp_pause_resource_all(omp_pause_hard) == 0; }

}  // namespace dspark::ops
