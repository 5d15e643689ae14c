// DeepSeek-V4's attention (transformers' DeepseekV4Attention; ../shared/reference/
// v4_transformers.md section 3). Every layer attends over its sliding window of raw keys; a CSA
// layer adds the compressed entries its lightning indexer selects, an HCA layer every causally
// visible compressed entry; a learned sink per head joins each softmax. One shared key = value
// head (kv), partial RoPE on each head's last rope_dim dims (interleaved pairs), the output's rope
// slice turned back to the query's frame, and a grouped low-rank output projection.
//
// Names follow transformers' state dict under `self_attn.` (q_a_proj, q_a_norm, q_b_proj,
// kv_proj, kv_norm, o_a_proj, o_b_proj, sinks, compressor.*, compressor.indexer.*).
//
// The indexer: transformers gives it no gradient (spec 8.1). Here, with indexer_loss_coeff > 0,
// it learns as DeepSeek-V3.2's does in its sparse stage (docs/dsa.md 6): a KL loss to the head
// mean of the attention's probabilities over the selected compressed entries (renormalised over
// them, without the window's keys and the sink), its inputs detached.
#pragma once

#include "titan/autograd/variable.h"
#include "titan/distributed/context_parallel.h"
#include "titan/kernels/rope.h"
#include "titan/models/aux_loss.h"
#include "titan/models/converters.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/nn/layers.h"

namespace titan::models::deepseek_v4 {

class Indexer;

// Softmax-gated pooling of every m tokens into one entry (HCA; CSA overlaps each entry with the
// previous window, kernels/compressor.h), then the weighted RMSNorm and RoPE at the entry's
// first position w m. The pooling runs fused or in its small-op form ([model] converters:
// compressor).
class Compressor : public nn::Module, public SwitchableOp {
 public:
  Compressor(const DeepSeekV4Args& a, int64_t width, int64_t ratio, bool overlap);
  const char* converter_op() const override { return kConverterCompressor; }
  // h [B, S, d] -> [B, floor(S / m), width].
  Variable forward(const Variable& h, const kernels::RopeTables& rope) const;
  // Context parallelism: h [B, 2 L, d] holds this rank's two chunks (layout; L a multiple of m)
  // -> the entries of those chunks [B, 2 L / m, width], the same rows as forward() over the whole
  // sequence gives there. CSA's first entry of a chunk also pools the m tokens before it: their
  // projections come from the chunk before (distributed::preceding_rows).
  Variable forward_chunks(const Variable& h, const kernels::RopeTables& rope, const distributed::ProcessGroup& cp,
                          const distributed::CpLayout& layout) const;
  // CSA: the lightning indexer under this compressor (transformers' compressor.indexer).
  Indexer& add_indexer(const DeepSeekV4Args& a);

  nn::Linear &kv_proj, &gate_proj;
  nn::Parameter& position_bias;  // [m, width] (CSA: [m, 2 width])
  nn::RMSNorm& kv_norm;
  Indexer* indexer = nullptr;

 private:
  // The pooling of kv and gate [B, S, C] in the form chosen.
  Variable pool(const Variable& kv, const Variable& gate) const;
  int64_t width_, ratio_, rope_dim_;
  bool overlap_;
};

// The scorer's weights_proj (transformers' compressor.indexer.scorer).
class IndexerScorer : public nn::Module {
 public:
  IndexerScorer(int64_t dim, int64_t heads, double init_std);
  nn::Linear& weights_proj;  // [nI, d]
};

// CSA's lightning indexer: its own CSA compressor at width dI gives the keys; queries from the
// query latent, per-head weights from h; each query keeps the top-k visible entries.
class Indexer : public Compressor {
 public:
  explicit Indexer(const DeepSeekV4Args& a);
  struct Selection {
    Tensor idx;       // [B, S, K] i32, -1 padded (kernels::indexer_topk)
    Variable q, k, w;  // the scores' inputs, for the KL loss: [B, S, nI, dI], [B, T, dI], [B, S, nI]
  };
  // h [B, S, d] and qr [B, S, Rq], both detached by the caller; positions [B, S].
  Selection select(const Variable& h, const Variable& qr, const kernels::RopeTables& rope, const Tensor& positions) const;
  // The parts: the queries and weights of h's rows (sel.q, sel.w), and sel.idx from sel.q, sel.k,
  // sel.w for queries whose first sits at global position pos0 (context parallelism: a chunk's
  // start, with sel.k the entries of the whole sequence up to the chunk's end).
  Selection queries(const Variable& h, const Variable& qr, const kernels::RopeTables& rope,
                    const Tensor& positions) const;
  void choose(Selection& sel, int64_t pos0) const;

  nn::Linear& q_b_proj;  // [nI dI, Rq]
  IndexerScorer& scorer;

 private:
  int64_t heads_, head_dim_, rope_dim_, topk_, ratio_;
};

class Attention : public nn::Module {
 public:
  Attention(const DeepSeekV4Args& a, LayerType type);
  // h [B S, d] (the normed block input) at positions [B, S]; rope: the layer's tables (main for a
  // sliding-only layer, compress otherwise) -> [B S, d]. aux (null: none wanted) receives the
  // indexer's KL when it trains.
  Variable forward(const Variable& h, const Tensor& positions, const kernels::RopeTables& rope, AuxLosses* aux) const;

  nn::Linear &q_a_proj;
  nn::RMSNorm& q_a_norm;
  nn::Linear &q_b_proj, &kv_proj;
  nn::RMSNorm& kv_norm;
  nn::Linear &o_a_proj, &o_b_proj;  // o_a_proj [G Ro, H D / G]: group g's rows g Ro .. (g + 1) Ro
  nn::Parameter& sinks;             // [H]
  Compressor* compressor = nullptr;  // CSA / HCA
  double indexer_loss_coeff = 0;     // CSA: > 0 trains the indexer (the model's [model] key)
  // Context parallelism (torchtitan-npu's scheme): h and positions hold this rank's two chunks
  // of each sequence. Queries stay local; the keys each chunk needs from before it are its
  // window's W - 1 raw key rows (and CSA's m overlapping tokens' compressor projections), and
  // the compressed entries (and CSA's indexer keys) of every rank, all-gathered in sequence
  // order: no raw K/V of the whole sequence is exchanged. Null: one rank holds whole sequences.
  const distributed::ProcessGroup* cp = nullptr;
  // Tensor + sequence parallelism (models/deepseek_v4/parallelize.cpp): h is this rank's piece of
  // the tokens, gathered here; this rank runs heads [r H / tp, (r + 1) H / tp) and output groups
  // [r G / tp, ..) (the same heads: groups hold contiguous heads), and its partial sums of the
  // output are reduce-scattered back to its piece. Call after the parameters are placed.
  void set_tensor_parallel(const distributed::ProcessGroup* tp);

 private:
  // What one block of queries attends over: its raw key rows (the queries are the last rows),
  // the compressed entries from position 0, the CSA selection; pos0 its first query's position.
  struct Keys {
    Variable kv, entries;
    Indexer::Selection sel;
    int64_t pos0 = 0;
  };
  // o [B, S, H, D] of queries q [B, S, H, D] over keys; adds the indexer's KL to aux when it
  // trains, weighted by kl_share of indexer_loss_coeff (the block's share of the layer's rows).
  Variable attend(const Variable& q, const Keys& keys, AuxLosses* aux, double kl_share) const;
  // The attention over whole sequences, and over this rank's two chunks under context parallelism.
  Variable attend_whole(const Variable& h, const Variable& qr, const Variable& q, const Variable& kv,
                        const Tensor& positions, const kernels::RopeTables& rope, AuxLosses* aux) const;
  Variable attend_chunks(const Variable& h, const Variable& qr, const Variable& q, const Variable& kv,
                         const Tensor& positions, const kernels::RopeTables& rope, AuxLosses* aux) const;

  const distributed::ProcessGroup* tp_ = nullptr;
  LayerType type_;
  int64_t heads_, head_dim_, rope_dim_, groups_, window_, ratio_;
  double norm_eps_;
  Tensor ones_head_;  // the per-head query norm's constant weight [D]
};

}  // namespace titan::models::deepseek_v4
