// The status page on a node's admin port, in headless Chromium (Debian's `chromium`, installed
// by tools/setup.sh): it loads, lists every node of loopback-3, and shows a drain within a few
// seconds; a screenshot is kept in $TANDEM_BUILD_ROOT/test-artifacts/status-page.png.
#include <doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "tests/support/http_client.hpp"
#include "tests/support/process.hpp"
#include "tests/support/serve_cluster.hpp"

using namespace tandem::testing;
using namespace std::chrono_literals;
namespace http = tandem::testing::http;

namespace {

const char* chromium_path = "/usr/bin/chromium";

// Chromium as the environment runs it (headless, no sandbox as root, nothing from the
// network); `extra` picks what it does (--dump-dom, --screenshot=...).
RunResult chromium(const std::string& profile, const std::string& url,
                   const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {chromium_path,
                                   "--headless",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--disable-quic",
                                   "--no-first-run",
                                   "--disable-background-networking",
                                   "--disable-component-update",
                                   "--disable-sync",
                                   "--user-data-dir=" + profile,
                                   "--virtual-time-budget=4000"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(url);
  return run(argv, 60000ms);
}

}  // namespace

TEST_CASE("status page: loads in Chromium, lists every node, shows a drain within seconds" *
          doctest::timeout(300)) {
  REQUIRE_MESSAGE(access(chromium_path, X_OK) == 0,
                  "Chromium is missing: tools/setup.sh installs Debian's chromium");
  ServeCluster c(Layout::loopback3, 1);
  REQUIRE_MESSAGE(c.wait_ready(60000ms), c.logs());
  for (int i = 0; i < 4; ++i) REQUIRE(complete(c.http_port(), "Once upon a time", 8).error.empty());
  const uint16_t admin = c.admin_port("front");
  const std::string url = "http://127.0.0.1:" + std::to_string(admin) + "/status";
  // The page's data: the node samples the cluster from the first ask on.
  auto sampled = [&] {
    auto r = http::get(admin, "/status.json", 3000ms);
    return r.ok() && r.status == 200 && r.body.find("\"samples\":[{") != std::string::npos;
  };
  REQUIRE_MESSAGE(eventually(20000ms, sampled), c.logs());
  auto page = http::get(admin, "/status", 3000ms);
  REQUIRE(page.status == 200);
  CHECK(page.body.find("<title>Tandem status</title>") != std::string::npos);
  // Nothing is loaded from elsewhere (the one URL in it is the SVG namespace's name).
  CHECK(page.body.find("src=") == std::string::npos);
  CHECK(page.body.find("<link") == std::string::npos);
  CHECK(page.body.find("@import") == std::string::npos);
  CHECK(page.body.find("https://") == std::string::npos);

  std::string profile = make_temp_dir("chromium");
  RunResult dom = chromium(profile, url, {"--dump-dom"});
  INFO(dom.output.substr(0, 4000));
  REQUIRE(dom.exit_code == 0);
  CHECK(dom.output.find("3/3 nodes up") != std::string::npos);
  for (const char* node : {"front", "prefill", "decode"}) {
    CHECK(dom.output.find(std::string("<td>") + node + "</td>") != std::string::npos);
  }
  CHECK(dom.output.find("<td>decode/decode/decode</td>") != std::string::npos);
  CHECK(dom.output.find("<td>front/gateway</td>") != std::string::npos);
  CHECK(dom.output.find("<polyline") != std::string::npos);  // the plots have lines

  RunResult drained = c.shell("drain decode 30");
  REQUIRE_MESSAGE(drained.exit_code == 0, drained.output);
  auto drained_at = std::chrono::steady_clock::now();
  bool shown = false;
  double seconds = 0;
  while (!shown && std::chrono::steady_clock::now() - drained_at < 30s) {
    RunResult again = chromium(profile, url, {"--dump-dom"});
    shown = again.output.find("<tr class=\"draining\"><td>decode/decode/decode</td>") !=
            std::string::npos;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - drained_at).count();
  }
  MESSAGE("the page showed the drain ", seconds, " s after `drain` returned");
  CHECK(shown);  // within the loop's 30 s bound: the page refreshes every 2 s

  std::string artifacts = build_root() + "/test-artifacts";
  std::filesystem::create_directories(artifacts);
  std::string png = artifacts + "/status-page.png";
  std::filesystem::remove(png);
  RunResult shot = chromium(profile, url, {"--window-size=1280,1500", "--screenshot=" + png});
  CHECK_MESSAGE(shot.exit_code == 0, shot.output);
  struct stat st {};
  REQUIRE(stat(png.c_str(), &st) == 0);
  CHECK(st.st_size > 20000);  // a rendered page, not an empty image
  CHECK(c.shell("undrain decode").exit_code == 0);
  std::filesystem::remove_all(profile);
}
