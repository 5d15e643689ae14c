#include "titan/models/mtp_targets.h"

#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/distributed/context_parallel.h"

namespace titan::models::mtp {

Tensor shifted_tokens(const Tensor& tokens, int64_t k) {
  const int64_t b = tokens.size(0), s = tokens.size(1);
  Tensor out = Tensor::empty({b, s}, DType::i32, MemCategory::activations);
  const Tensor in_c = tokens.contiguous();
  const int32_t* in = in_c.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  // Past the row any valid id does: those positions have no target, and causal attention keeps
  // them from reaching the earlier ones.
  for (int64_t r = 0; r < b; ++r)
    for (int64_t i = 0; i < s; ++i) o[r * s + i] = i + k < s ? in[r * s + i + k] : 0;
  return out;
}

Tensor shifted_targets(const Tensor& targets, int64_t batch, int64_t seq, int64_t k) {
  Tensor out = Tensor::empty({batch * seq}, DType::i32, MemCategory::activations);
  const Tensor in_c = targets.contiguous();
  const int32_t* in = in_c.data<int32_t>();
  int32_t* o = out.data<int32_t>();
  for (int64_t r = 0; r < batch; ++r)
    for (int64_t i = 0; i < seq; ++i) o[r * seq + i] = i + k < seq ? in[r * seq + i + k] : -100;
  return out;
}

ModuleBatch module_batch(const CausalLM& model, const Tensor& tokens, const Tensor& targets, int64_t k) {
  const int64_t b = tokens.size(0), s = tokens.size(1);
  ModuleBatch out{shifted_tokens(tokens, k), shifted_targets(targets, b, s, k).view({b, s})};
  if (const distributed::ProcessGroup* cp = model.context_parallel()) {
    const distributed::CpLayout layout = distributed::cp_layout(*cp, s);
    out.ids = distributed::local_chunks(out.ids, layout);
    out.targets = distributed::local_chunks(out.targets, layout);
  }
  out.targets = out.targets.contiguous().view({out.targets.numel()});
  return out;
}

void check_batch(const std::string& model, const Tensor& targets, int64_t batch, int64_t seq, int64_t depth) {
  TITAN_CHECK(targets.dtype() == DType::i32 && targets.numel() == batch * seq,
              model + " MTP: the targets must be i32 with one entry per token (" + std::to_string(batch * seq) +
                  "), got " + targets.str(),
              "pass the [B*S] targets of the tokens given to the forward");
  TITAN_CHECK(seq > depth, model + " MTP: a sequence of " + std::to_string(seq) + " tokens leaves no target for module " +
                               std::to_string(depth) + " (it predicts " + std::to_string(depth + 1) + " tokens ahead)",
              "train with training.seq_len > model.mtp_layers");
}

void add_module_loss(const CausalLM& model, const autograd::Variable& logits, const Tensor& targets, double weight,
                     AuxLosses& aux) {
  autograd::Variable lk = model.next_token_loss(logits, targets);  // loss parallel under TP
  double value = 0;
  if (const distributed::ProcessGroup* cp = model.context_parallel()) std::tie(lk, value) = distributed::mean_over_sequences(lk, targets, *cp);
  else value = lk.value().item();
  aux.push_back({"mtp_loss", autograd::scale(lk, weight), value, true});  // the metric: the mean of the L_k
}

}  // namespace titan::models::mtp
