// One Llama decoder layer as a single op, for the engine's bfloat16, int8 and int4 modes (any ISA: V16 helpers).
// Every row is one position of some sequence: a decode step has one row per sequence, a prefill or recompute chunk
// one row per position (its context_lens = position + 1). All rows' K/V are stored before any row attends, so a
// chunk's rows see each other causally, and a row gets the same bits whether it comes in a decode step, a prefill
// chunk or a recompute after preemption, alone or in any batch (the linears are batch-invariant, the rest per row).
//
//   decode_layer(x [B, H] fp32, positions [B], cos, sin [max_positions, D] fp32, norms [2, H] fp32,
//                weights [qkv, o, gate_up, down] in the tile or the AMX panel layout, all bf16, int8 or int4,
//                scales (per weight: fp32 [N] for int8, fp32 [N/4, K/32, 4] for int4, None for bf16),
//                k_cache, v_cache (mutated: the new K/V rows), slot_mapping [B], block_tables [B, n],
//                context_lens [B], eps, int8_q8: int8 tiles times x's Q8 rows, linear_int8_q8) -> x' [B, H] fp32
//
// Why: at batch 1-4 a compiled layer costs ~0.4 ms of Python, guards and tiny kernels on top of its weight
// reads, ~10 ms per 20-layer step; here the glue (norms, RoPE, KV store, SiLU gate, residuals) is a few
// vector loops and the layer is one dispatcher call.
// Numerics: residual stream, norms and RoPE in fp32, the projections' inputs and outputs in bf16 (for int8 weights
// too), q/K/V rounded to bf16 for the attention (K/V quantised to int8 rows from fp32 instead in int8 pools), the
// SiLU gate computed in fp32 and rounded once.

#include "cpu_kernels.h"

#include <cmath>

namespace chattts_velocity_cpu {
namespace {

struct Projection {
  at::Tensor weight;                 // the tile or AMX panel layout (see cpu_linear.cpp)
  std::optional<at::Tensor> scales;  // int8 weights: fp32 [N]; int4: fp32 [N/4, K/32, 4]
  bool int8_q8 = false;              // int8 tiles times Q8 rows of x (linear_int8_q8), else weight-only
  bool panels() const { return weight.size(2) == 16; }
  bool int4() const { return weight.scalar_type() == at::kByte; }
  int64_t out_features() const { return panels() ? weight.size(0) * 16 : weight.size(0) * 4; }
  int64_t in_features() const {
    return panels() ? weight.size(1) * 2 : weight.size(1) * (int4() ? 32 : weight.size(3));
  }
};

at::Tensor project(const Projection& p, const at::Tensor& x) {  // [M, K] -> [M, N], bf16
  if (p.weight.scalar_type() == at::kChar)
    return p.int8_q8 ? linear_int8_q8(x, p.weight, *p.scales) : linear_int8(x, p.weight, *p.scales);
  if (p.int4()) return linear_int4(x, p.weight, *p.scales);
  return linear_bf16(x, p.weight);
}

template <typename T>
constexpr at::ScalarType act_type() {  // the projections' activations (bf16 in both modes)
  return std::is_same_v<T, float> ? at::kFloat : at::kBFloat16;
}

template <typename T>
T* data(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// y[b] = w * (x[b] / sqrt(mean(x[b]^2) + eps)), in fp32 and in that order (HF's), stored as T.
template <typename T>
void rms_norm(const float* x, const float* w, T* y, int64_t B, int64_t H, float eps) {
  for (int64_t b = 0; b < B; ++b) {
    const float* row = x + b * H;
    V16 squares = v_zero();
    for (int64_t h = 0; h < H; h += 16) squares = v_fmadd(load16(row + h), load16(row + h), squares);
    const V16 inv = v_set1(1.0f / std::sqrt(reduce_add(squares) / H + eps));
    for (int64_t h = 0; h < H; h += 16) store16(y + b * H + h, v_mul(load16(w + h), v_mul(load16(row + h), inv)));
  }
}

// RoPE, NeoX halves: out = x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1); fp32, stored as O.
template <typename T, typename O>
void rotate(const T* x, const float* cos, const float* sin, O* out, int64_t half) {
  for (int64_t i = 0; i < half; i += 16) {
    const V16 x1 = load16(x + i), x2 = load16(x + half + i);
    store16(out + i, v_sub(v_mul(x1, load16(cos + i)), v_mul(x2, load16(sin + i))));
    store16(out + half + i, v_add(v_mul(x2, load16(cos + half + i)), v_mul(x1, load16(sin + half + i))));
  }
}

// K rotated into a pool row, and a slot's V rows: bf16 rows (rounded), or int8 rows with their scale (quantize_row,
// from fp32: K is not rounded to bf16 first).
template <typename T>
void store_k(const T* x, const float* cos, const float* sin, uint16_t* row, int64_t D) {
  rotate(x, cos, sin, row, D / 2);
}

template <typename T>
void store_k(const T* x, const float* cos, const float* sin, uint8_t* row, int64_t D) {
  float rotated[kMaxHeadDim];
  rotate(x, cos, sin, rotated, D / 2);
  quantize_row(rotated, row, D);
}

template <typename T>
void store_v(const T* x, uint16_t* slot, int64_t heads, int64_t D) {
  for (int64_t i = 0; i < heads * D; i += 16) store16(slot + i, load16(x + i));
}

template <typename T>
void store_v(const T* x, uint8_t* slot, int64_t heads, int64_t D) {
  for (int64_t h = 0; h < heads; ++h) quantize_row(x + h * D, slot + h * (D + kKvScaleBytes), D);
}

// qkv [B, 3H] -> q rotated into q_out [B, H] (bf16); K rotated and V written to their pool slots (pools
// [num_blocks, block_size, heads, R] of P: bf16 with R = D, or int8 with R = D + kKvScaleBytes; slot s at
// s * heads * R).
template <typename T, typename P>
void rope_and_store(const T* qkv, const int64_t* positions, const float* cos, const float* sin, const int64_t* slots,
                    uint16_t* q_out, P* k_pool, P* v_pool, int64_t B, int64_t heads, int64_t D) {
  const int64_t H = heads * D, R = std::is_same_v<P, uint8_t> ? D + kKvScaleBytes : D;
  for (int64_t b = 0; b < B; ++b) {
    const T* row = qkv + b * 3 * H;
    const float* c = cos + positions[b] * D;
    const float* s = sin + positions[b] * D;
    P* k_slot = k_pool + slots[b] * heads * R;
    for (int64_t h = 0; h < heads; ++h) {
      rotate(row + h * D, c, s, q_out + b * H + h * D, D / 2);
      store_k(row + H + h * D, c, s, k_slot + h * R, D);
    }
    store_v(row + 2 * H, v_pool + slots[b] * heads * R, heads, D);
  }
}

// gate_up [B, 2I] -> out [B, I] = silu(gate) * up, in fp32, rounded once to T.
template <typename T>
void silu_gate(const T* gate_up, T* out, int64_t B, int64_t I) {
  const V16 one = v_set1(1.0f);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < I; i += 16) {
      const V16 g = load16(gate_up + b * 2 * I + i), u = load16(gate_up + b * 2 * I + I + i);
      const V16 silu = v_div(g, v_add(one, exp_ps(v_sub(v_zero(), g))));
      store16(out + b * I + i, v_mul(silu, u));
    }
}

template <typename T>
void add_rows(const float* x, const T* y, float* out, int64_t n) {  // out = x + y, n % 16 == 0
  for (int64_t i = 0; i < n; i += 16) store16(out + i, v_add(load16(x + i), load16(y + i)));
}

struct Step {
  at::Tensor positions, cos, sin, k_cache, v_cache, slot_mapping, block_tables, context_lens;
};

// T: the projections' activation type (uint16_t = bf16).
// x + attention(rms_norm(x)) -> out [B, H] fp32; writes the new K/V rows into the pools.
template <typename T>
void attention_block(const at::Tensor& x, const float* norm, const Projection& qkv_proj, const Projection& o_proj,
                     const Step& s, float eps, at::Tensor& out) {
  const int64_t B = x.size(0), H = x.size(1), heads = s.k_cache.size(2), D = kv_head_dim(s.k_cache);
  auto h = at::empty({B, H}, x.options().dtype(act_type<T>()));
  rms_norm(data<float>(x), norm, data<T>(h), B, H, eps);
  const auto qkv = project(qkv_proj, h);
  TORCH_CHECK(qkv.size(1) == 3 * H, "weights[0] must be the fused q/k/v projection [3H, H]");
  auto q = at::empty({B, heads, D}, x.options().dtype(at::kBFloat16));
  if (s.k_cache.scalar_type() == at::kChar)
    rope_and_store(data<T>(qkv), data<int64_t>(s.positions), data<float>(s.cos), data<float>(s.sin),
                   data<int64_t>(s.slot_mapping), data<uint16_t>(q), data<uint8_t>(s.k_cache),
                   data<uint8_t>(s.v_cache), B, heads, D);
  else
    rope_and_store(data<T>(qkv), data<int64_t>(s.positions), data<float>(s.cos), data<float>(s.sin),
                   data<int64_t>(s.slot_mapping), data<uint16_t>(q), data<uint16_t>(s.k_cache),
                   data<uint16_t>(s.v_cache), B, heads, D);
  const auto attended = paged_decode_attention(q, s.k_cache, s.v_cache, s.block_tables, s.context_lens,
                                               1.0 / std::sqrt(static_cast<double>(D))).view({B, H});
  const auto o = project(o_proj, attended.to(act_type<T>()));  // no copy for bf16
  add_rows(data<float>(x), data<T>(o), data<float>(out), B * H);
}

// out += mlp(rms_norm(out)), in place.
template <typename T>
void mlp_block(at::Tensor& out, const float* norm, const Projection& gate_up_proj, const Projection& down_proj,
               float eps) {
  const int64_t B = out.size(0), H = out.size(1), I = down_proj.in_features();
  const auto act = out.options().dtype(act_type<T>());
  auto h = at::empty({B, H}, act);
  rms_norm(data<float>(out), norm, data<T>(h), B, H, eps);
  const auto gate_up = project(gate_up_proj, h);
  TORCH_CHECK(gate_up.size(1) == 2 * I, "weights[2] must be the fused gate/up projection [2I, H]");
  auto gated = at::empty({B, I}, act);
  silu_gate(data<T>(gate_up), data<T>(gated), B, I);
  const auto down = project(down_proj, gated);
  add_rows(data<float>(out), data<T>(down), data<float>(out), B * H);
}

template <typename T>
at::Tensor layer(const at::Tensor& x, const float* norms, const Projection (&w)[4], const Step& s, float eps) {
  auto out = at::empty_like(x);
  attention_block<T>(x, norms, w[0], w[1], s, eps, out);
  mlp_block<T>(out, norms + x.size(1), w[2], w[3], eps);
  return out;
}

void check_step(const at::Tensor& x, const Step& s, const at::Tensor& norms) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous fp32 [B, H]");
  const int64_t B = x.size(0), H = x.size(1);
  const auto kv_type = s.k_cache.scalar_type();
  TORCH_CHECK((kv_type == at::kBFloat16 || kv_type == at::kChar) && s.k_cache.is_contiguous() &&
                  s.v_cache.sizes() == s.k_cache.sizes() && s.v_cache.scalar_type() == kv_type &&
                  s.v_cache.is_contiguous(), "k_cache and v_cache must be contiguous bf16 pools (or int8 pools with "
                  "their scales) of one shape");
  TORCH_CHECK(s.k_cache.dim() == 4 && s.k_cache.size(2) * kv_head_dim(s.k_cache) == H &&
                  kv_head_dim(s.k_cache) % 32 == 0 && kv_head_dim(s.k_cache) <= kMaxHeadDim,
              "the caches must be [num_blocks, block_size, heads, head_dim (+ 4 int8)] with heads * head_dim = H, "
              "head_dim % 32 == 0");
  TORCH_CHECK(H % 16 == 0, "H must be a multiple of 16");
  TORCH_CHECK(norms.scalar_type() == at::kFloat && norms.is_contiguous() && norms.numel() == 2 * H,
              "norms must be contiguous fp32 [2, H]");
  for (const auto* t : {&s.positions, &s.slot_mapping})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == B, "positions and slot_mapping must be int64 [B]");
  TORCH_CHECK(s.cos.scalar_type() == at::kFloat && s.cos.is_contiguous() && s.cos.sizes() == s.sin.sizes() &&
                  s.sin.is_contiguous() && s.cos.dim() == 2 && s.cos.size(1) == kv_head_dim(s.k_cache),
              "cos and sin must be contiguous fp32 [max_positions, head_dim]");
  const int64_t slots = s.k_cache.size(0) * s.k_cache.size(1);
  const int64_t* pos = data<int64_t>(s.positions);
  const int64_t* slot = data<int64_t>(s.slot_mapping);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(pos[b] >= 0 && pos[b] < s.cos.size(0), "positions[", b, "] = ", pos[b], " is outside the RoPE table");
    TORCH_CHECK(slot[b] >= 0 && slot[b] < slots, "slot_mapping[", b, "] = ", slot[b], " is outside the pool");
  }
}

}  // namespace

at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& norms, at::TensorList weights,
                        const c10::List<std::optional<at::Tensor>>& scales,
                        at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slot_mapping,
                        const at::Tensor& block_tables, const at::Tensor& context_lens, double eps, bool int8_q8) {
  TORCH_CHECK(weights.size() == 4 && scales.size() == 4, "weights and scales: one each for qkv, o, gate_up, down");
  const Step step{positions, cos, sin, k_cache, v_cache, slot_mapping, block_tables, context_lens};
  check_step(x, step, norms);
  Projection w[4];
  for (size_t i = 0; i < 4; ++i) w[i] = {weights[i], scales.get(i), int8_q8};
  const auto type = w[0].weight.scalar_type();
  for (const auto& p : w) {
    TORCH_CHECK(p.weight.scalar_type() == type && p.weight.dim() == 4 &&
                    (type == at::kBFloat16 || type == at::kChar || type == at::kByte),
                "weights must be all bf16, all int8 or all int4 (uint8) in a kernel layout");
    TORCH_CHECK(type == at::kBFloat16 || p.scales.has_value(), "int8 and int4 weights need their scales");
  }
  return layer<uint16_t>(x, data<float>(norms), w, step, static_cast<float>(eps));
}

}  // namespace chattts_velocity_cpu
