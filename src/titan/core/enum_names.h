// Names for the values of a closed set of choices. Code holds the choice as an enum class, so
// that every switch over it is checked by the compiler (-Wswitch); configs, command lines and
// logs spell it as text. One table per enum, declared next to the enum, pairs each value with
// its name; the functions below are the only place either is turned into the other.
//
// A table is found by argument-dependent lookup: next to `enum class E` declare
//   std::span<const EnumName<E>> enum_names(E);  // the argument only picks the overload
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace titan {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
};

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { enum_names(e) } -> std::convertible_to<std::span<const EnumName<E>>>;
};

// The name of `value`; "" for a value its table leaves out (a table may name a subset, e.g. the
// element types a config accepts).
template <NamedEnum E>
std::string_view name_of(E value) {
  for (const EnumName<E>& n : enum_names(value))
    if (n.value == value) return n.name;
  return {};
}

// The value called `name` (exactly, case included), if any.
template <NamedEnum E>
std::optional<E> enum_named(std::string_view name) {
  for (const EnumName<E>& n : enum_names(E{}))
    if (n.name == name) return n.value;
  return std::nullopt;
}

// Every name, in the table's order (the order messages and docs list them in).
template <NamedEnum E>
std::vector<std::string_view> enum_name_list() {
  std::vector<std::string_view> out;
  for (const EnumName<E>& n : enum_names(E{})) out.push_back(n.name);
  return out;
}

}  // namespace titan
