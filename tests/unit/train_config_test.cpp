#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/train/config.h"

using namespace titan;
using namespace titan::train;
namespace fs = std::filesystem;

namespace {

// Tests run from the project root (tests/CMakeLists.txt sets WORKING_DIRECTORY).
const fs::path kConfigsDir = "configs";
const fs::path kDocs = "docs/config.md";

// Writes `text` to a fresh file named after the running test and returns its path.
fs::path write_toml(const std::string& text, const std::string& suffix = "") {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir = fs::path(testing::TempDir()) / "titan_config_test";
  fs::create_directories(dir);
  const fs::path path = dir / (std::string(info->name()) + suffix + ".toml");
  std::ofstream(path) << text;
  return path;
}

// The error load_config throws for this file and these overrides, or a failure if none.
Error load_error(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  const fs::path path = write_toml(toml);
  try {
    load_config(path, overrides);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected titan::Error for:\n" << toml;
  return Error("no error", "", __FILE__, __LINE__);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
    << "missing \"" << (needle) << "\" in:\n" << (haystack)

}  // namespace

// ---- loading ------------------------------------------------------------------------------------

TEST(Config, EmptyFileGivesDefaults) {
  EXPECT_EQ(load_config(write_toml("")), JobConfig{});
  EXPECT_EQ(JobConfig{}.optimizer.lr, 8e-4);
  EXPECT_FALSE(JobConfig{}.lr_scheduler.decay_ratio.has_value());
}

TEST(Config, ReadsEveryType) {
  const JobConfig c = load_config(write_toml(R"(
[job]
description = "a \"quoted\" run"
print_config = true
[model]
name = "deepseek_v32"
flavor = "16B"
converters = ["dsa.fused", "moe.grouped"]
[training]
seq_len = 512
max_norm = 2          # an integer is a fine number
[lr_scheduler]
decay_ratio = 0.25
decay_type = "sqrt"
[parallelism]
data_parallel_shard_degree = -1
expert_parallel_degree = 4
)"));
  EXPECT_EQ(c.job.description, "a \"quoted\" run");
  EXPECT_TRUE(c.job.print_config);
  EXPECT_EQ(c.model.name, "deepseek_v32");
  EXPECT_EQ(c.model.flavor, "16B");
  EXPECT_EQ(c.model.converters, (std::vector<std::string>{"dsa.fused", "moe.grouped"}));
  EXPECT_EQ(c.training.seq_len, 512);
  EXPECT_EQ(c.training.max_norm, 2.0);
  EXPECT_EQ(c.lr_scheduler.decay_ratio, 0.25);
  EXPECT_EQ(c.lr_scheduler.decay_type, optim::LrDecay::sqrt);
  EXPECT_EQ(c.parallelism.expert_parallel_degree, 4);
}

TEST(Config, EveryShippedConfigLoads) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(kConfigsDir)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    const JobConfig c = load_config(entry.path());
    EXPECT_EQ(parse_config(to_toml(c), "resolved"), c);
    // Every shipped schedule can be built and evaluated over its whole run.
    const optim::LrSchedule schedule = make_lr_schedule(c);
    EXPECT_EQ(schedule.lr_factor(c.training.steps) >= c.lr_scheduler.min_lr_factor, true);
  }
  EXPECT_GE(count, 4);
}

// ---- overrides ----------------------------------------------------------------------------------

TEST(Config, OverridesInBothFormsAndInOrder) {
  const fs::path path =
      write_toml("[training]\nsteps = 100\n[lr_scheduler]\nwarmup_steps = 10\ndecay_ratio = 0.5\n");
  const JobConfig c = load_config(path, {"--training.steps=20", "--optimizer.lr", "1e-3", "--checkpoint.enable",
                                         "--metrics.enable_jsonl", "false", "--model.converters=a, b,,c",
                                         "--lr_scheduler.decay_ratio=none", "--training.steps", "30",
                                         "--parallelism.data_parallel_shard_degree", "-1"});
  EXPECT_EQ(c.training.steps, 30);  // the last one wins
  EXPECT_EQ(c.optimizer.lr, 1e-3);
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_FALSE(c.metrics.enable_jsonl);
  EXPECT_EQ(c.model.converters, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(c.lr_scheduler.decay_ratio.has_value());
  EXPECT_EQ(c.parallelism.data_parallel_shard_degree, -1);
  EXPECT_TRUE(load_config(path, {"--model.converters="}).model.converters.empty());
}

TEST(Config, OverrideOfUnknownKeyNamesTheOverride) {
  const Error e = load_error("", {"--training.seqlen=128"});
  EXPECT_HAS(e.message(), "override --training.seqlen=128");
  EXPECT_HAS(e.message(), "unknown key training.seqlen");
  EXPECT_HAS(e.hint(), "--training.seq_len");
}

TEST(Config, OverrideErrors) {
  Error e = load_error("", {"--training.steps=ten"});
  EXPECT_HAS(e.message(), "override --training.steps=ten");
  EXPECT_HAS(e.message(), "an integer >= 1");
  EXPECT_HAS(e.hint(), "--training.steps=10000");

  e = load_error("", {"--trainig.steps=10"});
  EXPECT_HAS(e.message(), "unknown section [trainig]");
  EXPECT_HAS(e.hint(), "[training]");

  e = load_error("", {"--training.seq_len=0"});
  EXPECT_HAS(e.message(), "override --training.seq_len=0");
  EXPECT_HAS(e.message(), "an integer >= 1");
  EXPECT_HAS(e.hint(), "--training.seq_len=");

  e = load_error("", {"--training.steps"});
  EXPECT_HAS(e.message(), "has no value");

  e = load_error("", {"training.steps=5"});
  EXPECT_HAS(e.message(), "not of the form --section.key=value");

  e = load_error("", {"--steps=5"});
  EXPECT_HAS(e.hint(), "--training.steps");

  e = load_error("", {"--checkpoint.enable=yes"});
  EXPECT_HAS(e.message(), "true or false");

  e = load_error("", {"--metrics.enable_wandb"});
  EXPECT_HAS(e.message(), "is a TorchTitan key");
  EXPECT_HAS(e.hint(), "drop the override");
}

// ---- errors in the file -------------------------------------------------------------------------

TEST(ConfigErrors, UnknownSectionSuggestsTheClosest) {
  const Error e = load_error("[trainng]\nsteps = 5\n");
  EXPECT_HAS(e.message(), ".toml:1:2");  // file:line:column of the section name
  EXPECT_HAS(e.message(), "unknown section [trainng]");
  EXPECT_HAS(e.hint(), "did you mean [training]?");
  EXPECT_HAS(load_error("[zzz]\n").hint(), "the sections are: job, model");
}

TEST(ConfigErrors, UnknownKeySuggestsTheClosest) {
  Error e = load_error("[training]\nsteps = 5\nseqlen = 128\n");
  EXPECT_HAS(e.message(), "UnknownKeySuggestsTheClosest.toml:3:1");
  EXPECT_HAS(e.message(), "unknown key training.seqlen");
  EXPECT_HAS(e.hint(), "did you mean training.seq_len?");

  // A key in the wrong section finds its home.
  e = load_error("[training]\nlr = 1e-3\n");
  EXPECT_HAS(e.hint(), "optimizer.lr");
  e = load_error("[training]\nseed = 3\n");
  EXPECT_HAS(e.hint(), "debug.seed");

  // Nothing close: the section's keys are listed.
  e = load_error("[optimizer]\nmomentum_dampening = 0.1\n");
  EXPECT_HAS(e.hint(), "[optimizer] takes: name, lr, beta1, beta2, eps, weight_decay");
}

// [optimizer] name = "Muon" and its keys: read as written; a wrong choice or value names the key,
// where it came from and the fix.
TEST(ConfigErrors, MuonKeys) {
  const JobConfig c = load_config(write_toml("[optimizer]\nname = \"Muon\"\nmuon_lr = 0.02\nmuon_adjust_lr = "
                                             "\"original\"\nmuon_ns_steps = 6\nmuon_nesterov = false\n"));
  EXPECT_EQ(c.optimizer.name, OptimizerKind::muon);
  EXPECT_EQ(c.optimizer.muon_lr, 0.02);
  EXPECT_EQ(c.optimizer.muon_adjust_lr, optim::MuonLrAdjust::original);
  EXPECT_EQ(c.optimizer.muon_ns_steps, 6);
  EXPECT_FALSE(c.optimizer.muon_nesterov);
  EXPECT_FALSE(JobConfig{}.optimizer.muon_lr.has_value()) << "unset: the Muon group takes optimizer.lr";
  EXPECT_EQ(JobConfig{}.optimizer.muon_adjust_lr, optim::MuonLrAdjust::match_rms_adamw);

  Error e = load_error("[optimizer]\nname = \"muon\"\n");
  EXPECT_HAS(e.message(), "optimizer.name");
  EXPECT_HAS(e.message() + e.hint(), "\"Muon\"");
  e = load_error("[optimizer]\nname = \"Muon\"\nmuon_adjust_lr = \"rms\"\n");
  EXPECT_HAS(e.message(), "optimizer.muon_adjust_lr");
  EXPECT_HAS(e.message() + e.hint(), "match_rms_adamw");
  e = load_error("", {"--optimizer.muon_momentum=1"});
  EXPECT_HAS(e.message(), "override --optimizer.muon_momentum=1");
  EXPECT_HAS(e.hint(), "--optimizer.muon_momentum=0.95");
  e = load_error("[optimizer]\nmuon_ns_steps = 0\n");
  EXPECT_HAS(e.message(), "optimizer.muon_ns_steps");
  e = load_error("[optimizer]\nmuon_momentun = 0.9\n");
  EXPECT_HAS(e.hint(), "optimizer.muon_momentum");
  e = load_error("[checkpoint]\nallow_optimiser_switch = true\n");
  EXPECT_HAS(e.hint(), "checkpoint.allow_optimizer_switch");
}

TEST(ConfigErrors, TorchTitanOnlyKeysSayWhy) {
  Error e = load_error("[metrics]\nenable_wandb = true\n");
  EXPECT_HAS(e.message(), "metrics.enable_wandb is a TorchTitan key");
  EXPECT_HAS(e.message(), "metrics.enable_jsonl");
  e = load_error("[compile]\nenable = false\n");
  EXPECT_HAS(e.message(), "[compile] is a TorchTitan section");
  EXPECT_HAS(e.hint(), "remove the [compile] table");
}

TEST(ConfigErrors, KeyOutsideAnySection) {
  Error e = load_error("steps = 5\n");
  EXPECT_HAS(e.message(), "key steps is outside any section");
  EXPECT_HAS(e.hint(), "[training]");
  e = load_error("training = 5\n");
  EXPECT_HAS(e.message(), "training must be a table");
}

TEST(ConfigErrors, WrongType) {
  Error e = load_error("[training]\nseq_len = \"2048\"\n");
  EXPECT_HAS(e.message(), ".toml:2:11");
  EXPECT_HAS(e.message(), "training.seq_len must be an integer >= 1");
  EXPECT_HAS(e.message(), "got the string \"2048\"");
  EXPECT_HAS(e.hint(), "seq_len = 2048");

  e = load_error("[training]\nsteps = 10.5\n");
  EXPECT_HAS(e.message(), "training.steps must be an integer");

  e = load_error("[model]\nconverters = \"float8\"\n");
  EXPECT_HAS(e.message(), "model.converters must be a list of non-empty strings");
  e = load_error("[model]\nconverters = [\"a\", 3]\n");
  EXPECT_HAS(e.message(), "an array holding the integer 3");

  e = load_error("[checkpoint]\nenable = 1\n");
  EXPECT_HAS(e.message(), "checkpoint.enable must be true or false");

  e = load_error("[optimizer]\nlr = \"fast\"\n");
  EXPECT_HAS(e.message(), "optimizer.lr must be a number > 0");
}

TEST(ConfigErrors, ImpossibleValues) {
  struct Case {
    std::string toml, key, accepted;
  };
  const std::vector<Case> cases = {
      {"[optimizer]\nlr = -1e-3\n", "optimizer.lr = -0.001", "a number > 0"},
      {"[optimizer]\nbeta2 = 1.0\n", "optimizer.beta2 = 1.0", "a number in [0, 1)"},
      {"[optimizer]\nname = \"SGD\"\n", "optimizer.name = \"SGD\"", "one of: AdamW"},
      {"[lr_scheduler]\ndecay_type = \"exp\"\n", "lr_scheduler.decay_type = \"exp\"", "one of: linear, sqrt, cosine"},
      {"[lr_scheduler]\nmin_lr_factor = 1.5\n", "lr_scheduler.min_lr_factor = 1.5", "a number in [0, 1]"},
      {"[lr_scheduler]\ndecay_ratio = -0.5\n", "lr_scheduler.decay_ratio = -0.5", "a number in [0, 1], or unset"},
      {"[training]\nseq_len = 0\n", "training.seq_len = 0", "an integer >= 1"},
      {"[training]\nseq_len = -4\n", "training.seq_len = -4", "an integer >= 1"},
      {"[training]\nmax_norm = nan\n", "training.max_norm = nan", "a number > 0"},
      {"[training]\nglobal_batch_size = 0\n", "training.global_batch_size = 0", "an integer >= 1, or -1"},
      {"[training]\nmixed_precision_param = \"fp16\"\n", "training.mixed_precision_param",
       "one of: bfloat16, float16, float32"},
      {"[training]\ngradient_sync_dtype = \"fp8\"\n", "training.gradient_sync_dtype",
       "one of: float32, bfloat16, float16"},
      {"[training]\nloss_scale_backoff_factor = 0\n", "training.loss_scale_backoff_factor = 0", "a number in (0, 1)"},
      {"[parallelism]\ndata_parallel_shard_degree = 0\n", "parallelism.data_parallel_shard_degree = 0",
       "an integer >= 1, or -1"},
      {"[checkpoint]\nkeep_latest_k = 1\n", "checkpoint.keep_latest_k = 1", "an integer >= 2, or 0"},
      {"[checkpoint]\nasync_mode = \"async_with_pinned_mem\"\n", "checkpoint.async_mode",
       "one of: disabled, async"},
      {"[activation_checkpoint]\nmode = \"memory_budget\"\n", "activation_checkpoint.mode",
       "one of: none, full, selective"},
      {"[model]\nname = \"gpt2\"\n", "model.name = \"gpt2\"", "one of: llama3, deepseek_v3, deepseek_v32"},
      {"[model]\nflavor = \"\"\n", "model.flavor = \"\"", "a non-empty string"},
      {"[validation]\nsteps = 0\n", "validation.steps = 0", "an integer >= 1, or -1"},
      {"[debug]\nseed = -1\n", "debug.seed = -1", "an integer >= 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.toml);
    const Error e = load_error(c.toml);
    EXPECT_HAS(e.message(), "ImpossibleValues.toml:2:");  // the file and the line of the value
    EXPECT_HAS(e.message(), c.key);
    EXPECT_HAS(e.message(), c.accepted);
    EXPECT_HAS(e.hint(), "under [" + c.key.substr(0, c.key.find('.')) + "] in ");
  }
}

TEST(ConfigErrors, ChoiceTypoSuggestsTheChoice) {
  const Error e = load_error("[lr_scheduler]\ndecay_type = \"Cosine\"\n");
  EXPECT_HAS(e.hint(), "did you mean \"cosine\"?");
  EXPECT_HAS(e.hint(), "set `decay_type = \"cosine\"` under [lr_scheduler]");
}

// An enum-valued key holds its enum once parsed, yet reads and fails as the string it is spelled
// with: a name its enum lacks is reported by validation (so an override may still replace it), in
// the override's words when it came from one.
TEST(ConfigChoices, ParseToEnumsAndKeepTheirErrorsUntilValidation) {
  const JobConfig c = load_config(write_toml("[parallelism]\nfsdp_reshard_after_forward = \"never\"\n"
                                             "[activation_checkpoint]\nmode = \"full\"\n"),
                                  {"--parallelism.pipeline_parallel_schedule=DualPipeV", "--optimizer.swap=file",
                                   "--checkpoint.export_dtype=float16"});
  EXPECT_EQ(c.parallelism.fsdp_reshard_after_forward, distributed::ReshardAfterForward::never);
  EXPECT_EQ(c.activation_checkpoint.mode, models::Recompute::full);
  EXPECT_EQ(c.parallelism.pipeline_parallel_schedule, distributed::pp::ScheduleKind::dual_pipe_v);
  EXPECT_EQ(c.optimizer.swap, OptimizerSwap::file);
  EXPECT_EQ(c.checkpoint.export_dtype, DType::f16);
  EXPECT_HAS(to_toml(c), "fsdp_reshard_after_forward = \"never\"\n");
  EXPECT_HAS(to_toml(c), "pipeline_parallel_schedule = \"DualPipeV\"\n");
  EXPECT_HAS(to_toml(c), "export_dtype = \"float16\"\n");

  // A bad value in the file that an override replaces is no error.
  EXPECT_EQ(load_config(write_toml("[fault]\non_nonfinite = \"retry\"\n"), {"--fault.on_nonfinite=skip"})
                .fault.on_nonfinite,
            NonFinitePolicy::skip);
  const Error e = load_error("", {"--fault.on_nonfinite=retry"});
  EXPECT_HAS(e.message(), "override --fault.on_nonfinite=retry: fault.on_nonfinite = \"retry\" is not accepted");
  EXPECT_HAS(e.message(), "one of: abort, skip, rollback");
  EXPECT_HAS(e.hint(), "pass --fault.on_nonfinite=");
}

// A key that takes a subset of its enum (training.dtype: float32 alone of every DType, since
// TorchTitan's full-bf16 mode is not carried) refuses the rest, whether spelled in the file or set in code.
TEST(ConfigChoices, SubsetOfAnEnumRefusesTheRest) {
  const Error e = load_error("[training]\ndtype = \"bfloat16\"\n");
  EXPECT_HAS(e.message(), "training.dtype = \"bfloat16\" is not accepted; it must be one of: float32");
  JobConfig c;
  c.training.mixed_precision_param = DType::f8e4m3;
  try {
    validate(c);
    ADD_FAILURE() << "validate accepted training.mixed_precision_param = f8e4m3";
  } catch (const Error& v) {
    EXPECT_HAS(v.message(), "training.mixed_precision_param = \"float8_e4m3fn\" is not accepted");
  }
}

// A file's warmup longer than its run shrinks to the run with one warning naming both keys and
// their sources (a smoke run: --training.steps=2 against the default warmup of 200).
TEST(Config, WarmupLongerThanTheRunIsClampedWithAWarning) {
  ::testing::internal::CaptureStderr();
  JobConfig c = load_config(write_toml("[training]\nsteps = 100\n[lr_scheduler]\nwarmup_steps = 150\n"));
  std::string warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 100);
  EXPECT_HAS(warning, "warning: lr_scheduler.warmup_steps = 150 (at ");
  EXPECT_HAS(warning, "training.steps = 100 (at ");
  ::testing::internal::CaptureStderr();
  c = load_config(write_toml(""), {"--training.steps=2"});
  warning = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 2);
  EXPECT_HAS(warning, "lr_scheduler.warmup_steps = 200 (default)");
  EXPECT_HAS(warning, "training.steps = 2 (from --training.steps=2)");
  EXPECT_EQ(std::count(warning.begin(), warning.end(), '\n'), 1) << warning;
  // A warmup within the run says nothing.
  ::testing::internal::CaptureStderr();
  c = load_config(write_toml("[training]\nsteps = 100\n[lr_scheduler]\nwarmup_steps = 100\n"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  // A config changed in code is checked, not changed.
  c.lr_scheduler.warmup_steps = 101;
  EXPECT_THROW(validate(c), Error);
}

TEST(ConfigErrors, RelationsBetweenKeys) {
  Error e = load_error("[training]\nlocal_batch_size = 8\nglobal_batch_size = 20\n");
  EXPECT_HAS(e.message(), "training.global_batch_size = 20");
  EXPECT_HAS(e.message(), "not a multiple of training.local_batch_size = 8");

  e = load_error("[parallelism]\nexpert_parallel_degree = 2\n");
  EXPECT_HAS(e.message(), "needs a mixture-of-experts model");
  EXPECT_HAS(e.message(), "model.name = \"llama3\" (default)");
  EXPECT_EQ(load_config(write_toml("[model]\nname = \"deepseek_v3\"\n[parallelism]\nexpert_parallel_degree = 2\n"))
                .parallelism.expert_parallel_degree,
            2);

  e = load_error("[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 3\n");
  EXPECT_HAS(e.message(), "does not divide training.local_batch_size = 8");

  e = load_error("[checkpoint]\ninitial_load_in_hf = true\ninitial_load_model_only = false\n");
  EXPECT_HAS(e.message(), "checkpoint.initial_load_model_only = false");
  e = load_error("[checkpoint]\nlast_save_in_hf = true\nlast_save_model_only = false\n");
  EXPECT_HAS(e.message(), "checkpoint.last_save_model_only = false");
}

TEST(ConfigErrors, TomlSyntaxErrorHasLineAndColumn) {
  const Error e = load_error("[training]\nsteps = 10\nseq_len = = 3\n");
  EXPECT_HAS(e.message(), "TomlSyntaxErrorHasLineAndColumn.toml:3:");
  EXPECT_HAS(e.message(), "TOML syntax error");
  EXPECT_FALSE(e.hint().empty());
  // A key given twice is a syntax error too.
  EXPECT_HAS(load_error("[training]\nsteps = 1\nsteps = 2\n").message(), ".toml:3:");
}

TEST(ConfigErrors, MissingFile) {
  try {
    load_config("configs/no_such_config.toml");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_HAS(e.message(), "configs/no_such_config.toml does not exist");
    EXPECT_HAS(e.hint(), "configs/");
  }
  EXPECT_THROW(load_config(kConfigsDir), Error);  // a folder is not a config file
}

// ---- writing ------------------------------------------------------------------------------------

TEST(Config, RoundTripThroughToml) {
  JobConfig c;
  c.job.description = "tabs\tquotes\" backslash\\ newline\n unicode é";
  c.model.name = "deepseek_v3";
  c.model.converters = {"x", "y.z"};
  c.training.seq_len = 384;
  c.training.global_batch_size = 64;
  c.optimizer.lr = 3.0000000000000001e-4;
  c.optimizer.eps = 1e-15;
  c.optimizer.weight_decay = 0.0;
  c.lr_scheduler.warmup_steps = 7;
  c.lr_scheduler.decay_ratio = 0.1;
  c.lr_scheduler.decay_type = optim::LrDecay::cosine;
  c.parallelism.expert_parallel_degree = 8;
  c.checkpoint.keep_latest_k = 0;
  c.debug.seed = 1234567890123;
  validate(c);
  const std::string text = to_toml(c);
  EXPECT_EQ(parse_config(text, "resolved"), c);
  // Through a file and load_config, as a run folder's copy is read back.
  EXPECT_EQ(load_config(write_toml(text)), c);
  // An unset optional is left out, and reads back unset.
  c.lr_scheduler.decay_ratio.reset();
  EXPECT_EQ(parse_config(to_toml(c), "resolved"), c);
  EXPECT_HAS(to_toml(c), "# decay_ratio is unset");
}

TEST(Config, ToTomlListsEveryKey) {
  const std::string text = to_toml(JobConfig{});
  for (const auto& spec : config_schema()) {
    // Unset by default (an optional key), which the file says so.
    if (text.find("# " + std::string(spec.key) + " is unset") != std::string::npos) continue;
    EXPECT_HAS(text, std::string(spec.key) + " = ");
  }
}

TEST(Config, ValidateCatchesValuesSetInCode) {
  JobConfig c;
  c.training.seq_len = 0;
  try {
    validate(c);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_HAS(e.message(), "training.seq_len = 0");
    EXPECT_HAS(e.hint(), "set training.seq_len to 2048");
  }
}

// ---- the schema drives help and docs ------------------------------------------------------------

TEST(ConfigSchema, KeysAreUniqueAndGroupedBySection) {
  std::vector<std::string> seen;
  size_t section_index = 0;
  for (const auto& spec : config_schema()) {
    const std::string name = std::string(spec.section) + "." + std::string(spec.key);
    EXPECT_EQ(std::find(seen.begin(), seen.end(), name), seen.end()) << name;
    seen.push_back(name);
    while (section_index < config_sections().size() && config_sections()[section_index].name != spec.section)
      ++section_index;
    ASSERT_LT(section_index, config_sections().size()) << name << " is out of section order";
    EXPECT_FALSE(spec.doc.empty()) << name;
  }
}

TEST(ConfigSchema, HelpListsEveryKey) {
  const std::string help = config_help();
  for (const auto& spec : config_schema())
    EXPECT_HAS(help, "--" + std::string(spec.section) + "." + std::string(spec.key) + "=<");
}

// docs/config.md holds the generated reference between two markers. When the schema changes,
// regenerate it with: TITAN_REGENERATE_DOCS=1 build/tests/train_config_test --gtest_filter='*Docs*'
TEST(ConfigSchema, DocsMatchTheSchema) {
  const std::string begin = "<!-- BEGIN GENERATED: config_reference_markdown() -->\n";
  const std::string end = "<!-- END GENERATED -->";
  std::string docs = read_file(kDocs);
  const size_t b = docs.find(begin), e = docs.find(end);
  ASSERT_NE(b, std::string::npos) << kDocs << " lacks the marker " << begin;
  ASSERT_NE(e, std::string::npos) << kDocs << " lacks the marker " << end;
  const std::string generated = config_reference_markdown();
  if (std::getenv("TITAN_REGENERATE_DOCS")) {
    docs.replace(b + begin.size(), e - b - begin.size(), generated);
    std::ofstream(kDocs) << docs;
    return;
  }
  EXPECT_EQ(docs.substr(b + begin.size(), e - b - begin.size()), generated)
      << kDocs << " is out of date; regenerate it: "
      << "TITAN_REGENERATE_DOCS=1 build/tests/train_config_test --gtest_filter='*Docs*'";
  for (const auto& spec : config_schema())
    EXPECT_HAS(docs, "`" + std::string(spec.section) + "." + std::string(spec.key) + "`");
}

// ---- derived values -----------------------------------------------------------------------------

TEST(Config, GradientAccumulationSteps) {
  JobConfig c;
  c.training.local_batch_size = 4;
  EXPECT_EQ(gradient_accumulation_steps(c, 2), 1);  // global -1: one micro-batch per rank
  c.training.global_batch_size = 32;
  EXPECT_EQ(gradient_accumulation_steps(c, 1), 8);
  EXPECT_EQ(gradient_accumulation_steps(c, 2), 4);
  EXPECT_EQ(gradient_accumulation_steps(c, 8), 1);
  try {
    gradient_accumulation_steps(c, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_HAS(e.message(), "training.global_batch_size = 32 is not a multiple of");
    EXPECT_HAS(e.hint(), "multiple of 12");
  }
}

TEST(Config, LrScheduleFromConfig) {
  const JobConfig c = load_config(
      write_toml("[training]\nsteps = 10\n[lr_scheduler]\nwarmup_steps = 2\ndecay_ratio = 0.8\n"
                 "decay_type = \"linear\"\nmin_lr_factor = 0.0\n"));
  const optim::LrSchedule s = make_lr_schedule(c);
  EXPECT_DOUBLE_EQ(s.lr_factor(1), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_factor(3), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_factor(10), 0.125);
}
