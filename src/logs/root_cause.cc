#include "logs/root_cause.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

namespace kvferry::logs {
namespace {

int level_rank(const std::string& l) {
  static const char* order[] = {"trace", "debug", "info", "warning", "error", "critical"};
  for (int i = 0; i < 6; ++i)
    if (l == order[i]) return i;
  return -1;
}

bool engine_rank(const std::string& rank) { return RankId::parse(rank).has_value(); }

// The room's cause as the logs tell it.
struct Cause {
  std::string origin, code, reason;
  const LogLine* root = nullptr;  // the root-cause event
};

std::optional<Cause> find_cause(const std::vector<const LogLine*>& lines,
                                const std::vector<const LogLine*>& peer_dead) {
  std::map<std::pair<std::string, std::string>, int> release_votes, votes;
  for (const LogLine* l : lines) {
    if (l->code.empty() || l->origin.empty()) continue;
    ++votes[{l->origin, l->code}];
    if (l->is_from_another_rank) ++release_votes[{l->origin, l->code}];
  }
  if (votes.empty()) return std::nullopt;
  const auto& pick = release_votes.empty() ? votes : release_votes;
  auto best = std::max_element(pick.begin(), pick.end(),
                               [](const auto& a, const auto& b) { return a.second < b.second; });
  Cause c;
  c.origin = best->first.first;
  c.code = best->first.second;
  for (const LogLine* l : lines) {  // the origin's own first line naming the cause
    if (l->rank == c.origin && l->code == c.code && l->origin == c.origin) {
      c.root = l;
      break;
    }
  }
  if (!c.root) {  // the origin wrote nothing (e.g. it died): who detected it
    for (const LogLine* l : peer_dead)
      if (l->peer == c.origin && (!c.root || l->ts_us < c.root->ts_us)) c.root = l;
  }
  if (!c.root) {
    for (const LogLine* l : lines)
      if (l->origin == c.origin && l->code == c.code && (!c.root || l->ts_us < c.root->ts_us)) c.root = l;
  }
  // Reason: the "reason" field of the origin's lines first, then of any line naming the cause.
  for (int pass = 0; pass < 2 && c.reason.empty(); ++pass) {
    for (const LogLine* l : lines) {
      if (l->code != c.code || l->origin != c.origin || (pass == 0 && l->rank != c.origin)) continue;
      c.reason = l->reason;
      if (!c.reason.empty()) break;
    }
  }
  return c;
}

// Causal merge (root_cause.h). `cause` null: plain merge by ts, each file in its own order.
std::vector<const LogLine*> merge(std::vector<const LogLine*> lines, const Cause* cause) {
  if (cause && cause->root && std::find(lines.begin(), lines.end(), cause->root) == lines.end())
    lines.push_back(cause->root);
  std::map<std::string, std::vector<const LogLine*>> by_file;
  for (const LogLine* l : lines) by_file[l->file].push_back(l);
  // Each source's first failure line ("learned") and what must precede it.
  std::unordered_map<std::string, const LogLine*> learned_by_rank;
  std::unordered_map<const LogLine*, const LogLine*> needs;
  for (auto& [file, q] : by_file) {
    std::stable_sort(q.begin(), q.end(), [](const LogLine* a, const LogLine* b) { return a->line_no < b->line_no; });
    if (!cause) continue;
    for (const LogLine* l : q) {
      if (l == cause->root || (!l->code.empty() && l->origin == cause->origin)) {
        learned_by_rank.emplace(l->rank, l);
        break;
      }
    }
  }
  if (cause) {
    for (const auto& [rank, l] : learned_by_rank) {
      if (l == cause->root) continue;
      const LogLine* pre = cause->root;
      if (!l->via.empty() && l->via != rank) {
        auto v = learned_by_rank.find(l->via);
        if (v != learned_by_rank.end()) pre = v->second;
      }
      if (pre && pre != l) needs[l] = pre;
    }
  }
  std::vector<const LogLine*> out;
  std::set<const LogLine*> placed;
  std::map<std::string, size_t> head;
  for (const auto& [file, q] : by_file) head[file] = 0;
  while (out.size() < lines.size()) {
    const LogLine* best = nullptr;
    const LogLine* fallback = nullptr;
    std::string best_file, fallback_file;
    for (const auto& [file, q] : by_file) {
      if (head[file] >= q.size()) continue;
      const LogLine* l = q[head[file]];
      auto earlier = [&](const LogLine* x) { return !x || l->ts_us < x->ts_us; };
      if (earlier(fallback)) fallback = l, fallback_file = file;
      auto n = needs.find(l);
      if (n != needs.end() && !placed.count(n->second)) continue;
      if (earlier(best)) best = l, best_file = file;
    }
    if (!best) best = fallback, best_file = fallback_file;  // a cycle in `via`: fall back to ts
    out.push_back(best);
    placed.insert(best);
    ++head[best_file];
  }
  return out;
}

struct RoomIndex {
  std::map<uint64_t, std::vector<const LogLine*>> by_room;
  std::vector<const LogLine*> peer_dead;
};

RoomIndex index(const LogSet& set) {
  RoomIndex x;
  for (const LogLine& l : set.lines) {
    if (l.room) x.by_room[*l.room].push_back(&l);
    if (l.event == "peer_dead" && !l.peer.empty()) x.peer_dead.push_back(&l);
  }
  return x;
}

FailedRoom analyze(uint64_t room, const std::vector<const LogLine*>& lines, const Cause& c) {
  FailedRoom f;
  f.room = room;
  f.origin = c.origin;
  f.code = c.code;
  f.reason = c.reason;
  if (c.root) {
    f.time = c.root->ts;
    f.logged_by = c.root->rank;
    f.root_line = c.root->msg;
  }
  f.timeline = merge(lines, &c);
  std::map<std::string, RankPath> paths;
  std::vector<std::string> order;
  for (const LogLine* l : f.timeline) {
    if (!engine_rank(l->rank) || !l->room) continue;
    auto [it, fresh] = paths.try_emplace(l->rank);
    RankPath& p = it->second;
    if (level_rank(l->level) > level_rank(p.level)) p.level = l->level;
    if (l->is_from_another_rank) p.is_from_another_rank = l->is_from_another_rank;
    if (fresh) p.rank = l->rank;
    if (!p.ts.empty() || l->code.empty() || l->origin != c.origin) continue;
    p.ts = l->ts;
    p.via = l->via;
    order.push_back(l->rank);
    if (l->rank == c.origin) {
      p.how = "root cause";
    } else if (!l->via.empty()) {
      auto via = RankId::parse(l->via), self = RankId::parse(l->rank);
      bool same_engine = via && self && via->role == self->role;
      p.how = (same_engine ? "engine agreement from " : "status from ") + l->via;
    } else {
      p.how = "propagated";
    }
  }
  for (const std::string& r : order) f.ranks.push_back(paths[r]);
  std::set<std::string> lost;
  for (const LogLine* l : lines)
    if (l->superseded_by == c.origin && l->rank != c.origin) lost.insert(l->rank);
  f.superseded.assign(lost.begin(), lost.end());
  return f;
}

}  // namespace

std::vector<const LogLine*> room_timeline(const LogSet& set, uint64_t room) {
  RoomIndex x = index(set);
  auto it = x.by_room.find(room);
  if (it == x.by_room.end()) return {};
  auto cause = find_cause(it->second, x.peer_dead);
  return merge(it->second, cause ? &*cause : nullptr);
}

std::vector<FailedRoom> failed_rooms(const LogSet& set, std::optional<uint64_t> only) {
  RoomIndex x = index(set);
  std::vector<FailedRoom> out;
  for (const auto& [room, lines] : x.by_room) {
    if (only && room != *only) continue;
    auto cause = find_cause(lines, x.peer_dead);
    if (!cause) continue;
    out.push_back(analyze(room, lines, *cause));
  }
  std::stable_sort(out.begin(), out.end(), [](const FailedRoom& a, const FailedRoom& b) {
    return a.time != b.time ? a.time < b.time : a.room < b.room;
  });
  return out;
}

std::string failed_rooms_json(const std::vector<FailedRoom>& rooms) {
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const FailedRoom& f : rooms) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array(), path = nlohmann::ordered_json::array();
    for (const RankPath& p : f.ranks) {
      ranks.push_back(p.rank);
      path.push_back({{"rank", p.rank}, {"ts", p.ts}, {"via", p.via}, {"how", p.how}, {"level", p.level}});
    }
    arr.push_back({{"room", std::to_string(f.room)},
                   {"origin", f.origin},
                   {"code", f.code},
                   {"reason", f.reason},
                   {"time", f.time},
                   {"logged_by", f.logged_by},
                   {"ranks", ranks},
                   {"path", path},
                   {"superseded", f.superseded}});
  }
  return arr.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string failed_room_text(const FailedRoom& f, bool timeline) {
  std::string s = fmt::format("room {}: {} at {}{}: {}\n", f.room, f.code, f.origin,
                              f.time.empty() ? "" : " (" + f.time + ")", f.reason);
  if (!f.logged_by.empty() && f.logged_by != f.origin)
    s += fmt::format("  root cause logged by {}: {}\n", f.logged_by, f.root_line);
  size_t i = 0;
  for (const RankPath& p : f.ranks) {
    s += fmt::format("  {}. {:<12} {}  {}{}\n", ++i, p.rank, p.ts, p.how,
                     p.level.empty() ? "" : " (highest level " + p.level + ")");
  }
  for (const std::string& r : f.superseded)
    s += fmt::format("  {}'s own failure was superseded by {}\n", r, f.origin);
  if (timeline) {
    s += "  timeline (causal order; ts is each process's own clock):\n";
    for (const LogLine* l : f.timeline)
      s += fmt::format("    {} {:<12} {:<8} {}: {}\n", l->ts, l->rank, l->level, l->component, l->msg);
  }
  return s;
}

}  // namespace kvferry::logs
