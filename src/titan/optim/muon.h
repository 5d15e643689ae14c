// Muon (KellerJordan/Muon; torch.optim.Muon, whose arithmetic this follows step for step): each
// matrix's gradient feeds an EMA momentum buffer, the Nesterov mix of the two is orthogonalised by
// a quintic Newton-Schulz iteration, and the parameter takes decoupled weight decay and the
// orthogonalised update at a shape-adjusted learning rate:
//
//   buf  <- lerp(buf, g, 1 - momentum)                 buf = momentum buf + (1 - momentum) g
//   u    <- nesterov ? lerp(g, buf, momentum) : buf
//   O    <- NS(u)                                      (newton_schulz below)
//   p    <- p (1 - lr weight_decay) - adjust(lr, shape) O
//
// adjust: "original" lr sqrt(max(1, rows / cols)); "match_rms_adamw" (Moonlight) lr 0.2 sqrt(max(rows, cols)).
// Parameters are matrices [rows, cols], or stacked experts [E, rows, cols], each expert its own
// matrix. One f32 buffer per parameter (category optimizer_state): half of AdamW's state; with a
// Swap the buffers live in a file instead (swapped_moments.h) and stream through two chunk
// buffers, the arithmetic the same on the same values, so the parameters come out bit for bit
// as in memory. The step allocates nothing: the update matrix and the Newton-Schulz working
// memory are sized once for the largest matrix.
// ../shared/reference/v4.md section 1 has the sources. This optimizer takes matrices only;
// muon_adamw.h pairs it with AdamW for the rest of a model (the trainer's [optimizer] name = "Muon").
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/enum_names.h"
#include "titan/distributed/process_group.h"
#include "titan/nn/module.h"
#include "titan/optim/optimizer.h"

namespace titan::optim {

class SwappedMoments;

enum class MuonLrAdjust { original, match_rms_adamw };
inline constexpr std::array<EnumName<MuonLrAdjust>, 2> kMuonLrAdjustNames = {{
    {MuonLrAdjust::original, "original"},
    {MuonLrAdjust::match_rms_adamw, "match_rms_adamw"},
}};
constexpr std::span<const EnumName<MuonLrAdjust>> enum_names(MuonLrAdjust) { return kMuonLrAdjustNames; }

struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  double weight_decay = 0.1;
  std::array<double, 3> ns_coefficients{3.4445, -4.775, 2.0315};  // (a, b, c)
  int ns_steps = 5;
  double eps = 1e-7;  // the norm's floor before the iteration
  MuonLrAdjust adjust = MuonLrAdjust::original;
  // The iteration's GEMM inputs: f32, or bf16 (as torch.optim.Muon; 2x the GEMM rate on a CPU
  // with AVX512-BF16), the iterate and the products staying f32.
  DType ns_dtype = DType::f32;
};

// The working memory of newton_schulz for matrices up to a size, allocated once.
class NewtonSchulzScratch {
 public:
  NewtonSchulzScratch() = default;
  // Room for a [rows, cols] matrix (either orientation) besides what it has room for already.
  void fit(int64_t rows, int64_t cols);
  // Room for the bf16 copies of ns_dtype bf16 too (from now on, for every shape fitted).
  void fit_bf16();
  int64_t bytes() const;

 private:
  friend void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonConfig& c, NewtonSchulzScratch& s);
  Tensor x_, next_;        // [m, n] f32: the iterate, and the next one
  Tensor gram_, poly_;     // [m, m] f32: A = X X^T, then b A + c A A
  Tensor x16_, gram16_, poly16_;  // bf16 copies of X, A and b A + c A A (ns_dtype bf16)
  int64_t wide_ = 0, small_ = 0;  // the largest m x n and m x m it holds
};

// In place, x [rows, cols] f32 contiguous: X = x (its transpose when rows > cols, so that the Gram
// matrix X X^T is the small one), X /= max(||X||_F, eps), then ns_steps times
// X <- a X + (b A + c A A) X with A = X X^T, transposed back. In f32 (torch.optim.Muon casts to
// bf16 first; f32 here is what the golden test can hold to 1e-6; ns_dtype bf16 rounds the GEMMs'
// inputs to bf16). The scratch must fit the shape.
void newton_schulz(float* x, int64_t rows, int64_t cols, const MuonConfig& config, NewtonSchulzScratch& scratch);
// The same with scratch of its own.
void newton_schulz(Tensor& x, const MuonConfig& config);

// The rank of `ranks` that orthogonalises each of these [rows, cols] matrices: the costliest
// Newton-Schulz first (4 m^2 n + 2 m^3 per iteration, m the small side), each to the least loaded
// of its holders (holders[i]: the ranks holding a piece of matrix i; empty or absent: all ranks;
// the lowest of a tie). Every rank computes the same from the same shapes.
std::vector<int> muon_owners(const std::vector<std::pair<int64_t, int64_t>>& matrices, int ranks,
                             const std::vector<std::vector<int>>& holders = {});

// The learning rate a [rows, cols] matrix takes.
double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonLrAdjust adjust);

// Split matrices (owner-compute, Megatron-FSDP's FsdpMuon scheme, extended to tensor parallelism):
// FSDP splits a matrix by rows over its shard group (dp_shard x cp); tensor parallelism splits it
// by rows (column-parallel) or columns (row-parallel) over the TP group, and FSDP then splits each
// TP piece by rows, so that the ranks of dp_shard x cp x tp hold disjoint rectangles of it. Each
// rank updates its piece's momentum, and the Nesterov mixes go to the matrix's owner, one of the
// ranks holding a piece, which assembles the whole matrix, orthogonalises it and sends each holder
// its piece of the result to apply. Owners are chosen once, greedily by Newton-Schulz cost (the
// costliest matrix first, to its least loaded holder), so the group shares the work. Each step is
// two all-to-alls per group: each rank sends the pieces of others' matrices it holds and receives
// those of its own, then the reverse: over the group 2 (N-1)/N of the split matrices' elements for
// N equal pieces, the minimum for whole matrices on one rank each. (The alternative under TP, an
// all-gather so that every TP rank orthogonalises every matrix and keeps its slice, moves
// (N-1) of each matrix, the same at N = 2 and more above, and does N times the Newton-Schulz work.)
// Which group a parameter's matrices go to: its TP split (TrainableParam::tp_dim) to the TP
// group's, any other to the shard group's (a matrix every TP rank holds whole, split by FSDP alone,
// is orthogonalised at each TP coordinate, as AdamW repeats the update of a replicated parameter).
// Stacked experts split on dim 0 (FSDP, EP) are whole per expert and need nothing; split over TP
// (moe_tp_scheme "gather") each expert is a split matrix of its own. The owner's matrix is the one
// rank's, bit for bit, so the result is too.
class Muon {
 public:
  // Each param's value is a matrix or stacked experts (f32, contiguous); its buffer takes its shape.
  // shard_group: the FSDP group that splits matrices by rows (null: none); tp_shard_group: the
  // ranks that hold the pieces of a tensor-parallel matrix, dp_shard x cp x tp (null: no TP).
  // Collective over both groups (each rank learns the others' pieces).
  Muon(std::vector<nn::TrainableParam> params, const MuonConfig& config, const std::optional<Swap>& swap = std::nullopt,
       const distributed::ProcessGroup* shard_group = nullptr,
       const distributed::ProcessGroup* tp_shard_group = nullptr);
  ~Muon();
  // One update with learning rate lr; the gradients are multiplied by grad_scale first (clipping).
  // Parameters without a gradient this step are skipped.
  void step(float lr, float grad_scale = 1.0f);
  const MuonConfig& config() const { return config_; }
  // The swapped buffers, or null when they are in memory.
  const SwappedMoments* swapped() const { return swapped_.get(); }
  // Bytes of the step's working memory (the update matrix, Newton-Schulz's scratch, and for split
  // matrices the exchange buffers).
  int64_t scratch_bytes() const;
  // Elements this rank sends per step (both all-to-alls of every group, to other ranks only), and
  // how many matrices it orthogonalises of how many split ones (the sums over its groups).
  int64_t exchanged_elements() const;
  int owned_matrices() const;
  int split_matrices() const;
  // The same for the TP group's exchange alone (0 without TP).
  int64_t tp_exchanged_elements() const;
  int tp_owned_matrices() const;
  int tp_split_matrices() const;
  // The buffers as "<param name>.momentum_buffer" (swapped ones read into new tensors).
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // The same, the swapped buffers streamed (optimizer.h).
  SavedState state_for_save() const;
  std::vector<std::pair<std::string, Shape>> state_shapes() const;
  // Throws, changing nothing, unless `state` holds every buffer in its shape.
  void check_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) const;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source);

 private:
  struct Slot {
    nn::TrainableParam param;
    Tensor buffer;  // undefined when swapped
    int64_t count = 1, rows = 0, cols = 0;  // the matrices here (experts), and a whole one's shape
    int64_t piece = 0;                      // elements of each matrix here (rows x cols when whole)
    float decay = 1, step_lr = 0;           // this step's
    // Per matrix here: where its piece goes in its exchange's send buffer (and comes back), or -1
    // when the matrix is whole here. exchange: which of exchanges_ (-1: none).
    std::vector<int64_t> send_at;
    int exchange = -1;
    bool any_split() const { return exchange >= 0; }
  };
  // A rectangle of a matrix: the rows and columns a rank holds of it (none: rows x cols = 0).
  struct Piece {
    int64_t row = 0, col = 0, rows = 0, cols = 0;
    int64_t size() const { return rows * cols; }
  };
  // The split matrices of one group and their two all-to-alls.
  struct Exchange {
    const distributed::ProcessGroup* group = nullptr;
    Tensor send, recv;                              // [sum of send_counts], [sum of recv_counts]
    std::vector<int64_t> send_counts, recv_counts;  // per rank of the group, elements
    struct Owned {  // a matrix this rank orthogonalises: each rank's piece, and where it is in recv
      size_t slot = 0;
      std::vector<Piece> pieces;
      std::vector<int64_t> recv_at;
    };
    std::vector<Owned> owned;
    int matrices = 0;  // split over the group
  };
  // Learns every rank's pieces of the slots `members` over `group` and lays out the exchange of the
  // split ones (their owners, send_at, the buffers); whole matrices stay with their slots.
  void plan_exchange(const distributed::ProcessGroup& group, const std::vector<size_t>& members);
  // Elements [begin, begin + n) of the slot's parameter, whose momentum buffer there is buf:
  // the momentum and the Nesterov mix into the update matrix (a split matrix: into its exchange's
  // send buffer), and each whole matrix completed by them orthogonalised and applied. Called in
  // element order over the whole parameter.
  void update(Slot& s, int64_t begin, int64_t n, float* buf, float grad_scale);
  // One group's split matrices: Nesterov mixes to their owners, orthogonalised there, pieces back, applied.
  void update_split_matrices(Exchange& x);
  std::vector<Slot> slots_;
  std::vector<Exchange> exchanges_;  // the shard group's and the TP group's, those with split matrices
  int tp_exchange_ = -1;             // which of exchanges_ is the TP group's
  MuonConfig config_;
  Tensor update_;  // [rows * cols] of the largest matrix: one matrix's update
  NewtonSchulzScratch scratch_;
  std::unique_ptr<SwappedMoments> swapped_;
  bool broken_ = false;  // a swapped step failed midway; a load_state_dict repairs it
  void check_usable() const;
};

}  // namespace titan::optim
