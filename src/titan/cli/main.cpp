// The `titan` command: one binary, one subcommand per job.
#include <omp.h>
#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "titan/cli/ckpt_cli.h"
#include "titan/cli/cpu_binding.h"
#include "titan/cli/data_cli.h"
#include "titan/cli/fr_cli.h"
#include "titan/cli/launch_cli.h"
#include "titan/cli/generate_cli.h"
#include "titan/cli/plan_cli.h"
#include "titan/cli/plot_cli.h"
#include "titan/cli/tokenizer_cli.h"
#include "titan/cli/train_cli.h"
#include "titan/core/cpu_features.h"
#include "titan/core/error.h"
#include "titan/distributed/runtime.h"
#include "titan/data/tokenizer.h"
#include "titan/kernels/cpu/isa_info.h"
#include "titan/kernels/peak.h"
#include "titan/train/machine_peak.h"
#include "titan/train/stop_request.h"

namespace {

constexpr const char* kUsage = R"(usage: titan <command> [options]

commands:
  train       train a model from a TOML config: titan train --config configs/llama3_debug.toml
  generate    sample text from a checkpoint (KV cache; temperature, top-k, top-p, seed)
  tokenizer   train / use a byte-level BPE tokenizer (Hugging Face tokenizer.json)
  data        prepare token shards from text or JSONL; inspect shards
  ckpt        convert checkpoints to and from Hugging Face folders (DeepSeek-V3)
  launch      run a training job under mpirun and restart it from its last checkpoint when a rank dies:
              titan launch -np 4 --max-restarts 3 -- train --config configs/llama3_debug.toml
  fr          analyze the flight-recorder dumps a watchdog timeout wrote: titan fr analyze DIR
  plan        a parallel plan before it runs: titan plan --pp-schedule all --pp 4 --microbatches 8
  plot        draw a run's plots (loss, speed, memory, expert load) from its metrics: titan plot RUN_DIR
  info        this machine: CPU capability in use, threads, measured peak FLOP/s and bandwidth

Run `titan <command> --help` for a command's options.
)";

// The CPUs the OpenMP threads may run on, as "0,1,5" (each thread's affinity, joined).
std::string thread_cpus() {
  std::vector<int> seen(CPU_SETSIZE, 0);
#pragma omp parallel
  for (int c : titan::distributed::allowed_cpus()) {  // this thread's
#pragma omp atomic write
    seen[size_t(c)] = 1;
  }
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (seen[size_t(c)]) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

// The data CLI tokenizes through our Tokenizer (data/ itself does not depend on it).
titan::data::Encoder make_encoder(const std::string& path) {
  auto tok = std::make_shared<titan::data::Tokenizer>(titan::data::Tokenizer::load(path));
  titan::data::Encoder e;
  e.encode = [tok](std::string_view text) { return tok->encode(text); };
  e.vocab_size = tok->vocab_size();
  TITAN_CHECK(tok->eos_id().has_value(), "tokenizer " + path + " has no end-of-sequence token",
              "documents are packed with EOS between them; train the tokenizer with an EOS special token");
  e.eos_id = *tok->eos_id();
  e.bos_id = tok->bos_id().value_or(-1);
  return e;
}

int info_main() {
  const auto isa = titan::cpu_capability();
  std::printf("cpu capability: %s (detected %s); kernels run the %s variant\n",
              std::string(titan::cpu_capability_name(isa)).c_str(),
              std::string(titan::cpu_capability_name(titan::cpu_capability_detected())).c_str(),
              TITAN_CPU_KERNEL(isa_variant_name)());
  std::printf("threads: %d (OMP_PROC_BIND=%s), on CPUs %s\n", omp_get_max_threads(),
              std::getenv("OMP_PROC_BIND") ? std::getenv("OMP_PROC_BIND") : "unset", thread_cpus().c_str());
  const titan::train::StablePeak stable = titan::train::stable_machine_peak(0.3);
  const auto& peak = stable.measured;
  std::printf("measured peak: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, memcpy %.1f GB/s\n", peak.f32_flops / 1e9,
              peak.bf16_flops / 1e9, peak.memcpy_bytes / 1e9);
  std::printf("best measured on this machine (what MFU divides by): f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s%s\n",
              stable.peak.f32_flops / 1e9, stable.peak.bf16_flops / 1e9,
              stable.cache.empty() ? "" : (", kept in " + stable.cache.string()).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `titan train`: a stop request (SIGUSR1 from `titan launch` or a batch system, Ctrl-C) during
  // start-up must not kill the rank. Held from here (the mask and a pending signal survive the
  // re-exec), recorded once the handlers are in, before MPI starts (train/stop_request.h).
  const bool training = argc >= 2 && std::strcmp(argv[1], "train") == 0;
  if (training) titan::train::hold_stop_signals();
  titan::cli::bind_threads(argv);
  if (training) titan::train::install_stop_handlers();
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view cmd = argv[1];
  // A job of several ranks ends together: a rank that fails takes the others down (they would
  // otherwise wait in their next collective until the watchdog's timeout).
  auto finish = [](int code) {
    titan::distributed::CommEngine& engine = titan::distributed::CommEngine::get();
    if (code != 0 && engine.uses_mpi() && engine.world_size() > 1) engine.abort(code);
    titan::distributed::shutdown_runtime();
    return code;
  };
  try {
    if (cmd == "info") return info_main();
    // Each subcommand reads argv from its own name on.
    if (cmd == "train") return finish(titan::cli::train_main(argc - 1, argv + 1));
    if (cmd == "generate") return titan::cli::generate_main(argc - 1, argv + 1);
    if (cmd == "tokenizer") return titan::cli::tokenizer_main(argc - 1, argv + 1);
    if (cmd == "ckpt") return titan::cli::ckpt_main(argc - 1, argv + 1);
    if (cmd == "data") return titan::cli::data_main(argc - 1, argv + 1, make_encoder);
    if (cmd == "launch") return titan::cli::launch_main(argc - 1, argv + 1);
    if (cmd == "fr") return titan::cli::fr_main(argc - 1, argv + 1);
    if (cmd == "plan") return titan::cli::plan_main(argc - 1, argv + 1);
    if (cmd == "plot") return titan::cli::plot_main(argc - 1, argv + 1);
    std::fprintf(stderr, "titan: unknown command '%s'\n\n%s", argv[1], kUsage);
    return 2;
  } catch (const std::exception& e) {
    // titan::Error says what failed and how to fix it; anything else (a filesystem_error, JSON's,
    // bad_alloc) is named by its type's own message, never left to std::terminate.
    const bool ours = dynamic_cast<const titan::Error*>(&e) != nullptr;
    const std::string what = ours ? e.what() : std::string(e.what()) + (dynamic_cast<const std::bad_alloc*>(&e)
                                                                           ? " (out of memory)"
                                                                           : " (an unexpected error)");
    const auto& engine = titan::distributed::CommEngine::get();
    if (engine.world_size() > 1)
      std::fprintf(stderr, "titan %s: rank %d: error: %s\n", argv[1], engine.world_rank(), what.c_str());
    else std::fprintf(stderr, "titan %s: error: %s\n", argv[1], what.c_str());
    return finish(1);
  }
}
