#include "titan/train/checkpointing.h"

#include <cstdio>
#include <map>
#include <set>

#include "titan/checkpoint/checkpoint.h"

namespace titan::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_mtp(const std::string& n) { return n.starts_with("mtp."); }
std::string mtp_module(const std::string& n) { return n.substr(0, n.find('.', 4)); }  // "mtp.K"

std::map<std::string, const GlobalSlice*> slices_of(const std::vector<nn::TrainableParam>& params) {
  std::map<std::string, const GlobalSlice*> out;
  for (const nn::TrainableParam& p : params) out[p.name] = p.slice.global_shape.empty() ? nullptr : &p.slice;
  return out;
}

std::string joined(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

checkpoint::SaveRequest run_checkpoint_request(int64_t step, const RunParts& parts, const JobConfig& config,
                                               const json& train_state, bool model_only, DType export_dtype) {
  checkpoint::SaveRequest req;
  req.step = step;
  req.config_toml = to_toml(config);
  req.train_state = train_state;
  const bool lead = parts.world.rank() == 0;
  const auto& params = parts.data_parallel.params();
  // Each piece once: a parameter's slices by the ranks that hold them (replicas but the first
  // write none, nor do tensor-parallel ranks but the first of a parameter they all hold),
  // replicated state (buffers, step counters) by rank 0.
  std::set<std::string> duplicates;
  for (const nn::TrainableParam& p : params)
    if (p.tp_duplicate) duplicates.insert(p.name);
  // The weights and the optimizer state change only in the optimizer step: an async save reads
  // them in place (until_step), the buffers it copies when it starts.
  if (parts.data_parallel.writes_params())
    for (const nn::TrainableParam& p : params) {
      if (p.tp_duplicate) continue;
      const Tensor& v = p.var.value();
      const bool exported = model_only && export_dtype != DType::f32;
      req.tensors.push_back({"model." + p.name, exported ? v.to(export_dtype) : v, p.slice, exported, !exported});
    }
  if (parts.writes_buffers)
    for (const auto& [name, b] : parts.model.named_buffers()) req.tensors.push_back({"model." + name, b, {}});
  if (!model_only) {
    const auto slices = slices_of(params);
    // Whether this rank writes a state key, and the slice it writes.
    const auto writes = [&](const std::string& key, GlobalSlice* slice) {
      const std::string param = optim::state_key_param(key);
      if (param.empty()) return lead;
      if (!parts.data_parallel.writes_params() || duplicates.count(param)) return false;
      if (const GlobalSlice* s = slices.at(param)) *slice = *s;
      return true;
    };
    optim::SavedState state = parts.optimizer.state_for_save();
    for (const auto& [key, t] : state.in_memory)
      if (GlobalSlice slice; writes(key, &slice)) req.tensors.push_back({"optim." + key, t, slice, false, true});
    // Swapped state: streamed from the swap file into the file, its keys mapped to pieces.
    std::vector<int64_t> piece_of(state.streamed.size(), -1);
    for (size_t k = 0; k < state.streamed.size(); ++k)
      if (GlobalSlice slice; writes(state.streamed[k].first, &slice)) {
        piece_of[k] = int64_t(req.tensors.size());
        req.tensors.push_back({"optim." + state.streamed[k].first, Tensor(), slice, false, true, state.streamed[k].second});
      }
    if (state.stream)
      req.streams.push_back([stream = std::move(state.stream), piece_of](const checkpoint::StreamEmit& emit) {
        stream([&](size_t key, int64_t begin, const float* values, int64_t n) {
          if (piece_of[key] >= 0) emit(size_t(piece_of[key]), begin, values, n);
        });
      });
  }
  return req;
}

fs::path save_run_checkpoint(const fs::path& root, int64_t step, const RunParts& parts, const JobConfig& config,
                             const json& train_state, bool model_only, DType export_dtype) {
  return checkpoint::save_checkpoint(root, run_checkpoint_request(step, parts, config, train_state, model_only, export_dtype),
                                     &parts.world);
}

json load_run_checkpoint(const fs::path& folder, const RunParts& parts, const JobConfig& config, bool model_only) {
  checkpoint::CheckpointReader reader(folder);
  const std::string what = "checkpoint step " + std::to_string(reader.step());
  const bool lead = parts.world.rank() == 0;
  const auto& params = parts.data_parallel.params();
  const auto buffers = parts.model.named_buffers();
  // Statistics (nn::BufferKind) a checkpoint may lack (one from Hugging Face, or an older build):
  // zeros then. This rank's counts since the step began are zero at every save and never loaded.
  std::set<std::string> step_counts, statistics;
  for (const auto& [name, b] : parts.model.named_buffers(nn::BufferKind::step_statistic)) step_counts.insert(name);
  for (const auto& [name, b] : parts.model.named_buffers(nn::BufferKind::saved_statistic)) statistics.insert(name);
  statistics.insert(step_counts.begin(), step_counts.end());
  std::set<std::string> own, saved;
  for (const nn::TrainableParam& p : params) own.insert(p.name);
  for (const auto& [name, b] : buffers) own.insert(name);
  for (const std::string& n : reader.names())
    if (n.starts_with("model.")) saved.insert(n.substr(6));

  // MTP modules only train: those the checkpoint has beyond model.mtp_layers (DeepSeek-V3's, from
  // Hugging Face) are dropped, and those it lacks (added to a pretrained model, or one converted
  // from a folder transformers saved, which has no MTP weights) keep their init, each said in one
  // line. A module the checkpoint has only part of (e.g. a dense block where ours is MoE) is an error.
  std::set<std::string> dropped, extra, missing;
  std::map<std::string, std::vector<std::string>> mtp_missing;  // module -> its tensors the checkpoint lacks
  std::map<std::string, size_t> mtp_size;
  for (const std::string& n : saved)
    if (!own.count(n) && !(parts.other_stages && parts.other_stages->count(n)))
      (is_mtp(n) ? dropped.insert(mtp_module(n)) : extra.insert(n));
  for (const std::string& n : own) {
    if (statistics.count(n)) continue;
    if (is_mtp(n)) {
      ++mtp_size[mtp_module(n)];
      if (!saved.count(n)) mtp_missing[mtp_module(n)].push_back(n);
    } else if (!saved.count(n)) {
      missing.insert(n);
    }
  }
  TITAN_CHECK(extra.empty(), what + " (" + folder.string() + ") has tensors the model does not: " + joined(extra),
              "load a checkpoint of the same model and flavor");
  TITAN_CHECK(missing.empty(), what + " (" + folder.string() + ") lacks tensors of the model: " + joined(missing),
              "load a checkpoint of the same model and flavor");
  std::set<std::string> fresh;
  for (const auto& [module, lacking] : mtp_missing) {
    TITAN_CHECK(lacking.size() == mtp_size.at(module),
                what + " holds part of MTP module " + module + ": '" + lacking.front() + "' (and " +
                    std::to_string(lacking.size() - 1) + " more) are missing",
                "its MTP module has another architecture than model.mtp_layers builds (e.g. a dense block where "
                "ours is MoE); set model.mtp_layers = 0, or load a checkpoint of this architecture");
    fresh.insert(module);
  }
  if (lead && !fresh.empty())
    std::printf("MTP module %s: not in %s, starts from a fresh initialization (debug.seed %lld)\n", joined(fresh).c_str(),
                what.c_str(), static_cast<long long>(config.debug.seed));
  if (lead && !dropped.empty())
    std::printf("MTP module %s of %s: not loaded (model.mtp_layers = %lld)\n", joined(dropped).c_str(), what.c_str(),
                static_cast<long long>(config.model.mtp_layers));

  for (const nn::TrainableParam& p : params)
    if (saved.count(p.name)) reader.read("model." + p.name, p.var.value(), p.slice.global_shape.empty() ? nullptr : &p.slice);
  for (const auto& [name, b] : buffers)
    if (saved.count(name) && !step_counts.count(name)) reader.read("model." + name, b);
  parts.data_parallel.refresh_compute_copies();

  // A checkpoint from before optimizers had a choice was saved by AdamW.
  const std::string saved_by = model_only ? "" : checkpoint::load_train_state(folder).value("optimizer", "AdamW");
  const std::string trains_with = parts.optimizer.name();
  if (!model_only && saved_by != trains_with) {
    TITAN_CHECK(config.checkpoint.allow_optimizer_switch,
                what + " (" + folder.string() + ") holds " + saved_by + "'s optimizer state, but optimizer.name = \"" +
                    trains_with + "\"",
                "set checkpoint.allow_optimizer_switch = true to resume with " + trains_with +
                    " starting fresh (its state dropped; weights, step, data position and LR schedule carry on), or "
                    "train on with optimizer.name = \"" + saved_by + "\"");
    if (lead)
      std::printf("%s was trained with %s: its optimizer state is dropped and %s starts fresh "
                  "(checkpoint.allow_optimizer_switch = true)\n",
                  what.c_str(), saved_by.c_str(), trains_with.c_str());
  }
  if (!model_only && saved_by == trains_with) {
    const auto slices = slices_of(params);
    std::map<std::string, Tensor> state;
    for (const auto& [key, shape] : parts.optimizer.state_shapes()) {
      if (!reader.contains("optim." + key)) continue;  // load_state_dict names what is missing
      const std::string param = optim::state_key_param(key);
      if (param.empty()) {
        state[key] = reader.read_full("optim." + key);
      } else {
        Tensor dst = Tensor::empty(shape, DType::f32, MemCategory::temporaries);
        reader.read("optim." + key, dst, slices.at(param));
        state[key] = dst;
      }
    }
    parts.optimizer.load_state_dict(state, what);
  }
  json train_state = checkpoint::load_train_state(folder);
  // The step the run goes on from: the one the folder's metadata commits, nothing else.
  if (const auto it = train_state.find("step");
      it != train_state.end() && !(it->is_number_integer() && it->get<int64_t>() == reader.step()))
    throw checkpoint::CorruptCheckpoint((folder / "train_state.json").string() + ": step " + it->dump() +
                                            ", but metadata.json commits step " + std::to_string(reader.step()),
                                        "the checkpoint is damaged; load an earlier step", __FILE__, __LINE__);
  return train_state;
}

bool is_weights_only(const fs::path& folder) {
  try {
    return !checkpoint::load_train_state(folder).contains("step");
  } catch (const checkpoint::CorruptCheckpoint&) {
    return false;
  }
}

std::optional<fs::path> newest_full_checkpoint(const fs::path& root, int64_t at_most, std::vector<fs::path>* weights_only) {
  const auto all = checkpoint::committed_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->first > at_most) continue;
    if (!is_weights_only(it->second)) return it->second;
    if (weights_only) weights_only->push_back(it->second);
  }
  return std::nullopt;
}

std::string load_outcome(const std::function<void()>& load) {
  try {
    load();
    return {};
  } catch (const checkpoint::CorruptCheckpoint& e) {
    return "C" + e.message();
  } catch (const checkpoint::CheckpointIOError& e) {
    return e.missing().empty() ? "I" + e.message() : "M" + e.missing().string() + "\n" + e.message();
  } catch (const IOError& e) {
    return "I" + e.message();
  } catch (const std::exception& e) {
    return "E" + std::string(e.what());
  } catch (...) {
    return "Ean exception that is not a std::exception";
  }
}

LoadVerdict judge_load(const fs::path& folder, const std::vector<std::string>& outcomes,
                       const std::function<bool(const fs::path&)>& seen_by_some_rank) {
  LoadVerdict v;
  std::string damage, io;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    const std::string& o = outcomes[r];
    if (o.empty()) continue;
    const std::string rank = "\n  rank " + std::to_string(r) + ": ";
    if (o[0] == 'E') {
      return {LoadVerdict::Kind::failed, "loading " + folder.string() + " failed on rank " + std::to_string(r) + ": " +
                                             o.substr(1)};
    } else if (o[0] == 'C') {
      damage += rank + o.substr(1);
    } else if (o[0] == 'M') {
      const size_t nl = o.find('\n');
      if (seen_by_some_rank(o.substr(1, nl - 1)))
        io += rank + o.substr(nl + 1) + " (another rank sees the file: a stale cache here?)";
      else
        damage += rank + o.substr(nl + 1);
    } else {
      io += rank + o.substr(1);
    }
  }
  if (!io.empty())
    return {LoadVerdict::Kind::failed, "reading " + folder.string() + " failed with an I/O error, not damage; the "
                                           "checkpoint is left in place:" + io};
  if (!damage.empty()) return {LoadVerdict::Kind::damaged, damage};
  return v;
}

}  // namespace titan::train
