// CS_HD: functions that are also host code (so that a host program can run them and compare
// with the CPU without a GPU) are __host__ __device__ under nvcc and plain C++ elsewhere.
#pragma once

#if defined(__CUDACC__)
#define CS_HD __host__ __device__
#else
#define CS_HD
#endif
