#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "check/error_of.hpp"
#include "weave/common/error.hpp"
#include "weave/runtime/communicator.hpp"
#include "weave/runtime/env.hpp"

namespace env = weave::env;
using env::Type;

namespace {

// Sets (or unsets) one variable for a scope; the tests run inside whatever environment ctest or a
// launcher gave them, so each restores what it found.
class Scoped {
 public:
  Scoped(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~Scoped() {
    if (had_)
      setenv(name_.c_str(), saved_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  std::string name_, saved_;
  bool had_ = false;
};

using weave::check::error_of;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Env, TableIsWellFormed) {
  std::set<std::string_view> names;
  for (const env::Var& v : env::kVars) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_FALSE(v.meaning.empty()) << v.name;
    EXPECT_EQ(v.meaning.find('|'), std::string_view::npos) << v.name << ": '|' would break the README's table";
    EXPECT_EQ(&env::lookup(v.name), &v);
  }
}

// With the variable unset, and with it set but empty, each typed reader gives the row's default;
// a row without a default gives "" (string, path) or is read with raw() only.
TEST(Env, EveryRowParsesItsDefault) {
  for (const env::Var& v : env::kVars) {
    for (const char* value : {static_cast<const char*>(nullptr), ""}) {
      SCOPED_TRACE(std::string(v.name) + (value ? " set empty" : " unset"));
      Scoped s(std::string(v.name).c_str(), value);
      const std::string d(v.dflt);
      if (d.empty() && v.type != Type::string && v.type != Type::path) {
        switch (v.type) {
          case Type::boolean: EXPECT_THROW(env::get_bool(v.name), std::logic_error); break;
          case Type::integer: EXPECT_THROW(env::get_int(v.name), std::logic_error); break;
          case Type::size: EXPECT_THROW(env::get_size(v.name), std::logic_error); break;
          case Type::seconds: EXPECT_THROW(env::get_seconds(v.name), std::logic_error); break;
          default: break;
        }
        continue;
      }
      switch (v.type) {
        case Type::boolean: EXPECT_EQ(env::get_bool(v.name), env::parse_bool(v.name, d)); break;
        case Type::integer: EXPECT_EQ(env::get_int(v.name), env::parse_int(v.name, d)); break;
        case Type::size: EXPECT_EQ(env::get_size(v.name), env::parse_size(v.name, d)); break;
        case Type::seconds: EXPECT_EQ(env::get_seconds(v.name), env::parse_seconds(v.name, d)); break;
        case Type::string:
        case Type::path: EXPECT_EQ(env::get_string(v.name), d); break;
      }
    }
  }
}

// The defaults the README and the communicator's header state.
TEST(Env, DefaultsAreTheDocumentedOnes) {
  Scoped a("WEAVE_HEAP_BYTES", nullptr), b("WEAVE_WAIT_TIMEOUT_S", nullptr), c("WEAVE_SHARE_GPUS", nullptr),
      d("WEAVE_PDL", nullptr), e("WEAVE_TUNER_CACHE", nullptr), f("WEAVE_STRESS_SCALE", nullptr),
      g("WEAVE_ATTN_BWD_CHUNK", nullptr), h("WEAVE_TEST_VERBOSE", nullptr), i("WEAVE_GRAPH_REPLAYS", nullptr),
      j("WEAVE_SKIP_TORCH", nullptr);
  EXPECT_EQ(env::get_size("WEAVE_HEAP_BYTES"), size_t(1) << 30);
  EXPECT_EQ(env::get_seconds("WEAVE_WAIT_TIMEOUT_S"), weave::runtime::kDefaultWaitTimeoutS);
  EXPECT_EQ(env::get_seconds("WEAVE_WAIT_TIMEOUT_S"), 600.0);
  EXPECT_FALSE(env::get_bool("WEAVE_SHARE_GPUS"));
  EXPECT_TRUE(env::get_bool("WEAVE_PDL"));
  EXPECT_TRUE(weave::pdl_allowed_by_env());
  EXPECT_EQ(env::get_string("WEAVE_TUNER_CACHE"), "");
  EXPECT_EQ(env::get_int("WEAVE_STRESS_SCALE"), 1);
  EXPECT_EQ(env::get_int("WEAVE_ATTN_BWD_CHUNK"), 1 << 26);  // python/weave/autograd.py's default
  EXPECT_FALSE(env::get_bool("WEAVE_TEST_VERBOSE"));
  EXPECT_EQ(env::get_int("WEAVE_GRAPH_REPLAYS"), 1000);  // python/tests/refs.py's default
  EXPECT_FALSE(env::get_bool("WEAVE_SKIP_TORCH"));       // scripts/deps.sh installs torch
}

TEST(Env, SetValuesAreRead) {
  Scoped a("WEAVE_HEAP_BYTES", "4G"), b("WEAVE_WAIT_TIMEOUT_S", "2.5"), c("WEAVE_SHARE_GPUS", "1"),
      d("WEAVE_TUNER_CACHE", "off"), e("WEAVE_RANK", "3");
  EXPECT_EQ(env::get_size("WEAVE_HEAP_BYTES"), size_t(4) << 30);
  EXPECT_EQ(env::get_seconds("WEAVE_WAIT_TIMEOUT_S"), 2.5);
  EXPECT_TRUE(env::get_bool("WEAVE_SHARE_GPUS"));
  EXPECT_EQ(env::get_string("WEAVE_TUNER_CACHE"), "off");
  EXPECT_EQ(env::raw("WEAVE_RANK"), "3");
  EXPECT_EQ(env::parse_int("WEAVE_RANK", *env::raw("WEAVE_RANK")), 3);
}

TEST(Env, UnknownNamesAndWrongTypesAreRefused) {
  EXPECT_THROW(env::lookup("WEAVE_NO_SUCH_VARIABLE"), std::logic_error);
  EXPECT_THROW(env::raw("WEAVE_NO_SUCH_VARIABLE"), std::logic_error);
  EXPECT_THROW(env::get_int("WEAVE_LL128_LAG"), std::logic_error);  // an experiment knob, removed
  EXPECT_THROW(env::get_size("WEAVE_COLL_PUSH_SLOT_BYTES"), std::logic_error);
  EXPECT_THROW(env::get_bool("PATH"), std::logic_error);
  EXPECT_THROW(env::get_size("WEAVE_PDL"), std::logic_error);
  EXPECT_THROW(env::get_bool("WEAVE_HEAP_BYTES"), std::logic_error);
  EXPECT_THROW(env::parse_seconds("WEAVE_HEAP_BYTES", "1"), std::logic_error);
  try {
    env::get_int("WEAVE_NO_SUCH_VARIABLE");
  } catch (const std::logic_error& e) {
    EXPECT_TRUE(has(e.what(), "WEAVE_NO_SUCH_VARIABLE")) << e.what();
  }
}

TEST(Env, Sizes) {
  const char* n = "WEAVE_HEAP_BYTES";
  EXPECT_EQ(env::parse_size(n, "1073741824"), size_t(1) << 30);
  EXPECT_EQ(env::parse_size(n, "1"), 1u);
  EXPECT_EQ(env::parse_size(n, "4K"), size_t(4) << 10);
  EXPECT_EQ(env::parse_size(n, "3KiB"), size_t(3) << 10);
  EXPECT_EQ(env::parse_size(n, "512M"), size_t(512) << 20);
  EXPECT_EQ(env::parse_size(n, "5MiB"), size_t(5) << 20);
  EXPECT_EQ(env::parse_size(n, "2G"), size_t(2) << 30);
  EXPECT_EQ(env::parse_size(n, "1GiB"), size_t(1) << 30);
  for (const char* bad : {"12Q", "", "0", "0G", "-1", "+1", " 1G", "1G ", "G", "1.5G", "1g", "1GB", "99999999999G",
                          "18446744073709551616"}) {
    const std::string err = error_of([&] { env::parse_size(n, bad); });
    EXPECT_TRUE(has(err, std::string("WEAVE_HEAP_BYTES='") + bad + "' is not a size (e.g. 1073741824, 512M, 2G)"))
        << "'" << bad << "' gave '" << err << "'";
  }
  Scoped s(n, "12Q");
  EXPECT_TRUE(has(error_of([&] { env::get_size(n); }), "WEAVE_HEAP_BYTES='12Q' is not a size"));
}

TEST(Env, Seconds) {
  const char* n = "WEAVE_WAIT_TIMEOUT_S";
  EXPECT_EQ(env::parse_seconds(n, "600"), 600.0);
  EXPECT_EQ(env::parse_seconds(n, "0"), 0.0);
  EXPECT_EQ(env::parse_seconds(n, "2.5"), 2.5);
  EXPECT_EQ(env::parse_seconds(n, "1e3"), 1000.0);
  for (const char* bad : {"", "-1", "abc", "10s", "1 ", "inf", "nan", "1e999"}) {
    const std::string err = error_of([&] { env::parse_seconds(n, bad); });
    EXPECT_TRUE(has(err, std::string("WEAVE_WAIT_TIMEOUT_S='") + bad + "' is not a number of seconds >= 0"))
        << "'" << bad << "' gave '" << err << "'";
  }
}

TEST(Env, Booleans) {
  for (const char* n : {"WEAVE_SHARE_GPUS", "WEAVE_PDL"}) {
    EXPECT_FALSE(env::parse_bool(n, "0"));
    EXPECT_TRUE(env::parse_bool(n, "1"));
    for (const char* bad : {"", "true", "false", "yes", "on", "2", "00", " 1"}) {
      const std::string err = error_of([&] { env::parse_bool(n, bad); });
      EXPECT_TRUE(has(err, std::string(n) + "='" + bad + "' is not a boolean (0 or 1)"))
          << "'" << bad << "' gave '" << err << "'";
    }
  }
  Scoped s("WEAVE_SHARE_GPUS", "yes");
  EXPECT_TRUE(has(error_of([] { env::get_bool("WEAVE_SHARE_GPUS"); }), "WEAVE_SHARE_GPUS='yes' is not a boolean"));
}

TEST(Env, Integers) {
  const char* n = "WEAVE_RANK";
  EXPECT_EQ(env::parse_int(n, "0"), 0);
  EXPECT_EQ(env::parse_int(n, "8"), 8);
  EXPECT_EQ(env::parse_int(n, "-1"), -1);
  for (const char* bad : {"", "abc", "1x", " 1", "+1", "1.0", "99999999999999"}) {
    const std::string err = error_of([&] { env::parse_int(n, bad); });
    EXPECT_TRUE(has(err, std::string("WEAVE_RANK='") + bad + "' is not an integer")) << "'" << bad << "' gave '" << err
                                                                                      << "'";
  }
}

// The README's table is the code's: a row changed in one place only fails here, with the table
// to paste.
TEST(Env, ReadmeTableMatchesTheCode) {
  std::ifstream f(WEAVE_README);
  ASSERT_TRUE(f) << "cannot read " << WEAVE_README;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string table = env::markdown_table();
  EXPECT_TRUE(has(ss.str(), table)) << WEAVE_README << " should hold this table:\n" << table;
}

}  // namespace
