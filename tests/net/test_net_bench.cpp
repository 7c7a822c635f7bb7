// weave-bench net end to end on the CPU: 2 simulated nodes (weave-run -n 2 --nodes 2 --no-gpu),
// libfabric's tcp provider on loopback, tiny sizes. Checks that every JSON line is a well-formed
// flat object with the suite's keys, that every row is correct, that a corrupted transfer is
// caught (rows correct: false, exit 1), and that the suite skips cleanly (exit 0) with one rank
// or without --nodes. The figures themselves are not asserted: CI machines are shared.
// The GPU suites on the network path (net_tp with its gemm_ar rows, net_coll) need a GPU per rank
// for any row (their buffers are device memory); here only their options, their refusals and their
// skips (exit 0 with one rank or without --nodes) are checked.
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "run_command.hpp"

namespace {

using weave::test::Result;
Result run(const std::vector<std::string>& args) { return weave::test::run_command(args); }

// A flat JSON object whose values are strings, numbers or booleans (what JsonLine writes), as
// key -> the value's text (strings unquoted). False when the line is anything else.
bool parse_flat(const std::string& s, std::map<std::string, std::string>& out, std::string& why) {
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  };
  auto str = [&](std::string& v) {
    if (i >= s.size() || s[i] != '"') return false;
    for (++i; i < s.size() && s[i] != '"'; ++i) {
      if (s[i] == '\\') ++i;
      if (i < s.size()) v += s[i];
    }
    if (i >= s.size()) return false;
    ++i;
    return true;
  };
  ws();
  if (i >= s.size() || s[i++] != '{') return why = "no '{'", false;
  ws();
  if (i < s.size() && s[i] == '}') return ++i, true;
  for (;;) {
    std::string k, v;
    ws();
    if (!str(k)) return why = "a key is not a string", false;
    ws();
    if (i >= s.size() || s[i++] != ':') return why = "no ':' after " + k, false;
    ws();
    if (i < s.size() && s[i] == '"') {
      if (!str(v)) return why = "unterminated string of " + k, false;
    } else if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0) {
      v = s[i] == 't' ? "true" : "false";
      i += v.size();
    } else {
      const char* start = s.c_str() + i;
      char* end = nullptr;
      std::strtod(start, &end);
      if (end == start) return why = "the value of " + k + " is not a string, number or boolean", false;
      v.assign(start, static_cast<size_t>(end - start));
      i += static_cast<size_t>(end - start);
      if (v == "nan" || v == "inf" || v == "-inf") return why = k + " is not finite", false;
    }
    if (out.count(k)) return why = "duplicate key " + k, false;
    out[k] = v;
    ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') {
      ++i;
      ws();
      return i == s.size() ? true : (why = "text after '}'", false);
    }
    return why = "no ',' or '}' after " + k, false;
  }
}

std::string json_path(const char* name) {
  const std::string p = std::string(::testing::TempDir()) + "weave_net_bench_" + std::to_string(getpid()) + "_" + name;
  std::remove(p.c_str());
  return p;
}

std::vector<std::map<std::string, std::string>> read_rows(const std::string& path) {
  std::vector<std::map<std::string, std::string>> rows;
  std::ifstream f(path);
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    std::map<std::string, std::string> row;
    std::string why;
    EXPECT_TRUE(parse_flat(line, row, why)) << "line " << n << ": " << why << ": " << line;
    rows.push_back(row);
  }
  return rows;
}

double num(const std::map<std::string, std::string>& r, const std::string& k) {
  auto it = r.find(k);
  return it == r.end() ? -1 : std::strtod(it->second.c_str(), nullptr);
}

// Tiny sizes: a few seconds on a loaded 2-core machine. Without the NCCL rows, which need a GPU
// per rank (on a GPU machine, --no-gpu would make them skip anyway: both ranks see GPU 0).
std::vector<std::string> tiny(const std::string& json) {
  return {WEAVE_RUN_BIN,
          "--no-gpu",
          "-n",
          "2",
          "--nodes",
          "2",
          "--timeout",
          "100",
          "--",
          BENCH_BIN,
          "net",
          "--sizes",
          "4K,40K",
          "--chunks",
          "16K",
          "--budget",
          "64K",
          "--repeats",
          "1",
          "--latency-commands",
          "100",
          "--rate-commands",
          "1000",
          "--parts",
          "proxy,transfer",
          "--json",
          json};
}

TEST(WeaveBenchNet, RowsAreWellFormedAndCorrect) {
  unsetenv("WEAVE_BOOTSTRAP");
  const std::string json = json_path("ok.json");
  const Result r = run(tiny(json));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("every message's chunks arrived"), std::string::npos) << r.out;
  const auto rows = read_rows(json);
  int proxy_weave = 0, proxy_raw = 0, transfer_weave = 0, transfer_raw = 0;
  for (const auto& row : rows) {
    SCOPED_TRACE(row.count("kernel") ? row.at("kernel") + "/" + (row.count("impl") ? row.at("impl") : "?") : "?");
    for (const char* k : {"kernel", "impl", "nodes", "world", "transport", "provider", "notify", "bytes", "correct"})
      EXPECT_TRUE(row.count(k)) << "missing " << k;
    EXPECT_EQ(num(row, "nodes"), 2);
    EXPECT_EQ(num(row, "world"), 2);
    EXPECT_EQ(row.at("transport"), "libfabric");
    EXPECT_EQ(row.at("provider").rfind("tcp", 0), 0u) << row.at("provider");
    EXPECT_EQ(row.at("correct"), "true");
    const std::string kernel = row.at("kernel"), impl = row.at("impl");
    if (kernel == "proxy") {
      for (const char* k : {"batch", "p50_us", "p99_us", "commands_per_s", "writes_per_command"}) {
        EXPECT_TRUE(row.count(k)) << "missing " << k;
        EXPECT_GT(num(row, k), 0) << k;
      }
      EXPECT_LE(num(row, "p50_us"), num(row, "p99_us"));
      if (impl == "weave") {
        ++proxy_weave;
        EXPECT_TRUE(row.at("notify") == "ordered" || row.at("notify") == "unordered") << row.at("notify");
        EXPECT_TRUE(row.count("taken_p50_us") && row.count("meets_target"));
        // Ordered mode is a data write and a flag write per command, unordered one write.
        EXPECT_EQ(num(row, "writes_per_command"), row.at("notify") == "ordered" ? 2 : 1);
      } else {
        ++proxy_raw;
        EXPECT_EQ(impl, "libfabric");
        EXPECT_GT(num(row, "cq_poll_us"), 0);
      }
    } else {
      ASSERT_EQ(kernel, "transfer");
      for (const char* k : {"chunk_bytes", "time_us", "gbs", "iters"}) {
        EXPECT_TRUE(row.count(k)) << "missing " << k;
        EXPECT_GT(num(row, k), 0) << k;
      }
      EXPECT_TRUE(num(row, "bytes") == 4096 || num(row, "bytes") == 40960) << num(row, "bytes");
      EXPECT_EQ(num(row, "chunk_bytes"), 16384);
      if (impl == "weave") {
        ++transfer_weave;
        EXPECT_GT(num(row, "ratio_vs_libfabric"), 0);
      } else {
        ++transfer_raw;
      }
    }
  }
  // Two notification modes x batches 8 and 1; the raw rows per batch; per size: raw + 2 modes.
  EXPECT_EQ(proxy_weave, 4);
  EXPECT_EQ(proxy_raw, 2);
  EXPECT_EQ(transfer_weave, 4);
  EXPECT_EQ(transfer_raw, 2);
  std::remove(json.c_str());
}

// The calls rows: the agreement's host time per call, agreed keys and new keys through the
// mailbox, and the bootstrap all-gather per call beside them; every row correct.
TEST(WeaveBenchNet, CallsRows) {
  unsetenv("WEAVE_BOOTSTRAP");
  const std::string json = json_path("calls.json");
  const Result r = run({WEAVE_RUN_BIN, "--no-gpu", "-n", "2", "--nodes", "2", "--timeout", "120", "--", BENCH_BIN,
                        "net", "--parts", "calls", "--agree-calls", "100", "--json", json});
  ASSERT_EQ(r.status, 0) << r.out;
  std::set<std::string> seen;
  for (const auto& row : read_rows(json)) {
    EXPECT_EQ(row.at("kernel"), "calls");
    EXPECT_EQ(row.at("correct"), "true");
    EXPECT_GT(num(row, "time_us"), 0);
    EXPECT_EQ(num(row, "calls"), row.at("what") == "new key" ? 10 : 100);
    seen.insert(row.at("impl") + "/" + row.at("what"));
  }
  EXPECT_EQ(seen, (std::set<std::string>{"weave/agreed", "weave/new key", "bootstrap/agreed"}));
  std::remove(json.c_str());
}

TEST(WeaveBenchNet, WrongBytesMakeRowsWrongAndTheCommandFail) {
  unsetenv("WEAVE_BOOTSTRAP");
  const std::string json = json_path("corrupt.json");
  std::vector<std::string> args = tiny(json);
  for (const char* a : {"--parts", "transfer", "--notify", "unordered", "--sizes", "4K", "--test-corrupt", "100"})
    args.push_back(a);
  const Result r = run(args);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("WRONG"), std::string::npos) << r.out;
  const auto rows = read_rows(json);
  ASSERT_EQ(rows.size(), 2u) << r.out;  // raw and weave (unordered), 4K
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("correct"), "false");
    ASSERT_TRUE(row.count("error"));
    EXPECT_NE(row.at("error").find("byte 96"), std::string::npos) << row.at("error");  // the word holding byte 100
  }
  std::remove(json.c_str());
}

// The GPU-producer proxy rows (part proxy_gpu) need a GPU on the sender: in CPU mode the part says
// it is skipped and writes no row, and the run still succeeds; a bad --gpu-producers is refused.
TEST(WeaveBenchNet, GpuProducerPartSkipsWithoutAGpu) {
  unsetenv("WEAVE_BOOTSTRAP");
  const std::string json = json_path("proxy_gpu.json");
  const Result r = run({WEAVE_RUN_BIN, "--no-gpu", "-n", "2", "--nodes", "2", "--timeout", "60", "--", BENCH_BIN, "net",
                        "--parts", "proxy_gpu", "--json", json});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("proxy_gpu: skipped"), std::string::npos) << r.out;
  EXPECT_TRUE(read_rows(json).empty()) << r.out;
  std::remove(json.c_str());
  const Result bad = run({BENCH_BIN, "net", "--gpu-producers", "3"});
  EXPECT_NE(bad.status, 0) << bad.out;
  EXPECT_NE(bad.out.find("--gpu-producers"), std::string::npos) << bad.out;
}

TEST(WeaveBenchNet, SkipsWithoutTwoNodesAndRefusesBadOptions) {
  unsetenv("WEAVE_BOOTSTRAP");
  Result r = run({BENCH_BIN, "net"});  // one rank
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
  r = run({WEAVE_RUN_BIN, "--no-gpu", "-n", "2", "--timeout", "60", "--", BENCH_BIN, "net"});  // no --nodes
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
  r = run({BENCH_BIN, "net", "--sizes", "12Q"});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("--sizes: '12Q' is not a size"), std::string::npos) << r.out;
  r = run({BENCH_BIN, "net", "--chunk", "1M"});
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("unknown option --chunk"), std::string::npos) << r.out;
}

// net_tp's --kernels takes gemm_ar, its --impls weave-adaptive and --sweep fixed splits, net_coll its sizes, collectives and impls: accepted options
// reach the run, which skips with one rank (exit 0); bad ones are refused with a message (exit 1),
// before anything is started. Without --nodes both skip under weave-run too.
TEST(WeaveBenchNetGpuSuites, AcceptTheirOptionsAndRefuseBadOnes) {
  unsetenv("WEAVE_BOOTSTRAP");
  for (const std::vector<std::string>& ok :
       {std::vector<std::string>{BENCH_BIN, "net_tp", "--kernels", "gemm_ar", "--sizes", "1000,2048"},
        std::vector<std::string>{BENCH_BIN, "net_tp", "--kernels", "ag_gemm,gemm_rs,gemm_ar", "--impls", "weave,nccl"},
        std::vector<std::string>{BENCH_BIN, "net_tp", "--kernels", "gemm_rs", "--impls", "weave-adaptive", "--sweep",
                                 "1+1,2+6,8+24"},
        std::vector<std::string>{BENCH_BIN, "net_coll"},
        std::vector<std::string>{BENCH_BIN, "net_coll", "--sizes", "1M,4M,16M,64M", "--kernels",
                                 "all_reduce,all_gather,reduce_scatter", "--impls", "weave,nccl", "--chunk", "64K",
                                 "--send-blocks", "2", "--recv-blocks", "4", "--notify", "unordered"}}) {
    const Result r = run(ok);
    EXPECT_EQ(r.status, 0) << ok[1] << ": " << r.out;
    EXPECT_NE(r.out.find("skipped: 1 rank"), std::string::npos) << ok[1] << ": " << r.out;
  }
  const struct {
    std::vector<std::string> args;
    const char* says;
  } bad[] = {
      {{BENCH_BIN, "net_tp", "--kernels", "gemm_ar,gemm_allreduce"},
       "'gemm_allreduce' is not ag_gemm, gemm_rs or gemm_ar"},
      {{BENCH_BIN, "net_tp", "--impls", "weave,adaptive"},
       "'adaptive' is not weave, weave-unfused, nccl or weave-adaptive"},
      {{BENCH_BIN, "net_tp", "--sweep", "2x6"}, "--sweep: '2x6' is not S+R"},
      {{BENCH_BIN, "net_tp", "--sweep", "2+40"}, "--sweep: '40' is not an integer from 1 to 32"},
      {{BENCH_BIN, "net_coll", "--kernels", "all_to_all"},
       "'all_to_all' is not all_reduce, all_gather or reduce_scatter"},
      {{BENCH_BIN, "net_coll", "--impls", "weave,weave-unfused"}, "'weave-unfused' is not weave or nccl"},
      {{BENCH_BIN, "net_coll", "--impls", "torch"}, "'torch' is not weave or nccl"},
      {{BENCH_BIN, "net_coll", "--sizes", "1M,1000"}, "1000 is not a multiple of 16 bytes"},
      {{BENCH_BIN, "net_coll", "--sizes", "12Q"}, "--sizes: '12Q' is not a size"},
      {{BENCH_BIN, "net_coll", "--chunk", "100"}, "--chunk 100 is not a multiple of 16 bytes"},
      {{BENCH_BIN, "net_coll", "--parts", "proxy"}, "unknown option --parts"},
  };
  for (const auto& b : bad) {
    const Result r = run(b.args);
    EXPECT_EQ(r.status, 1) << b.args[1] << " " << b.args[3] << ": " << r.out;
    EXPECT_NE(r.out.find(b.says), std::string::npos) << r.out;
  }
  for (const char* suite : {"net_tp", "net_coll"}) {
    const Result r = run({WEAVE_RUN_BIN, "--no-gpu", "-n", "2", "--timeout", "60", "--", BENCH_BIN, suite});
    EXPECT_EQ(r.status, 0) << suite << ": " << r.out;
    EXPECT_NE(r.out.find("skipped: no rendezvous address"), std::string::npos) << suite << ": " << r.out;
  }
  const Result h = run({BENCH_BIN, "net_coll", "--help"});
  EXPECT_EQ(h.status, 0) << h.out;
  EXPECT_NE(h.out.find("net_reduce_scatter"), std::string::npos) << h.out;
}

}  // namespace
