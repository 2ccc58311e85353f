// The names every isa_<isa>.h must provide, with their signatures, as code: included after the ISA header (by
// cpu_kernels.h and the harness), it fails to compile when a name is missing or its signature differs. The shared
// pieces (kTileRows, step_bytes, prefetch, prefetch_row, softmax_tail) come from isa_common.h.
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace chattts_velocity_cpu {

// Layout and tuning constants.
static_assert(std::is_same_v<decltype(kRowGroup), const int64_t> && kRowGroup >= 1 && kRowGroup <= 4,
              "kRowGroup: rows of x per tile_rows pass, 1 to 4");
static_assert(std::is_same_v<decltype(kQ8RowGroup), const int64_t> && kQ8RowGroup >= 1 && kQ8RowGroup <= 16,
              "kQ8RowGroup: rows of x per tile_rows_int4 / tile_rows_int8 pass, 1 to 16");
static_assert(std::is_same_v<decltype(kPrefetch), const int64_t>, "kPrefetch: bytes ahead of the weight stream");
static_assert(std::is_same_v<decltype(kQ8Int8Unsigned), const bool>,
              "kQ8Int8Unsigned: tile_rows_int8 takes Q8 rows as q + 128 (offset_q8)");
static_assert(std::is_same_v<decltype(kQ8Int4Unsigned), const bool>,
              "kQ8Int4Unsigned: tile_rows_int4 takes Q8 rows as q + 128 (offset_q8)");
static_assert(std::is_same_v<decltype(kWidenInt8Blocks), const bool>,
              "kWidenInt8Blocks: bf16-activation int8 tiles widen a block once for many rows");
static_assert(std::is_pointer_v<Activations>, "Activations: x as tile_rows reads it");
static_assert(std::is_same_v<WideWeight, uint16_t> || std::is_same_v<WideWeight, int8_t>,
              "WideWeight: what widen_int8_block writes");

struct IsaContract {  // never used: each member names one function of the contract with its signature
  // V16: 16 fp32 lanes, and its helpers (the attention rows and the decode layer's glue)
  static constexpr V16 (*zero)() = &v_zero;
  static constexpr V16 (*set1)(float) = &v_set1;
  static constexpr V16 (*add)(V16, V16) = &v_add;
  static constexpr V16 (*sub)(V16, V16) = &v_sub;
  static constexpr V16 (*mul)(V16, V16) = &v_mul;
  static constexpr V16 (*div)(V16, V16) = &v_div;
  static constexpr V16 (*fmadd)(V16, V16, V16) = &v_fmadd;  // a * b + c
  static constexpr V16 (*max)(V16, V16) = &v_max;
  static constexpr V16 (*abs)(V16) = &v_abs;
  static constexpr float (*sum)(V16) = &reduce_add;
  static constexpr float (*top)(V16) = &reduce_max;
  static constexpr V16 (*exp)(V16) = &exp_ps;  // relative error <= 1e-6 on [-87, 88]
  static constexpr V16 (*load_fp32)(const float*) = &load16;
  static constexpr V16 (*load_bf16)(const uint16_t*) = &load16;
  static constexpr V16 (*load_int8)(const uint8_t*) = &load16_int8;
  static constexpr void (*store_fp32)(float*, V16) = &store16;
  static constexpr void (*store_bf16)(uint16_t*, V16) = &store16;        // round to nearest even
  static constexpr void (*store_int8)(uint8_t*, V16) = &store16_int8;    // round half even, saturate
  static constexpr void (*store_int16)(int16_t*, V16) = &store16_int16;  // round half even, saturate
  // the tile linear (cpu_linear.cpp)
  static constexpr Activations (*prepare)(const uint16_t*, int64_t, int64_t, std::vector<float>&, bool) =
      &prepare_activations;
  using Tiles = void (*)(Activations, const uint16_t*, const float*, at::BFloat16*, int64_t, int64_t, int64_t);
  using Int8Tiles = void (*)(Activations, const int8_t*, const float*, at::BFloat16*, int64_t, int64_t, int64_t);
  using WideTiles = void (*)(Activations, const WideWeight*, const float*, at::BFloat16*, int64_t, int64_t, int64_t);
  using Q8Int8 = void (*)(Q8Rows, const int8_t*, const float*, at::BFloat16*, int64_t, int64_t, int64_t);
  using Q8Int4 = void (*)(Q8Rows, const uint8_t*, const float*, at::BFloat16*, int64_t, int64_t, int64_t);
  static constexpr Tiles bf16_tiles[2] = {&tile_rows<1, uint16_t>, &tile_rows<kRowGroup, uint16_t>};
  static constexpr Int8Tiles int8_tiles[2] = {&tile_rows<1, int8_t>, &tile_rows<kRowGroup, int8_t>};
  static constexpr WideTiles wide_tiles[2] = {&tile_rows<1, WideWeight>, &tile_rows<kRowGroup, WideWeight>};
  static constexpr Q8Int8 int8_q8[2] = {&tile_rows_int8<1>, &tile_rows_int8<kQ8RowGroup>};
  static constexpr Q8Int4 int4_q8[2] = {&tile_rows_int4<1>, &tile_rows_int4<kQ8RowGroup>};
  static constexpr void (*widen)(const int8_t*, WideWeight*, int64_t, int64_t) = &widen_int8_block;
  // the paged attention's rows (attention_rows.h)
  static constexpr float (*bf16_dot)(const uint16_t*, const uint8_t*, int64_t) = &Bf16Dot::dot;
  static constexpr int32_t (*int8_dot)(const int16_t*, const uint8_t*, int64_t) = &dot_int16_int8;
  static constexpr float (*softmax)(float*, int64_t, float) = &softmax_row;  // exp(s - top) in place, their sum
};

}  // namespace chattts_velocity_cpu
