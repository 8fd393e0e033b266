// `kvferry logs DIR`: every failed room's root cause and its way to every other rank, from the
// JSON logs of a replay (or any run); src/logs/root_cause.h does the work.
#include <CLI/CLI.hpp>

#include <charconv>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "logs/log_set.h"
#include "logs/root_cause.h"

namespace kvferry::cli {

void add_logs_command(CLI::App& app) {
  struct Opts {
    std::string dir;
    std::string room;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "logs", "Root cause of every failed room from a run's JSON logs (DIR/logs/*.jsonl or DIR/*.jsonl)");
  cmd->add_option("DIR", o->dir, "a replay's output directory, or a directory of *.jsonl logs")->required();
  cmd->add_option("--room", o->room, "only this room (decimal bootstrap_room); prints its whole timeline");
  cmd->add_flag("--json", o->json, "a JSON array, one object per failed room");
  cmd->callback([o] {
    std::optional<uint64_t> only;
    if (!o->room.empty()) {
      uint64_t r = 0;
      auto [end, ec] = std::from_chars(o->room.data(), o->room.data() + o->room.size(), r);
      if (ec != std::errc() || end != o->room.data() + o->room.size()) {
        std::cerr << "kvferry logs: --room expects a decimal room id, got '" << o->room << "'\n";
        throw CLI::RuntimeError(2);
      }
      only = r;
    }
    auto set = logs::read_log_dir(o->dir);
    if (!set.ok()) {
      std::cerr << "kvferry logs: " << set.status().message() << "\n";
      throw CLI::RuntimeError(2);
    }
    if (set->invalid_lines)
      std::cerr << "kvferry logs: skipped " << set->invalid_lines << " line(s) that are not log objects (first: "
                << set->first_invalid << ")\n";
    auto rooms = logs::failed_rooms(*set, only);
    if (o->json) {
      std::cout << logs::failed_rooms_json(rooms) << "\n";
      return;
    }
    if (only && rooms.empty()) {
      auto t = logs::room_timeline(*set, *only);
      if (t.empty()) {
        std::cerr << "kvferry logs: no line names room " << *only << "\n";
        throw CLI::RuntimeError(1);
      }
      std::cout << "room " << *only << " did not fail; its timeline:\n";
      for (const logs::LogLine* l : t)
        std::cout << "  " << l->ts << " " << l->rank << " " << l->level << " " << l->component << ": " << l->msg << "\n";
      return;
    }
    std::cout << set->files << " log files, " << set->lines.size() << " lines, " << rooms.size()
              << " failed room(s)\n";
    for (const auto& f : rooms) std::cout << logs::failed_room_text(f, only.has_value());
  });
}

}  // namespace kvferry::cli
