// One model family's home (TorchTitan's TrainSpec): its flavors, how to build it, what it has
// (routed experts, multi-token prediction, sparse attention), what the memory planner needs
// beyond its parameters, and its Hugging Face conversion. Each family defines one in
// models/<family>/family.cpp and families.cpp registers it with one line. Nothing outside
// models/ compares a model's name: it asks the family (model_family(name)).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/hf.h"
#include "titan/models/causal_lm.h"

namespace titan::models {

// ---- what the memory planner asks a family (train/memory_plan.h) besides its parameters, which
// it reads from the family's model built without storage (nn::ParametersWithoutStorage)

// Activation bytes per token (of the rank's tokens: its context-parallel share) of one block.
struct BlockActivations {
  double held = 0;            // kept for backward without checkpointing
  double kept_full = 0;       // under full checkpointing: the block's input
  double kept_selective = 0;  // under selective: the input and the GEMM / attention outputs
  // A block replayed in backward: its held tensors (selective: and the saved ones) plus what is
  // alive at the replay's peak, over what the mode kept.
  double replay_full = 0, replay_selective = 0;
  double backward = 0;  // temporaries of its backward (activation gradients, kernel scratch)
};

struct ActivationModel {
  std::vector<BlockActivations> blocks;  // by block id (MTP modules after the main blocks)
  double io = 0;             // inputs, targets, positions
  double embedding = 0;      // the embedding's output (when it is not the first block's input)
  double head = 0;           // final norm, logits and the loss's buffers
  double head_backward = 0;  // the loss's backward: the logits' gradient
};

// The job as the planner describes it to a family.
struct PlanQuery {
  std::string flavor;
  int64_t vocab = 0, seq_len = 0;
  int64_t topk = 0;  // [dsa] topk (0: the flavor's)
  int64_t mtp_layers = 0;
  int tp = 1, cp = 1;
  bool bf16 = false;           // bf16 mixed precision: activations in bf16
  bool moe_tp_gather = false;  // MoE under TP: TorchTitan's all-gather scheme instead of the fix
};

// One collective context parallelism runs per block: bytes per token of this rank, summed over
// what one rank sends to one other (the planner scales it by cp - 1, tokens and blocks).
struct ContextParallelTraffic {
  std::string op;  // "send", "all_gather", "reduce_scatter"
  double bytes_per_token = 0;
  std::string note;
};

// ---- Hugging Face conversion (`titan ckpt convert`)

struct HfImport {
  std::string model;  // the registered name that trains it (e.g. deepseek_v32 when it has indexers)
  std::vector<std::pair<std::string, Tensor>> state;  // our names, in the model's order
  nlohmann::json hf_config;  // recorded with the checkpoint: --to-hf restores the architecture
  int64_t mtp_layers = 0;
  std::string note;  // said to the user when not empty
};

struct HfExport {
  std::map<std::string, Tensor> tensors;  // the checkpoint's model tensors, by our names
  const nlohmann::json* hf_config = nullptr;  // recorded by an import (null: use the flavor)
  std::string model, flavor;                   // from the checkpoint's config.toml or --flavor
  int64_t mtp_layers = 0;                      // its [model] mtp_layers
  std::string source;                          // the checkpoint folder, for messages
  checkpoint::HfWriteOptions options;
};

// The export's tensors for an architecture's state (names and shapes, in its order): each must be
// in the checkpoint with that shape, else an error naming the tensor and --flavor.
std::vector<std::pair<std::string, Tensor>> export_tensors(const HfExport& job,
                                                           const std::vector<std::pair<std::string, Shape>>& shapes);

struct HfConversion {
  bool (*reads)(const nlohmann::json& config);  // whether a folder's config.json is this family's
  HfImport (*import_folder)(const checkpoint::HfFolder& folder);
  // Writes the tensors as a folder; returns how many tensors it wrote.
  size_t (*export_folder)(const HfExport& job, const std::filesystem::path& dir);
};

// ---- the spec

struct ModelFamily {
  std::string name;  // [model] name
  std::vector<std::string> (*flavors)();
  bool routed_experts = false;          // MoE layers: expert parallelism and the [model] moe_* keys apply
  bool multi_token_prediction = false;  // [model] mtp_layers
  bool sparse_attention = false;        // the [dsa] schedule
  bool tensor_parallel = true;          // a tensor-parallel plan (parallelize.cpp); false: TP 1 only
  bool fp16 = false;                    // training.mixed_precision_param = "float16" (autograd/half_linear.h)
  // The ops [model] converters may switch between their fused and small-op forms
  // (models/converters.h: kConverterRmsNorm, ...); empty: the key is refused.
  std::vector<std::string> converters;
  // The model at `flavor` with the tokenizer's vocabulary; parameters uninitialized. The options
  // are the ones the traits above allow (model_family's build_model checks the rest).
  std::unique_ptr<CausalLM> (*build)(const std::string& flavor, int64_t vocab, int64_t max_seq_len,
                                     const ModelOptions& options) = nullptr;
  // Its transformer blocks (the pipeline's stage split), without building it.
  int64_t (*n_layers)(const std::string& flavor, int64_t vocab, const ModelOptions& options) = nullptr;
  ActivationModel (*activations)(const PlanQuery& q) = nullptr;
  // Routed experts each token visits, by block id (0: a dense block); empty without experts.
  std::vector<int64_t> (*experts_per_token)(const PlanQuery& q) = nullptr;
  std::vector<ContextParallelTraffic> (*context_parallel_traffic)(const PlanQuery& q) = nullptr;
  const HfConversion* hf = nullptr;  // null: no Hugging Face conversion
};

// The registered families (families.cpp), and one by name: an unknown name throws, listing them.
const std::vector<const ModelFamily*>& model_families();
const ModelFamily& model_family(const std::string& name);
std::vector<std::string> model_names();
const std::string& default_model_name();  // [model] name's default: the first registered family

}  // namespace titan::models
