// Linears for the CPU engine: y = x @ W.T, x and y bf16, products summed in fp32, on the ISA's tile micro-kernels
// (isa_<isa>.h tile_rows, tile_rows_int8, tile_rows_int4) or, on AMX CPUs, the AMX panel kernel (cpu_amx.cpp).
//
// Batch invariance (the seed contract): a row's result never depends on how many rows come with it. Each row has
// its own accumulators summed in one fixed order at every M, and the kernel is chosen by the weight's layout only
// (never by M). Prefill, decode and recompute after preemption therefore give a row the same bits.
//
// Tile layout of W [N, K]: [N / 4, K / C, 4, C] (C = 32 for bf16, 16 for int8; int4: 16 bytes per 32 columns),
// i.e. for every group of 4 output rows the column chunks of those rows follow each other in memory. Threads take
// blocks of kBlockTiles tiles and pass all rows of x over a block while it is in cache, so W streams from memory
// once per call at any M (AVX-512, one row: 85-95 % of the memory bandwidth, where oneDNN reaches about 60 %).
//
// Ops (schemas in cpu_register.cpp), x [M, K] bf16 -> y [M, N] bf16:
//   linear_bf16(x, weight): weight in the tile layout, or in the AMX panel layout (kernels.to_panels) on AMX CPUs.
//   linear_int8(x, weight, scales): weight-only int8 with per-output-row scales, either layout. Where the ISA has
//     exact int16 dot products (CV_INT8_Q16: AVX-512 VNNI, AVX2) the tiles multiply x's Q16 rows (q8_rows.h: int16 per
//     row, closer to x than its bf16 rounding) in int32 sums, scaled once; elsewhere the int8 values are exact in
//     bf16 / fp32, so the arithmetic is linear_bf16's, then the fp32 sum is scaled and rounded once.
//   linear_int8_q8(x, weight, scales): int8 tiles with per-output-row scales times x quantised per row and
//     32-column group to int8 (q8_rows.h): integer dot products per group (vpdpbusd, vpmaddubsw, SDOT / SMULL)
//     times the group's scale, summed in fp32, times the row's scale once (kernels.int8_q8 chooses it).
//   linear_int4(x, weight, scales): int4 tiles with a scale per 32-column group, times x's Q8 rows as linear_int8's
//     tiles: integer dot products per group, scaled once.
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

namespace chattts_velocity_cpu {
namespace {

constexpr int64_t kBlockTiles = 8;  // tiles per cache-resident weight block (32 outputs, 48-192 KB of bf16)

// kernel(rows, m0) for the rows of x in groups of Group (rows: a std::integral_constant, the group's size).
template <int64_t Group, typename Kernel>
void row_groups(int64_t M, Kernel&& kernel) {
  static_assert(Group >= 1 && Group <= 4, "row groups of 1 to 4 rows");
  for (int64_t m0 = 0; m0 < M; m0 += Group) {
    switch (std::min<int64_t>(Group, M - m0)) {
      case 1: kernel(std::integral_constant<int, 1>{}, m0); break;
      case 2: if constexpr (Group > 1) kernel(std::integral_constant<int, 2>{}, m0); break;
      case 3: if constexpr (Group > 2) kernel(std::integral_constant<int, 3>{}, m0); break;
      default: kernel(std::integral_constant<int, static_cast<int>(Group)>{}, m0); break;
    }
  }
}

// kernel(rows, m0) for groups of Group rows, then the rest in groups of Group / 2 (while above 4), then by
// row_groups. For kernels whose rows never share arithmetic (exact integer sums, per-row fp32 lanes), so how the
// rows are grouped never changes a row's result.
template <int64_t Group, typename Kernel>
void wide_row_groups(int64_t M, Kernel&& kernel) {
  if constexpr (Group > 4) {
    int64_t m0 = 0;
    for (; m0 + Group <= M; m0 += Group) kernel(std::integral_constant<int, static_cast<int>(Group)>{}, m0);
    wide_row_groups<Group / 2>(M - m0, [&](auto rows, int64_t m) { kernel(rows, m0 + m); });
  } else {
    row_groups<Group>(M, kernel);
  }
}

// All M rows of x times tiles [0, n) of a weight block, kRowGroup rows at a time (the block stays in cache meanwhile).
template <typename W>
void rows_times_block(Activations x, int64_t M, const W* w, const float* row_scales, at::BFloat16* y, int64_t K,
                      int64_t N, int64_t n) {
  row_groups<kRowGroup>(M, [&](auto rows, int64_t m0) {
    tile_rows<decltype(rows)::value, W>(x + m0 * K, w, row_scales, y + m0 * N, K, N, n);
  });
}

// y [M, N] bf16 = x [M, K] bf16 @ W.T, W in bf16 or int8 tiles (then times row_scales). The weight streams from
// memory once per call: threads take blocks of kBlockTiles tiles and pass every row of x over a block before the next.
template <typename W>
at::Tensor tiles_linear(const at::Tensor& x, const at::Tensor& tiles, const float* row_scales) {
  const int64_t M = x.size(0), K = x.size(1), num_tiles = tiles.size(0), N = num_tiles * kTileRows;
  constexpr int64_t kTileElements = step_bytes<W>() / sizeof(W) * kTileRows;  // per 32 columns
  auto xb = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  std::vector<float> staged;
  const Activations xp = prepare_activations(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M, K, staged,
                                             std::is_same_v<W, uint16_t>);
  const W* wp = reinterpret_cast<const W*>(tiles.data_ptr());
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, num_tiles, kBlockTiles, [&](int64_t t0, int64_t t1) {
    // int8 on ISAs that keep a block widened (kWidenInt8Blocks): once per block for many rows (the same values)
    const bool widen = std::is_same_v<W, int8_t> && kWidenInt8Blocks && M > kRowGroup;
    std::vector<WideWeight> buffer(widen ? kBlockTiles * kTileRows * K : 0);
    for (int64_t b0 = t0; b0 < t1; b0 += kBlockTiles) {
      const int64_t n = std::min(kBlockTiles, t1 - b0), offset = b0 * (K / 32) * kTileElements;
      const float* block_scales = row_scales ? row_scales + b0 * kTileRows : nullptr;
      if constexpr (std::is_same_v<W, int8_t> && kWidenInt8Blocks) {
        if (widen) {
          widen_int8_block(wp + offset, buffer.data(), K, n);
          rows_times_block<WideWeight>(xp, M, buffer.data(), block_scales, yp + b0 * kTileRows, K, N, n);
          continue;
        }
      }
      rows_times_block<W>(xp, M, wp + offset, block_scales, yp + b0 * kTileRows, K, N, n);
    }
  });
  return y;
}

// y [M, N] bf16 = x [M, K] bf16 @ W.T for int4 tiles [N/4, K/32, 4, 16] with group_scales [N/4, K/32, 4], or for
// int8 tiles [N/4, K/16, 4, 16] with row_scales [N]: x is quantised once (Q8 rows), then blocks of tiles stream as in
// tiles_linear, each times every row group of x.
template <typename W>
at::Tensor q8_tiles_linear(const at::Tensor& x, const at::Tensor& tiles, const float* scales) {
  constexpr bool kInt4 = std::is_same_v<W, uint8_t>;
  const int64_t M = x.size(0), K = x.size(1), num_tiles = tiles.size(0), N = num_tiles * kTileRows;
  const int64_t tile_bytes = (kInt4 ? K / 2 : K) * kTileRows, tile_scales = kInt4 ? K / kQ8Group * kTileRows : kTileRows;
  auto xb = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  std::vector<int8_t> q(static_cast<size_t>(M * K));
  std::vector<float> q_scales(static_cast<size_t>(M * K / kQ8Group));
  quantize_q8_rows(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M, K, q.data(), q_scales.data());
  if (kInt4 ? kQ8Int4Unsigned : kQ8Int8Unsigned) offset_q8(q.data(), M * K);
  const W* wp = reinterpret_cast<const W*>(tiles.data_ptr());
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, num_tiles, kBlockTiles, [&](int64_t t0, int64_t t1) {
    for (int64_t b0 = t0; b0 < t1; b0 += kBlockTiles) {
      const int64_t n = std::min(kBlockTiles, t1 - b0);
      wide_row_groups<kQ8RowGroup>(M, [&](auto rows, int64_t m0) {
        const Q8Rows xm{q.data() + m0 * K, q_scales.data() + m0 * (K / kQ8Group)};
        constexpr int kRows = decltype(rows)::value;
        auto* out = yp + m0 * N + b0 * kTileRows;
        if constexpr (kInt4)
          tile_rows_int4<kRows>(xm, wp + b0 * tile_bytes, scales + b0 * tile_scales, out, K, N, n);
        else
          tile_rows_int8<kRows>(xm, wp + b0 * tile_bytes, scales + b0 * tile_scales, out, K, N, n);
      });
    }
  });
  return y;
}

#if CV_INT8_Q16
// x [M, K] bf16 -> Q16 rows (q8_rows.h): q [M, K] int16, scales [M].
void quantize_q16_rows(const uint16_t* x, int64_t M, int64_t K, int16_t* q, float* scales) {
  for (int64_t m = 0; m < M; ++m, x += K, q += K) {
    V16 top = v_zero();
    for (int64_t k = 0; k < K; k += 16) top = v_max(top, v_abs(load16(x + k)));
    const float largest = reduce_max(top);
    scales[m] = largest / 32767.0f;
    const V16 inverse = v_set1(largest > 0.0f ? 32767.0f / largest : 0.0f);
    for (int64_t k = 0; k < K; k += 16) store16_int16(q + k, v_mul(load16(x + k), inverse));  // half even, <= 32767
  }
}

// y [M, N] bf16 = x [M, K] bf16 @ W.T for int8 tiles [N/4, K/16, 4, 16] with row_scales [N]: x quantised once (Q16
// rows), then blocks of tiles stream as in tiles_linear, each times every row group of x.
at::Tensor q16_tiles_linear(const at::Tensor& x, const at::Tensor& tiles, const float* row_scales) {
  const int64_t M = x.size(0), K = x.size(1), num_tiles = tiles.size(0), N = num_tiles * kTileRows;
  TORCH_CHECK(K <= kQ16MaxK, "int8 linears take at most ", kQ16MaxK, " input features here (int32 sums), got ", K);
  auto xb = x.contiguous();
  auto y = at::empty({M, N}, x.options());
  std::vector<int16_t> q(static_cast<size_t>(M * K));
  std::vector<float> q_scales(static_cast<size_t>(M));
  quantize_q16_rows(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M, K, q.data(), q_scales.data());
  const int8_t* wp = tiles.data_ptr<int8_t>();
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, num_tiles, kBlockTiles, [&](int64_t t0, int64_t t1) {
    for (int64_t b0 = t0; b0 < t1; b0 += kBlockTiles) {
      const int64_t n = std::min(kBlockTiles, t1 - b0);
      wide_row_groups<kQ16RowGroup>(M, [&](auto rows, int64_t m0) {
        tile_rows_q16<decltype(rows)::value>(Q16Rows{q.data() + m0 * K, q_scales.data() + m0},
                                             wp + b0 * kTileRows * K, row_scales + b0 * kTileRows,
                                             yp + m0 * N + b0 * kTileRows, K, N, n);
      });
    }
  });
  return y;
}
#endif

bool is_panels(const at::Tensor& weight) {  // the AMX layout [N/16, K/2, 16, 2], else the tiles [N/4, K/C, 4, C]
  return weight.dim() == 4 && weight.size(2) == 16 && weight.size(3) == 2;
}

void check_inputs(const at::Tensor& x, const at::Tensor& tiles, int64_t chunk, int64_t columns) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x must be bf16 [M, K]");
  TORCH_CHECK(tiles.dim() == 4 && tiles.size(2) == kTileRows && tiles.size(3) == chunk && tiles.is_contiguous(),
              "tiles must be a contiguous [N/4, K/", columns, ", 4, ", chunk, "] weight");
  TORCH_CHECK(tiles.size(1) * columns == x.size(1) && x.size(1) % 32 == 0, "x has ", x.size(1),
              " features, the weight ", tiles.size(1) * columns, " (a multiple of 32)");
}

}  // namespace

at::Tensor linear_bf16(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16, "weight must be bfloat16");
#if CV_HAS_AMX
  if (is_panels(weight)) return linear_bf16_amx(x.contiguous(), weight);
#endif
  check_inputs(x, weight, 32, 32);
  return tiles_linear<uint16_t>(x, weight, nullptr);
}

at::Tensor linear_int8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(weight.scalar_type() == at::kChar, "weight must be int8");
  const int64_t N = is_panels(weight) ? weight.size(0) * 16 : weight.size(0) * kTileRows;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == N && scales.is_contiguous(),
              "scales must be float32 [N]");
#if CV_HAS_AMX
  if (is_panels(weight)) return linear_int8_amx(x.contiguous(), weight, scales);
#endif
  check_inputs(x, weight, 16, 16);
#if CV_INT8_Q16
  return q16_tiles_linear(x, weight, scales.data_ptr<float>());
#else
  return tiles_linear<int8_t>(x, weight, scales.data_ptr<float>());
#endif
}

at::Tensor linear_int8_q8(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(weight.scalar_type() == at::kChar && !is_panels(weight), "weight must be int8 tiles");
  check_inputs(x, weight, 16, 16);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == weight.size(0) * kTileRows &&
                  scales.is_contiguous(), "scales must be float32 [N]");
  return q8_tiles_linear<int8_t>(x, weight, scales.data_ptr<float>());
}

// int4 tiles [N/4, K/32, 4, 16] uint8 (byte j of a group: column j in its low nibble, j + 16 in its high one, each
// q + 8 for q in [-8, 7]) and one fp32 scale per (row, 32-column group) in tile order [N/4, K/32, 4].
at::Tensor linear_int4(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scales) {
  TORCH_CHECK(weight.scalar_type() == at::kByte, "weight must be uint8 (two int4 values per byte)");
  check_inputs(x, weight, 16, 32);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  scales.numel() == weight.size(0) * weight.size(1) * kTileRows,
              "scales must be contiguous float32 [N/4, K/32, 4]");
  return q8_tiles_linear<uint8_t>(x, weight, scales.data_ptr<float>());
}

}  // namespace chattts_velocity_cpu
