// A pool of page-aligned host buffers for staging (host collectives): a buffer handed back is kept
// for the next request of the same size, so a collective in a training loop reads into memory that
// is already mapped (no page faults, no zeroing by the kernel) even after the device adopted the
// previous one. Thread-safe; bounded (oldest sizes dropped first).
#pragma once

#include <cstddef>
#include <cstdint>

namespace txla::util {

// A buffer of at least `bytes` bytes (64-byte aligned); give it back with HostPoolRelease.
void* HostPoolAcquire(size_t bytes);
void HostPoolRelease(void* p, size_t bytes);
// Bytes held free in the pool, and how many acquisitions it served from free buffers.
size_t HostPoolFreeBytes();
int64_t HostPoolHits();

}  // namespace txla::util
