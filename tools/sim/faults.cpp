#include "tools/sim/faults.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <random>

#include "runtime/base/assert.hpp"

namespace tandem::sim {

std::string_view to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::crash: return "crash";
    case FaultKind::partition: return "partition";
    case FaultKind::loss: return "loss";
    case FaultKind::delay: return "delay";
    case FaultKind::slow: return "slow";
    case FaultKind::hang: return "hang";
    case FaultKind::ioerr: return "ioerr";
    case FaultKind::torn: return "torn";
  }
  return "?";
}

bool FaultPlan::has_random() const {
  return std::any_of(std::begin(random_per_s), std::end(random_per_s),
                     [](double r) { return r > 0; });
}

namespace {

bool parse_number(std::string_view text, double* out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && std::isfinite(*out);
}

// "30s", "1.5s", "500ms" -> ms.
bool parse_time(std::string_view text, double* ms) {
  double scale = 0;
  if (text.size() > 2 && text.substr(text.size() - 2) == "ms") {
    scale = 1;
    text.remove_suffix(2);
  } else if (text.size() > 1 && text.back() == 's') {
    scale = 1e3;
    text.remove_suffix(1);
  } else {
    return false;
  }
  if (!parse_number(text, ms) || *ms < 0) return false;
  *ms *= scale;
  return true;
}

bool known_kind(std::string_view name, FaultKind* kind) {
  for (auto k : {FaultKind::crash, FaultKind::partition, FaultKind::loss, FaultKind::delay,
                 FaultKind::slow, FaultKind::hang, FaultKind::ioerr, FaultKind::torn}) {
    if (to_string(k) == name) {
      *kind = k;
      return true;
    }
  }
  return false;
}

bool valid_node(std::string_view n) {
  if (n == "gateway" || n == "router") return true;
  for (std::string_view prefix : {"prefill-", "decode-", "instance-"}) {
    if (n.substr(0, prefix.size()) != prefix) continue;
    std::string_view digits = n.substr(prefix.size());
    return !digits.empty() && digits.size() <= 5 &&
           std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  }
  return false;
}

bool is_link(FaultKind k) {
  return k == FaultKind::partition || k == FaultKind::loss || k == FaultKind::delay;
}

// The shortest text that parses back to the same double.
std::string format_number(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  RT_ASSERT(ec == std::errc(), v);
  return std::string(buf, end);
}

std::string format_ms(double ms) { return format_number(ms) + "ms"; }

}  // namespace

Result<FaultPlan> parse_faults(std::string_view spec) {
  FaultPlan plan;
  size_t index = 0;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view term = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    ++index;
    auto bad = [&](const std::string& why) {
      return make_error(ErrorKind::invalid, "--faults: term " + std::to_string(index) + " '" +
                                                std::string(term) + "': " + why);
    };
    size_t colon = term.find(':');
    if (colon == std::string_view::npos) return bad("expected KIND:...");
    std::string_view kind_name = term.substr(0, colon), rest = term.substr(colon + 1);
    if (kind_name == "random") {
      size_t eq = rest.find('=');
      FaultKind k{};
      if (eq == std::string_view::npos || !known_kind(rest.substr(0, eq), &k)) {
        return bad("expected random:KIND=RATE, KIND one of crash, partition, loss, delay, slow, "
                   "hang, ioerr, torn");
      }
      std::string_view rate = rest.substr(eq + 1);
      if (rate.size() > 2 && rate.substr(rate.size() - 2) == "/s") rate.remove_suffix(2);
      double r = 0;
      if (!parse_number(rate, &r) || r < 0 || r > 1000) return bad("RATE must be in [0, 1000]");
      plan.random_per_s[static_cast<int>(k)] = r;
      continue;
    }
    Fault f;
    if (!known_kind(kind_name, &f.kind)) {
      return bad("unknown kind '" + std::string(kind_name) +
                 "' (crash, partition, loss, delay, slow, hang, ioerr, torn, random)");
    }
    size_t at = rest.rfind('@');
    if (at == std::string_view::npos) return bad("expected @TIME");
    std::string_view target = rest.substr(0, at), when = rest.substr(at + 1);
    size_t plus = when.find('+');
    if (!parse_time(when.substr(0, plus), &f.at_ms)) return bad("bad time (e.g. 30s, 500ms)");
    if (plus != std::string_view::npos) {
      if (!parse_time(when.substr(plus + 1), &f.for_ms) || f.for_ms <= 0) {
        return bad("bad duration (e.g. +10s, +500ms; > 0)");
      }
    } else if (f.kind != FaultKind::crash) {
      return bad("needs a duration (+D)");
    }
    if (is_link(f.kind)) {
      std::string_view link = target;
      if (f.kind != FaultKind::partition) {
        size_t eq = target.find('=');
        if (eq == std::string_view::npos) return bad("expected A/B=VALUE");
        link = target.substr(0, eq);
        if (!parse_number(target.substr(eq + 1), &f.value)) return bad("bad value");
        if (f.kind == FaultKind::loss && (f.value < 0 || f.value > 1)) {
          return bad("loss probability must be in [0, 1]");
        }
        if (f.kind == FaultKind::delay && (f.value < 0 || f.value > 3.6e6)) {
          return bad("delay must be in [0, 3600000] ms");
        }
      }
      size_t slash = link.find('/');
      if (slash == std::string_view::npos) return bad("expected two nodes A/B");
      f.a = std::string(link.substr(0, slash));
      f.b = std::string(link.substr(slash + 1));
      if (!valid_node(f.a) || !valid_node(f.b)) return bad("unknown node name");
      if (f.a == f.b) return bad("a link joins two different nodes");
    } else {
      std::string_view node = target;
      if (f.kind == FaultKind::ioerr || f.kind == FaultKind::torn) {
        size_t eq = target.rfind('=');
        if (eq == std::string_view::npos || !parse_number(target.substr(eq + 1), &f.value) ||
            f.value < 0 || f.value > 1) {
          return bad("expected " + std::string(to_string(f.kind)) +
                     ":NODE=P, P a probability in [0, 1]");
        }
        node = target.substr(0, eq);
        if (node.substr(0, 8) != "prefill-") {
          return bad("tier 2 lives on prefill instances' nodes: expected prefill-N");
        }
      }
      if (f.kind == FaultKind::slow) {
        size_t x = target.rfind('x');
        if (x == std::string_view::npos || !parse_number(target.substr(x + 1), &f.value) ||
            f.value < 1 || f.value > 1e6) {
          return bad("expected slow:NODExFACTOR, FACTOR in [1, 1e6]");
        }
        node = target.substr(0, x);
      }
      f.a = std::string(node);
      if (!valid_node(f.a)) return bad("unknown node name '" + f.a + "'");
      if (f.a == "gateway" || f.a == "router") {
        return bad("only instances (prefill-N, decode-N) crash, slow down or hang");
      }
    }
    plan.faults.push_back(std::move(f));
  }
  return plan;
}

std::vector<Fault> expand_faults(const FaultPlan& plan, const std::vector<std::string>& instances,
                                 const std::vector<std::string>& nodes, double duration_ms,
                                 uint64_t seed) {
  std::vector<std::pair<size_t, Fault>> all;
  for (const Fault& f : plan.faults) all.emplace_back(all.size(), f);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * (static_cast<double>(rng() >> 11) * 0x1.0p-53);
  };
  auto pick = [&](const std::vector<std::string>& from) {
    return from[static_cast<size_t>(rng() % from.size())];
  };
  std::vector<std::string> prefills;  // tier-2 faults' nodes
  for (const std::string& n : instances) {
    if (n.rfind("prefill-", 0) == 0) prefills.push_back(n);
  }
  for (int k = 0; k < fault_kinds_count; ++k) {
    double rate = plan.random_per_s[k];
    if (!(rate > 0) || instances.empty() || nodes.size() < 2) continue;
    auto kind = static_cast<FaultKind>(k);
    bool tier2 = kind == FaultKind::ioerr || kind == FaultKind::torn;
    if (tier2 && prefills.empty()) continue;
    double t = 0;
    for (size_t n = 0; n < 4096; ++n) {  // bounded: at most 4096 faults of one kind
      t += -std::log(1.0 - uniform(0, 1)) / rate * 1e3;  // exponential gaps
      if (t >= duration_ms) break;
      Fault f;
      f.kind = kind;
      f.at_ms = std::floor(t);
      f.for_ms = std::floor(uniform(200, 8000));
      if (is_link(kind)) {
        f.a = pick(instances);  // links that matter: an instance and any other node
        do f.b = pick(nodes); while (f.b == f.a);
        if (kind == FaultKind::loss) f.value = std::floor(uniform(1, 100)) / 100;
        if (kind == FaultKind::delay) f.value = std::floor(uniform(1, 500));
      } else if (tier2) {
        f.a = pick(prefills);
        f.value = std::floor(uniform(1, 100)) / 100;
      } else {
        f.a = pick(instances);
        if (kind == FaultKind::slow) f.value = std::floor(uniform(2, 20));
        if (kind == FaultKind::crash && uniform(0, 1) < 0.2) f.for_ms = -1;  // stays down
      }
      all.emplace_back(all.size(), std::move(f));
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& x, const auto& y) {
    return x.second.at_ms != y.second.at_ms ? x.second.at_ms < y.second.at_ms : x.first < y.first;
  });
  std::vector<Fault> out;
  for (auto& [index, f] : all) out.push_back(std::move(f));
  return out;
}

std::string describe(const Fault& f) {
  std::string s(to_string(f.kind));
  s += ':';
  switch (f.kind) {
    case FaultKind::partition: s += f.a + "/" + f.b; break;
    case FaultKind::loss:
    case FaultKind::delay: s += f.a + "/" + f.b + "=" + format_number(f.value); break;
    case FaultKind::slow: s += f.a + "x" + format_number(f.value); break;
    case FaultKind::ioerr:
    case FaultKind::torn: s += f.a + "=" + format_number(f.value); break;
    default: s += f.a;
  }
  s += "@" + format_ms(f.at_ms);
  if (f.for_ms > 0) s += "+" + format_ms(f.for_ms);
  return s;
}

std::string describe(const std::vector<Fault>& faults) {
  std::string s;
  for (const Fault& f : faults) {
    if (!s.empty()) s += ',';
    s += describe(f);
  }
  return s;
}

}  // namespace tandem::sim
