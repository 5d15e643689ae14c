#include "titan/distributed/expert_parallel.h"

#include <cstring>

#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/distributed/compute_pair.h"

namespace titan::distributed {

namespace {

// Elements per row (a tensor of no rows has them too).
int64_t row_width(const Tensor& t) {
  int64_t w = 1;
  for (int d = 1; d < t.shape().size(); ++d) w *= t.shape()[d];
  return w;
}

// Copies row blocks of `src` into `dst` (both [rows, D], contiguous, one dtype): block i has
// rows[i] rows, at src_at[i] in src and dst_at[i] in dst.
void move_blocks(const Tensor& dst, const Tensor& src, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& src_at, const std::vector<int64_t>& dst_at) {
  const size_t row_bytes = size_t(row_width(src)) * dtype_bits(src.dtype()) / 8;
  auto* out = static_cast<char*>(dst.data_ptr());
  const auto* in = static_cast<const char*>(src.data_ptr());
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] > 0)
      std::memcpy(out + size_t(dst_at[i]) * row_bytes, in + size_t(src_at[i]) * row_bytes, size_t(rows[i]) * row_bytes);
}

// All-to-all-v of whole rows over `g`: send_rows[j] rows of `in` to member j, recv_rows[j] rows
// from it into `out`; waits (inside a compute pair, after letting the other piece compute).
void all_to_all_rows(const ProcessGroup& g, const Tensor& out, const Tensor& in, const std::vector<int64_t>& send_rows,
                     const std::vector<int64_t>& recv_rows) {
  const int64_t width = row_width(in);
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t j = 0; j < send.size(); ++j) send[j] = send_rows[j] * width, recv[j] = recv_rows[j] * width;
  const Work sent = g.all_to_allv(out, in, send, recv);
  handoff();
  sent.wait();
}

Shape with_rows(const Tensor& t, int64_t rows) {
  std::vector<int64_t> d(t.shape().begin(), t.shape().end());
  d[0] = rows;
  return Shape(d);
}

}  // namespace

void shard_experts(nn::Parameter& p, const ProcessGroup& ep) {
  nn::divide_parameter(p, 0, ep.size(), ep.rank());
  p.expert_sharded = true;
}

ExpertExchange::ExpertExchange(std::span<const int64_t> offsets, const ProcessGroup& ep) : ep_(ep) {
  const int n = ep.size();
  const int64_t experts = int64_t(offsets.size()) - 1;
  TITAN_CHECK(experts >= n && experts % n == 0,
              "expert parallelism: " + std::to_string(experts) + " routed experts over " + std::to_string(n) + " ranks",
              "use an expert_parallel_degree that divides the routed experts");
  local_experts_ = experts / n;
  sent_ = offsets.back();
  // Counts first: member j learns how many of this rank's rows go to each of its experts.
  Tensor mine = Tensor::empty({experts}, DType::i64, MemCategory::temporaries);
  for (int64_t e = 0; e < experts; ++e) mine.data<int64_t>()[e] = offsets[size_t(e + 1)] - offsets[size_t(e)];
  Tensor theirs = Tensor::empty({experts}, DType::i64, MemCategory::temporaries);
  {
    ProfileScope prof("ep.counts");
    const Work counted = ep.all_to_all(theirs, mine);
    handoff();
    counted.wait();
  }
  const int64_t el = local_experts_;
  send_rows_.assign(size_t(n), 0);
  recv_rows_.assign(size_t(n), 0);
  from_.assign(theirs.data<int64_t>(), theirs.data<int64_t>() + experts);
  local_offsets_.assign(size_t(el + 1), 0);
  for (int s = 0; s < n; ++s)
    for (int64_t e = 0; e < el; ++e) {
      send_rows_[size_t(s)] += mine.data<int64_t>()[s * el + e];
      recv_rows_[size_t(s)] += from_[size_t(s * el + e)];
      local_offsets_[size_t(e + 1)] += from_[size_t(s * el + e)];
    }
  for (int64_t e = 0; e < el; ++e) local_offsets_[size_t(e + 1)] += local_offsets_[size_t(e)];
  received_ = local_offsets_.back();
  // Where block (s, e) sits among the rows as they arrive (by source) and as the experts read
  // them (by expert).
  at_source_.assign(size_t(n * el), 0);
  at_expert_.assign(size_t(n * el), 0);
  std::vector<int64_t> filled(local_offsets_.begin(), local_offsets_.end() - 1);
  for (int64_t s = 0, src = 0; s < n; ++s)
    for (int64_t e = 0; e < el; ++e) {
      const size_t b = size_t(s * el + e);
      at_source_[b] = src, src += from_[b];
      at_expert_[b] = filled[size_t(e)], filled[size_t(e)] += from_[b];
    }
}

Tensor ExpertExchange::dispatch(const Tensor& rows) const {
  ProfileScope prof("ep.dispatch");
  TITAN_CHECK(rows.shape()[0] == sent_ && rows.is_contiguous(),
              "ExpertExchange::dispatch: " + rows.shape().str() + " rows for a plan of " + std::to_string(sent_));
  Tensor arrived = Tensor::empty(with_rows(rows, received_), rows.dtype(), MemCategory::temporaries);  // by source
  all_to_all_rows(ep_, arrived, rows, send_rows_, recv_rows_);
  // Source-major [s: e0 e1 ..] -> expert-major [e: s0 s1 ..].
  Tensor out = Tensor::empty(arrived.shape(), rows.dtype(), MemCategory::activations);
  move_blocks(out, arrived, from_, at_source_, at_expert_);
  return out;
}

Tensor ExpertExchange::combine(const Tensor& rows) const {
  ProfileScope prof("ep.combine");
  TITAN_CHECK(rows.shape()[0] == received_ && rows.is_contiguous(),
              "ExpertExchange::combine: " + rows.shape().str() + " rows for a plan of " + std::to_string(received_));
  Tensor leaving = Tensor::empty(rows.shape(), rows.dtype(), MemCategory::temporaries);  // by destination
  move_blocks(leaving, rows, from_, at_expert_, at_source_);
  Tensor out = Tensor::empty(with_rows(rows, sent_), rows.dtype(), MemCategory::activations);
  all_to_all_rows(ep_, out, leaving, recv_rows_, send_rows_);
  return out;
}

}  // namespace titan::distributed
