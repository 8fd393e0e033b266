// `kvferry replay`: the main job. Validates the options, starts the bootstrap service, every
// prefill and decode rank and the router as separate processes of one process group (loopback
// sockets, or with --hosts each process on its host: started through the host's exec prefix,
// binding and advertising the host's address; hosts.h), supervises them, and writes
// DIR/report.json (docs/report.md).
//
// Processes (argv[1] is the subcommand of the same executable):
//   bootstrap  kvferry bootstrap --host ADDR --port P --log-file DIR/logs/bootstrap.jsonl
//   ranks      kvferry rank --role prefill|decode --tp-rank R [--dp-rank D] ... (child_args.h):
//              dp x tp ranks per engine, each DP group its own engine (leader tp0 + followers)
//   router     kvferry router ... --results DIR/results.json
//   xPyD (--prefill-instances / --decode-instances): one bootstrap service per prefill instance
//              (bootstrap, bootstrap1, ...) and every instance's ranks (prefill1-tp0, decode1-tp0,
//              ...: child_args.h rank_file()); decode ranks default to instance 0's bootstrap, the
//              router names the room's prefill instance's per request (router.h)
// Each child's stdout+stderr: DIR/logs/<name>.stderr (name: bootstrap, prefill-tp0, ...,
// prefill-tp0-dp1, ..., router; see rank_file()).
// Supervision: any rank or the bootstrap exiting before the router finished, or a failed router,
// kills the whole group, prints the process and its stderr tail, writes a partial report and
// returns non-zero. SIGINT/SIGTERM to the orchestrator stop the router first (it writes the results
// so far), then every rank (SIGTERM; they flush and exit), and write a report of the finished
// requests marked "partial" (docs/metrics.md). No child outlives it
// (process group + PR_SET_PDEATHSIG).
// Planned peer deaths (fault plan): the router asks for the kill over the orchestrator's
// ControlSocket (peer_death_frames.h); the orchestrator SIGKILLs that rank, notes the time
// (CLOCK_MONOTONIC), tells the router, and once the process is reaped and restart_delay_ms passed
// starts the same command line again (its log and stderr files are appended to). That exit is
// not a failure; any other is.
// Thread contract: run_replay() on the main thread (it installs SIGINT/SIGTERM handlers).
// The options and their validation: replay_config.h; the children's command lines:
// child_args.h; the planned peer deaths: peer_death_executor.h.
#pragma once
#include <iosfwd>

#include "replay/child_args.h"
#include "replay/replay_config.h"

namespace kvferry::replay {

// Runs the replay; prints progress/summary to `out`, errors to `err`. Returns the exit code:
// 0 replay ran and is clean; 1 replay ran with problems (mismatched bytes, misattributed faults,
// unexpected failures, ...) or stopped early; 2 invalid options; 128+N stopped by signal N.
int run_replay(ReplayConfig config, std::ostream& out, std::ostream& err);

}  // namespace kvferry::replay
