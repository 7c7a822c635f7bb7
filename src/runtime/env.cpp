#include "weave/runtime/env.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "weave/common/error.hpp"
#include "weave/tile/tma.hpp"

namespace weave::env {

namespace {

using detail::concat;

[[noreturn]] void malformed(std::string_view name, std::string_view text, std::string_view form) {
  throw Error(concat("weave: ", name, "='", text, "' is not ", form));
}

const Var& typed(std::string_view name, Type t) {
  const Var& v = lookup(name);
  if (v.type != t && !(t == Type::string && v.type == Type::path))
    throw std::logic_error(concat("weave::env: ", name, " is a ", type_name(v.type), ", not a ", type_name(t)));
  return v;
}

// The set value, else the default; a typed read of a variable without a default is a misuse.
std::string value_or_default(const Var& v) {
  if (auto s = raw(v.name); s && !s->empty()) return *s;
  if (v.dflt.empty() && v.type != Type::string && v.type != Type::path)
    throw std::logic_error(concat("weave::env: ", v.name, " has no default; read it with env::raw"));
  return std::string(v.dflt);
}

}  // namespace

std::string_view type_name(Type t) {
  switch (t) {
    case Type::boolean: return "bool";
    case Type::integer: return "int";
    case Type::size: return "size";
    case Type::seconds: return "seconds";
    case Type::string: return "string";
    case Type::path: return "path";
  }
  return "?";
}

std::string_view who_name(Who w) {
  switch (w) {
    case Who::user: return "user";
    case Who::launcher: return "launcher";
    case Who::system: return "system";
    case Who::site: return "site";
    case Who::test: return "tests only";
    case Who::script: return "scripts only";
  }
  return "?";
}

const Var& lookup(std::string_view name) {
  for (const Var& v : kVars)
    if (v.name == name) return v;
  throw std::logic_error(concat("weave::env: ", name, " is not in weave's table of environment variables (env.hpp)"));
}

std::optional<std::string> raw(std::string_view name) {
  const Var& v = lookup(name);
  const char* s = std::getenv(std::string(v.name).c_str());
  if (!s) return std::nullopt;
  return std::string(s);
}

bool parse_bool(std::string_view name, std::string_view text) {
  typed(name, Type::boolean);
  if (text == "0") return false;
  if (text == "1") return true;
  malformed(name, text, "a boolean (0 or 1)");
}

int parse_int(std::string_view name, std::string_view text) {
  typed(name, Type::integer);
  int x = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, x);
  if (text.empty() || ec != std::errc() || p != end) malformed(name, text, "an integer (e.g. 0, 8)");
  return x;
}

size_t parse_size(std::string_view name, std::string_view text) {
  typed(name, Type::size);
  unsigned long long x = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, x);
  const std::string_view unit(p, static_cast<size_t>(end - p));
  const unsigned long long mul = unit.empty()                       ? 1
                                 : unit == "K" || unit == "KiB" ? 1ull << 10
                                 : unit == "M" || unit == "MiB" ? 1ull << 20
                                 : unit == "G" || unit == "GiB" ? 1ull << 30
                                                                : 0;
  if (ec != std::errc() || mul == 0 || x == 0 || x > ~0ull / mul)
    malformed(name, text, "a size (e.g. 1073741824, 512M, 2G)");
  return static_cast<size_t>(x * mul);
}

double parse_seconds(std::string_view name, std::string_view text) {
  typed(name, Type::seconds);
  const std::string s(text);  // strtod needs the terminator
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  if (s.empty() || end == s.c_str() || *end != 0 || !std::isfinite(x) || x < 0)
    malformed(name, text, "a number of seconds >= 0 (e.g. 600, 2.5)");
  return x;
}

bool get_bool(std::string_view name) { return parse_bool(name, value_or_default(typed(name, Type::boolean))); }
int get_int(std::string_view name) { return parse_int(name, value_or_default(typed(name, Type::integer))); }
size_t get_size(std::string_view name) { return parse_size(name, value_or_default(typed(name, Type::size))); }
double get_seconds(std::string_view name) { return parse_seconds(name, value_or_default(typed(name, Type::seconds))); }
std::string get_string(std::string_view name) { return value_or_default(typed(name, Type::string)); }

std::string markdown_table() {
  std::string t = "| variable | type | default | set by | meaning |\n| --- | --- | --- | --- | --- |\n";
  for (const Var& v : kVars)
    t += concat("| `", v.name, "` | ", type_name(v.type), " | ", v.dflt.empty() ? "unset" : concat("`", v.dflt, "`"),
                " | ", who_name(v.who), " | ", v.meaning, " |\n");
  return t;
}

}  // namespace weave::env

namespace weave {

bool pdl_allowed_by_env() {
  static const bool on = env::get_bool("WEAVE_PDL");
  return on;
}

tile::L2Promotion tma_l2_promotion_by_env() {
  static const tile::L2Promotion chosen =
      tile::parse_l2_promotion(env::get_string("WEAVE_TMA_L2_PROMOTION").c_str());
  return chosen;
}

}  // namespace weave
