// The CPU ops' OpenMP worker threads, as a process-wide resource.
#pragma once

namespace se::cpu {

// libgomp gives each thread that opens parallel regions a pool of workers and keeps that pool after the regions
// end. When the pools together hold more threads than there are cores, it stops letting idle workers spin:
// between two of the engine's ops they then sleep, and every op waits for them to wake. A thread done with CPU work
// for good releases its pool with this, e.g. the thread that loaded the model before the engine thread takes over
// (the pool comes back by itself if the thread opens a region again).
void release_calling_thread_workers();

}  // namespace se::cpu
