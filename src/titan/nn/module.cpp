#include "titan/nn/module.h"

#include "titan/autograd/quantized_linear.h"

#include "titan/core/rng.h"

namespace titan::nn {

namespace {
thread_local bool parameters_without_storage = false;
}

ParametersWithoutStorage::ParametersWithoutStorage() : outer_(parameters_without_storage) {
  parameters_without_storage = true;
}
ParametersWithoutStorage::~ParametersWithoutStorage() { parameters_without_storage = outer_; }

void Module::check_new_name(const std::string& name) const {
  TITAN_CHECK(!name.empty() && name.find('.') == std::string::npos, "bad module member name '" + name + "'",
              "names are non-empty and contain no '.'");
  for (const auto& [n, p] : params_) TITAN_CHECK(n != name, "duplicate member name '" + name + "'");
  for (const Buffer& b : buffers_) TITAN_CHECK(b.name != name, "duplicate member name '" + name + "'");
  for (const auto& [n, c] : children_) TITAN_CHECK(n != name, "duplicate member name '" + name + "'");
}

Parameter& Module::register_parameter(const std::string& name, const Shape& shape, Init init, bool weight_decay) {
  check_new_name(name);
  auto p = std::make_unique<Parameter>();
  p->var = Variable(parameters_without_storage ? Tensor::unallocated(shape, DType::f32, MemCategory::parameters)
                                               : Tensor::zeros(shape, DType::f32, MemCategory::parameters),
                    true, name);
  p->init = init;
  p->weight_decay = weight_decay;
  params_.emplace_back(name, std::move(p));
  return *params_.back().second;
}

void divide_parameter(Parameter& p, int dim, int64_t parts, int64_t index) {
  const Shape whole = p.var.shape();
  TITAN_CHECK(dim >= 0 && dim < whole.size() && parts >= 1 && index >= 0 && index < parts && whole[dim] % parts == 0,
              p.var.name() + " " + whole.str() + " cannot be divided into " + std::to_string(parts) +
                  " pieces along dim " + std::to_string(dim),
              "a parallel degree must divide the dimension it splits");
  Shape piece = whole;
  piece[dim] = whole[dim] / parts;
  p.slice = split_slice(p.slice, piece, dim, parts, index);
  p.var = Variable(p.var.value().storage_allocated() ? Tensor::zeros(piece, DType::f32, MemCategory::parameters)
                                                     : Tensor::unallocated(piece, DType::f32, MemCategory::parameters),
                   true, p.var.name());
}

void Module::materialize_parameters() {
  if (parameters_without_storage) return;
  for (auto& [name, p] : named_parameters())
    if (!p->var.value().storage_allocated())
      p->var = Variable(Tensor::zeros(p->var.shape(), DType::f32, MemCategory::parameters), true, p->var.name());
}

void Module::register_buffer(const std::string& name, Tensor t, BufferKind kind) {
  check_new_name(name);
  buffers_.push_back({name, std::move(t), kind});
}

void Module::add_child(const std::string& name, std::unique_ptr<Module> m) {
  check_new_name(name);
  children_.emplace_back(name, std::move(m));
}

Module* Module::child(const std::string& name) const {
  for (const auto& [n, c] : children_)
    if (n == name) return c.get();
  return nullptr;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [n, c] : children_) c->apply(fn);
  fn(*this);
}

void Module::collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>& out) {
  for (auto& [n, p] : params_) out.emplace_back(prefix + n, p.get());
  for (auto& [n, c] : children_) c->collect_parameters(prefix + n + ".", out);
}

void Module::collect_buffers(const std::string& prefix, const BufferKind* kind,
                             std::vector<std::pair<std::string, Tensor>>& out) {
  for (const Buffer& b : buffers_)
    if (!kind || b.kind == *kind) out.emplace_back(prefix + b.name, b.tensor);
  for (auto& [n, c] : children_) c->collect_buffers(prefix + n + ".", kind, out);
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect_parameters("", out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_buffers("", nullptr, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(BufferKind kind) {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_buffers("", &kind, out);
  return out;
}

int64_t Module::num_parameters() {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p->var.value().numel();
  return n;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, p] : named_parameters()) out.emplace_back(name, p->var.value());
  for (auto& [name, b] : named_buffers()) out.emplace_back(name, b);
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict, const std::string& source) {
  autograd::note_parameters_changed();  // quantized weight caches recompute
  size_t used = 0;
  std::string missing;
  for (auto& [name, t] : state_dict()) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing += (missing.empty() ? "" : ", ") + name;
      continue;
    }
    ++used;
    TITAN_CHECK(it->second.shape() == t.shape(), "tensor '" + name + "' in " + source + " has shape " +
                                                     it->second.shape().str() + " but the model expects " + t.shape().str(),
                "the checkpoint was made for another model flavor; check [model] flavor");
    Tensor dst = t;
    dst.copy_(it->second);
  }
  if (strict) {
    TITAN_CHECK(missing.empty(), source + " lacks tensors the model needs: " + missing,
                "load a checkpoint of the same model and flavor, or load non-strictly");
    if (used != state.size()) {
      std::string extra;
      std::map<std::string, bool> known;
      for (auto& [name, t] : state_dict()) known[name] = true;
      for (const auto& [name, t] : state)
        if (!known.count(name)) extra += (extra.empty() ? "" : ", ") + name;
      TITAN_FAIL(source + " has tensors the model does not: " + extra,
                 "load a checkpoint of the same model and flavor, or load non-strictly");
    }
  }
}

void init_parameter(Tensor& t, const std::string& name, const Init& in, uint64_t seed, const GlobalSlice* slice) {
  switch (in.kind) {
    case Init::Kind::zeros: t.fill_(0); break;
    case Init::Kind::ones: t.fill_(1); break;
    case Init::Kind::constant: t.fill_(in.a); break;
    case Init::Kind::normal: init_normal(t, seed, name, in.a, in.b, slice); break;
    case Init::Kind::trunc_normal:
      init_trunc_normal(t, seed, name, in.a, in.b, in.a + in.low * in.b, in.a + in.high * in.b, slice);
      break;
    case Init::Kind::uniform: init_uniform(t, seed, name, in.a, in.b, slice); break;
  }
}

void Module::init_parameters(uint64_t seed) {
  autograd::note_parameters_changed();
  for (auto& [name, p] : named_parameters())
    init_parameter(p->var.mutable_value(), name, p->init, seed, p->slice.global_shape.empty() ? nullptr : &p->slice);
}

std::vector<TrainableParam> trainable_params(const std::vector<std::pair<std::string, Parameter*>>& params) {
  std::vector<TrainableParam> out;
  out.reserve(params.size());
  for (const auto& [name, p] : params)
    out.push_back({name, p->var, &p->compute, p->weight_decay, p->slice, p->tp_partial_grad, p->tp_duplicate,
                   p->tp_plan.dim});
  return out;
}

void Module::set_compute_dtype(DType dtype) {
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
              "compute dtype must be f32, bf16 or f16, not " + std::string(dtype_name(dtype)));
  for (auto& [name, p] : named_parameters()) {
    if (!p->gemm_weight) continue;
    p->compute = dtype != DType::f32 ? Tensor::empty(p->var.shape(), dtype, MemCategory::parameters) : Tensor();
  }
  refresh_compute_copies();
}

void Module::refresh_compute_copies() {
  for (auto& [name, p] : named_parameters())
    if (p->compute.defined()) p->compute.copy_(p->var.value());
}

void Module::zero_grad() {
  for (auto& [name, p] : named_parameters()) p->var.zero_grad();
}

}  // namespace titan::nn
