// RankMetrics (include/kvferry/metrics.h) on prometheus-cpp's core library (Debian
// prometheus-cpp-dev): its registry keeps the series, its TextSerializer writes the exposition.
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <utility>

#include "kvferry/metrics.h"

namespace kvferry {
namespace {
// 1 ms .. 60 s: a room's transfer on one machine takes milliseconds to seconds.
const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

std::unique_ptr<RankMetrics> g_metrics;
}  // namespace

struct RankMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Labels constant;
  prometheus::Family<prometheus::Counter>* rooms = nullptr;
  prometheus::Family<prometheus::Counter>* failures = nullptr;
  prometheus::Counter* ok_rooms = nullptr;
  prometheus::Counter* failed_rooms = nullptr;
  prometheus::Counter* sent = nullptr;
  prometheus::Counter* verified = nullptr;
  prometheus::Counter* mismatched = nullptr;
  prometheus::Histogram* latency = nullptr;
  std::array<prometheus::Gauge*, 5> in_flight{};
  prometheus::Gauge* peers = nullptr;
  prometheus::Gauge* live_rooms = nullptr;
  prometheus::Gauge* records = nullptr;
  prometheus::Gauge* pages = nullptr;
  std::mutex mu;  // guards failure_series (Family::Add is thread-safe; the cache is not)
  std::map<std::pair<ErrorCode, bool>, prometheus::Counter*> failure_series;

  template <typename Builder>
  auto& family(Builder b, const char* name, const char* help) {
    return b.Name(name).Help(help).Labels(constant).Register(*registry);
  }
  prometheus::Counter& counter(const char* name, const char* help) {
    return family(prometheus::BuildCounter(), name, help).Add({});
  }
  prometheus::Gauge& gauge(const char* name, const char* help) {
    return family(prometheus::BuildGauge(), name, help).Add({});
  }
};

RankMetrics::RankMetrics(const RankId& self) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.constant = {{"rank", self.str()}, {"role", std::string(role_name(self.role))}};
  m.rooms = &m.family(prometheus::BuildCounter(), "kvferry_rooms_total",
                      "Rooms released on this rank, by outcome");
  m.ok_rooms = &m.rooms->Add({{"outcome", "success"}});
  m.failed_rooms = &m.rooms->Add({{"outcome", "failed"}});
  m.failures = &m.family(prometheus::BuildCounter(), "kvferry_failures_total",
                         "Failed rooms by error code and by whether this rank observed the root cause "
                         "(local) or learned it from another rank (propagated)");
  m.sent = &m.counter("kvferry_sent_bytes_total", "Prefill: KV and aux bytes written by this rank");
  m.verified = &m.counter("kvferry_verified_bytes_total", "Decode: KV bytes verified by this rank");
  m.mismatched = &m.counter("kvferry_mismatched_bytes_total", "Decode: KV bytes that did not match");
  m.latency = &m.family(prometheus::BuildHistogram(), "kvferry_transfer_latency_seconds",
                        "Decode: from init() (metadata sent) to Success of a room")
                   .Add({}, kLatencyBuckets);
  auto& flight = m.family(prometheus::BuildGauge(), "kvferry_rooms_in_flight", "Live rooms by KVPoll state");
  for (int i = 0; i < 5; ++i)
    m.in_flight[i] = &flight.Add({{"state", std::string(to_string(static_cast<KVPoll>(i)))}});
  m.peers = &m.gauge("kvferry_peer_connections", "Peer ranks of the other engine this rank is connected to");
  m.live_rooms = &m.gauge("kvferry_live_rooms", "Rooms held by the driver and the endpoint (leak counter)");
  m.records = &m.gauge("kvferry_registry_records", "Failure registry records (leak counter)");
  m.pages = &m.gauge("kvferry_pages_in_use", "Pool pages and aux slots in use (leak counter)");
}

RankMetrics::~RankMetrics() = default;

void RankMetrics::room_released(bool success, double latency_s) {
  (success ? impl_->ok_rooms : impl_->failed_rooms)->Increment();
  if (latency_s >= 0) impl_->latency->Observe(latency_s);
}

void RankMetrics::add_sent_bytes(uint64_t bytes) { impl_->sent->Increment(static_cast<double>(bytes)); }

void RankMetrics::add_verified_bytes(uint64_t verified, uint64_t mismatched) {
  impl_->verified->Increment(static_cast<double>(verified));
  impl_->mismatched->Increment(static_cast<double>(mismatched));
}

void RankMetrics::room_failed(ErrorCode code, bool from_another_rank) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto& c = impl_->failure_series[{code, from_another_rank}];
  if (!c) {
    c = &impl_->failures->Add(
        {{"code", std::string(code_name(code))}, {"origin_kind", from_another_rank ? "propagated" : "local"}});
  }
  c->Increment();
}

void RankMetrics::set_rooms_in_flight(const std::array<uint64_t, 5>& rooms_by_state) {
  for (int i = 0; i < 5; ++i) impl_->in_flight[i]->Set(static_cast<double>(rooms_by_state[i]));
}

void RankMetrics::set_leaks(uint64_t live_rooms, uint64_t records, uint64_t pages_in_use, uint64_t peers) {
  impl_->live_rooms->Set(static_cast<double>(live_rooms));
  impl_->records->Set(static_cast<double>(records));
  impl_->pages->Set(static_cast<double>(pages_in_use));
  impl_->peers->Set(static_cast<double>(peers));
}

std::string RankMetrics::exposition() const {
  return prometheus::TextSerializer().Serialize(impl_->registry->Collect());
}

void init_rank_metrics(const RankId& self) {
  if (!g_metrics) g_metrics = std::make_unique<RankMetrics>(self);
}

RankMetrics* rank_metrics() { return g_metrics.get(); }

Status write_metrics_file(const RankMetrics& metrics, const std::string& path) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << metrics.exposition();
    if (!out.flush()) return {ErrorCode::kInternal, "cannot write " + tmp};
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return {ErrorCode::kInternal, "cannot rename " + tmp};
  return Status::Ok();
}

}  // namespace kvferry
