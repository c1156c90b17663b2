// Ending a thread's OpenMP workers when another thread takes over the compute.
//
// The kernels run their parallel regions through ATen's OpenMP backend
// (libgomp). libgomp keeps a team of worker threads for each thread that has
// opened parallel regions, and while it manages more OpenMP threads than the
// process has CPUs it shortens every worker's busy wait to ~100 iterations,
// so each of a forward's ~200 short regions wakes its workers with futex
// calls. A process that loads a model on its main thread and then decodes on
// another (the serve engine) has two teams: on 2 cores a SmolLM2 decode step
// took 16.6 ms there against 4.3 ms with one team. (The thread count needs
// no handing over: ATen gives a new thread the count last set on any.)
#pragma once

namespace dspark::ops {

/// Ends the calling thread's OpenMP worker threads (omp_pause_resource_all
/// with omp_pause_hard). They start again if the calling thread opens another
/// parallel region. Returns false where the runtime refuses (inside a
/// parallel region); nothing changes then.
bool release_worker_threads();

}  // namespace dspark::ops
