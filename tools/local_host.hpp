// Which manifest hosts are this machine (for `tandem up`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::tools {

struct HostIdentity {
  std::string hostname;                // gethostname()
  std::vector<std::string> addresses;  // numeric addresses of local interfaces (getifaddrs)
};

// Reads this machine's hostname and interface addresses. Never fails: a part it cannot read
// stays empty (loopback and "localhost" are recognised without it).
HostIdentity this_host();

// True when `numeric` is an IPv4/IPv6 literal that is loopback (127.0.0.0/8, ::1, or
// ::ffff:127.x.y.z) or equal to one of self.addresses. False for non-literals.
bool is_local_address(std::string_view numeric, const HostIdentity& self);

// True when `host` names this machine: "localhost" (any case), the hostname or its first
// label (any case), a local address literal, or a name that resolves (getaddrinfo; may block
// on DNS) to a local address. A name that does not resolve is not local.
bool is_local_host(std::string_view host, const HostIdentity& self);

}  // namespace tandem::tools
