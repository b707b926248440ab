// AMX tiles: the tile configuration the bf16 GEMM loads, and whether this process may use the
// tiles. Shared by the GEMM (gemm_bf16.cpp), bench_peak's tile peak and the tests.
#pragma once
#include <cstdint>
#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace cstorch::cpu {

// Palette 1, eight tiles of 16 rows of 64 bytes: what each thread loads (LDTILECFG) before its
// tiles.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// Whether the CPU has AMX-BF16 and AMX tiles (CPUID) and Linux grants this process the tile data
// state (arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA); the grant is per process, asking again is
// harmless). False where a sandbox refuses the request.
inline bool amx_granted() {
#if !defined(__x86_64__)
  return false;  // x86 only
#else
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 22)) || !(d & (1u << 24))) return false;  // AMX-BF16, AMX-TILE
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#endif
}

}  // namespace cstorch::cpu
