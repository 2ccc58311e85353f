// The ops' schemas and their CPU implementations, registered in the namespace CV_OPS (chattts_velocity_<isa>, from
// -DCV_OPS=...). The one driver that includes torch/library.h: the others compile against the light ATen headers.
#include <torch/library.h>

#include "cpu_kernels.h"

#define CV_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)  // expands CV_OPS before pasting
#define CV_LIBRARY_IMPL(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

CV_LIBRARY(CV_OPS, m) {
  m.def("linear_bf16(Tensor x, Tensor weight) -> Tensor");
  m.def("linear_int8(Tensor x, Tensor weight, Tensor scales) -> Tensor");
  m.def("linear_int8_q8(Tensor x, Tensor weight, Tensor scales) -> Tensor");
  m.def("linear_int4(Tensor x, Tensor weight, Tensor scales) -> Tensor");
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor context_lens, float scale) -> Tensor");
  m.def("decode_layer(Tensor x, Tensor positions, Tensor cos, Tensor sin, Tensor norms, Tensor[] weights, "
        "Tensor?[] scales, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor block_tables, "
        "Tensor context_lens, float eps, bool int8_q8=False) -> Tensor");
  m.def("head_linear(Tensor x, Tensor weight) -> Tensor");
  m.def("dwconv_norm(Tensor x, Tensor weight, Tensor bias, int dilation, Tensor norm_weight, Tensor norm_bias, "
        "float eps) -> Tensor");
  m.def("scale_add_(Tensor(a!) x, Tensor y, Tensor gamma) -> Tensor(a!)");
  m.def("audio_linear(Tensor x, Tensor panels, Tensor bias, int n, bool gelu) -> Tensor");
  m.def("audio_linear_add_(Tensor(a!) residual, Tensor x, Tensor panels, Tensor bias, Tensor gamma) -> Tensor(a!)");
  m.def("dwconv_norm_rows(Tensor x, Tensor offsets, Tensor weight, Tensor bias, int dilation, Tensor norm_weight, "
        "Tensor norm_bias, float eps) -> Tensor");
  m.def("sample_rows(Tensor logits, Tensor temperatures, Tensor penalties, Tensor history, Tensor top_p, "
        "Tensor top_k, Tensor mask_eos, Tensor eos_ids, Tensor seeds, int rows_per_seq) -> Tensor");
#if CV_HAS_AMX
  m.def("amx_ready() -> bool", &chattts_velocity_cpu::amx_ready);
#endif
}

CV_LIBRARY_IMPL(CV_OPS, CPU, m) {
  m.impl("linear_bf16", &chattts_velocity_cpu::linear_bf16);
  m.impl("linear_int8", &chattts_velocity_cpu::linear_int8);
  m.impl("linear_int8_q8", &chattts_velocity_cpu::linear_int8_q8);
  m.impl("linear_int4", &chattts_velocity_cpu::linear_int4);
  m.impl("paged_decode_attention", &chattts_velocity_cpu::paged_decode_attention);
  m.impl("decode_layer", &chattts_velocity_cpu::decode_layer);
  m.impl("head_linear", &chattts_velocity_cpu::head_linear);
  m.impl("dwconv_norm", &chattts_velocity_cpu::dwconv_norm);
  m.impl("scale_add_", &chattts_velocity_cpu::scale_add_);
  m.impl("audio_linear", &chattts_velocity_cpu::audio_linear);
  m.impl("audio_linear_add_", &chattts_velocity_cpu::audio_linear_add_);
  m.impl("dwconv_norm_rows", &chattts_velocity_cpu::dwconv_norm_rows);
  m.impl("sample_rows", &chattts_velocity_cpu::sample_rows);
}
