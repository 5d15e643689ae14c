#include "titan/distributed/process_group.h"

#include <climits>
#include <cstring>

#include "titan/core/error.h"
#include "titan/distributed/comm_engine.h"

namespace titan::distributed {

namespace {

void check_contiguous(const Tensor& t, const char* op, const char* which) {
  TITAN_CHECK(t.defined() && t.is_contiguous(), std::string(op) + ": the " + which + " tensor must be defined and contiguous, got " +
                                                    (t.defined() ? t.str() : std::string("an undefined tensor")));
}

// What the communication thread cannot report well is checked here, on the caller's thread.
void check_size(const Tensor& t, const char* op) {
  TITAN_CHECK(t.numel() <= INT_MAX, std::string(op) + " of " + std::to_string(t.numel()) +
                                        " elements exceeds MPI's int counts",
              "split the buffer (this build moves at most 2^31 - 1 elements per call)");
}

void check_reducible(const Tensor& t, const char* op) {
  TITAN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16 || t.dtype() == DType::i32 ||
                  t.dtype() == DType::i64,
              std::string(op) + " of " + std::string(dtype_name(t.dtype())) + " values",
              "reduce f32, bf16, f16 or integer tensors");
}

std::unique_ptr<Request> request(CommOp op, int group, const Tensor& in, const Tensor& out) {
  if (in.defined()) check_size(in, comm_op_name(op));
  if (out.defined()) check_size(out, comm_op_name(op));
  auto r = std::make_unique<Request>();
  r->op = op;
  r->group = group;
  if (in.defined()) {
    r->keep_in = in;
    r->in = in.data_ptr();
    r->in_elems = in.numel();
    r->elem = elem_of(in.dtype());
  }
  if (out.defined()) {
    r->keep_out = out;
    r->out = out.data_ptr();
    r->out_elems = out.numel();
    r->elem = elem_of(out.dtype());
  }
  return r;
}

}  // namespace

ProcessGroup::ProcessGroup(int engine_group, std::string name, int rank, std::vector<int> world_ranks)
    : engine_group_(engine_group), name_(std::move(name)), rank_(rank), world_ranks_(std::move(world_ranks)) {}

Work ProcessGroup::all_reduce(const Tensor& t, ReduceOp op) const {
  check_contiguous(t, "all_reduce", "reduced");
  check_reducible(t, "all_reduce");
  auto r = request(CommOp::all_reduce, engine_group_, t, t);
  r->reduce = op;
  return CommEngine::get().enqueue(std::move(r));
}

Work ProcessGroup::reduce_scatter(const Tensor& out, const Tensor& in) const {
  check_contiguous(in, "reduce_scatter", "input");
  check_contiguous(out, "reduce_scatter", "output");
  check_reducible(in, "reduce_scatter");
  TITAN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() * size(),
              "reduce_scatter on group " + name_ + ": input " + in.str() + " must hold " + std::to_string(size()) +
                  " chunks of the output " + out.str());
  return CommEngine::get().enqueue(request(CommOp::reduce_scatter, engine_group_, in, out));
}

Work ProcessGroup::all_gather(const Tensor& out, const Tensor& in) const {
  check_contiguous(in, "all_gather", "input");
  check_contiguous(out, "all_gather", "output");
  TITAN_CHECK(in.dtype() == out.dtype() && out.numel() == in.numel() * size(),
              "all_gather on group " + name_ + ": output " + out.str() + " must hold " + std::to_string(size()) +
                  " copies of the input " + in.str());
  return CommEngine::get().enqueue(request(CommOp::all_gather, engine_group_, in, out));
}

Work ProcessGroup::all_to_all(const Tensor& out, const Tensor& in) const {
  check_contiguous(in, "all_to_all", "input");
  check_contiguous(out, "all_to_all", "output");
  TITAN_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel() && in.numel() % size() == 0,
              "all_to_all on group " + name_ + ": input " + in.str() + " and output " + out.str() +
                  " must have the same size, a multiple of " + std::to_string(size()));
  return CommEngine::get().enqueue(request(CommOp::all_to_all, engine_group_, in, out));
}

Work ProcessGroup::all_to_allv(const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_counts,
                               const std::vector<int64_t>& recv_counts) const {
  check_contiguous(in, "all_to_allv", "input");
  check_contiguous(out, "all_to_allv", "output");
  int64_t sent = 0, received = 0;
  for (int64_t c : send_counts) sent += c;
  for (int64_t c : recv_counts) received += c;
  TITAN_CHECK(int(send_counts.size()) == size() && int(recv_counts.size()) == size() && sent <= in.numel() &&
                  received <= out.numel() && in.dtype() == out.dtype(),
              "all_to_allv on group " + name_ + ": counts for " + std::to_string(size()) + " members summing to " +
                  std::to_string(sent) + " / " + std::to_string(received) + " elements do not fit " + in.str() + " / " +
                  out.str());
  auto r = request(CommOp::all_to_allv, engine_group_, in, out);
  r->in_elems = sent;
  r->out_elems = received;
  r->send_counts = send_counts;
  r->recv_counts = recv_counts;
  if (size() == 1 && sent > 0) std::memcpy(out.data_ptr(), in.data_ptr(), size_t(sent) * elem_bytes(r->elem));
  if (size() == 1) r->in = r->out = nullptr;  // copied above
  return CommEngine::get().enqueue(std::move(r));
}

Work ProcessGroup::broadcast(const Tensor& t, int root) const {
  check_contiguous(t, "broadcast", "broadcast");
  TITAN_CHECK(root >= 0 && root < size(), "broadcast on group " + name_ + ": root " + std::to_string(root) + " is not a member");
  auto r = request(CommOp::broadcast, engine_group_, Tensor(), t);
  r->peer = root;
  return CommEngine::get().enqueue(std::move(r));
}

Work ProcessGroup::send(const Tensor& t, int peer, int tag) const {
  check_contiguous(t, "send", "sent");
  TITAN_CHECK(peer >= 0 && peer < size() && peer != rank_, "send on group " + name_ + ": peer " + std::to_string(peer) +
                                                               " is not another member");
  auto r = request(CommOp::send, engine_group_, t, Tensor());
  r->peer = peer, r->tag = tag;
  return CommEngine::get().enqueue(std::move(r));
}

Work ProcessGroup::recv(const Tensor& t, int peer, int tag) const {
  check_contiguous(t, "recv", "received");
  TITAN_CHECK(peer >= 0 && peer < size() && peer != rank_, "recv on group " + name_ + ": peer " + std::to_string(peer) +
                                                               " is not another member");
  auto r = request(CommOp::recv, engine_group_, Tensor(), t);
  r->peer = peer, r->tag = tag;
  return CommEngine::get().enqueue(std::move(r));
}

Work ProcessGroup::barrier() const { return CommEngine::get().enqueue(request(CommOp::barrier, engine_group_, Tensor(), Tensor())); }

void ProcessGroup::all_reduce(std::span<double> values, ReduceOp op) const {
  if (values.empty()) return;
  auto r = std::make_unique<Request>();
  r->op = CommOp::all_reduce;
  r->group = engine_group_;
  r->elem = Elem::f64;
  r->reduce = op;
  r->in = r->out = values.data();
  r->in_elems = r->out_elems = int64_t(values.size());
  CommEngine::get().enqueue(std::move(r)).wait();
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& text) const {
  if (size() == 1) return {text};
  Tensor mine = Tensor::full({1}, double(text.size()), DType::i64);
  Tensor lengths = Tensor::empty({size()}, DType::i64);
  all_gather(lengths, mine).wait();
  std::vector<int64_t> counts(static_cast<size_t>(size()));
  int64_t total = 0;
  for (int i = 0; i < size(); ++i) total += counts[size_t(i)] = lengths.data<int64_t>()[i];
  std::string all(size_t(total), '\0');
  auto r = std::make_unique<Request>();
  r->op = CommOp::all_gatherv;
  r->group = engine_group_;
  r->elem = Elem::u8;
  r->in = text.data();
  r->in_elems = int64_t(text.size());
  r->out = all.data();
  r->out_elems = total;
  r->recv_counts = counts;
  CommEngine::get().enqueue(std::move(r)).wait();
  std::vector<std::string> out;
  int64_t off = 0;
  for (int64_t c : counts) out.push_back(all.substr(size_t(off), size_t(c))), off += c;
  return out;
}

}  // namespace titan::distributed
