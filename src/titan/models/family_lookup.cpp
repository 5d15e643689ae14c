// Lookups over the registered families (models/family.h), by name. Apart from the registry's
// list (families.cpp) so that code which needs the names and traits, not the models (the fuzz
// build's config parser), links these with a list of its own.
#include "titan/core/error.h"
#include "titan/models/family.h"

namespace titan::models {

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name);
  return names;
}

const std::string& default_model_name() { return model_families().front()->name; }

const ModelFamily& model_family(const std::string& name) {
  for (const ModelFamily* f : model_families())
    if (f->name == name) return *f;
  std::string names;
  for (const std::string& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  TITAN_FAIL("model '" + name + "' is not implemented in this build", "set [model] name to one of: " + names);
}

}  // namespace titan::models
