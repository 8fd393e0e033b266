// `kvferry rank`: one engine rank (internal; `kvferry replay` spawns these).
#include <CLI/CLI.hpp>

#include <map>
#include <memory>

#include "cli/commands.h"
#include "driver/rank.h"
#include "kvferry/deadlines.h"

namespace kvferry::cli {

void add_rank_command(CLI::App& app) {
  auto opts = std::make_shared<RankOptions>();
  auto role = std::make_shared<std::string>("prefill");
  auto transport = std::make_shared<std::string>("shm");
  opts->models_file = KVFERRY_SOURCE_DIR "/data/models.json";
  CLI::App* cmd = app.add_subcommand("rank", "run one engine rank (internal: spawned by `kvferry replay`)");
  cmd->add_option("--role", *role, "prefill or decode")->check(CLI::IsMember({"prefill", "decode"}))->required();
  cmd->add_option("--tp-rank", opts->tp_rank, "this rank's tensor-parallel index")->required();
  cmd->add_option("--tp-size", opts->tp_size, "ranks in this engine")->required();
  cmd->add_option("--peer-tp-size", opts->peer_tp_size, "ranks in the other engine (default: same)");
  cmd->add_option("--dp-rank", opts->dp_rank, "this rank's data-parallel group");
  cmd->add_option("--peer-dp-size", opts->peer_dp_size, "DP groups of the other engine");
  cmd->add_option("--model", opts->model, "model geometry name");
  cmd->add_option("--models-file", opts->models_file, "model geometry file");
  cmd->add_option("--page-size", opts->page_size, "tokens per page");
  cmd->add_option("--pool-mib", opts->pool_mib, "this rank's KV pool in MiB");
  cmd->add_option("--chunk-tokens", opts->chunk_tokens, "prefill: tokens per send()");
  cmd->add_option("--bootstrap", opts->bootstrap, "bootstrap service host:port");
  cmd->add_option("--engine-endpoint", opts->engine_endpoint, "the engine leader's endpoint")->required();
  cmd->add_option("--router-endpoint", opts->router_endpoint, "the router's endpoint")->required();
  cmd->add_option("--transport", *transport, "shm or tcp")->check(CLI::IsMember({"shm", "tcp"}));
  cmd->add_option("--log-file", opts->log_file, "JSON lines log file");
  cmd->add_option("--port-file", opts->port_file,
                  "leader: write the bound port of --engine-endpoint here (port 0: any free port)");
  opts->deadlines = deadlines_from_env();
  for (const DeadlineField& f : deadline_fields())
    cmd->add_option(f.option, opts->deadlines.*f.member, std::string(f.help) + " (env " + f.env + ")");
  cmd->callback([opts, role, transport] {
    opts->role = *role == "prefill" ? Role::kPrefill : Role::kDecode;
    opts->transport = *transport == "tcp" ? TransportKind::kTcp : TransportKind::kShm;
    int rc = run_rank(*opts);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
