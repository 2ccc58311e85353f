// AMX bf16 linears for decode batches of 5-64 rows (Intel CPUs with AMX-BF16): y = x @ W.T.
//
//   linear_bf16_amx(x [M, K] bf16, panels) -> y [M, N] bf16, products summed in fp32 (reached through
//   linear_bf16 in cpu_linear.cpp); amx_ready() -> bool: the CPU has AMX and Linux granted this process its state.
//
// At these batch sizes the AVX-512 tile kernel re-reads W per 4 rows and oneDNN reaches ~60 % of the memory
// bandwidth; here W streams from memory once per 64 rows, so the whole batch costs about what one row does.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "cpu_kernels.h"

#include <sys/syscall.h>
#include <unistd.h>

namespace chattts_velocity_cpu {
namespace {

// Panel layout of W [N, K] for AMX: [N / 16, K / 2, 16, 2], i.e. per 16 output columns the (k, k + 1) pairs of those
// columns follow each other; 16 consecutive pairs of a panel are one 1 KB AMX B tile (16 rows of 64 bytes).
// A pass over W multiplies up to 64 rows of x (four 16-row A tiles, zero-padded) into four fp32 C tiles, so W
// streams from memory once per 64 rows and the tile unit's arithmetic is never the limit at decode batch sizes.
constexpr int64_t kTileRows = 16, kMaxGroups = kAmxMaxRows / kTileRows;
constexpr int64_t kPanelPrefetch = 4096;  // bytes ahead of the B tile being loaded

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {  // every tile 16 rows x 64 bytes; per thread, so called by every worker
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = kTileRows;
  }
  _tile_loadconfig(&cfg);
}

// C tiles 0..G-1 (rows 16g..16g+15 of x), A tile 6, B tile 7. x is [16 G, K] bf16 (padded), out fp32 [16 G, 16].
template <int G>
void amx_panel(const uint16_t* x, const uint16_t* panel, float* out, int64_t K) {
  _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  const int64_t row_bytes = K * 2;
  for (int64_t k = 0; k < K; k += 32) {
    const char* ahead = reinterpret_cast<const char*>(panel + k * 16) + kPanelPrefetch;
    for (int line = 0; line < 16; ++line) _mm_prefetch(ahead + 64 * line, _MM_HINT_T0);
    _tile_loadd(7, panel + k * 16, 64);
    _tile_loadd(6, x + k, row_bytes);
    _tile_dpbf16ps(0, 6, 7);
    if constexpr (G > 1) { _tile_loadd(6, x + 16 * K + k, row_bytes); _tile_dpbf16ps(1, 6, 7); }
    if constexpr (G > 2) { _tile_loadd(6, x + 32 * K + k, row_bytes); _tile_dpbf16ps(2, 6, 7); }
    if constexpr (G > 3) { _tile_loadd(6, x + 48 * K + k, row_bytes); _tile_dpbf16ps(3, 6, 7); }
  }
  _tile_stored(0, out, 64);
  if constexpr (G > 1) _tile_stored(1, out + 256, 64);
  if constexpr (G > 2) _tile_stored(2, out + 512, 64);
  if constexpr (G > 3) _tile_stored(3, out + 768, 64);
}

}  // namespace

bool amx_ready() {  // Linux gives a process the AMX tile state only on request
  static const bool ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ready;
}

at::Tensor linear_bf16_amx(const at::Tensor& x, const at::Tensor& panels) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be bf16 [M, K]");
  TORCH_CHECK(panels.dim() == 4 && panels.size(2) == 16 && panels.size(3) == 2 && panels.is_contiguous() &&
                  panels.scalar_type() == at::kBFloat16, "panels must be a contiguous bf16 [N/16, K/2, 16, 2] weight");
  TORCH_CHECK(panels.size(1) * 2 == x.size(1) && x.size(1) % 32 == 0, "x has ", x.size(1), " features, the weight ",
              panels.size(1) * 2, " (a multiple of 32)");
  TORCH_CHECK(amx_ready(), "the AMX tile state is unavailable");
  const int64_t M = x.size(0), K = x.size(1), N = panels.size(0) * 16;
  auto y = at::empty({M, N}, x.options());
  auto wp = reinterpret_cast<const uint16_t*>(panels.data_ptr());
  auto yp = reinterpret_cast<uint16_t*>(y.data_ptr());
  for (int64_t m0 = 0; m0 < M; m0 += kAmxMaxRows) {
    const int64_t rows = std::min(M - m0, kAmxMaxRows), groups = (rows + kTileRows - 1) / kTileRows;
    auto xpad = at::zeros({groups * kTileRows, K}, x.options());
    xpad.narrow(0, 0, rows).copy_(x.narrow(0, m0, rows));
    auto xp = reinterpret_cast<const uint16_t*>(xpad.data_ptr());
    at::parallel_for(0, panels.size(0), 4, [&](int64_t p0, int64_t p1) {
      configure_tiles();
      alignas(64) float out[kTileRows * kMaxGroups * 16];
      for (int64_t p = p0; p < p1; ++p) {
        const uint16_t* panel = wp + p * 16 * K;
        switch (groups) {
          case 1: amx_panel<1>(xp, panel, out, K); break;
          case 2: amx_panel<2>(xp, panel, out, K); break;
          case 3: amx_panel<3>(xp, panel, out, K); break;
          default: amx_panel<4>(xp, panel, out, K); break;
        }
        for (int64_t m = 0; m < rows; ++m) store16(yp + (m0 + m) * N + p * 16, _mm512_load_ps(out + m * 16));
      }
      _tile_release();
    });
  }
  return y;
}

}  // namespace chattts_velocity_cpu

TORCH_LIBRARY_FRAGMENT(chattts_velocity_cpu, m) {
  m.def("amx_ready() -> bool", &chattts_velocity_cpu::amx_ready);
}
