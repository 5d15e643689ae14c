#include "titan/train/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <sstream>
#include <toml++/toml.h>

#include "titan/core/error.h"
#include "titan/distributed/runtime.h"
#include "titan/models/family.h"

namespace titan::train {
namespace {

// ---- schema construction helpers ----------------------------------------------------------------

template <NamedEnum E>
EnumRef enum_ref(E* field) {
  return EnumRef{field, [](const void* f) { return name_of(*static_cast<const E*>(f)); },
                 [](void* f, std::string_view name) {
                   const std::optional<E> value = enum_named<E>(name);
                   if (value) *static_cast<E*>(f) = *value;
                   return value.has_value();
                 }};
}

template <auto Section, auto Member>
FieldRef member(JobConfig& c) {
  auto* field = &((c.*Section).*Member);
  if constexpr (std::is_enum_v<std::remove_pointer_t<decltype(field)>>)
    return enum_ref(field);
  else
    return field;
}

Rule at_least(double v) {
  Rule r;
  r.min = v;
  return r;
}
Rule greater_than(double v) {
  Rule r = at_least(v);
  r.min_open = true;
  return r;
}
Rule closed_interval(double lo, double hi) {
  Rule r = at_least(lo);
  r.max = hi;
  return r;
}
Rule half_open_interval(double lo, double hi) {
  Rule r = closed_interval(lo, hi);
  r.max_open = true;
  return r;
}
Rule open_interval(double lo, double hi) {
  Rule r = half_open_interval(lo, hi);
  r.min_open = true;
  return r;
}
Rule or_sentinel(Rule r, int64_t sentinel) {
  r.sentinel = sentinel;
  return r;
}
// The registered model families' names (models/family.h), kept for the rule's views.
Rule one_of_models() {
  static const std::vector<std::string> names = models::model_names();
  Rule r;
  for (const std::string& n : names) r.choices.push_back(n);
  return r;
}
// An enum-valued key that takes every value of its enum, in the order of its names table.
template <NamedEnum E>
Rule one_of() {
  Rule r;
  r.choices = enum_name_list<E>();
  return r;
}
// An enum-valued key that takes only `values` (e.g. the element types training supports).
template <NamedEnum E>
Rule one_of(std::initializer_list<E> values) {
  Rule r;
  for (const E v : values) r.choices.push_back(name_of(v));
  return r;
}
Rule choices(std::initializer_list<std::string_view> names) {
  Rule r;
  r.choices = names;
  return r;
}
Rule non_empty() {
  Rule r;
  r.non_empty = true;
  return r;
}
Rule anything() { return Rule{}; }

// Sections and keys TorchTitan has that titan.cpp deliberately does not: a TorchTitan config
// that carries them gets the reason instead of a bare "unknown key".
struct NotCarried {
  std::string_view name;  // "section" or "section.key"
  std::string_view reason;
};
const std::vector<NotCarried>& torchtitan_only() {
  static const std::vector<NotCarried> table = {
      {"compile", "titan.cpp is compiled ahead of time; there is no torch.compile step to configure"},
      {"experimental", "it imports Python modules, and titan.cpp has none"},
      {"job.custom_config_module", "it extends the config with a Python dataclass, and titan.cpp has none"},
      {"metrics.enable_wandb", "titan.cpp writes metrics to {job.dump_folder}/{metrics.jsonl_file}; "
                               "use metrics.enable_jsonl"},
      {"training.gc_freq", "it schedules Python's garbage collector, and titan.cpp has none"},
      {"training.gc_debug", "it debugs Python's garbage collector, and titan.cpp has none"},
      {"training.mixed_precision_reduce", "titan.cpp names it training.gradient_sync_dtype"},
      {"optimizer.implementation", "titan.cpp has one optimizer implementation per device"},
      {"comm.train_timeout_seconds", "titan.cpp names it comm.timeout_seconds"},
  };
  return table;
}

const NotCarried* find_torchtitan_only(std::string_view name) {
  for (const auto& n : torchtitan_only())
    if (n.name == name) return &n;
  return nullptr;
}

// ---- value helpers ------------------------------------------------------------------------------

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

std::string full_name(const KeySpec& spec) { return fmt::format("{}.{}", spec.section, spec.key); }

// Shortest text that reads back to the same double, with a '.' or an exponent so that TOML reads
// it as a float (nan and inf are TOML floats as they are).
std::string format_number(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

// A TOML basic string: quotes, backslashes and control characters escaped.
std::string quote(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
        else
          out += ch;
    }
  }
  return out + "\"";
}

// The value as TOML writes it; an unset optional has no TOML form and reads "unset".
std::string format_value(FieldRef ref) {
  return std::visit(overloaded{
                        [](int64_t* p) { return std::to_string(*p); },
                        [](double* p) { return format_number(*p); },
                        [](bool* p) { return std::string(*p ? "true" : "false"); },
                        [](std::string* p) { return quote(*p); },
                        [](std::vector<std::string>* p) {
                          std::string s = "[";
                          for (size_t i = 0; i < p->size(); ++i) s += (i ? ", " : "") + quote((*p)[i]);
                          return s + "]";
                        },
                        [](std::optional<double>* p) { return *p ? format_number(**p) : std::string("unset"); },
                        [](const EnumRef& e) { return quote(e.name(e.field)); },
                    },
                    ref);
}

std::string type_name(FieldRef ref) {
  return std::visit(overloaded{
                        [](int64_t*) { return "integer"; },
                        [](double*) { return "number"; },
                        [](bool*) { return "boolean"; },
                        [](std::string*) { return "string"; },
                        [](std::vector<std::string>*) { return "list of strings"; },
                        [](std::optional<double>*) { return "number (optional)"; },
                        [](const EnumRef&) { return "string"; },  // as TOML and the command line spell it
                    },
                    ref);
}

// The default value of a key, as TOML text.
std::string default_text(const KeySpec& spec) {
  JobConfig defaults;
  return format_value(spec.field(defaults));
}

// A value to show in "write it like this" hints: the default, or for an unset optional the
// middle of its range.
std::string example_text(const KeySpec& spec) {
  JobConfig defaults;
  const FieldRef ref = spec.field(defaults);
  if (auto* opt = std::get_if<std::optional<double>*>(&ref); opt && !**opt)
    return format_number(spec.rule.min && spec.rule.max ? (*spec.rule.min + *spec.rule.max) / 2 : 1.0);
  return format_value(ref);
}

std::string join(const std::vector<std::string_view>& items, std::string_view sep) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? std::string(sep) : "") + std::string(items[i]);
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// Whether a typo of `typed` could plausibly be `distance` edits away from what was meant.
bool close_enough(std::string_view typed, size_t distance) {
  return distance <= std::max<size_t>(2, typed.size() / 3);
}

const SectionSpec* find_section(std::string_view name) {
  for (const auto& s : config_sections())
    if (s.name == name) return &s;
  return nullptr;
}

const KeySpec* find_key(std::string_view section, std::string_view key) {
  for (const auto& spec : config_schema())
    if (spec.section == section && spec.key == key) return &spec;
  return nullptr;
}

// The known key closest to section.key: the same name in another section costs one edit, so a
// key put in the wrong section (training.lr) finds its home (optimizer.lr).
const KeySpec* closest_key(std::string_view section, std::string_view key) {
  const KeySpec* best = nullptr;
  size_t best_distance = SIZE_MAX;
  for (const auto& spec : config_schema()) {
    const size_t d = edit_distance(key, spec.key) + (spec.section == section ? 0 : 1);
    if (d < best_distance) best = &spec, best_distance = d;
  }
  return close_enough(key, best_distance) ? best : nullptr;
}

const SectionSpec* closest_section(std::string_view name) {
  const SectionSpec* best = nullptr;
  size_t best_distance = SIZE_MAX;
  for (const auto& s : config_sections()) {
    const size_t d = edit_distance(name, s.name);
    if (d < best_distance) best = &s, best_distance = d;
  }
  return close_enough(name, best_distance) ? best : nullptr;
}

std::string keys_of_section(std::string_view section) {
  std::vector<std::string_view> keys;
  for (const auto& spec : config_schema())
    if (spec.section == section) keys.push_back(spec.key);
  return join(keys, ", ");
}

// ---- where a value came from --------------------------------------------------------------------

// Every message names the config file; values set in it add line:column, values from an
// override name the override, so the user knows which of the two to edit.
struct Origin {
  std::string where;  // "configs/x.toml:12:5" or "--training.steps=5"
  bool is_override = false;
};

struct Context {
  std::string source;                     // the config file (empty: a JobConfig built in code)
  std::map<std::string, Origin> origins;  // "section.key" -> where it was last set
  // "section.key" -> a string its enum has no value for, as last set. Validation reports it, so
  // that a bad value a later override replaces is no error, and errors come in schema order.
  std::map<std::string, std::string> unknown_choices;

  std::string file() const { return source.empty() ? std::string("config") : "config " + source; }

  // The place to blame for the key's current value.
  std::string locate(const KeySpec& spec) const {
    const auto it = origins.find(full_name(spec));
    if (it == origins.end()) return file();
    if (it->second.is_override) return fmt::format("{}, override {}", file(), it->second.where);
    return it->second.where;
  }

  // "training.steps = 5 (from --training.steps=5)", for messages that involve several keys.
  std::string describe(const KeySpec& spec, FieldRef ref) const {
    std::string s = fmt::format("{} = {}", full_name(spec), format_value(ref));
    if (source.empty()) return s;
    const auto it = origins.find(full_name(spec));
    if (it == origins.end()) return s + " (default)";
    return s + fmt::format(" ({} {})", it->second.is_override ? "from" : "at", it->second.where);
  }

  // How to give the key another value, in the form the user used for it.
  std::string how_to_set(const KeySpec& spec, std::string_view value) const {
    const auto it = origins.find(full_name(spec));
    if (it != origins.end() && it->second.is_override)
      return fmt::format("pass --{}={}", full_name(spec), value);
    if (source.empty()) return fmt::format("set {} to {}", full_name(spec), value);
    return fmt::format("set `{} = {}` under [{}] in {}", spec.key, value, spec.section, source);
  }
};

// `shown`: the key's value as TOML writes it.
[[noreturn]] void fail_value(const Context& ctx, const KeySpec& spec, const std::string& shown,
                             std::string_view problem, std::string hint) {
  TITAN_FAIL(fmt::format("{}: {} = {} {}", ctx.locate(spec), full_name(spec), shown, problem), std::move(hint));
}

// ---- reading values -----------------------------------------------------------------------------

std::string node_description(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "the string " + quote(node.as_string()->get());
    case toml::node_type::integer: return "the integer " + std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point: return "the number " + format_number(node.as_floating_point()->get());
    case toml::node_type::boolean: return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

std::string location(const std::string& source, const toml::source_region& region) {
  return fmt::format("{}:{}:{}", source, region.begin.line, region.begin.column);
}

[[noreturn]] void fail_type(const Context& ctx, const KeySpec& spec, const std::string& where,
                            const std::string& got) {
  TITAN_FAIL(fmt::format("{}: {} must be {}, got {}", where, full_name(spec), accepted_values(spec), got),
             fmt::format("write it like `{} = {}` under [{}] in {}", spec.key, example_text(spec), spec.section,
                         ctx.source));
}

// An enum-valued key set to `text`: its value, or, when no value has that name, the text kept
// for validation to report.
void set_choice(Context& ctx, const KeySpec& spec, const EnumRef& e, std::string_view text) {
  if (e.assign(e.field, text))
    ctx.unknown_choices.erase(full_name(spec));
  else
    ctx.unknown_choices[full_name(spec)] = std::string(text);
}

void set_from_toml(Context& ctx, const KeySpec& spec, FieldRef ref, const toml::node& node,
                   const std::string& where) {
  auto wrong_type = [&](const std::string& got) { fail_type(ctx, spec, where, got); };
  std::visit(overloaded{
                 [&](int64_t* p) {
                   if (auto v = node.as_integer()) *p = v->get();
                   else wrong_type(node_description(node));
                 },
                 [&](double* p) {
                   // An integer is a fine number: `lr = 1` means 1.0.
                   if (auto v = node.as_floating_point()) *p = v->get();
                   else if (auto i = node.as_integer()) *p = double(i->get());
                   else wrong_type(node_description(node));
                 },
                 [&](bool* p) {
                   if (auto v = node.as_boolean()) *p = v->get();
                   else wrong_type(node_description(node));
                 },
                 [&](std::string* p) {
                   if (auto v = node.as_string()) *p = v->get();
                   else wrong_type(node_description(node));
                 },
                 [&](std::vector<std::string>* p) {
                   const toml::array* array = node.as_array();
                   if (!array) return wrong_type(node_description(node));
                   std::vector<std::string> items;
                   for (const toml::node& item : *array) {
                     if (!item.is_string()) return wrong_type("an array holding " + node_description(item));
                     items.push_back(item.as_string()->get());
                   }
                   *p = std::move(items);
                 },
                 [&](std::optional<double>* p) {
                   if (auto v = node.as_floating_point()) *p = v->get();
                   else if (auto i = node.as_integer()) *p = double(i->get());
                   else wrong_type(node_description(node));
                 },
                 [&](const EnumRef& e) {
                   if (auto v = node.as_string()) set_choice(ctx, spec, e, v->get());
                   else wrong_type(node_description(node));
                 },
             },
             ref);
}

std::optional<int64_t> parse_int(std::string_view text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<double> parse_double(std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Sets the key from command-line text: the same types as TOML, lists comma-separated.
void set_from_text(Context& ctx, const KeySpec& spec, FieldRef ref, std::string_view text,
                   const std::string& override_text) {
  auto wrong_type = [&] {
    TITAN_FAIL(fmt::format("{}, override {}: {} must be {}, got '{}'", ctx.file(), override_text,
                           full_name(spec), accepted_values(spec), text),
               fmt::format("pass it like --{}={}", full_name(spec), example_text(spec)));
  };
  std::visit(overloaded{
                 [&](int64_t* p) {
                   if (auto v = parse_int(text)) *p = *v;
                   else wrong_type();
                 },
                 [&](double* p) {
                   if (auto v = parse_double(text)) *p = *v;
                   else wrong_type();
                 },
                 [&](bool* p) {
                   const std::string t = lower(text);
                   if (t == "true") *p = true;
                   else if (t == "false") *p = false;
                   else wrong_type();
                 },
                 [&](std::string* p) { *p = std::string(text); },
                 [&](std::vector<std::string>* p) {
                   std::vector<std::string> items;
                   std::string_view rest = text;
                   while (!rest.empty()) {
                     const size_t comma = rest.find(',');
                     const std::string_view item = trim(rest.substr(0, comma));
                     if (!item.empty()) items.emplace_back(item);
                     rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
                   }
                   *p = std::move(items);
                 },
                 [&](std::optional<double>* p) {
                   if (lower(text) == "none") p->reset();
                   else if (auto v = parse_double(text)) *p = *v;
                   else wrong_type();
                 },
                 [&](const EnumRef& e) { set_choice(ctx, spec, e, text); },
             },
             ref);
}

// ---- validation ---------------------------------------------------------------------------------

bool in_range(const Rule& rule, double v) {
  if (rule.min && (rule.min_open ? v <= *rule.min : v < *rule.min)) return false;
  if (rule.max && (rule.max_open ? v >= *rule.max : v > *rule.max)) return false;
  return true;
}

// The accepted choice `value` was probably meant as (case or a small typo), for the hint.
std::string_view closest_choice(const Rule& rule, std::string_view value) {
  std::string_view best;
  size_t best_distance = SIZE_MAX;
  for (const auto c : rule.choices) {
    const size_t d = lower(c) == lower(value) ? 0 : edit_distance(value, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return close_enough(value, best_distance) ? best : std::string_view();
}

// `value` against the key's rule; `shown` is how the message shows the key's value (the whole
// list for a list element).
void check_string(const Context& ctx, const KeySpec& spec, std::string_view value, const std::string& shown) {
  const Rule& rule = spec.rule;
  if (rule.non_empty && value.empty())
    fail_value(ctx, spec, shown, "is not accepted; it must be " + accepted_values(spec),
               ctx.how_to_set(spec, example_text(spec)));
  if (rule.choices.empty() || std::find(rule.choices.begin(), rule.choices.end(), value) != rule.choices.end())
    return;
  const std::string_view guess = closest_choice(rule, value);
  const std::string fix = ctx.how_to_set(spec, quote(guess.empty() ? rule.choices.front() : guess));
  fail_value(ctx, spec, shown, fmt::format("is not accepted; it must be {}", accepted_values(spec)),
             guess.empty() ? fix : fmt::format("did you mean \"{}\"? {}", guess, fix));
}

// An enum-valued key: a name its enum lacks, as the config spelled it, or a value (set in code)
// outside the key's choices, is refused as a string outside the choices would be.
void check_choice(const Context& ctx, const KeySpec& spec, const EnumRef& e) {
  const auto unknown = ctx.unknown_choices.find(full_name(spec));
  const std::string_view value = unknown != ctx.unknown_choices.end() ? unknown->second : e.name(e.field);
  check_string(ctx, spec, value, quote(value));
}

void check_key(const Context& ctx, const KeySpec& spec, JobConfig& config) {
  const FieldRef ref = spec.field(config);
  const Rule& rule = spec.rule;
  auto out_of_range = [&] {
    fail_value(ctx, spec, format_value(ref), "is not accepted; it must be " + accepted_values(spec),
               ctx.how_to_set(spec, example_text(spec)));
  };
  auto check_number = [&](double v) {
    if (!std::isfinite(v) || !in_range(rule, v)) out_of_range();
  };
  std::visit(overloaded{
                 [&](int64_t* p) {
                   if (!(rule.sentinel && *p == *rule.sentinel) && !in_range(rule, double(*p))) out_of_range();
                 },
                 [&](double* p) { check_number(*p); },
                 [&](bool*) {},
                 [&](std::string* p) { check_string(ctx, spec, *p, format_value(ref)); },
                 [&](std::vector<std::string>* p) {
                   for (const auto& item : *p) check_string(ctx, spec, item, format_value(ref));
                 },
                 [&](std::optional<double>* p) {
                   if (*p) check_number(**p);
                 },
                 [&](const EnumRef& e) { check_choice(ctx, spec, e); },
             },
             ref);
}

// Constraints that involve more than one key. Each message shows every key involved with the
// place its value came from.
void check_relations(const Context& ctx, JobConfig& c) {
  auto spec = [](std::string_view section, std::string_view key) -> const KeySpec& { return *find_key(section, key); };
  auto show = [&](const KeySpec& s) { return ctx.describe(s, s.field(c)); };
  auto fail = [&](const KeySpec& primary, const std::string& problem, const std::string& hint) {
    TITAN_FAIL(fmt::format("{}: {}", ctx.locate(primary), problem), hint);
  };

  const KeySpec& warmup = spec("lr_scheduler", "warmup_steps");
  const KeySpec& steps = spec("training", "steps");
  if (c.lr_scheduler.warmup_steps > c.training.steps)
    fail(warmup, fmt::format("{} is longer than the run: {}", show(warmup), show(steps)),
         fmt::format("lower lr_scheduler.warmup_steps to at most {}, or raise training.steps", c.training.steps));

  const KeySpec& global = spec("training", "global_batch_size");
  const KeySpec& local = spec("training", "local_batch_size");
  if (c.training.global_batch_size != -1 && c.training.global_batch_size % c.training.local_batch_size != 0)
    fail(global, fmt::format("{} is not a multiple of {}", show(global), show(local)),
         fmt::format("set training.global_batch_size to a multiple of {} (the quotient, divided by the "
                     "data-parallel degree, is the number of gradient-accumulation steps), or -1",
                     c.training.local_batch_size));

  const KeySpec& micro = spec("parallelism", "pipeline_parallel_microbatch_size");
  if (c.parallelism.pipeline_parallel_degree > 1 &&
      c.training.local_batch_size % c.parallelism.pipeline_parallel_microbatch_size != 0)
    fail(micro, fmt::format("{} does not divide {}", show(micro), show(local)),
         "pipeline micro-batches split the local batch; pick a pipeline_parallel_microbatch_size that divides "
         "training.local_batch_size");

  const KeySpec& ep = spec("parallelism", "expert_parallel_degree");
  const KeySpec& name = spec("model", "name");
  if (c.parallelism.expert_parallel_degree > 1 && !models::model_family(c.model.name).routed_experts) {
    std::string moe;
    for (const models::ModelFamily* f : models::model_families())
      if (f->routed_experts) moe += (moe.empty() ? "" : " / ") + f->name;
    fail(ep, fmt::format("{} needs a mixture-of-experts model, but {} is dense", show(ep), show(name)),
         "set parallelism.expert_parallel_degree = 1, or train " + moe);
  }

  // Quantized training runs under data parallelism (FSDP, HSDP, DDP) only: tensor parallelism would
  // cut weight blocks and context parallelism the token tiles of the weight-gradient GEMMs, and
  // neither path is built or tested with the recipes.
  const KeySpec& converters = spec("model", "converters");
  const bool quantized = std::any_of(c.model.converters.begin(), c.model.converters.end(),
                                     [](const std::string& n) { return n.rfind("quantize.", 0) == 0; });
  for (const char* key : {"tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                          "pipeline_parallel_degree"}) {
    const KeySpec& degree = spec("parallelism", key);
    if (quantized && std::get<int64_t*>(degree.field(c))[0] > 1)
      fail(degree, fmt::format("{} with a quantization converter ({})", show(degree), show(converters)),
           fmt::format("quantized training runs under data parallelism only: set parallelism.{} = 1, or drop "
                       "the quantize.* converters (docs/precision.md)", key));
  }

  // FP8 all-gather: needs the FP8 blockwise linears it gathers, and FSDP to gather them.
  const KeySpec& fp8_gather = spec("quantize.linear.float8", "enable_fsdp_float8_all_gather");
  const bool linear_f8 = std::find(c.model.converters.begin(), c.model.converters.end(), "quantize.linear.float8") !=
                         c.model.converters.end();
  if (c.quantize_linear_float8.enable_fsdp_float8_all_gather && !linear_f8)
    fail(fp8_gather, fmt::format("{} without FP8 blockwise linears ({})", show(fp8_gather), show(converters)),
         "add \"quantize.linear.float8\" (recipe_name = \"blockwise\") to [model] converters, or set "
         "quantize.linear.float8.enable_fsdp_float8_all_gather = false (MX recipes gather bf16: docs/precision.md)");
  const KeySpec& shard_degree = spec("parallelism", "data_parallel_shard_degree");
  if (c.quantize_linear_float8.enable_fsdp_float8_all_gather && c.parallelism.data_parallel_shard_degree == 1)
    fail(fp8_gather, fmt::format("{} without FSDP ({})", show(fp8_gather), show(shard_degree)),
         "shard the parameters (parallelism.data_parallel_shard_degree > 1 or -1), or set "
         "quantize.linear.float8.enable_fsdp_float8_all_gather = false: it changes only what FSDP's all-gathers send");

  // The weight-gradient GEMMs quantize tokens in tiles of 128 (FP8) or blocks of 32 (MX) along the
  // batch: a tile must not straddle two sequences, or its scale would depend on how sequences are
  // split over data-parallel ranks and micro-batches (and FSDP would not reproduce one rank).
  const KeySpec& seq_len = spec("training", "seq_len");
  if (quantized && c.training.seq_len % 128 != 0)
    fail(seq_len, fmt::format("{} with a quantization converter ({})", show(seq_len), show(converters)),
         "set training.seq_len to a multiple of 128: the quantized weight-gradient GEMMs' token tiles (128 for "
         "FP8, 32 for MX) must not straddle sequences, so that the scales do not depend on the data split");

  const KeySpec& scale_min = spec("training", "loss_scale_min");
  const KeySpec& scale_init = spec("training", "loss_scale_init");
  if (c.training.scales_loss() && c.training.loss_scale_min > c.training.loss_scale_init)
    fail(scale_min, fmt::format("{} is above {}", show(scale_min), show(scale_init)),
         "the scale starts at loss_scale_init and backs off to loss_scale_min: set loss_scale_min <= loss_scale_init");

  const KeySpec& mp = spec("training", "mixed_precision_param");
  if (c.training.mixed_precision_param == DType::f16 && !models::model_family(c.model.name).fp16) {
    std::string with;  // the families that train in fp16
    for (const models::ModelFamily* f : models::model_families())
      if (f->fp16) with += (with.empty() ? "" : ", ") + f->name;
    fail(mp, fmt::format("{} is not built for {} (it is for: {})", show(mp), show(name), with),
         "set training.mixed_precision_param = \"bfloat16\" (or \"float32\") for this model");
  }
  if (c.training.mixed_precision_param == DType::f16 && c.parallelism.enable_async_tensor_parallel)
    fail(mp, fmt::format("{} does not combine with parallelism.enable_async_tensor_parallel", show(mp)),
         "set parallelism.enable_async_tensor_parallel = false, or mixed_precision_param = \"bfloat16\"");

  const KeySpec& hf_load = spec("checkpoint", "initial_load_in_hf");
  const KeySpec& model_only_load = spec("checkpoint", "initial_load_model_only");
  if (c.checkpoint.initial_load_in_hf && !c.checkpoint.initial_load_model_only)
    fail(hf_load, fmt::format("{} needs model-only loading, but {}", show(hf_load), show(model_only_load)),
         "a Hugging Face checkpoint holds weights only; set checkpoint.initial_load_model_only = true");

  const KeySpec& hf_save = spec("checkpoint", "last_save_in_hf");
  const KeySpec& model_only_save = spec("checkpoint", "last_save_model_only");
  if (c.checkpoint.last_save_in_hf && !c.checkpoint.last_save_model_only)
    fail(hf_save, fmt::format("{} needs a model-only last save, but {}", show(hf_save), show(model_only_save)),
         "a Hugging Face checkpoint holds weights only; set checkpoint.last_save_model_only = true");
}

// A smoke run (--training.steps=2) with the config's long warmup: the warmup shrinks to the
// run, with one warning naming both keys and where their values came from.
void clamp_warmup(const Context& ctx, JobConfig& c) {
  if (c.lr_scheduler.warmup_steps <= c.training.steps) return;
  const KeySpec& warmup = *find_key("lr_scheduler", "warmup_steps");
  const KeySpec& steps = *find_key("training", "steps");
  if (distributed::launch_info().rank == 0)  // every rank parses the config; one says so
    fmt::print(stderr, "warning: {} is longer than the run ({}); warming up over all {} steps instead\n",
               ctx.describe(warmup, warmup.field(c)), ctx.describe(steps, steps.field(c)), c.training.steps);
  c.lr_scheduler.warmup_steps = c.training.steps;
}

void validate_in(const Context& ctx, JobConfig& config) {
  for (const auto& spec : config_schema()) check_key(ctx, spec, config);
  check_relations(ctx, config);
}

// ---- applying a TOML document and overrides ------------------------------------------------------

[[noreturn]] void fail_unknown_key(const Context& ctx, const std::string& where, std::string_view section,
                                   std::string_view key, bool from_override) {
  const std::string name = fmt::format("{}.{}", section, key);
  if (const NotCarried* n = find_torchtitan_only(name))
    TITAN_FAIL(fmt::format("{}: {} is a TorchTitan key that titan.cpp does not take: {}", where, name, n->reason),
               from_override ? std::string("drop the override")
                             : fmt::format("remove {} from the [{}] section", key, section));
  if (const KeySpec* guess = closest_key(section, key)) {
    if (from_override)
      TITAN_FAIL(fmt::format("{}: unknown key {}", where, name),
                 fmt::format("did you mean --{}=...?", full_name(*guess)));
    TITAN_FAIL(fmt::format("{}: unknown key {}", where, name),
               fmt::format("did you mean {}? (write `{} = ...` under [{}] in {})", full_name(*guess), guess->key,
                           guess->section, ctx.source));
  }
  TITAN_FAIL(fmt::format("{}: unknown key {}", where, name),
             fmt::format("[{}] takes: {}", section, keys_of_section(section)));
}

[[noreturn]] void fail_unknown_section(const std::string& where, std::string_view section) {
  if (const NotCarried* n = find_torchtitan_only(section))
    TITAN_FAIL(fmt::format("{}: [{}] is a TorchTitan section that titan.cpp does not take: {}", where, section,
                           n->reason),
               fmt::format("remove the [{}] table", section));
  std::vector<std::string_view> names;
  for (const auto& s : config_sections()) names.push_back(s.name);
  const SectionSpec* guess = closest_section(section);
  TITAN_FAIL(fmt::format("{}: unknown section [{}]", where, section),
             guess ? fmt::format("did you mean [{}]?", guess->name)
                   : fmt::format("the sections are: {}", join(names, ", ")));
}

// The section that holds a key of this name, for a key written before any [section] header.
const KeySpec* section_holding(std::string_view key) {
  for (const auto& spec : config_schema())
    if (spec.key == key) return &spec;
  return nullptr;
}

// Whether some section's name is `prefix` followed by a dot: TOML reads [quantize.linear.float8]
// as table quantize holding linear holding float8.
bool is_section_prefix(std::string_view prefix) {
  for (const auto& s : config_sections())
    if (s.name.size() > prefix.size() && s.name.substr(0, prefix.size()) == prefix && s.name[prefix.size()] == '.')
      return true;
  return false;
}

// The keys of [section] (a dotted one arrives as nested tables and is walked down to its leaves).
void apply_section(Context& ctx, JobConfig& config, const std::string& section, const toml::table& table,
                   const std::string& where) {
  if (!find_section(section) && is_section_prefix(section)) {
    for (auto&& [key, node] : table) {
      const std::string name = section + "." + std::string(key.str());
      const toml::table* sub = node.as_table();
      if (!sub || (!find_section(name) && !is_section_prefix(name)))
        fail_unknown_section(location(ctx.source, key.source()), name);
      apply_section(ctx, config, name, *sub, location(ctx.source, key.source()));
    }
    return;
  }
  if (!find_section(section)) fail_unknown_section(where, section);
  for (auto&& [key, node] : table) {
    const std::string key_where = location(ctx.source, key.source());
    const KeySpec* spec = find_key(section, key.str());
    if (!spec) fail_unknown_key(ctx, key_where, section, key.str(), false);
    set_from_toml(ctx, *spec, spec->field(config), node, location(ctx.source, node.source()));
    ctx.origins[full_name(*spec)] = Origin{location(ctx.source, node.source()), false};
  }
}

void apply_toml(Context& ctx, JobConfig& config, std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, ctx.source);
  } catch (const toml::parse_error& e) {
    TITAN_FAIL(fmt::format("{}: TOML syntax error: {}", location(ctx.source, e.source()), e.description()),
               "fix the TOML at that line and column (https://toml.io/en/v1.0.0 has the syntax)");
  }
  for (auto&& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const std::string where = location(ctx.source, section_key.source());
    const toml::table* table = section_node.as_table();
    if (!table) {
      if (find_section(section))
        TITAN_FAIL(fmt::format("{}: {} must be a table of keys, got {}", where, section,
                               node_description(section_node)),
                   fmt::format("write the [{}] header and its keys below it", section));
      const KeySpec* home = section_holding(section);
      TITAN_FAIL(fmt::format("{}: key {} is outside any section", where, section),
                 home ? fmt::format("move it under a [{}] header", home->section)
                      : "every key belongs under a [section] header; docs/config.md lists them");
    }
    apply_section(ctx, config, section, *table, where);
  }
}

bool is_flag(std::string_view arg) { return arg.size() > 2 && arg.substr(0, 2) == "--"; }

void apply_overrides(Context& ctx, JobConfig& config, const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    TITAN_CHECK(is_flag(arg), fmt::format("{}: override '{}' is not of the form --section.key=value", ctx.file(), arg),
                "write overrides like --training.steps=100 or --training.steps 100");
    const std::string_view body = std::string_view(arg).substr(2);
    const size_t eq = body.find('=');
    const std::string_view name = body.substr(0, eq);
    const size_t dot = name.rfind('.');  // the key follows the last dot: --quantize.linear.mx.recipe_name
    if (dot == std::string_view::npos) {
      const KeySpec* home = section_holding(name);
      TITAN_FAIL(fmt::format("{}: override {} does not name a section.key", ctx.file(), arg),
                 home ? fmt::format("did you mean --{}?", full_name(*home))
                      : "write overrides like --training.steps=100; docs/config.md lists every key");
    }
    const std::string_view section = name.substr(0, dot), key = name.substr(dot + 1);
    const std::string where = fmt::format("{}, override {}", ctx.file(), arg);
    if (!find_section(section)) fail_unknown_section(where, section);
    const KeySpec* spec = find_key(section, key);
    if (!spec) fail_unknown_key(ctx, where, section, key, true);
    const FieldRef ref = spec->field(config);

    std::string value, shown = arg;
    if (eq != std::string_view::npos) {
      value = std::string(body.substr(eq + 1));
    } else if (i + 1 < args.size() && !is_flag(args[i + 1])) {
      value = args[++i];
      shown = fmt::format("{} {}", arg, value);
    } else {
      // A bare boolean flag turns the key on, as TorchTitan's command line does.
      TITAN_CHECK(std::holds_alternative<bool*>(ref), fmt::format("{}: override {} has no value", ctx.file(), arg),
                  fmt::format("pass it like --{}={}", full_name(*spec), example_text(*spec)));
      value = "true";
    }
    set_from_text(ctx, *spec, ref, value, shown);
    ctx.origins[full_name(*spec)] = Origin{shown, true};
  }
}

std::string range_text(const Rule& rule) {
  if (rule.min && rule.max)
    return fmt::format("in {}{}, {}{}", rule.min_open ? "(" : "[", *rule.min, *rule.max, rule.max_open ? ")" : "]");
  if (rule.min) return fmt::format("{} {}", rule.min_open ? ">" : ">=", *rule.min);
  if (rule.max) return fmt::format("{} {}", rule.max_open ? "<" : "<=", *rule.max);
  return "";
}

}  // namespace

// ---- the schema ---------------------------------------------------------------------------------

const std::vector<SectionSpec>& config_sections() {
  static const std::vector<SectionSpec> sections = {
      {"job", "What the run is and where everything it writes goes."},
      {"model", "Which model to build and the assets (tokenizer, weights) that come with it."},
      {"training", "The training loop: data, batch, sequence length, steps, precision, clipping."},
      {"optimizer", "The optimizer and its hyperparameters."},
      {"lr_scheduler",
       "The learning-rate schedule: linear warmup, a stable plateau, then a decay to "
       "lr x min_lr_factor (warmup-stable-decay, laid out as in TorchTitan)."},
      {"parallelism",
       "How ranks split the work. The product of the degrees is the number of ranks; "
       "data_parallel_shard_degree = -1 takes whatever the others leave."},
      {"comm",
       "The communication layer between ranks: the watchdog that ends a job whose collective stalls, and the "
       "flight recorder it dumps."},
      {"checkpoint", "Saving, resuming and importing/exporting checkpoints."},
      {"activation_checkpoint", "Trading compute for memory by recomputing activations in backward."},
      {"metrics", "What is logged, how often, and where."},
      {"profiling",
       "Looking at steps of a run: a Chrome trace (chrome://tracing, Perfetto) of every rank's ops, collectives, data "
       "loading, optimizer and checkpoint, and a snapshot of the memory live at a step's peak."},
      {"validation", "Periodic evaluation of the loss on a held-out dataset."},
      {"dsa",
       "DeepSeek Sparse Attention training (model deepseek_v32): a dense warm-up that trains only the "
       "lightning indexers, then sparse training of everything. `[model] converters = [\"dsa_fused\"]` picks "
       "the fused kernels; without it the small-op reference path runs (docs/converters.md). deepseek_v4 reads "
       "indexer_loss_coeff (its CSA indexers' KL loss; 0: they do not learn, as in transformers) and topk (the "
       "compressed entries each CSA query attends to); it has no warm-up."},
      {"fault",
       "What a numerical fault does: a loss or gradient norm that is NaN or infinite on any rank is seen by all "
       "before the optimizer step."},
      {"quantize.linear.float8",
       "DeepSeek-V3's FP8 blockwise training of the linear layers, on when [model] converters names "
       "\"quantize.linear.float8\": E4M3 activations and gradients in 1 x 128 tiles, weights in 128 x 128 blocks, "
       "f32 scales, f32 master weights (docs/precision.md)."},
      {"quantize.linear.mx",
       "OCP MX training of the linear layers, on when [model] converters names \"quantize.linear.mx\": UE8M0 "
       "scales per 32 elements along each GEMM's reduction (docs/precision.md)."},
      {"quantize.grouped_mm.float8",
       "FP8 blockwise training of the routed experts' grouped GEMMs (each expert's weight its own 128 x 128 "
       "blocks), on when [model] converters names \"quantize.grouped_mm.float8\"."},
      {"quantize.grouped_mm.mx",
       "OCP MX training of the routed experts' grouped GEMMs (per expert), on when [model] converters names "
       "\"quantize.grouped_mm.mx\"; recipe_name = \"mxfp4\" is DeepSeek-V4's FP4 experts."},
      {"debug", "Reproducibility."},
  };
  return sections;
}

const std::vector<KeySpec>& config_schema() {
  using C = JobConfig;
  static const std::vector<KeySpec> schema = {
      // [job]
      {"job", "dump_folder", member<&C::job, &Job::dump_folder>, non_empty(),
       "Folder for everything the run writes: checkpoints, metrics, the resolved config."},
      {"job", "description", member<&C::job, &Job::description>, anything(),
       "Free text describing the job; kept in the resolved config next to the run."},
      {"job", "print_config", member<&C::job, &Job::print_config>, anything(),
       "Print the resolved config (as TOML, as written to {job.dump_folder}/config.toml) when the run starts."},
      // [model]
      {"model", "name", member<&C::model, &Model::name>, one_of_models(),
       "Model family to train."},
      {"model", "flavor", member<&C::model, &Model::flavor>, non_empty(),
       "Size or variant within the family (e.g. debugmodel, 8B, 16B); the family's registry checks the name."},
      {"model", "hf_assets_path", member<&C::model, &Model::hf_assets_path>, anything(),
       "Folder of Hugging Face assets (tokenizer.json, config.json, safetensors weights). Empty: none."},
      {"model", "tokenizer_path", member<&C::model, &Model::tokenizer_path>, anything(),
       "A Hugging Face tokenizer.json. Empty: {model.hf_assets_path}/tokenizer.json."},
      {"model", "converters", member<&C::model, &Model::converters>, non_empty(),
       "Which form of each op with a fused kernel runs: the fused kernel or its small-op form (the same math "
       "from basic autograd ops, as PyTorch code would write it). `<op>_fused` or `<op>_small_ops` picks one op, "
       "`small_ops` every op not named `_fused`; ops: rms_norm and rope (llama3, deepseek_v3, deepseek_v32), "
       "grouped_mm and permute (MoE experts and their token permute/unpermute; deepseek_v3, deepseek_v32, deepseek_v4), "
       "dsa (deepseek_v32), hyper_connection and compressor (deepseek_v4's mHC maps and compressors). Unnamed "
       "ops keep their default: fused, except DSA, whose fused kernels run only with dsa_fused. The model refuses "
       "other names, listing its own. Measured pairs: docs/converters.md."},
      {"model", "mtp_layers", member<&C::model, &Model::mtp_layers>, at_least(0),
       "Multi-token prediction modules (DeepSeek-V3 report, section 2.2; deepseek_v3 and deepseek_v4): module k adds "
       "a block that predicts the token k + 1 ahead, through the shared embedding and output head. 0: none; "
       "DeepSeek-V3 trained with 1, DeepSeek-V4 ships 1 (docs/deepseek_v4.md)."},
      {"model", "mtp_loss_weight", member<&C::model, &Model::mtp_loss_weight>, at_least(0),
       "Weight lambda of the MTP loss: the training loss adds lambda / mtp_layers times the sum of the modules' "
       "cross-entropies (logged unweighted as mtp_loss). DeepSeek-V3: 0.3, then 0.1 for the last 4.8T tokens."},
      {"model", "moe_load_balance_coeff", member<&C::model, &Model::moe_load_balance_coeff>, at_least(0),
       "MoE aux-loss-free load balancing (DeepSeek-V3; DeepSeek-V4's learned layers, its hash layers have no bias): "
       "after each optimizer step every expert's routing bias moves "
       "by this much toward balance (up when it got fewer tokens than the mean, down when more). Raise it when the "
       "logged moe_imbalance climbs toward n_routed_experts / top-k (all tokens on the same experts); 0: off."},
      {"model", "moe_aux_loss_alpha", member<&C::model, &Model::moe_aux_loss_alpha>, at_least(0),
       "Weight alpha of the MoE sequence-wise balance loss (DeepSeek-V3 report, section 2.1.2), added to the training "
       "loss; DeepSeek-V3 used 1e-4. 0: off. deepseek_v4 refuses it (it balances by the bias alone)."},
      // [training]
      {"training", "dataset", member<&C::training, &Training::dataset>, non_empty(), "Training dataset name."},
      {"training", "dataset_path", member<&C::training, &Training::dataset_path>, anything(),
       "Folder made by `titan data prepare` (train/ and val/ inside); required to train. The shipped configs use "
       "./data/kjv, which scripts/prepare_data.sh makes."},
      {"training", "local_batch_size", member<&C::training, &Training::local_batch_size>, at_least(1),
       "Sequences per micro-batch on each data-parallel rank."},
      {"training", "global_batch_size", member<&C::training, &Training::global_batch_size>,
       or_sentinel(at_least(1), -1),
       "Sequences per optimizer step over all ranks: a multiple of local_batch_size x data-parallel degree, "
       "the quotient being the gradient-accumulation steps. -1: local_batch_size x data-parallel degree "
       "(no accumulation)."},
      {"training", "seq_len", member<&C::training, &Training::seq_len>, at_least(1), "Tokens per sequence."},
      {"training", "max_norm", member<&C::training, &Training::max_norm>, greater_than(0),
       "Gradients are clipped to this global L2 norm."},
      {"training", "steps", member<&C::training, &Training::steps>, at_least(1), "Optimizer steps to train."},
      {"training", "dtype", member<&C::training, &Training::dtype>, one_of({DType::f32}),
       "Storage type of parameters, gradients and optimizer state: float32 (TorchTitan's default). Its "
       "full-bf16 mode (no float32 masters) is not carried: bf16 compute comes from "
       "training.mixed_precision_param, with float32 masters and optimizer state."},
      {"training", "mixed_precision_param", member<&C::training, &Training::mixed_precision_param>,
       one_of({DType::bf16, DType::f16, DType::f32}),
       "Type parameters are cast to for forward and backward when training.dtype is float32. bfloat16: "
       "activations and GEMMs in bf16. float16 (llama3): every GEMM's operands rounded to f16 (overflowing to "
       "infinity) with f32 accumulation, its output too, and dynamic loss scaling on (training.loss_scaling); "
       "docs/precision.md says what is real and what is emulated."},
      {"training", "gradient_sync_dtype", member<&C::training, &Training::gradient_sync_dtype>,
       one_of({DType::f32, DType::bf16, DType::f16}),
       "Type gradients travel in for the data-parallel reductions (DDP's all-reduce, FSDP's reduce-scatter "
       "and HSDP's all-reduce): cast before, summed in f32 inside the reduction, read back into the f32 "
       "gradients. TorchTitan's mixed_precision_reduce. float32 is bit for bit the unconverted path."},
      {"training", "loss_scaling", member<&C::training, &Training::loss_scaling>, one_of<LossScaling>(),
       "Dynamic loss scaling (PyTorch's GradScaler): the loss is multiplied by the scale before backward and "
       "the gradients divided by it before clipping; a step whose gradients hold an infinity or NaN on any "
       "rank is skipped (no update; the step and the learning-rate schedule still advance) and the scale "
       "multiplied by loss_scale_backoff_factor; loss_scale_growth_interval finite steps in a row multiply it "
       "by loss_scale_growth_factor. The scale is logged with each step and saved in checkpoints. auto: "
       "dynamic under mixed_precision_param = \"float16\", none otherwise."},
      {"training", "loss_scale_init", member<&C::training, &Training::loss_scale_init>, greater_than(0),
       "The first loss scale (GradScaler's init_scale)."},
      {"training", "loss_scale_growth_factor", member<&C::training, &Training::loss_scale_growth_factor>,
       at_least(1), "The scale is multiplied by this after loss_scale_growth_interval finite steps (growth_factor)."},
      {"training", "loss_scale_backoff_factor", member<&C::training, &Training::loss_scale_backoff_factor>,
       open_interval(0, 1), "The scale is multiplied by this at a step that overflowed (backoff_factor)."},
      {"training", "loss_scale_growth_interval", member<&C::training, &Training::loss_scale_growth_interval>,
       at_least(1), "Finite steps in a row before the scale grows (growth_interval)."},
      {"training", "loss_scale_min", member<&C::training, &Training::loss_scale_min>, greater_than(0),
       "The scale never backs off below this. An overflow at the minimum scale is a real divergence: it goes "
       "to fault.on_nonfinite."},
      // [optimizer]
      {"optimizer", "name", member<&C::optimizer, &Optimizer::name>, one_of<OptimizerKind>(),
       "The optimizer. AdamW: every parameter. Muon: Newton-Schulz orthogonalised momentum for the hidden "
       "matrices (2-D weights, and each routed expert's matrices) and AdamW, with lr, beta1, beta2, eps and "
       "weight_decay, for the embedding, the output head, norms, biases and any other parameter that is not a "
       "matrix; one f32 state per Muon parameter instead of AdamW's two. The run prints what goes where."},
      {"optimizer", "lr", member<&C::optimizer, &Optimizer::lr>, greater_than(0),
       "Peak learning rate; [lr_scheduler] scales it at every step."},
      {"optimizer", "beta1", member<&C::optimizer, &Optimizer::beta1>, half_open_interval(0, 1),
       "Decay of the first-moment (mean) estimate."},
      {"optimizer", "beta2", member<&C::optimizer, &Optimizer::beta2>, half_open_interval(0, 1),
       "Decay of the second-moment (uncentered variance) estimate."},
      {"optimizer", "eps", member<&C::optimizer, &Optimizer::eps>, greater_than(0),
       "Added to the square root of the second moment, keeping the update finite."},
      {"optimizer", "weight_decay", member<&C::optimizer, &Optimizer::weight_decay>, at_least(0),
       "Decoupled weight decay (AdamW), scaled by the scheduled learning rate."},
      {"optimizer", "swap", member<&C::optimizer, &Optimizer::swap>, one_of<OptimizerSwap>(),
       "Where the optimizer state (AdamW's two moments; Muon's momentum buffers, in a second file) lives "
       "between steps. none: in memory. file: in a file in swap_path, one per rank (under FSDP each rank's "
       "shard), streamed through two chunk buffers during the step (read chunk "
       "i+1, update chunk i, write chunk i-1), with direct I/O where the filesystem has it; training is bit "
       "for bit the same."},
      {"optimizer", "swap_path", member<&C::optimizer, &Optimizer::swap_path>, non_empty(),
       "Folder for the swap files, relative to job.dump_folder or absolute: a local disk (NVMe, SSD). Each "
       "file is removed from the folder as soon as it is open and its space reserved; the space returns "
       "when the run ends."},
      {"optimizer", "swap_chunk_mb", member<&C::optimizer, &Optimizer::swap_chunk_mb>, at_least(1),
       "MiB of optimizer state per swap chunk; two chunks (of each file) are in memory during the step."},
      {"optimizer", "muon_lr", member<&C::optimizer, &Optimizer::muon_lr>, greater_than(0),
       "Peak learning rate of Muon's group (optimizer.name = \"Muon\"), scaled by [lr_scheduler] like lr. "
       "Unset: lr, which is right with muon_adjust_lr = \"match_rms_adamw\" (Muon's updates then have "
       "AdamW's RMS); \"original\" wants its own, e.g. 0.02."},
      {"optimizer", "muon_momentum", member<&C::optimizer, &Optimizer::muon_momentum>, half_open_interval(0, 1),
       "Muon's momentum: buffer = muon_momentum x buffer + (1 - muon_momentum) x gradient."},
      {"optimizer", "muon_nesterov", member<&C::optimizer, &Optimizer::muon_nesterov>, anything(),
       "Orthogonalise the Nesterov mix of gradient and momentum buffer (true) or the buffer itself."},
      {"optimizer", "muon_ns_steps", member<&C::optimizer, &Optimizer::muon_ns_steps>, closed_interval(1, 99),
       "Newton-Schulz iterations per matrix and step (quintic, coefficients 3.4445, -4.775, 2.0315)."},
      {"optimizer", "muon_ns_dtype", member<&C::optimizer, &Optimizer::muon_ns_dtype>, one_of({DType::bf16, DType::f32}),
       "Type of the Newton-Schulz GEMMs' inputs: float32, or bfloat16 as torch.optim.Muon (2x the GEMM rate where "
       "the CPU has AVX512-BF16); the iterate, products and momentum stay float32."},
      {"optimizer", "muon_adjust_lr", member<&C::optimizer, &Optimizer::muon_adjust_lr>, one_of<optim::MuonLrAdjust>(),
       "Learning rate of a [rows, cols] matrix under Muon. match_rms_adamw (Moonlight): lr x 0.2 x "
       "sqrt(max(rows, cols)), AdamW's update RMS, so AdamW's lr and weight_decay carry over. original "
       "(Keller Jordan): lr x sqrt(max(1, rows / cols)). Weight decay takes the unadjusted lr in both."},
      // [lr_scheduler]
      {"lr_scheduler", "warmup_steps", member<&C::lr_scheduler, &LrScheduler::warmup_steps>, at_least(0),
       "Steps of linear warmup: step s of the warmup trains at lr x s / warmup_steps. A warmup longer than "
       "training.steps (e.g. a short smoke run) is shortened to the run, with a warning."},
      {"lr_scheduler", "decay_ratio", member<&C::lr_scheduler, &LrScheduler::decay_ratio>,
       closed_interval(0, 1),
       "Share of training.steps, at the end of the run, spent decaying; between warmup and decay the rate "
       "stays at lr. Unset: the decay starts right after warmup. A decay that would overlap the warmup starts "
       "after it instead."},
      {"lr_scheduler", "decay_type", member<&C::lr_scheduler, &LrScheduler::decay_type>,
       one_of<optim::LrDecay>(),
       "Shape of the decay at progress p: linear 1 - p, sqrt 1 - sqrt(p), cosine (1 + cos(pi p)) / 2."},
      {"lr_scheduler", "min_lr_factor", member<&C::lr_scheduler, &LrScheduler::min_lr_factor>,
       closed_interval(0, 1), "The decay ends at lr x min_lr_factor."},
      // [parallelism]
      {"parallelism", "data_parallel_replicate_degree",
       member<&C::parallelism, &Parallelism::data_parallel_replicate_degree>, at_least(1),
       "Replicas of the model: DDP when data_parallel_shard_degree is 1, HSDP when both are above 1."},
      {"parallelism", "data_parallel_shard_degree", member<&C::parallelism, &Parallelism::data_parallel_shard_degree>,
       or_sentinel(at_least(1), -1),
       "Ranks that shard parameters, gradients and optimizer state (FSDP). -1: the ranks the other degrees "
       "leave."},
      {"parallelism", "fsdp_reshard_after_forward", member<&C::parallelism, &Parallelism::fsdp_reshard_after_forward>,
       one_of<distributed::ReshardAfterForward>(),
       "Whether FSDP frees a unit's gathered parameters after its forward and gathers them again for its "
       "backward: always saves memory (every unit), never saves communication (ZeRO-2), default does it for "
       "the embedding and every block but not the output head (whose backward follows at once)."},
      {"parallelism", "tensor_parallel_degree", member<&C::parallelism, &Parallelism::tensor_parallel_degree>,
       at_least(1), "Tensor- and sequence-parallel ranks."},
      {"parallelism", "enable_async_tensor_parallel",
       member<&C::parallelism, &Parallelism::enable_async_tensor_parallel>, anything(),
       "TorchTitan's asynchronous TP: each block's token all-gather overlaps its column-parallel projections "
       "(this rank's piece is multiplied while the others arrive; backward, the gradient's reduce-scatter "
       "overlaps the weight gradients), and its row-parallel projections' reduce-scatter runs in column "
       "blocks behind their GEMMs. llama3 and DeepSeek (whose MoE layers under moe_tp_scheme = \"gather\" stay "
       "synchronous); no effect without TP."},
      {"parallelism", "moe_tp_scheme", member<&C::parallelism, &Parallelism::moe_tp_scheme>, one_of<MoeTpScheme>(),
       "Mixture-of-experts layers under tensor parallelism. sequence (torchtitan-npu's MoE TP fix): each rank "
       "routes its own sequence piece to whole routed experts, with no TP communication around them. gather "
       "(TorchTitan v0.2's): the tokens are all-gathered, every rank routes all of them through its slice of "
       "every expert's hidden units, and the partial outputs are reduce-scattered; with expert parallelism "
       "(TorchTitan's expert-tensor parallelism) every TP rank dispatches all the tokens over its own EP group."},
      {"parallelism", "pipeline_parallel_degree", member<&C::parallelism, &Parallelism::pipeline_parallel_degree>,
       at_least(1), "Pipeline ranks."},
      {"parallelism", "pipeline_parallel_schedule", member<&C::parallelism, &Parallelism::pipeline_parallel_schedule>,
       one_of<distributed::pp::ScheduleKind>(),
       "Pipeline schedule (distributed/pipeline_schedule.h; `titan plan --pp-schedule all` compares them). "
       "Interleaved and V-shaped schedules put several stages on each rank."},
      {"parallelism", "pipeline_parallel_microbatch_size",
       member<&C::parallelism, &Parallelism::pipeline_parallel_microbatch_size>, at_least(1),
       "Sequences per pipeline micro-batch; must divide training.local_batch_size."},
      {"parallelism", "pipeline_parallel_first_stage_less_layers",
       member<&C::parallelism, &Parallelism::pipeline_parallel_first_stage_less_layers>, at_least(0),
       "Blocks the first pipeline stage holds fewer than the others, for the embedding (TorchTitan's split, "
       "distributed/pipeline_stages.h)."},
      {"parallelism", "pipeline_parallel_last_stage_less_layers",
       member<&C::parallelism, &Parallelism::pipeline_parallel_last_stage_less_layers>, at_least(0),
       "Blocks the last pipeline stage holds fewer than the others, for the final norm, output and loss (and "
       "DeepSeek-V3's and V4's MTP modules). V-shaped schedules put the first and the last stage on rank 0: there 0 and 0 "
       "balance the ranks better when the head costs less than a block (bench/pipeline.sh compares splits)."},
      {"parallelism", "pipeline_parallel_expert_parallel_overlap",
       member<&C::parallelism, &Parallelism::pipeline_parallel_expert_parallel_overlap>, anything(),
       "With expert parallelism, run each of DualPipeV's overlapped pairs (a forward of one micro-batch, a "
       "backward of another) as two pieces taking turns at every expert all-to-all, so that each one's exchange "
       "hides under the other's compute (TorchTitan's key); false runs the pair one after the other. No effect "
       "without EP or under other schedules."},
      {"parallelism", "pipeline_parallel_gradient_sum",
       member<&C::parallelism, &Parallelism::pipeline_parallel_gradient_sum>, one_of<GradientSum>(),
       "How a pipeline rank sums its micro-batches' gradients. in_place (TorchTitan's): each backward adds into "
       "one gradient buffer per parameter, so a step holds one unsharded gradient of its stages (FSDP "
       "reduce-scatters it once, after the last weight gradient); the sum's order follows the schedule, so the "
       "losses match one rank's to rounding. tree: each micro-batch's gradients are kept apart and summed as a "
       "binary tree in micro-batch order, as one rank accumulating does: the same gradients as one rank, bit for "
       "bit, at the cost of up to log2(micro-batches) + 1 unsharded gradients (titan plan counts the one "
       "configured). Under FSDP's zero3 (pipeline_parallel_fsdp) the sum is of reduce-scattered f32 shards: "
       "tree keeps up to log2(micro-batches) + 1 shards, in_place one."},
      {"parallelism", "pipeline_parallel_fsdp", member<&C::parallelism, &Parallelism::pipeline_parallel_fsdp>,
       one_of<PipelineFsdp>(),
       "FSDP under pipeline parallelism. zero3: each micro-batch's gradients of a unit are reduce-scattered into "
       "f32 shards as soon as its weight gradient completes (under ZB-V and DualPipeV after the deferred W) and "
       "the units are gathered for each forward and backward and freed between them (fsdp_reshard_after_forward "
       "as without PP): memory of ZeRO-3, at micro-batches x the reduce-scatter bytes and up to 2 x micro-batches "
       "x the all-gather bytes. With the tree sum each data-parallel rank then takes every data-parallel degree-th "
       "micro-batch of the global batch, so the sum over ranks and micro-batches is one rank's tree, bit for bit. "
       "per_step: the stage's gradients stay unsharded through the step and are reduce-scattered once after the "
       "last weight gradient, and the units stay gathered from first use (TorchTitan's default under PP): fewest "
       "bytes, most memory."},
      {"parallelism", "context_parallel_degree", member<&C::parallelism, &Parallelism::context_parallel_degree>,
       at_least(1),
       "Ranks that split each sequence, into 2 x degree head-tail chunks (rank r holds chunks r and "
       "2 x degree - 1 - r). Dense attention runs as ring attention; deepseek_v32's sparse stage "
       "all-gathers the latent keys and indexer keys (DSA context parallel)."},
      {"parallelism", "expert_parallel_degree", member<&C::parallelism, &Parallelism::expert_parallel_degree>,
       at_least(1),
       "Ranks that split the routed experts of a mixture-of-experts model; borrowed from the "
       "data_parallel_shard x context_parallel x tensor_parallel ranks (whole TP groups: a multiple of "
       "tensor_parallel_degree), or under moe_tp_scheme = \"gather\" (whose experts are split over TP) from "
       "data_parallel_shard x context_parallel alone. Tokens reach their experts by all-to-all; FSDP shards "
       "the experts over the ranks left over."},
      // [comm]
      {"comm", "init_timeout_seconds", member<&C::comm, &Comm::init_timeout_seconds>, at_least(1),
       "Watchdog deadline, in seconds, for each collective until the first step ends (start-up, first "
       "checkpoint load): a collective that has not finished by then dumps every rank's flight recorder and "
       "ends the job, naming the collective and the ranks that never arrived. Also the deadline of the MPI "
       "calls that block the communication thread (MPI_Init and the start-up collectives, communicator "
       "splits, the barrier and MPI_Finalize at the end), which end the job naming the call."},
      {"comm", "timeout_seconds", member<&C::comm, &Comm::timeout_seconds>, at_least(1),
       "Watchdog deadline, in seconds, for each collective from the second step on."},
      {"comm", "trace_buf_size", member<&C::comm, &Comm::trace_buf_size>, at_least(1),
       "Collectives the flight recorder keeps per rank (the newest; older ones fall off)."},
      {"comm", "save_traces_folder", member<&C::comm, &Comm::save_traces_folder>, non_empty(),
       "Folder, relative to job.dump_folder, for the flight-recorder dumps (rank<r>.json); read them with "
       "`titan fr analyze <folder>`."},
      // [checkpoint]
      {"checkpoint", "enable", member<&C::checkpoint, &Checkpoint::enable>, anything(),
       "Save checkpoints, and resume from the latest one in {job.dump_folder}/{checkpoint.folder}."},
      {"checkpoint", "folder", member<&C::checkpoint, &Checkpoint::folder>, non_empty(),
       "Checkpoint folder, relative to job.dump_folder."},
      {"checkpoint", "interval", member<&C::checkpoint, &Checkpoint::interval>, at_least(1),
       "Steps between checkpoints."},
      {"checkpoint", "async_mode", member<&C::checkpoint, &Checkpoint::async_mode>, one_of<CheckpointAsyncMode>(),
       "disabled: training waits while a checkpoint is written. async: a background thread writes each rank's "
       "state while training goes on, reading the weights and optimizer state in place (the next optimizer step "
       "waits until it has read them all) and copying only the buffers; the checkpoint counts once every "
       "rank's file is written and rank 0 has committed it (metadata.json last). At most one save is in flight; "
       "the final save is synchronous."},
      {"checkpoint", "staging_mib", member<&C::checkpoint, &Checkpoint::staging_mib>, at_least(1),
       "MiB of the one buffer each rank's save streams its file through (swapped optimizer moments come "
       "straight from the swap file): what a save holds beyond the state itself, whatever the model's size."},
      {"checkpoint", "keep_latest_k", member<&C::checkpoint, &Checkpoint::keep_latest_k>,
       or_sentinel(at_least(2), 0),
       "Checkpoints kept; older ones are deleted. 0 keeps all. 1 is refused: the newest may still be being "
       "written when the one before it would be deleted."},
      {"checkpoint", "load_step", member<&C::checkpoint, &Checkpoint::load_step>, or_sentinel(at_least(0), -1),
       "Step to resume from. -1: the latest."},
      {"checkpoint", "load_at_most", member<&C::checkpoint, &Checkpoint::load_at_most>, or_sentinel(at_least(0), -1),
       "Resume from the newest full checkpoint of a step no later than this, passing over damaged ones as load_step = "
       "-1 does; -1: no bound. Set over load_step. `titan launch` sets it when it restarts a run that pinned "
       "load_step: to the newest checkpoint the job committed since."},
      {"checkpoint", "last_save_model_only", member<&C::checkpoint, &Checkpoint::last_save_model_only>, anything(),
       "The checkpoint written at the end holds the model weights only (no optimizer or train state)."},
      {"checkpoint", "export_dtype", member<&C::checkpoint, &Checkpoint::export_dtype>,
       one_of({DType::f16, DType::bf16, DType::f32}), "Type of the weights in a model-only final checkpoint."},
      {"checkpoint", "initial_load_path", member<&C::checkpoint, &Checkpoint::initial_load_path>, anything(),
       "Checkpoint to start from when the checkpoint folder holds none (e.g. pretrained weights). Empty: none. "
       "One converted by `titan ckpt convert --from-hf` also sets the architecture (its config.json; "
       "model.flavor is then not used)."},
      {"checkpoint", "initial_load_model_only", member<&C::checkpoint, &Checkpoint::initial_load_model_only>,
       anything(), "Load only the model weights from initial_load_path: a fresh optimizer, starting at step 0."},
      {"checkpoint", "initial_load_in_hf", member<&C::checkpoint, &Checkpoint::initial_load_in_hf>, anything(),
       "initial_load_path is a Hugging Face safetensors folder (a DeepSeek-V3 / V3.2 one; FP8 weights are "
       "dequantized): rank 0 converts it once into {job.dump_folder}/hf_import/step-0, as `titan ckpt convert "
       "--from-hf` would, and every rank loads that. Needs initial_load_model_only."},
      {"checkpoint", "last_save_in_hf", member<&C::checkpoint, &Checkpoint::last_save_in_hf>, anything(),
       "Also write the final (model-only) checkpoint as a Hugging Face folder, {checkpoint.folder}/step-<N>-hf "
       "(safetensors in checkpoint.export_dtype, config.json), as `titan ckpt convert --to-hf` would. Needs "
       "last_save_model_only."},
      {"checkpoint", "enable_first_step_checkpoint",
       member<&C::checkpoint, &Checkpoint::enable_first_step_checkpoint>, anything(),
       "Also save right after step 1, proving that checkpoints work before a long run depends on them."},
      {"checkpoint", "allow_optimizer_switch", member<&C::checkpoint, &Checkpoint::allow_optimizer_switch>,
       anything(),
       "Resume from a checkpoint saved by another optimizer.name (e.g. AdamW's, now training with Muon): its "
       "optimizer state is dropped and the optimizer starts fresh; weights, step, data position and LR schedule "
       "carry on. A checkpoint of the same optimizer loads its state as always. False: such a resume is an error."},
      // [activation_checkpoint]
      {"activation_checkpoint", "mode", member<&C::activation_checkpoint, &ActivationCheckpoint::mode>,
       one_of<models::Recompute>(),
       "none keeps every activation; full recomputes each transformer block in backward; selective keeps the "
       "outputs the model's plan marks as expensive (matmuls, attention) and recomputes the rest."},
      // [metrics]
      {"metrics", "log_freq", member<&C::metrics, &Metrics::log_freq>, at_least(1), "Steps between metric logs."},
      {"metrics", "enable_jsonl", member<&C::metrics, &Metrics::enable_jsonl>, anything(),
       "Write one JSON object per logged step to {job.dump_folder}/{metrics.jsonl_file} (in place of "
       "TorchTitan's TensorBoard and W&B)."},
      {"metrics", "jsonl_file", member<&C::metrics, &Metrics::jsonl_file>, non_empty(),
       "Metrics file, relative to job.dump_folder."},
      {"metrics", "save_for_all_ranks", member<&C::metrics, &Metrics::save_for_all_ranks>, anything(),
       "Every rank writes its own metrics file, <jsonl_file stem>_rank<r><extension>; otherwise only rank 0 "
       "writes (and prints)."},
      {"metrics", "disable_color_printing", member<&C::metrics, &Metrics::disable_color_printing>, anything(),
       "Plain console output, without color codes (colors are used only when stdout is a terminal)."},
      {"metrics", "enable_tensorboard", member<&C::metrics, &Metrics::enable_tensorboard>, anything(),
       "Also write every logged scalar (losses, grad norm, lr, tokens/s, MFU, memory by category, MoE load per "
       "layer, validation) as TensorBoard event files in {job.dump_folder}/{metrics.save_tb_folder}: "
       "`tensorboard --logdir <that folder>`."},
      {"metrics", "save_tb_folder", member<&C::metrics, &Metrics::save_tb_folder>, non_empty(),
       "TensorBoard folder, relative to job.dump_folder (with save_for_all_ranks, rank r writes rank_<r>/ in it)."},
      {"metrics", "enable_plots", member<&C::metrics, &Metrics::enable_plots>, anything(),
       "At the end of training, draw {job.dump_folder}/plots/*.png from the metrics file: loss, speed, memory by "
       "category and (MoE) expert load per layer; `titan plot <job.dump_folder>` draws them any time. Needs "
       "metrics.enable_jsonl."},
      // [profiling]
      {"profiling", "enable_profiling", member<&C::profiling, &Profiling::enable_profiling>, anything(),
       "Trace every profile_freq-th step: each rank writes "
       "{job.dump_folder}/{profiling.save_traces_folder}/iteration_<step>/rank<r>_trace.json (open it in "
       "chrome://tracing or ui.perfetto.dev)."},
      {"profiling", "save_traces_folder", member<&C::profiling, &Profiling::save_traces_folder>, non_empty(),
       "Trace folder, relative to job.dump_folder."},
      {"profiling", "profile_freq", member<&C::profiling, &Profiling::profile_freq>, at_least(1),
       "Steps between traced (and memory-snapshotted) steps: steps profile_freq, 2 x profile_freq, ..."},
      {"profiling", "enable_memory_snapshot", member<&C::profiling, &Profiling::enable_memory_snapshot>, anything(),
       "At every profile_freq-th step, record the memory blocks live at the step's peak (size, category, the op that "
       "allocated it) as {job.dump_folder}/{profiling.save_memory_snapshot_folder}/iteration_<step>/"
       "rank<r>_memory_snapshot.json (by category, by allocating op, and every block)."},
      {"profiling", "save_memory_snapshot_folder", member<&C::profiling, &Profiling::save_memory_snapshot_folder>,
       non_empty(), "Memory snapshot folder, relative to job.dump_folder."},
      // [validation]
      {"validation", "enable", member<&C::validation, &Validation::enable>, anything(),
       "Evaluate the loss on the validation dataset every validation.freq steps."},
      {"validation", "dataset", member<&C::validation, &Validation::dataset>, non_empty(),
       "Validation dataset name."},
      {"validation", "dataset_path", member<&C::validation, &Validation::dataset_path>, anything(),
       "Folder whose val/ split is evaluated. Empty: training.dataset_path."},
      {"validation", "local_batch_size", member<&C::validation, &Validation::local_batch_size>, at_least(1),
       "Sequences per validation batch on each data-parallel rank."},
      {"validation", "seq_len", member<&C::validation, &Validation::seq_len>, at_least(1),
       "Tokens per validation sequence."},
      {"validation", "freq", member<&C::validation, &Validation::freq>, at_least(1), "Steps between validations."},
      {"validation", "steps", member<&C::validation, &Validation::steps>, or_sentinel(at_least(1), -1),
       "Batches per validation. -1: the whole validation dataset."},
      // [dsa]
      {"dsa", "warmup_steps", member<&C::dsa, &Dsa::warmup_steps>, at_least(0),
       "Optimizer steps of the dense warm-up stage (dense attention, every parameter but the indexers frozen, "
       "the indexer learns the attention's head-mean distribution); then the sparse stage. 0: sparse from "
       "the start."},
      {"dsa", "indexer_loss_coeff", member<&C::dsa, &Dsa::indexer_loss_coeff>, at_least(0),
       "Weight of the indexer's KL loss (mean over query rows, summed over layers) in the training loss. "
       "It reaches only the indexers, whose inputs are detached."},
      {"dsa", "topk", member<&C::dsa, &Dsa::topk>, at_least(0),
       "Keys each query attends to in the sparse stage. 0: the model flavor's index_topk."},
      // [fault]
      {"fault", "on_nonfinite", member<&C::fault, &Fault::on_nonfinite>, one_of<NonFinitePolicy>(),
       "A non-finite loss or gradient norm. abort: end the run, naming the step and the ranks. skip: drop the "
       "step's update (the batch is consumed; the step counts). rollback: reload the last committed checkpoint and "
       "train on from there, skipping the step's batch (a run that skipped it from the start ends the same, bit "
       "for bit); with no checkpoint to return to, abort."},
      {"fault", "inject_nonfinite_at_step", member<&C::fault, &Fault::inject_nonfinite_at_step>, at_least(0),
       "Testing: make one gradient element NaN on rank fault.inject_rank at this step (its first attempt only). "
       "0: never."},
      {"fault", "inject_rank", member<&C::fault, &Fault::inject_rank>, at_least(0),
       "Testing: the rank fault.inject_nonfinite_at_step poisons and fault.inject_step_delay_seconds slows."},
      {"fault", "inject_step_delay_seconds", member<&C::fault, &Fault::inject_step_delay_seconds>, at_least(0),
       "Testing: rank fault.inject_rank sleeps this long in every step (a straggler, which the metrics name)."},
      // [quantize.*]
      {"quantize.linear.float8", "recipe_name", member<&C::quantize_linear_float8, &QuantizeLinear::recipe_name>,
       choices({"blockwise"}),
       "blockwise: DeepSeek-V3's tiles and blocks. (torchao's rowwise and tensorwise recipes are not built.)"},
      {"quantize.linear.float8", "filter_fqns", member<&C::quantize_linear_float8, &QuantizeLinear::filter_fqns>,
       anything(),
       "Linear layers whose name contains one of these stay in high precision (the output head by default). "
       "Embeddings, norms, routers and mHC maps are never quantized."},
      {"quantize.linear.float8", "enable_fsdp_float8_all_gather",
       member<&C::quantize_linear_float8, &QuantizeLinear::enable_fsdp_float8_all_gather>, anything(),
       "Under FSDP, gather the quantized weights as FP8 codes with their 128 x 128 block scales (1 byte a value "
       "instead of bf16's 2): each rank quantizes its own rows with the whole weight's scales, and the result equals "
       "quantizing the gathered weight (TorchTitan's enable_fsdp_float8_all_gather; docs/precision.md)."},
      {"quantize.linear.mx", "recipe_name", member<&C::quantize_linear_mx, &QuantizeLinear::recipe_name>,
       choices({"mxfp8", "mxfp4"}),
       "mxfp8: E4M3 operands. mxfp4: E2M1 weights, E4M3 activations and gradients."},
      {"quantize.linear.mx", "filter_fqns", member<&C::quantize_linear_mx, &QuantizeLinear::filter_fqns>, anything(),
       "Linear layers whose name contains one of these stay in high precision (the output head by default)."},
      {"quantize.grouped_mm.float8", "recipe_name",
       member<&C::quantize_grouped_mm_float8, &QuantizeGroupedMm::recipe_name>, choices({"blockwise"}),
       "blockwise: DeepSeek-V3's tiles and blocks."},
      {"quantize.grouped_mm.float8", "fqns", member<&C::quantize_grouped_mm_float8, &QuantizeGroupedMm::fqns>,
       non_empty(), "Routed-expert modules whose name contains one of these are quantized."},
      {"quantize.grouped_mm.mx", "recipe_name", member<&C::quantize_grouped_mm_mx, &QuantizeGroupedMm::recipe_name>,
       choices({"mxfp8", "mxfp4"}), "mxfp8: E4M3 operands. mxfp4: E2M1 expert weights, E4M3 activations."},
      {"quantize.grouped_mm.mx", "fqns", member<&C::quantize_grouped_mm_mx, &QuantizeGroupedMm::fqns>, non_empty(),
       "Routed-expert modules whose name contains one of these are quantized."},
      // [debug]
      {"debug", "seed", member<&C::debug, &Debug::seed>, at_least(0),
       "Seed of every random stream (initialization, data order); the same seed and config reproduce a run."},
  };
  return schema;
}

std::string accepted_values(const KeySpec& spec) {
  JobConfig scratch;
  const Rule& rule = spec.rule;
  const std::string range = range_text(rule);
  return std::visit(
      overloaded{
          [&](int64_t*) {
            std::string s = range.empty() ? "an integer" : "an integer " + range;
            return rule.sentinel ? s + ", or " + std::to_string(*rule.sentinel) : s;
          },
          [&](double*) { return range.empty() ? std::string("a number") : "a number " + range; },
          [&](bool*) { return std::string("true or false"); },
          [&](std::string*) {
            if (!rule.choices.empty()) return "one of: " + join(rule.choices, ", ");
            return std::string(rule.non_empty ? "a non-empty string" : "any string");
          },
          [&](std::vector<std::string>*) {
            if (!rule.choices.empty()) return "a list of: " + join(rule.choices, ", ");
            return std::string(rule.non_empty ? "a list of non-empty strings" : "a list of strings");
          },
          [&](std::optional<double>*) {
            return (range.empty() ? std::string("a number") : "a number " + range) + ", or unset";
          },
          [&](const EnumRef&) { return "one of: " + join(rule.choices, ", "); },
      },
      spec.field(scratch));
}

// ---- public entry points ------------------------------------------------------------------------

JobConfig parse_config(std::string_view toml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides) {
  Context ctx;
  ctx.source = source_name;
  JobConfig config;
  apply_toml(ctx, config, toml_text);
  apply_overrides(ctx, config, overrides);
  clamp_warmup(ctx, config);
  validate_in(ctx, config);
  return config;
}

JobConfig load_config(const std::filesystem::path& toml_file, const std::vector<std::string>& overrides) {
  const std::string name = toml_file.string();
  std::error_code ec;
  TITAN_CHECK(std::filesystem::exists(toml_file, ec), fmt::format("config file {} does not exist", name),
              "check the path (relative paths start at the current directory); configs/ holds one TOML per "
              "model flavor");
  TITAN_CHECK(std::filesystem::is_regular_file(toml_file, ec), fmt::format("config file {} is not a file", name),
              "pass the path of a .toml file, e.g. configs/llama3_debug.toml");
  std::ifstream in(toml_file, std::ios::binary);
  TITAN_CHECK(in.is_open(), fmt::format("config file {} could not be opened", name),
              "check that the file is readable by this user");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), name, overrides);
}

void validate(const JobConfig& config) {
  // The schema's accessors take a mutable config; checking a copy keeps the caller's untouched.
  JobConfig copy = config;
  validate_in(Context{}, copy);
}

std::string to_toml(const JobConfig& config) {
  JobConfig copy = config;
  std::string out =
      "# titan.cpp job config, resolved: the defaults, then the config file, then command-line overrides.\n";
  for (const auto& section : config_sections()) {
    out += fmt::format("\n[{}]\n", section.name);
    for (const auto& spec : config_schema()) {
      if (spec.section != section.name) continue;
      const FieldRef ref = spec.field(copy);
      // TOML has no null: an unset optional key is left out, which reads back as unset.
      if (auto* opt = std::get_if<std::optional<double>*>(&ref); opt && !**opt)
        out += fmt::format("# {} is unset\n", spec.key);
      else
        out += fmt::format("{} = {}\n", spec.key, format_value(ref));
    }
  }
  return out;
}

std::string config_help() {
  std::string out = "Config keys: set them in the TOML file under [section], or override with --section.key=value\n";
  for (const auto& section : config_sections()) {
    out += fmt::format("\n[{}]  {}\n", section.name, section.doc);
    for (const auto& spec : config_schema()) {
      if (spec.section != section.name) continue;
      JobConfig scratch;
      out += fmt::format("  --{}=<{}>  default {}; {}\n      {}\n", full_name(spec), type_name(spec.field(scratch)),
                         default_text(spec), accepted_values(spec), spec.doc);
    }
  }
  return out;
}

std::string config_reference_markdown() {
  std::string out;
  for (const auto& section : config_sections()) {
    out += fmt::format("### [{}]\n\n{}\n\n", section.name, section.doc);
    out += "| key | type | default | accepted | description |\n|---|---|---|---|---|\n";
    for (const auto& spec : config_schema()) {
      if (spec.section != section.name) continue;
      JobConfig scratch;
      out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", full_name(spec), type_name(spec.field(scratch)),
                         default_text(spec), accepted_values(spec), spec.doc);
    }
    out += "\n";
  }
  return out;
}

int64_t gradient_accumulation_steps(const JobConfig& config, int64_t dp_degree) {
  TITAN_CHECK(dp_degree >= 1, fmt::format("data-parallel degree must be >= 1, got {}", dp_degree),
              "pass data_parallel_replicate_degree x data_parallel_shard_degree as resolved on the mesh");
  const int64_t per_step = config.training.local_batch_size * dp_degree;
  const int64_t global = config.training.global_batch_size;
  if (global == -1) return 1;
  TITAN_CHECK(global % per_step == 0,
              fmt::format("training.global_batch_size = {} is not a multiple of training.local_batch_size ({}) x "
                          "data-parallel degree ({}) = {}",
                          global, config.training.local_batch_size, dp_degree, per_step),
              fmt::format("set training.global_batch_size to a multiple of {} (e.g. {}), or -1 for {}", per_step,
                          std::max<int64_t>(1, global / per_step) * per_step, per_step));
  return global / per_step;
}

optim::LrSchedule make_lr_schedule(const JobConfig& config) {
  const LrScheduler& s = config.lr_scheduler;
  return optim::LrSchedule(config.training.steps, s.warmup_steps, s.decay_ratio,
                           s.decay_type, s.min_lr_factor);
}

std::string tokenizer_file(const JobConfig& c) {
  if (!c.model.tokenizer_path.empty()) return c.model.tokenizer_path;
  if (!c.model.hf_assets_path.empty()) return (std::filesystem::path(c.model.hf_assets_path) / "tokenizer.json").string();
  return {};
}

}  // namespace titan::train
