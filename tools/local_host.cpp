#include "tools/local_host.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <optional>

#include "runtime/base/assert.hpp"

namespace tandem::tools {
namespace {

// An address in canonical IPv6 form (IPv4 as ::ffff:a.b.c.d), or nullopt if not a literal.
std::optional<in6_addr> parse_literal(std::string_view text) {
  std::string s(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  if (auto percent = s.find('%'); percent != std::string::npos) s.resize(percent);  // scope id
  in6_addr v6{};
  if (::inet_pton(AF_INET6, s.c_str(), &v6) == 1) return v6;
  in_addr v4{};
  if (::inet_pton(AF_INET, s.c_str(), &v4) != 1) return std::nullopt;
  in6_addr mapped{};
  mapped.s6_addr[10] = 0xff;
  mapped.s6_addr[11] = 0xff;
  std::memcpy(&mapped.s6_addr[12], &v4, 4);
  return mapped;
}

bool is_loopback(const in6_addr& a) {
  if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string numeric_host(const sockaddr* sa) {
  char buf[NI_MAXHOST];
  socklen_t len = sa->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (::getnameinfo(sa, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return buf;
}

}  // namespace

HostIdentity this_host() {
  HostIdentity self;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) self.hostname = name;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return self;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    std::string text = numeric_host(it->ifa_addr);
    if (!text.empty()) self.addresses.push_back(text);
  }
  ::freeifaddrs(list);
  return self;
}

bool is_local_address(std::string_view numeric, const HostIdentity& self) {
  std::optional<in6_addr> addr = parse_literal(numeric);
  if (!addr) return false;
  if (is_loopback(*addr)) return true;
  for (const auto& mine : self.addresses) {
    std::optional<in6_addr> other = parse_literal(mine);
    if (other && std::memcmp(other->s6_addr, addr->s6_addr, 16) == 0) return true;
  }
  return false;
}

bool is_local_host(std::string_view host, const HostIdentity& self) {
  if (host.empty()) return false;
  if (iequals(host, "localhost")) return true;
  if (parse_literal(host)) return is_local_address(host, self);
  if (!self.hostname.empty()) {
    std::string_view mine = self.hostname;
    std::string_view short_name = mine.substr(0, mine.find('.'));
    if (iequals(host, mine) || iequals(host, short_name)) return true;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  if (::getaddrinfo(std::string(host).c_str(), nullptr, &hints, &results) != 0) return false;
  bool local = false;
  for (addrinfo* it = results; it != nullptr && !local; it = it->ai_next) {
    if (it->ai_family != AF_INET && it->ai_family != AF_INET6) continue;
    local = is_local_address(numeric_host(it->ai_addr), self);
  }
  ::freeaddrinfo(results);
  RT_ASSERT(results != nullptr || !local);
  return local;
}

}  // namespace tandem::tools
