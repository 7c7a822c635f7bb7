// Every environment variable weave reads, in one table, and the only reader of them: a name
// missing from the table is a programming error (std::logic_error), a malformed value a
// weave::Error that names the variable, the value and the form expected. The README's
// "Environment variables" table is markdown_table() (test_env checks that they agree).
// Variables read by tests, checks and scripts only are listed too (who = test or script), so
// that the table is complete; the C++ tests and checks read them here too, the scripts, CMake and
// Python on their own.
#pragma once
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace weave::env {

enum class Type { boolean, integer, size, seconds, string, path };
enum class Who {
  user,      // a weave setting a user may choose
  launcher,  // set by weave-run, torchrun or mpirun; weave only reads it
  system,    // set by the login environment
  site,      // other libraries' switches that a site sets; weave honours their "off"
  test,      // read by the tests or checks only
  script,    // read by a script or Makefile target only
};

struct Var {
  std::string_view name;
  Type type;
  std::string_view dflt;  // as text, in the form the type parses; "" = unset (meaning says what that does)
  Who who;
  std::string_view meaning;
};

// clang-format off
inline constexpr Var kVars[] = {
  {"WEAVE_HEAP_BYTES", Type::size, "1G", Who::user,
   "symmetric heap per rank, rounded up to the VMM granularity (`CommOptions::heap_bytes` wins when non-zero)"},
  {"WEAVE_WAIT_TIMEOUT_S", Type::seconds, "600", Who::user,
   "device-side wait timeout, 0 = never (`CommOptions::wait_timeout_s` wins when >= 0)"},
  {"WEAVE_SHARE_GPUS", Type::boolean, "0", Who::user,
   "1: more ranks than GPUs, rank r on GPU r % GPUs, kernels of different ranks time-slice; for "
   "correctness runs only (`weave-run --share-gpus` sets it)"},
  {"WEAVE_DEBUG", Type::boolean, "0", Who::user,
   "1: every collective call checks its operator, shapes and options with every rank before it "
   "launches (otherwise only a plan's first call does; `CommOptions::debug` wins when >= 0)"},
  {"WEAVE_PDL", Type::boolean, "1", Who::user,
   "0: kernels launch without programmatic dependent launch (A/B measurements, escape hatch)"},
  {"WEAVE_TMA_L2_PROMOTION", Type::string, "auto", Who::user,
   "bytes that L2 fetches around each TMA load's sectors: `auto` (128 for a row pitch off the 128-byte "
   "grid, else 256), or `none`, `64`, `128`, `256` for every map (A/B measurements, `docs/perf-notes.md`)"},
  {"WEAVE_TUNER_CACHE", Type::path, "", Who::user,
   "the tuner's cache file, `off` = memory only; unset: `$XDG_CACHE_HOME/weave/tuner.json`, else "
   "`$HOME/.cache/weave/tuner.json`, else off"},
  {"WEAVE_TUNER", Type::string, "model", Who::user,
   "how the tuner answers a shape its cache does not hold: `model` = the cost model's pick (no launch "
   "timed; kept in memory only, never in the cache file), `search` = time the candidates (bounded by "
   "`WEAVE_TUNER_BUDGET_S`) and cache the winner, which then wins over the model. `weave.tune` always "
   "searches, `weave-bench` unless this is set. The same on every rank"},
  {"WEAVE_TUNER_BUDGET_S", Type::seconds, "1", Who::user,
   "the time for one new shape's search (`WEAVE_TUNER=search`, `weave.tune(budget_s=None)`): samples "
   "shortened to fit, extra rounds only while time is left; `0` = the full search (100 ms of warm-up "
   "per sample, five rounds: ~10 s for 18 candidates; weave-bench's and `weave.tune`'s default)"},
  {"WEAVE_NET_PROVIDER", Type::string, "", Who::user,
   "the libfabric provider of the network path (`tcp`, `verbs`, `efa`, ...); unset: libfabric's first "
   "choice for RDM endpoints with RMA. libfabric's own `FI_PROVIDER` filters what it offers before weave "
   "chooses, and `FI_TCP_IFACE` (`FI_SOCKETS_IFACE` for `sockets`) picks the interface"},
  {"WEAVE_NET_NOTIFY", Type::string, "auto", Who::user,
   "how a chunk's arrival is published: `ordered` (data write, then flag write; needs the provider's "
   "write-after-write order), `unordered` (write with immediate data, the receiving proxy sets the flag) "
   "or `auto` (ordered where the provider orders writes)"},
  {"WEAVE_NET_TIMEOUT_S", Type::seconds, "30", Who::user,
   "the network proxy's limit for a completion that does not come, a command it cannot post and a peer "
   "that stays silent; then every rank's proxy ends with a diagnostic"},
  {"WEAVE_BOOTSTRAP", Type::string, "", Who::user,
   "host:port of the rendezvous for jobs across hosts (`weave-run --nodes` sets a free loopback port "
   "unless it is set)"},
  {"WEAVE_ATTN_BWD_CHUNK", Type::integer, "67108864", Who::user,
   "the unfused attention backward in Python (`weave.autograd`) works on blocks of at most this many "
   "scores (batch x the query heads of one kv head x query rows x keys; at least one row), which bounds "
   "its temporary memory; Python reads it, the C++ library does not"},
  {"WEAVE_HOSTNAME", Type::string, "", Who::launcher,
   "set by `weave-run --nodes N`: this rank's node name (`<host>/node<k>`, ranks in contiguous blocks), "
   "which the network path's bootstrap uses instead of the host name, so one machine's ranks form N "
   "simulated nodes; unset: the host name"},
  {"WEAVE_JOB_ID", Type::string, "", Who::launcher,
   "names the job (its bootstrap sockets) under any launcher; set by weave-run; unset: derived from the "
   "launcher's variables, `single-<pid>` without a launcher"},
  {"WEAVE_RANK", Type::integer, "", Who::launcher, "set by weave-run: this rank"},
  {"WEAVE_WORLD_SIZE", Type::integer, "", Who::launcher, "set by weave-run: the number of ranks"},
  {"WEAVE_LOCAL_RANK", Type::integer, "", Who::launcher, "set by weave-run: this rank on its node"},
  {"WEAVE_LOCAL_WORLD_SIZE", Type::integer, "", Who::launcher, "set by weave-run: the ranks on this node"},
  {"RANK", Type::integer, "", Who::launcher, "set by torchrun: this rank"},
  {"WORLD_SIZE", Type::integer, "", Who::launcher, "set by torchrun: the number of ranks"},
  {"LOCAL_RANK", Type::integer, "", Who::launcher, "set by torchrun: this rank on its node"},
  {"LOCAL_WORLD_SIZE", Type::integer, "", Who::launcher, "set by torchrun: the ranks on this node"},
  {"TORCHELASTIC_RUN_ID", Type::string, "", Who::launcher, "set by torchrun: part of the job id"},
  {"MASTER_ADDR", Type::string, "", Who::launcher, "set by torchrun: part of the job id"},
  {"MASTER_PORT", Type::string, "", Who::launcher, "set by torchrun: part of the job id"},
  {"OMPI_COMM_WORLD_RANK", Type::integer, "", Who::launcher, "set by OpenMPI's mpirun: this rank"},
  {"OMPI_COMM_WORLD_SIZE", Type::integer, "", Who::launcher, "set by mpirun: the number of ranks"},
  {"OMPI_COMM_WORLD_LOCAL_RANK", Type::integer, "", Who::launcher, "set by mpirun: this rank on its node"},
  {"OMPI_COMM_WORLD_LOCAL_SIZE", Type::integer, "", Who::launcher, "set by mpirun: the ranks on this node"},
  {"PMIX_NAMESPACE", Type::string, "", Who::launcher, "set by mpirun: the job id (preferred)"},
  {"OMPI_MCA_orte_hnp_uri", Type::string, "", Who::launcher, "set by older mpirun: the job id"},
  {"OMPI_MCA_ess_base_jobid", Type::string, "", Who::launcher, "set by older mpirun: the job id"},
  {"XDG_CACHE_HOME", Type::path, "", Who::system, "where the tuner's cache goes (see `WEAVE_TUNER_CACHE`)"},
  {"HOME", Type::path, "", Who::system, "where the tuner's cache goes without `XDG_CACHE_HOME`"},
  {"CUDA_VISIBLE_DEVICES", Type::string, "", Who::system,
   "CUDA's list of GPUs; `weave-run --nodes` gives each simulated node its block of them (rank r on GPU "
   "r % GPUs) by setting it per rank"},
  {"NCCL_NVLS_ENABLE", Type::integer, "", Who::site,
   "0: NVLink multicast is forbidden here (asking weave for it names this variable)"},
  {"TORCH_SYMM_MEM_DISABLE_MULTICAST", Type::boolean, "", Who::site, "1: the same as `NCCL_NVLS_ENABLE=0`"},
  {"NVSHMEM_DISABLE_NVLS", Type::boolean, "", Who::site, "1: the same as `NCCL_NVLS_ENABLE=0`"},
  {"WEAVE_TEST_SEED", Type::integer, "", Who::test,
   "replays a test or benchmark run's random inputs (unsigned, decimal or 0x-hex); unset: a fresh seed, "
   "printed"},
  {"WEAVE_STRESS_SCALE", Type::integer, "1", Who::test, "k: the stress tests run k times as many rounds"},
  {"WEAVE_SM_SPLIT_TRACE", Type::boolean, "0", Who::test,
   "1: test_sm_split_cpu prints the simulated timeline of the SM-split model"},
  {"WEAVE_TEST_GPUS", Type::integer, "", Who::test,
   "set by CTest: the GPUs a test binary needs; with fewer visible it reports skipped"},
  {"WEAVE_TEST_VERBOSE", Type::boolean, "0", Who::test,
   "1: the MoE layer tests print each check's worst ratio to its bound (rank 0)"},
  {"WEAVE_GRAPH_REPLAYS", Type::integer, "1000", Who::test,
   "the replays of each captured CUDA graph in the Python capture tests (`python/tests/test_gpu.py`, "
   "`test_multirank.py`; read by `refs.graph_replays`)"},
  {"WEAVE_BENCH_SUITE", Type::string, "primitives collectives gemm attention moe tp sp", Who::script,
   "the `weave-bench` subcommands `make bench` runs"},
  {"WEAVE_BUILD_ROOT", Type::path, "/work/main", Who::script,
   "where the build carried to a GPU machine was configured (`scripts/device-check.sh` links it to the "
   "checkout there, so that CTest's absolute paths resolve)"},
  {"WEAVE_TORCH_PYTHON", Type::path, "", Who::script,
   "the Python whose torch `weave._C` is built against, read on a build dir's first configure "
   "(`python/CMakeLists.txt`); unset: the Python the module is built for"},
  {"WEAVE_SKIP_TORCH", Type::boolean, "0", Who::script,
   "1: `scripts/deps.sh` installs the Python packages but torch (the Python tests then report skipped)"},
};
// clang-format on

std::string_view type_name(Type t);
std::string_view who_name(Who w);

// The row of `name`; std::logic_error if the table has none.
const Var& lookup(std::string_view name);

// The value as set (possibly empty), nullopt when unset.
std::optional<std::string> raw(std::string_view name);

// `text` in the form of `name`'s type (the row's type must match: std::logic_error otherwise).
// weave::Error on a malformed value. An empty text is malformed for every type but string/path.
bool parse_bool(std::string_view name, std::string_view text);        // 0 or 1
int parse_int(std::string_view name, std::string_view text);          // decimal, int range
size_t parse_size(std::string_view name, std::string_view text);      // > 0, unit K, KiB, M, MiB, G, GiB
double parse_seconds(std::string_view name, std::string_view text);   // decimal, finite, >= 0

// The variable's value when set and not empty, else the table's default. A row whose default is
// "" (unset) and whose type is not string/path has no value to give: std::logic_error, such a
// variable is read with raw().
bool get_bool(std::string_view name);
int get_int(std::string_view name);
size_t get_size(std::string_view name);
double get_seconds(std::string_view name);
std::string get_string(std::string_view name);  // string or path

// The table as the README shows it: header, separator and one row per variable.
std::string markdown_table();

}  // namespace weave::env

namespace weave {
// $WEAVE_PDL, read once; declared in pdl.cuh too, whose device-layer code reads no environment.
bool pdl_allowed_by_env();
}  // namespace weave
