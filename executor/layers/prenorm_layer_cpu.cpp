// One pre-norm decoder layer (Llama's order, no q/k norms: Llama, Mistral, Qwen2) of a forward whose
// rows attend over the paged KV pool in one group, as one op: the ops `PreNormLayer.forward` calls from
// Python, called here in the same order on the same tensors, so the output is the same bit for bit and
// the layer pays no Python between them (about 90 us a layer on the 2-core EPYC, a third of a batch-1
// decode layer at the GGUF's codes):
//
//   h, x = add_rms_norm(hidden, residual)            (x: the layer's input, the next residual)
//   q = rotary_kv_write(qkv_proj(h))                  (K and V written into the pool)
//   o = paged_attention_short(q)                      (one group: the whole batch, in order or gathered)
//   h, x = add_rms_norm(o_proj(o), x)
//   out = down_proj(act_mul(gate_up_proj(h)))         (returns (out, x); the next layer adds them)
//
// `prenorm_stack` runs every layer of the decoder so, one after another, in one call (where they share
// the attention settings and the rotary table), recording the hidden states a drafter asks for.
//
// A linear layer arrives as a kind and its tensors (`decoder/fused_layer.py` builds them from the
// layer's own routing for this many rows), the bias last when it has one:
//   0 dense: weight                          -> at::linear
//   1 q4 (int8_dot): pack_q4 tiles           -> specexec_cpu::q4_linear
//   2 q8 (int8_dot): pack_q8 or pack_q5 tiles, scale -> specexec_cpu::q8_linear (a row's or a block's scale)
//   3 torch int4: packed weight, table       -> at::_weight_int4pack_mm_for_cpu (groups of 32)
//   4 torch int8: int8 weight, scale         -> at::_weight_int8pack_mm
//   5 oneDNN: packed weight                  -> mkldnn::_linear_pointwise (the bias inside, as PackedLinear)
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

enum LinearKind : int64_t {
  kDense = 0, kQ4 = 1, kQ8 = 2, kTorchInt4 = 3, kTorchInt8 = 4, kOneDnn = 5, kQ8Offset = 6  // kQ8 with offsets
};

// oneDNN's multiply on a packed weight, called as `PackedLinear.forward` calls it (boxed: the op has
// no typed C++ entry point)
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.emplace_back(x);
  stack.emplace_back(packed);
  stack.emplace_back(bias.has_value() ? c10::IValue(*bias) : c10::IValue());
  stack.emplace_back(std::string("none"));
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(std::string(""));
  op.callBoxed(&stack);
  return stack[0].toTensor();
}

at::Tensor linear(const at::Tensor& x, int64_t kind, const std::vector<at::Tensor>& t) {
  static const auto q4 = find_op<at::Tensor(at::Tensor, at::Tensor)>("specexec_cpu::q4_linear");
  static const auto q8 =
      find_op<at::Tensor(at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>)>("specexec_cpu::q8_linear");
  const size_t arity = (kind == kDense || kind == kQ4 || kind == kOneDnn) ? 1 : kind == kQ8Offset ? 3 : 2;
  TORCH_CHECK(t.size() == arity || t.size() == arity + 1, "prenorm_layer: linear kind ", kind, " takes ", arity,
              " tensors and an optional bias, got ", t.size());
  const std::optional<at::Tensor> bias = t.size() > arity ? std::optional<at::Tensor>(t[arity]) : std::nullopt;
  at::Tensor out;
  switch (kind) {
    case kDense: return at::linear(x, t[0], bias);
    case kOneDnn: return onednn_linear(x, t[0], bias);
    case kQ4: out = q4.call(x, t[0]); break;
    case kQ8: out = q8.call(x, t[0], t[1], std::nullopt); break;
    case kQ8Offset: out = q8.call(x, t[0], t[1], t[2]); break;
    case kTorchInt4: out = at::_weight_int4pack_mm_for_cpu(x, t[0], 32, t[1]); break;
    case kTorchInt8: out = at::_weight_int8pack_mm(x, t[0], t[1]); break;
    default: TORCH_CHECK(false, "prenorm_layer: unknown linear kind ", kind);
  }
  return bias.has_value() ? out + *bias : out;  // as the Python layer adds it: one add after the matmul
}

// What every layer of one forward shares: the rows' rotary table, the pages, the attention settings.
struct StepArgs {
  const at::Tensor& rotary_rows;  // [T, 2, 1, head_dim]
  const at::Tensor& slots;        // [T]
  int64_t heads, kv_heads, head_dim;
  const at::Tensor& block_tables;  // [G, max_blocks]
  const at::Tensor& query_pos;     // [G, Q]
  const at::Tensor& kv_lens;       // [G]
  int64_t block_size;
  double scaling;
  int64_t window;
  double softcap;
  int64_t act;
  // where the group's queries are not the batch's rows in order (requests with different query lengths):
  // the padded group's rows are the batch's rows query_index [G * Q] (padding: row 0), and the batch's
  // rows are the group output's rows valid_rows [T], as the Python layer gathers and scatters them
  const std::optional<at::Tensor>& query_index;
  const std::optional<at::Tensor>& valid_rows;
  const std::optional<at::Tensor>& tree_bits;  // [G, Q]: a step verifying token trees (paged_attention_short)
};

std::tuple<at::Tensor, at::Tensor> layer_forward(const at::Tensor& hidden, const std::optional<at::Tensor>& residual,
                                                 const at::Tensor& input_norm, double input_eps,
                                                 const at::Tensor& post_norm, double post_eps,
                                                 const int64_t* kinds,  // qkv, o, gate_up, down
                                                 const std::vector<at::Tensor>* linears,  // the four calls' tensors
                                                 const at::Tensor& kv,  // [2, slots, kv_heads, head_dim] this layer's pool
                                                 const StepArgs& s) {
  static const auto add_rms_norm =
      find_op<std::tuple<at::Tensor, at::Tensor>(at::Tensor, std::optional<at::Tensor>, at::Tensor, double, bool)>(
          "specexec_cpu::add_rms_norm");
  static const auto rotary_kv_write =
      find_op<at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t)>(
          "specexec_cpu::rotary_kv_write");
  static const auto attend =
      find_op<at::Tensor(at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, double, int64_t, double,
                         std::optional<at::Tensor>)>("specexec_cpu::paged_attention_short");
  static const auto act_mul = find_op<at::Tensor(at::Tensor, int64_t)>("specexec_cpu::act_mul");
  const int64_t T = hidden.size(0), groups = s.query_pos.size(0), per_group = s.query_pos.size(1);
  const bool in_order = !s.query_index.has_value();
  TORCH_CHECK(in_order ? groups * per_group == T
                       : s.valid_rows.has_value() && s.query_index->numel() == groups * per_group &&
                             s.valid_rows->numel() == T,
              "prenorm_layer: the group's queries must be the whole batch, in order or laid out by "
              "query_index and valid_rows");
  auto [h, x] = add_rms_norm.call(hidden, residual, input_norm, input_eps, false);
  at::Tensor q = rotary_kv_write.call(linear(h, kinds[0], linears[0]), s.rotary_rows, kv, s.slots, s.heads,
                                      s.kv_heads, s.head_dim);  // [T, heads, head_dim]
  if (!in_order) q = q.index_select(0, *s.query_index);  // [G * Q, heads, head_dim]
  at::Tensor attended = attend.call(q.view({groups, per_group, s.heads, s.head_dim}), kv, s.block_tables,
                                    s.query_pos, s.kv_lens, s.block_size, s.scaling, s.window, s.softcap,
                                    s.tree_bits);
  attended = attended.reshape({groups * per_group, s.heads * s.head_dim});
  if (!in_order) attended = attended.index_select(0, *s.valid_rows);  // [T, heads * head_dim]
  auto [h2, x2] = add_rms_norm.call(linear(attended, kinds[1], linears[1]), x, post_norm, post_eps, false);
  at::Tensor out = linear(act_mul.call(linear(h2, kinds[2], linears[2]), s.act), kinds[3], linears[3]);
  return {out, x2};
}

std::tuple<at::Tensor, at::Tensor> prenorm_layer(
    at::Tensor hidden,                   // [T, hidden]
    std::optional<at::Tensor> residual,  // [T, hidden]; None: the first layer
    at::Tensor input_norm, double input_eps, at::Tensor post_norm, double post_eps,
    std::vector<int64_t> kinds,  // qkv, o, gate_up, down
    std::vector<at::Tensor> qkv, std::vector<at::Tensor> o, std::vector<at::Tensor> gate_up,
    std::vector<at::Tensor> down,
    at::Tensor rotary_rows,  // [T, 2, 1, head_dim]
    at::Tensor kv,           // [2, slots, kv_heads, head_dim] this layer's pool
    at::Tensor slots,        // [T]
    int64_t heads, int64_t kv_heads, int64_t head_dim,
    at::Tensor block_tables,  // [G, max_blocks] the group's
    at::Tensor query_pos,     // [G, Q]
    at::Tensor kv_lens,       // [G]
    int64_t block_size, double scaling, int64_t window, double softcap, int64_t act,
    std::optional<at::Tensor> query_index,  // [G * Q]; None: the group's queries are the batch in order
    std::optional<at::Tensor> valid_rows,   // [T]
    std::optional<at::Tensor> tree_bits) {  // [G, Q]; None: no token tree in the step
  TORCH_CHECK(kinds.size() == 4, "prenorm_layer: four linear kinds (qkv, o, gate_up, down)");
  const StepArgs step{rotary_rows, slots,   heads,  kv_heads, head_dim,    block_tables, query_pos,
                      kv_lens,     block_size, scaling, window, softcap, act, query_index, valid_rows, tree_bits};
  const std::vector<at::Tensor> linears[4] = {qkv, o, gate_up, down};
  return layer_forward(hidden, residual, input_norm, input_eps, post_norm, post_eps, kinds.data(), linears, kv, step);
}

// Every layer of the decoder, one after another, as one op: layer i's norms are norms[2i], norms[2i + 1]
// (eps the same), its four linear calls kinds[4i..4i + 3] with counts[4i..4i + 3] tensors each, taken in
// order from `tensors`, its pool kv[layer_idx[i]]. Returns the last layer's (output, input) as `prenorm_layer` does,
// and for each index c of `capture` (1 <= c < layers) the hidden state after layer c - 1 (residual + out).
std::tuple<at::Tensor, at::Tensor, std::vector<at::Tensor>> prenorm_stack(
    at::Tensor hidden,  // [T, hidden]
    std::vector<at::Tensor> norms, std::vector<double> eps, std::vector<int64_t> kinds, std::vector<int64_t> counts,
    std::vector<at::Tensor> tensors,
    at::Tensor kv,                     // [model layers, 2, slots, kv_heads, head_dim] the whole pool
    std::vector<int64_t> layer_idx,    // each layer's index into it
    at::Tensor rotary_rows, at::Tensor slots, int64_t heads, int64_t kv_heads, int64_t head_dim,
    at::Tensor block_tables, at::Tensor query_pos, at::Tensor kv_lens, int64_t block_size, double scaling,
    int64_t window, double softcap, int64_t act, std::optional<at::Tensor> query_index,
    std::optional<at::Tensor> valid_rows, std::optional<at::Tensor> tree_bits, std::vector<int64_t> capture) {
  const size_t layers = layer_idx.size();
  TORCH_CHECK(layers > 0 && norms.size() == 2 * layers && eps.size() == 2 * layers && kinds.size() == 4 * layers &&
                  counts.size() == 4 * layers,
              "prenorm_stack: per layer two norms and eps, four linear kinds and counts, one pool");
  const StepArgs step{rotary_rows, slots,   heads,  kv_heads, head_dim,    block_tables, query_pos,
                      kv_lens,     block_size, scaling, window, softcap, act, query_index, valid_rows, tree_bits};
  std::vector<at::Tensor> captured;
  std::optional<at::Tensor> residual;
  size_t next = 0;  // the next of `tensors`
  for (size_t i = 0; i < layers; ++i) {
    std::vector<at::Tensor> linears[4];
    for (size_t j = 0; j < 4; ++j) {
      const int64_t n = counts[4 * i + j];
      TORCH_CHECK(n > 0 && next + n <= tensors.size(), "prenorm_stack: fewer tensors than the counts say");
      linears[j].assign(tensors.begin() + next, tensors.begin() + next + n);
      next += n;
    }
    auto [out, x] = layer_forward(hidden, residual, norms[2 * i], eps[2 * i], norms[2 * i + 1], eps[2 * i + 1],
                                  kinds.data() + 4 * i, linears, kv.select(0, layer_idx[i]), step);
    hidden = out;
    residual = x;
    if (std::find(capture.begin(), capture.end(), static_cast<int64_t>(i + 1)) != capture.end() && i + 1 < layers) {
      captured.push_back(x + out);
    }
  }
  TORCH_CHECK(next == tensors.size(), "prenorm_stack: more tensors than the counts say");
  return {hidden, *residual, captured};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(specexec_cpu, m) {
  m.def("prenorm_layer", &prenorm_layer);
  m.def("prenorm_stack", &prenorm_stack);
}
