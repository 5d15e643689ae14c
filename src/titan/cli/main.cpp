// The `titan` command: one binary, one subcommand per job.
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "titan/cli/ckpt_cli.h"
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

// OpenMP reads its binding settings once at start-up, before main can set them; unbound threads
// can land on one core (measured here: half the FLOP/s). So the binary re-executes itself once
// with OMP_PROC_BIND/OMP_PLACES set unless the user chose their own. Under a launcher the ranks
// on one host split its CPUs: each takes its share (distributed/runtime.h) unless
// OMP_NUM_THREADS or OMP_PLACES is set.
void bind_threads(char** argv) {
  if (std::getenv("TITAN_NO_REEXEC")) return;
  const titan::distributed::LaunchInfo launch = titan::distributed::launch_info();
  const bool user_threads = std::getenv("OMP_NUM_THREADS") || std::getenv("OMP_PLACES");
  if (launch.local_size > 1 && !user_threads) {
    const auto [threads, places] =
        titan::distributed::thread_share(launch, titan::distributed::allowed_cpus(), int(sysconf(_SC_NPROCESSORS_ONLN)));
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    if (!places.empty()) setenv("OMP_PLACES", places.c_str(), 1);
    setenv("OMP_PROC_BIND", "close", 1);
  } else {
    if (std::getenv("OMP_PROC_BIND")) return;
    setenv("OMP_PROC_BIND", "close", 0);
    setenv("OMP_PLACES", "cores", 0);
  }
  setenv("TITAN_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run unbound
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
  std::printf("threads: %d (OMP_PROC_BIND=%s)\n", omp_get_max_threads(),
              std::getenv("OMP_PROC_BIND") ? std::getenv("OMP_PROC_BIND") : "unset");
  const auto peak = titan::kernels::measure_machine_peak(0.3);
  std::printf("measured peak: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, memcpy %.1f GB/s\n", peak.f32_flops / 1e9,
              peak.bf16_flops / 1e9, peak.memcpy_bytes / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // `titan train`: a stop request (SIGUSR1 from `titan launch` or a batch system, Ctrl-C) during
  // start-up must not kill the rank. Held from here (the mask and a pending signal survive the
  // re-exec), recorded once the handlers are in, before MPI starts (train/stop_request.h).
  const bool training = argc >= 2 && std::strcmp(argv[1], "train") == 0;
  if (training) titan::train::hold_stop_signals();
  bind_threads(argv);
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
