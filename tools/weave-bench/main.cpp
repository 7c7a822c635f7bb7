// weave-bench SUBCOMMAND [--key value | --flag]...: each kernel against its baselines,
// correctness first, then timing; a table on stdout, JSON lines to --json FILE.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "bench.hpp"
#include "weave/runtime/env.hpp"
#include "weave/runtime/tuner.hpp"

using namespace weave::bench;

static void usage() {
  std::fprintf(stderr, "usage: weave-bench SUBCOMMAND [--json FILE] [options]\nsubcommands:\n");
  for (auto& [name, e] : registry()) std::fprintf(stderr, "  %-12s %s\n", name.c_str(), e.help.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  auto it = registry().find(argv[1]);
  if (it == registry().end()) {
    std::fprintf(stderr, "weave-bench: unknown subcommand '%s'\n", argv[1]);
    usage();
    return 2;
  }
  for (int i = 2; i < argc; ++i)
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {  // no GPU needed
      std::printf("weave-bench %s: %s\n", argv[1], it->second.help.c_str());
      return 0;
    }
  Args a;
  for (int i = 2; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0) {
      std::fprintf(stderr, "weave-bench: unexpected argument '%s'\n", argv[i]);
      return 2;
    }
    std::string k = argv[i] + 2;
    if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) a.kv[k] = argv[++i];
    else a.kv[k] = "";
  }
  if (!std::strcmp(argv[1], "gemm") && a.get("dtype") == "fp8") it = registry().find("gemm_fp8");  // gemm_fp8.cu
  // A benchmark measures steady state, not a first call: the tuner searches (not the cost
  // model's pick) and fully (100 ms of warm-up per sample, five rounds) unless WEAVE_TUNER or
  // WEAVE_TUNER_BUDGET_S says otherwise (unset or empty: these defaults; the tuner reads a set
  // value itself).
  if (auto m = weave::env::raw("WEAVE_TUNER"); !m || m->empty())
    weave::runtime::Tuner::global().set_mode(weave::runtime::TuneMode::search);
  if (auto b = weave::env::raw("WEAVE_TUNER_BUDGET_S"); !b || b->empty())
    weave::runtime::Tuner::global().set_budget_s(0);
  int rc;
  try {
    rc = it->second.fn(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;  // options past the failure were never reached, which says nothing about them
  }
  // Options are read where they are used, so an unknown one shows only at the end of a run; it
  // fails the run rather than pass as if it had applied. (--list measures nothing: a run's other
  // options may ride along.)
  if (const std::string unread = a.never_asked(); !unread.empty() && !a.kv.count("list")) {
    std::fprintf(stderr, "weave-bench %s: option %s never read: misspelled, or not one of this subcommand's "
                 "(the run above did without it; --help lists the subcommands)\n", argv[1], unread.c_str());
    return rc != 0 ? rc : 2;
  }
  return rc;
}
