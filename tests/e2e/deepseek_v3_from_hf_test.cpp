// Continue-training a Hugging Face DeepSeek-V3: `titan ckpt convert --from-hf`, then `titan train`
// with checkpoint.initial_load_path at the converted step folder builds the HF architecture (not
// the flavor's), starts from its weights, resumes from its own checkpoints, optionally trains the
// checkpoint's MTP module, and `titan generate` continues a prompt from both the converted and the
// trained checkpoints as a greedy decode of their weights does.
// A folder transformers saved (no MTP weights though config.json says num_nextn_predict_layers 1)
// trains with MTP off, or with model.mtp_layers = 1 from a fresh MTP module, each said in one line.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/autograd/variable.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/checkpoint/hf.h"
#include "titan/cli/ckpt_cli.h"
#include "titan/cli/generate_cli.h"
#include "titan/data/prepare.h"
#include "titan/data/tokenizer.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v3/moe_layer.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;
namespace ds = titan::models::deepseek_v3;

namespace {

// A tiny DeepSeek-V3 with a MoE layer and one MTP layer, in Hugging Face's layout. Its vocabulary
// (704) covers both the byte dataset (257) and the fixture BPE tokenizer (702), padded as
// DeepSeek's is.
ds::DeepSeekV3Args tiny_args() {
  ds::DeepSeekV3Args a;
  a.vocab_size = 704, a.dim = 16, a.n_layers = 2, a.n_dense_layers = 1, a.n_heads = 2, a.inter_dim = 24;
  a.q_lora_rank = 8, a.kv_lora_rank = 8, a.qk_nope_head_dim = 4, a.qk_rope_head_dim = 4, a.v_head_dim = 4;
  a.moe_inter_dim = 8, a.n_routed_experts = 4, a.n_shared_experts = 1, a.n_activated_experts = 2;
  a.n_expert_groups = 1, a.n_limited_groups = 1, a.max_seq_len = a.original_seq_len = 64, a.norm_eps = 1e-6;
  a.num_mtp_layers = 1;
  return a;
}

fs::path make_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "corpus.txt");
    for (int d = 0; d < 60; ++d) text << "the cat sat on the mat. the dog lay on the rug.\n\n";
  }
  return test::prepare_byte_dataset(dir / "corpus.txt", dir, 0.05);
}

train::JobConfig config(const fs::path& data, const fs::path& run, const fs::path& init, int steps, int mtp_layers) {
  const std::string toml = "[job]\ndump_folder = \"" + run.string() +
                           "\"\n[model]\nname = \"deepseek_v3\"\nflavor = \"debugmodel\"\nmtp_layers = " +
                           std::to_string(mtp_layers) + "\n[training]\nlocal_batch_size = 2\nseq_len = 16\nsteps = " +
                           std::to_string(steps) + "\ndataset_path = \"" + data.string() +
                           "\"\nmixed_precision_param = \"float32\"\n[optimizer]\nlr = 1e-4\nweight_decay = 0\n"
                           "[lr_scheduler]\nwarmup_steps = 0\n[activation_checkpoint]\nmode = \"none\"\n"
                           "[checkpoint]\nenable = true\ninterval = 100\nkeep_latest_k = 0\nlast_save_model_only = false\n"
                           "initial_load_path = \"" + init.string() + "\"\n[metrics]\nlog_freq = 1\n[validation]\nenable = false\n";
  return train::parse_config(toml, "from_hf.toml");
}

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
  return m;
}

// max |a - b| of a run's model tensor against the HF original.
double drift(const checkpoint::LoadedCheckpoint& ck, const std::string& ours, const checkpoint::HfFolder& hf,
             const std::string& theirs) {
  return max_diff(ck.tensors.at("model." + ours), hf.load_f32(theirs));
}

// What `titan generate --temperature 0` must print for `prompt` from a checkpoint step folder:
// the prompt, its greedy continuation by full forwards over the whole sequence (no KV cache) of
// the checkpoint's weights, decoded, and a newline. Each choice must beat the runner-up by a
// margin that KV-cached decoding cannot round away.
std::string greedy_generation(const fs::path& step, const data::Tokenizer& tok, const std::string& prompt,
                              int new_tokens) {
  const checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(step);
  ds::DeepSeekV3Args a = ds::args_from_hf_config(ck.train_state.at("hf_config"), step.string());
  a.num_mtp_layers = 0;  // generation builds no MTP module
  ds::Transformer m(a, ds::moe_layer);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : ck.tensors)
    if (name.starts_with("model.") && !name.starts_with("model.mtp.")) state[name.substr(6)] = t;
  for (const auto& [name, t] : m.state_dict())  // run-time MoE statistics, not checkpointed
    if (name.ends_with("tokens_per_expert")) state.try_emplace(name, t);
  m.load_state_dict(state, /*strict=*/true, step.string());
  m.set_compute_dtype(DType::f32);
  autograd::NoGradGuard no_grad;
  std::vector<int32_t> ids = tok.encode(prompt, tok.bos_id().has_value());
  const size_t prompt_len = ids.size();
  for (int n = 0; n < new_tokens; ++n) {
    Tensor input = Tensor::empty({1, int64_t(ids.size())}, DType::i32);
    std::copy(ids.begin(), ids.end(), input.data<int32_t>());
    const Tensor logits = m.forward(input).value().contiguous();  // [S, V]
    const int64_t vocab = logits.size(1);
    const float* last = logits.data<float>() + (int64_t(ids.size()) - 1) * vocab;
    std::vector<float> sorted(last, last + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    EXPECT_GT(sorted[0] - sorted[1], 1e-3) << step << ": token " << n << " is a near-tie";
    const int32_t next = int32_t(std::max_element(last, last + vocab) - last);
    if (tok.eos_id() && next == *tok.eos_id()) break;
    ids.push_back(next);
  }
  EXPECT_GT(ids.size(), prompt_len) << step << ": the greedy continuation is empty";
  return prompt + tok.decode(std::span<const int32_t>(ids).subspan(prompt_len), /*skip_special=*/true) + "\n";
}

// For the saved fixtures' 32-token vocabulary: one token per byte, modulo 31 (31 ends a document).
fs::path make_small_vocab_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "corpus.txt");
    for (int d = 0; d < 60; ++d) text << "the cat sat on the mat. the dog lay on the rug.\n\n";
  }
  data::PrepareOptions o;
  o.inputs = {(dir / "corpus.txt").string()};
  o.output_dir = (dir / "prepared").string();
  o.val_fraction = 0.05;
  data::Encoder mod31;
  mod31.encode = [](std::string_view t) {
    std::vector<int32_t> ids;
    for (const char c : t) ids.push_back(int32_t(static_cast<unsigned char>(c) % 31));
    return ids;
  };
  mod31.vocab_size = 32;
  mod31.eos_id = 31;
  data::prepare_dataset(o, mod31);
  return dir / "prepared";
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

int run_cli(std::vector<std::string> args, int (*main_fn)(int, char**)) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return main_fn(int(argv.size()), argv.data());
}

// What `titan generate` prints to stdout; it must exit with 0.
std::string generate_output(const std::vector<std::string>& args) {
  testing::internal::CaptureStdout();
  const int rc = run_cli(args, cli::generate_main);
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0) << out;
  return out;
}

// A freshly initialized model of architecture `a` (seed) as a Hugging Face folder in f32: its
// weights and state buffers, not the routing statistics.
void write_hf_folder(const fs::path& dir, const ds::DeepSeekV3Args& a, uint64_t seed) {
  ds::Transformer m(a, ds::moe_layer);
  m.init_parameters(seed);
  std::set<std::string> statistics;
  for (const nn::BufferKind kind : {nn::BufferKind::step_statistic, nn::BufferKind::saved_statistic})
    for (const auto& [name, t] : m.named_buffers(kind)) statistics.insert(name);
  std::vector<std::pair<std::string, Tensor>> state;
  for (auto& [name, t] : m.state_dict())
    if (!statistics.count(name)) state.emplace_back(name, t);
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  ds::save_hf(dir, a, state, opt);
}

}  // namespace

TEST(DeepSeekV3FromHf, ConvertedCheckpointContinuesTraining) {
  const fs::path root = fs::temp_directory_path() / ("titan_from_hf_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const ds::DeepSeekV3Args a = tiny_args();
  write_hf_folder(root / "hf", a, 17);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", (root / "hf").string(), "--to", (root / "ckpt").string()},
                    cli::ckpt_main),
            0);
  const fs::path init = root / "ckpt/step-0";
  const fs::path data = make_dataset(root / "data");
  const checkpoint::HfFolder hf = checkpoint::HfFolder::open(root / "hf");
  // AdamW's first step moves a weight by about lr wherever its gradient is not tiny, and no step
  // moves one by more than about lr (the 3-step schedule runs at lr, 2/3 lr, 1/3 lr): a trained
  // tensor's largest change exceeds lr / 2, and stays far below any fresh initialization's
  // distance from the HF weights (std 0.02).
  const double lr = 1e-4, moved = 0.5 * lr, near = 3 * lr * 1.5;

  {  // Without MTP: the checkpoint's MTP layer is left out.
    train::Trainer t(config(data, root / "run", init, 3, 0), "from_hf");
    const train::TrainResult r = t.train();
    EXPECT_EQ(r.last_step, 3);
    EXPECT_TRUE(std::isfinite(r.last_loss));
  }
  {
    const auto ck = checkpoint::load_checkpoint(root / "run/checkpoint/step-3");
    ASSERT_TRUE(ck.train_state.contains("hf_config"));
    EXPECT_EQ(ck.tensors.at("model.tok_embeddings.weight").shape(), Shape({704, 16}));
    EXPECT_FALSE(ck.tensors.count("model.mtp.0.eh_proj.weight"));
    for (const auto& [ours, theirs] :
         {std::pair{"layers.1.attention.wq_a.weight", "model.layers.1.self_attn.q_a_proj.weight"},
          std::pair{"output.weight", "lm_head.weight"}}) {
      const double d = drift(ck, ours, hf, theirs);
      EXPECT_GT(d, moved) << ours << " did not train";
      EXPECT_LT(d, near) << ours << " did not start from the HF weights";
    }
  }
  {  // Resumes from its own step-3 with the same architecture: one step on from its weights, at
     // the 4-step schedule's last learning rate (linear decay without warmup: lr / 4).
    train::Trainer t(config(data, root / "run", init, 4, 0), "from_hf resumed");
    EXPECT_EQ(t.train().last_step, 4);
    const auto step3 = checkpoint::load_checkpoint(root / "run/checkpoint/step-3");
    const auto step4 = checkpoint::load_checkpoint(root / "run/checkpoint/step-4");
    for (const char* name : {"model.layers.1.attention.wq_a.weight", "model.output.weight"}) {
      const double d = max_diff(step4.tensors.at(name), step3.tensors.at(name));
      EXPECT_GT(d, 0.25 * moved) << name << " did not train after resuming";
      EXPECT_LT(d, 0.25 * lr * 1.5) << name << " did not resume from step 3";
    }
  }
  {  // With the MTP module, starting from the checkpoint's, and training it.
    train::Trainer t(config(data, root / "mtp_run", init, 3, 1), "from_hf mtp");
    EXPECT_EQ(t.train().last_step, 3);
    const auto ck = checkpoint::load_checkpoint(root / "mtp_run/checkpoint/step-3");
    for (const auto& [ours, theirs] :
         {std::pair{"mtp.0.eh_proj.weight", "model.layers.2.eh_proj.weight"},
          std::pair{"mtp.0.block.attention.wkv_a.weight", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight"}}) {
      const double d = drift(ck, ours, hf, theirs);
      EXPECT_GT(d, moved) << ours << " did not train";
      EXPECT_LT(d, near) << ours << " did not start from the HF weights";
    }
  }
  // Back to Hugging Face, with the MTP layer when the run trained it.
  for (const auto& [run, mtp] : {std::pair{"run/checkpoint/step-4", 0}, std::pair{"mtp_run/checkpoint/step-3", 1}}) {
    const fs::path out = root / ("hf_" + std::to_string(mtp));
    ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / run).string(), "--to-hf", out.string()}, cli::ckpt_main), 0);
    const checkpoint::HfFolder back = checkpoint::HfFolder::open(out);
    EXPECT_EQ(back.config().at("num_nextn_predict_layers").get<int>(), mtp);
    EXPECT_EQ(back.config().at("vocab_size").get<int>(), 704);
    EXPECT_EQ(back.contains("model.layers.2.eh_proj.weight"), mtp == 1);
  }
  // `titan generate` on the converted checkpoint and on the trained one: greedy, it prints the
  // prompt and the continuation the weights choose; sampled, the same text for the same seed.
  const std::string tok_path = "tests/fixtures/tokenizer/deepseek_v3_bpe.json";
  const data::Tokenizer tok = data::Tokenizer::load(tok_path);
  for (const fs::path& ck : {init, root / "mtp_run/checkpoint/step-3"}) {
    const std::vector<std::string> args = {"generate", "--checkpoint", ck.string(), "--tokenizer", tok_path,
                                           "--prompt", "the cat", "--max-new-tokens", "4"};
    std::vector<std::string> greedy = args, sampled = args;
    greedy.insert(greedy.end(), {"--temperature", "0"});
    sampled.insert(sampled.end(), {"--seed", "3"});
    EXPECT_EQ(generate_output(greedy), greedy_generation(ck, tok, "the cat", 4)) << ck;
    const std::string once = generate_output(sampled);
    EXPECT_TRUE(once.starts_with("the cat") && once.size() > std::string("the cat\n").size()) << ck << ": " << once;
    EXPECT_EQ(generate_output(sampled), once) << ck;
  }
  fs::remove_all(root);
}

// What transformers' save_pretrained writes (tests/fixtures/deepseek_v3_tiny_saved: config.json
// says num_nextn_predict_layers 1, the folder has no MTP weights) converts without MTP; training
// from it runs with MTP off, or with model.mtp_layers = 1 from a fresh MTP module (one line says
// so, and the MTP loss is logged); --to-hf then writes the MTP layer only when one was trained,
// and config.json counts exactly the MTP layers it wrote. The same folder with DeepSeek's MTP
// layer (_saved_mtp) trains from that layer, or says it is left out with mtp_layers = 0.
TEST(DeepSeekV3FromHf, FolderTransformersSavedTrainsWithFreshOrNoMtp) {
  const fs::path root = fs::temp_directory_path() / ("titan_from_saved_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const std::string saved = "tests/fixtures/deepseek_v3_tiny_saved", hub = "tests/fixtures/deepseek_v3_tiny_saved_mtp";
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", saved, "--to", (root / "ckpt").string()}, cli::ckpt_main), 0);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", hub, "--to", (root / "ckpt_mtp").string()}, cli::ckpt_main), 0);
  const fs::path data = make_small_vocab_dataset(root / "data");
  const auto train = [&](const fs::path& init, const std::string& run, int mtp) {
    testing::internal::CaptureStdout();
    {
      train::Trainer t(config(data, root / run, init, 2, mtp), "from_saved " + run);
      const train::TrainResult r = t.train();
      EXPECT_EQ(r.last_step, 2) << run;
      EXPECT_TRUE(std::isfinite(r.last_loss)) << run;
    }
    std::fflush(stdout);
    return testing::internal::GetCapturedStdout();
  };
  const std::string fresh_line =
      "MTP module mtp.0: not in checkpoint step 0, starts from a fresh initialization (debug.seed 0)\n";
  const std::string dropped_line = "MTP module mtp.0 of checkpoint step 0: not loaded (model.mtp_layers = 0)\n";

  std::string out = train(root / "ckpt/step-0", "off", 0);
  EXPECT_EQ(count(out, "MTP module"), 0u) << out;
  EXPECT_EQ(count(out, "mtp_loss"), 0u) << out;
  out = train(root / "ckpt/step-0", "fresh", 1);
  EXPECT_EQ(count(out, fresh_line), 1u) << out;
  EXPECT_EQ(count(out, "MTP module"), 1u) << out;
  EXPECT_GT(count(out, "mtp_loss"), 0u) << out;
  {
    const auto ck = checkpoint::load_checkpoint(root / "fresh/checkpoint/step-2");
    ASSERT_TRUE(ck.tensors.count("model.mtp.0.eh_proj.weight"));
    EXPECT_EQ(ck.tensors.at("model.mtp.0.eh_proj.weight").shape(), Shape({16, 32}));
  }
  const checkpoint::HfFolder hub_folder = checkpoint::HfFolder::open(hub);
  out = train(root / "ckpt_mtp/step-0", "hub", 1);
  EXPECT_EQ(count(out, "MTP module"), 0u) << out;  // the folder's MTP layer is the start
  {
    const auto ck = checkpoint::load_checkpoint(root / "hub/checkpoint/step-2");
    EXPECT_LT(drift(ck, "mtp.0.eh_proj.weight", hub_folder, "model.layers.2.eh_proj.weight"), 2 * 1e-4 * 1.5);
  }
  out = train(root / "ckpt_mtp/step-0", "hub_off", 0);
  EXPECT_EQ(count(out, dropped_line), 1u) << out;
  {  // Part of an MTP module (here its eh_proj gone) is an error, not a silent partial init.
    checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(root / "ckpt_mtp/step-0");
    checkpoint::SaveRequest req;
    for (const auto& [name, t] : ck.tensors)
      if (name != "model.mtp.0.eh_proj.weight") req.tensors.push_back({name, t, {}});
    req.train_state = ck.train_state;
    req.config_toml = ck.config_toml;
    const fs::path partial = checkpoint::save_checkpoint(root / "partial", req);
    try {
      train::Trainer t(config(data, root / "partial_run", partial, 2, 1), "from_saved partial");
      ADD_FAILURE() << "a checkpoint with part of mtp.0 loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("holds part of MTP module mtp.0: 'mtp.0.eh_proj.weight' (and 0 more)"),
                std::string::npos)
          << e.what();
    }
  }

  // Back to Hugging Face: the MTP layer exactly when the run trained one, counted by config.json;
  // converting that again imports it all without a note.
  for (const auto& [run, mtp] : {std::pair{"off", 0}, std::pair{"fresh", 1}}) {
    const fs::path hf = root / (std::string(run) + "_hf");
    ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / run / "checkpoint/step-2").string(), "--to-hf", hf.string()},
                      cli::ckpt_main),
              0);
    const checkpoint::HfFolder back = checkpoint::HfFolder::open(hf);
    EXPECT_EQ(back.config().at("num_nextn_predict_layers").get<int>(), mtp) << run;
    EXPECT_EQ(back.contains("model.layers.2.eh_proj.weight"), mtp == 1) << run;
    EXPECT_EQ(back.contains("model.layers.2.shared_head.head.weight"), mtp == 1) << run;
    testing::internal::CaptureStdout();
    EXPECT_EQ(run_cli({"ckpt", "convert", "--from-hf", hf.string(), "--to", (root / run / "again").string()},
                      cli::ckpt_main),
              0);
    std::fflush(stdout);
    out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(count(out, "num_nextn_predict_layers"), 0u) << out;
    EXPECT_EQ(count(out, "MTP layers: " + std::to_string(mtp) + ")"), 1u) << out;
  }
  fs::remove_all(root);
}

// checkpoint.initial_load_in_hf / last_save_in_hf: `titan train` reads a Hugging Face folder
// directly (rank 0 converts it into the run's hf_import/step-0) and writes its final weights as
// one beside the final checkpoint, which holds the same tensors.
TEST(DeepSeekV3FromHf, TrainReadsAndWritesHuggingFaceFolders) {
  const fs::path root = fs::temp_directory_path() / ("titan_train_hf_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ds::DeepSeekV3Args a = tiny_args();
  a.num_mtp_layers = 0;
  write_hf_folder(root / "hf", a, 23);
  const fs::path data = make_dataset(root / "data");
  train::JobConfig c = config(data, root / "run", root / "hf", 2, 0);
  c.checkpoint.initial_load_in_hf = true;
  c.checkpoint.initial_load_model_only = true;
  c.checkpoint.last_save_model_only = true;
  c.checkpoint.last_save_in_hf = true;
  {
    train::Trainer t(c, "train_hf");
    EXPECT_EQ(t.train().last_step, 2);
  }
  EXPECT_TRUE(fs::exists(root / "run/hf_import/step-0/metadata.json"));
  const checkpoint::HfFolder original = checkpoint::HfFolder::open(root / "hf");
  const checkpoint::HfFolder exported = checkpoint::HfFolder::open(root / "run/checkpoint/step-2-hf");
  EXPECT_EQ(exported.config().value("model_type", ""), "deepseek_v3");
  const checkpoint::LoadedCheckpoint final_ck = checkpoint::load_checkpoint(root / "run/checkpoint/step-2");
  // Started from the HF weights (within what 2 steps of lr 1e-4 move), and the export is exactly
  // the final checkpoint's weights, under HF's names.
  const std::string hf_name = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
  EXPECT_LT(max_diff(exported.load_f32(hf_name), original.load_f32(hf_name)), 5e-4);
  EXPECT_GT(max_diff(exported.load_f32(hf_name), original.load_f32(hf_name)), 0) << "it trained";
  EXPECT_EQ(max_diff(exported.load_f32(hf_name), final_ck.tensors.at("model.layers.0.attention.wkv_a.weight")), 0);
  EXPECT_EQ(max_diff(exported.load_f32("lm_head.weight"), final_ck.tensors.at("model.output.weight")), 0);
  fs::remove_all(root);
}
