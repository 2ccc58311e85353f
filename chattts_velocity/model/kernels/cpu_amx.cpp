// AMX linears (Intel CPUs with AMX-BF16): y = x @ W.T, x and y bf16, for any number of rows.
//
//   linear_bf16_amx(x [M, K], panels bf16) -> y [M, N];
//   linear_int8_amx(x [M, K], panels int8, scales [N] fp32) -> y [M, N], weight-only int8: the int8 values become
//   bf16 exactly (|q| <= 127) and the fp32 sums are scaled per column;
//   amx_ready() -> bool: the CPU has AMX and Linux granted this process its state.
// Reached through linear_bf16 / linear_int8 in cpu_linear.cpp, which use them at every M on AMX CPUs. Products are
// summed in fp32, each row of x on its own in one order, so a row's result does not depend on the other rows.
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

namespace chattts_velocity_cpu {
namespace {

// Panel layout of W [N, K]: [N / 16, K / 2, 16, 2], i.e. per 16 output columns the (k, k + 1) pairs of those
// columns follow each other; 16 consecutive pairs of a panel are one AMX B tile (16 rows of 16 column pairs).
// A pass over W multiplies up to 64 rows of x (four 16-row A tiles, zero-padded) into four fp32 C tiles.
constexpr int64_t kTileRows = 16;  // kAmxMaxRows / kTileRows = 4 row groups per pass
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

void prefetch_ahead(const void* p, int64_t bytes) {
  const char* ahead = static_cast<const char*>(p) + kPanelPrefetch;
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
}

// The B tile of pairs k/2 .. k/2 + 15 of a panel, as bf16: in place for bf16 weights, converted into `buffer`
// (1 KB, exact) for int8 ones.
inline const uint16_t* b_tile(const uint16_t* panel, int64_t k, uint16_t*) {
  prefetch_ahead(panel + k * 16, 1024);
  return panel + k * 16;
}

inline const uint16_t* b_tile(const int8_t* panel, int64_t k, uint16_t* buffer) {
  const int8_t* q = panel + k * 16;
  prefetch_ahead(q, 512);
  for (int i = 0; i < 512; i += 32) {
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i))));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i + 16))));
    _mm512_store_si512(buffer + i, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  return buffer;
}

// C tiles 0..G-1 (rows 16g..16g+15 of x), A tile 6, B tile 7. x is [16 G, K] bf16 (padded), out fp32 [16 G, 16].
template <int G, typename W>
void amx_panel(const uint16_t* x, const W* panel, float* out, int64_t K) {
  alignas(64) uint16_t buffer[512];
  _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  const int64_t row_bytes = K * 2;
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(7, b_tile(panel, k, buffer), 64);
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

// Two panels at once for up to 32 rows: C tiles 0..G-1 for panel a, 2..G+1 for panel b, B tiles 7 and 5, A tile 6.
// Two weight streams in flight keep the memory busier when there are too few rows to hide a B tile's load; every
// C element still sums over k in amx_panel's order (the same bits).
template <int G, typename W>
void amx_panel_pair(const uint16_t* x, const W* a, const W* b, float* out_a, float* out_b, int64_t K) {
  static_assert(G <= 2, "4 C tiles, A and two B tiles fill 7 of the 8 tiles");
  alignas(64) uint16_t buffer_a[512], buffer_b[512];
  _tile_zero(0);
  _tile_zero(2);
  if constexpr (G > 1) { _tile_zero(1); _tile_zero(3); }
  const int64_t row_bytes = K * 2;
  for (int64_t k = 0; k < K; k += 32) {
    _tile_loadd(7, b_tile(a, k, buffer_a), 64);
    _tile_loadd(5, b_tile(b, k, buffer_b), 64);
    _tile_loadd(6, x + k, row_bytes);
    _tile_dpbf16ps(0, 6, 7);
    _tile_dpbf16ps(2, 6, 5);
    if constexpr (G > 1) {
      _tile_loadd(6, x + 16 * K + k, row_bytes);
      _tile_dpbf16ps(1, 6, 7);
      _tile_dpbf16ps(3, 6, 5);
    }
  }
  _tile_stored(0, out_a, 64);
  _tile_stored(2, out_b, 64);
  if constexpr (G > 1) { _tile_stored(1, out_a + 256, 64); _tile_stored(3, out_b + 256, 64); }
}

// y [M, N] bf16 = x [M, K] bf16 @ W.T (times per-column scales for int8 weights). Threads take panels; each panel
// (16 columns, 24-96 KB) stays in cache while every 64-row pass of x goes over it, so W streams from memory once
// at any M. A row's sums do not depend on M (the batch-invariance contract of cpu_linear.cpp).
template <typename W>
void amx_linear(const uint16_t* x, const W* panels, const float* scales, uint16_t* y, int64_t M, int64_t K, int64_t N) {
  TORCH_CHECK(amx_ready(), "the AMX tile state is unavailable");
  const int64_t padded = (M + kTileRows - 1) / kTileRows * kTileRows;
  std::vector<uint16_t> storage(padded * K + 32);
  uint16_t* xpad = storage.data() + (-reinterpret_cast<uintptr_t>(storage.data()) / 2 & 31);  // 64-byte aligned
  std::memcpy(xpad, x, M * K * sizeof(uint16_t));
  std::memset(xpad + M * K, 0, (padded - M) * K * sizeof(uint16_t));
  at::parallel_for(0, N / 16, 4, [&](int64_t p0, int64_t p1) {
    configure_tiles();
    alignas(64) float out[2][kAmxMaxRows * 16];
    auto store = [&](const float* sums, int64_t p, int64_t m0, int64_t rows) {
      const __m512 scale = scales ? _mm512_loadu_ps(scales + p * 16) : _mm512_set1_ps(1.0f);
      for (int64_t m = 0; m < rows; ++m)
        store16(y + (m0 + m) * N + p * 16, _mm512_mul_ps(_mm512_load_ps(sums + m * 16), scale));
    };
    for (int64_t p = p0; p < p1;) {
      const W* panel = panels + p * 16 * K;
      if (M <= 2 * kTileRows && p + 1 < p1) {  // one pass of at most two row groups: two panels at a time
        if (M <= kTileRows) amx_panel_pair<1>(xpad, panel, panel + 16 * K, out[0], out[1], K);
        else amx_panel_pair<2>(xpad, panel, panel + 16 * K, out[0], out[1], K);
        store(out[0], p, 0, M);
        store(out[1], p + 1, 0, M);
        p += 2;
        continue;
      }
      for (int64_t m0 = 0; m0 < M; m0 += kAmxMaxRows) {
        const int64_t rows = std::min(M - m0, kAmxMaxRows);
        switch ((rows + kTileRows - 1) / kTileRows) {
          case 1: amx_panel<1>(xpad + m0 * K, panel, out[0], K); break;
          case 2: amx_panel<2>(xpad + m0 * K, panel, out[0], K); break;
          case 3: amx_panel<3>(xpad + m0 * K, panel, out[0], K); break;
          default: amx_panel<4>(xpad + m0 * K, panel, out[0], K); break;
        }
        store(out[0], p, m0, rows);
      }
      ++p;
    }
    _tile_release();
  });
}

void check_panels(const at::Tensor& x, const at::Tensor& panels, at::ScalarType w_type) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x must be contiguous bf16 [M, K]");
  TORCH_CHECK(panels.dim() == 4 && panels.size(2) == 16 && panels.size(3) == 2 && panels.is_contiguous() &&
                  panels.scalar_type() == w_type, "panels must be a contiguous ", w_type, " [N/16, K/2, 16, 2] weight");
  TORCH_CHECK(panels.size(1) * 2 == x.size(1) && x.size(1) % 32 == 0, "x has ", x.size(1), " features, the weight ",
              panels.size(1) * 2, " (a multiple of 32)");
}

}  // namespace

bool amx_ready() {  // Linux gives a process the AMX tile state only on request
  static const bool ready = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return ready;
}

at::Tensor linear_bf16_amx(const at::Tensor& x, const at::Tensor& panels) {
  check_panels(x, panels, at::kBFloat16);
  const int64_t M = x.size(0), K = x.size(1), N = panels.size(0) * 16;
  auto y = at::empty({M, N}, x.options());
  amx_linear(reinterpret_cast<const uint16_t*>(x.data_ptr()), reinterpret_cast<const uint16_t*>(panels.data_ptr()),
             nullptr, reinterpret_cast<uint16_t*>(y.data_ptr()), M, K, N);
  return y;
}

at::Tensor linear_int8_amx(const at::Tensor& x, const at::Tensor& panels, const at::Tensor& scales) {
  check_panels(x, panels, at::kChar);
  const int64_t M = x.size(0), K = x.size(1), N = panels.size(0) * 16;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N && scales.is_contiguous(),
              "scales must be float32 [N]");
  auto y = at::empty({M, N}, x.options());
  amx_linear(reinterpret_cast<const uint16_t*>(x.data_ptr()), panels.data_ptr<int8_t>(), scales.data_ptr<float>(),
             reinterpret_cast<uint16_t*>(y.data_ptr()), M, K, N);
  return y;
}

}  // namespace chattts_velocity_cpu
