#include "actors/kv_offload/tier2_report.hpp"

#include <cstdio>

#include "runtime/base/assert.hpp"

namespace tandem::kv_offload {
namespace {

std::string fixed1(double value) {
  char text[48];
  std::snprintf(text, sizeof text, "%.1f", value);
  return text;
}

std::string seconds_text(std::chrono::nanoseconds d) {
  char text[48];
  std::snprintf(text, sizeof text, "%.3f", std::chrono::duration<double>(d).count());
  return text;
}

std::string full_name(const std::string& node, const std::string& instance) {
  return node + "/kv-offload/" + instance;
}

void check_monotonic(const Tier2Counts& a, const Tier2Counts& b) {
  RT_ASSERT(b.lookups >= a.lookups && b.hit_blocks >= a.hit_blocks, "a count went back");
  RT_ASSERT(b.miss_blocks >= a.miss_blocks && b.stored_blocks >= a.stored_blocks,
            "a count went back");
  RT_ASSERT(b.store_dropped_blocks >= a.store_dropped_blocks, "a count went back");
  RT_ASSERT(b.corrupt_dropped_blocks >= a.corrupt_dropped_blocks, "a count went back");
  RT_ASSERT(b.read_bytes >= a.read_bytes && b.written_bytes >= a.written_bytes,
            "a count went back");
}

}  // namespace

RateWindow::RateWindow(std::chrono::nanoseconds interval) : interval_(interval) {
  RT_ASSERT(interval_.count() > 0, "rate interval", interval_.count());
}

void RateWindow::sample(std::chrono::nanoseconds now, const Tier2Counts& counts) {
  RT_ASSERT(now >= last_, "time went back", now.count(), last_.count());
  last_ = now;
  if (!start_) {
    start_.emplace(now, counts);
    return;
  }
  auto over = now - start_->first;
  if (over < interval_) return;
  const Tier2Counts& was = start_->second;
  check_monotonic(was, counts);
  double seconds = std::chrono::duration<double>(over).count();
  RT_ASSERT(seconds > 0, "an interval of no time");
  auto per_s = [seconds](uint64_t now_count, uint64_t was_count) {
    return static_cast<double>(now_count - was_count) / seconds;
  };
  Tier2Rates r;
  r.over = over;
  r.lookups_per_s = per_s(counts.lookups, was.lookups);
  r.hit_blocks_per_s = per_s(counts.hit_blocks, was.hit_blocks);
  r.miss_blocks_per_s = per_s(counts.miss_blocks, was.miss_blocks);
  r.stored_blocks_per_s = per_s(counts.stored_blocks, was.stored_blocks);
  r.read_bytes_per_s = per_s(counts.read_bytes, was.read_bytes);
  r.written_bytes_per_s = per_s(counts.written_bytes, was.written_bytes);
  rates_ = r;
  start_.emplace(now, counts);
}

const char* to_string(Tier2State state) {
  switch (state) {
    case Tier2State::off:
      return "off";
    case Tier2State::opening:
      return "opening";
    case Tier2State::open:
      return "open";
    case Tier2State::failed:
      return "failed";
  }
  return "unknown";
}

std::vector<std::string> tier2_status_header() {
  return {"node",
          "instance",
          "state",
          "io",
          "blocks used",
          "blocks capacity",
          "bytes used",
          "hits",
          "misses",
          "lookups",
          "stored",
          "store dropped",
          "corrupt dropped",
          "read bytes",
          "written bytes",
          "hits/s",
          "misses/s",
          "lookups/s",
          "stored/s",
          "read bytes/s",
          "written bytes/s",
          "rate seconds"};
}

std::vector<std::string> tier2_status_row(const Tier2Status& s) {
  const Tier2Counts& c = s.counts;
  std::string state = to_string(s.state);
  if (!s.why.empty()) state += ": " + s.why;
  std::vector<std::string> row = {s.node,
                                  s.instance,
                                  state,
                                  s.io_mode.empty() ? "-" : s.io_mode,
                                  std::to_string(s.blocks_used),
                                  std::to_string(s.blocks_capacity),
                                  std::to_string(s.blocks_used * s.block_bytes),
                                  std::to_string(c.hit_blocks),
                                  std::to_string(c.miss_blocks),
                                  std::to_string(c.lookups),
                                  std::to_string(c.stored_blocks),
                                  std::to_string(c.store_dropped_blocks),
                                  std::to_string(c.corrupt_dropped_blocks),
                                  std::to_string(c.read_bytes),
                                  std::to_string(c.written_bytes)};
  if (const auto& r = s.rates) {
    for (double v : {r->hit_blocks_per_s, r->miss_blocks_per_s, r->lookups_per_s,
                     r->stored_blocks_per_s, r->read_bytes_per_s, r->written_bytes_per_s}) {
      row.push_back(fixed1(v));
    }
    row.push_back(fixed1(std::chrono::duration<double>(r->over).count()));
  } else {
    row.insert(row.end(), 7, "-");  // no full interval yet
  }
  RT_ASSERT(row.size() == tier2_status_header().size(), "status row width", row.size());
  return row;
}

std::string tier2_status_text(const Tier2Status& s) {
  const Tier2Counts& c = s.counts;
  std::string out = full_name(s.node, s.instance) + ": " + to_string(s.state);
  if (!s.why.empty()) out += " (" + s.why + ")";
  if (!s.io_mode.empty()) out += ", " + s.io_mode + " I/O";
  out += "\n  blocks      " + std::to_string(s.blocks_used) + " used of " +
         std::to_string(s.blocks_capacity) + " (" + std::to_string(s.blocks_used * s.block_bytes) +
         " bytes)\n";
  out += "  lookups     " + std::to_string(c.lookups) + ": " + std::to_string(c.hit_blocks) +
         " blocks hit, " + std::to_string(c.miss_blocks) + " missed\n";
  out += "  stores      " + std::to_string(c.stored_blocks) + " blocks stored, " +
         std::to_string(c.store_dropped_blocks) + " dropped; " +
         std::to_string(c.corrupt_dropped_blocks) + " corrupt blocks dropped\n";
  out += "  disk        " + std::to_string(c.read_bytes) + " bytes read, " +
         std::to_string(c.written_bytes) + " bytes written\n";
  if (!s.rates) return out + "  per second  (no full interval yet)\n";
  const Tier2Rates& r = *s.rates;
  return out + "  per second  " + fixed1(r.lookups_per_s) + " lookups, " +
         fixed1(r.hit_blocks_per_s) + " hits, " + fixed1(r.miss_blocks_per_s) + " misses, " +
         fixed1(r.stored_blocks_per_s) + " stored, " + fixed1(r.read_bytes_per_s) +
         " bytes read, " + fixed1(r.written_bytes_per_s) + " bytes written (over " +
         fixed1(std::chrono::duration<double>(r.over).count()) + " s)\n";
}

uint64_t Tier2VerifyOutcome::dropped_count() const {
  uint64_t total = 0;
  for (const auto& [reason, count] : dropped_by_reason) total += count;
  return total;
}

std::vector<std::vector<std::string>> tier2_verify_rows(const Tier2VerifyOutcome& v) {
  RT_ASSERT(v.checked_count == v.ok_count + v.dropped_count(), "verify counts", v.checked_count,
            v.ok_count);
  std::vector<std::string> header = {"node", "instance", "checked", "ok", "dropped"};
  std::vector<std::string> row = {v.node, v.instance, std::to_string(v.checked_count),
                                  std::to_string(v.ok_count), std::to_string(v.dropped_count())};
  for (const auto& [reason, count] : v.dropped_by_reason) {
    header.push_back("dropped " + reason);
    row.push_back(std::to_string(count));
  }
  header.push_back("seconds");
  row.push_back(seconds_text(v.took));
  RT_ASSERT(header.size() == row.size(), "verify row width");
  return {header, row};
}

std::string tier2_verify_text(const Tier2VerifyOutcome& v) {
  RT_ASSERT(v.checked_count == v.ok_count + v.dropped_count(), "verify counts", v.checked_count,
            v.ok_count);
  std::string reasons;
  for (const auto& [reason, count] : v.dropped_by_reason) {
    reasons += (reasons.empty() ? "" : ", ") + reason + " " + std::to_string(count);
  }
  return full_name(v.node, v.instance) + ": verify checked " + std::to_string(v.checked_count) +
         " blocks in " + seconds_text(v.took) + " s: " + std::to_string(v.ok_count) + " ok, " +
         std::to_string(v.dropped_count()) + " dropped" +
         (reasons.empty() ? "" : " (" + reasons + ")") + "\n";
}

std::vector<std::vector<std::string>> tier2_drop_rows(const Tier2DropOutcome& d) {
  RT_ASSERT(d.pinned_count <= d.dropped_count, "more pinned than dropped", d.pinned_count);
  return {{"node", "instance", "dropped", "pinned", "seconds"},
          {d.node, d.instance, std::to_string(d.dropped_count), std::to_string(d.pinned_count),
           seconds_text(d.took)}};
}

std::string tier2_drop_text(const Tier2DropOutcome& d) {
  RT_ASSERT(d.pinned_count <= d.dropped_count, "more pinned than dropped", d.pinned_count);
  return full_name(d.node, d.instance) + ": dropped " + std::to_string(d.dropped_count) +
         " blocks in " + seconds_text(d.took) + " s (" + std::to_string(d.pinned_count) +
         " of them pinned: their slots free at the unpin)\n";
}

}  // namespace tandem::kv_offload
