// Test support: a metric read from a node's /metrics that fails the test when the scrape does
// not answer (or does not parse), so that a check such as "== 0" cannot pass on a dead node.
// A series absent from a good scrape still reads 0 (the nodes export most counters lazily).
#pragma once

#include <doctest.h>

#include <cstdint>
#include <string>

#include "tests/support/http_client.hpp"

namespace tandem::testing {

// `series` summed over the label blocks containing `label_part`, from GET /metrics on
// 127.0.0.1:port (`who` names that node in the failure). REQUIRE fails when the scrape does not
// answer 200 within 3 s or a value does not parse. Test thread only (REQUIRE throws).
inline double required_metric(uint16_t port, const std::string& who, const std::string& series,
                              const std::string& label_part = "") {
  http::Response r = http::get(port, "/metrics", std::chrono::milliseconds(3000));
  REQUIRE_MESSAGE((r.ok() && r.status == 200), "reading ", series, "{", label_part, "} from ",
                  who, " (port ", port, "): GET /metrics did not answer 200: status ", r.status,
                  " ", r.error);
  auto value = http::metric_sum_parsed(r.body, series, label_part);
  REQUIRE_MESSAGE(value.has_value(), "reading ", series, "{", label_part, "} from ", who,
                  ": a value in its /metrics does not parse");
  return *value;
}

}  // namespace tandem::testing
